// Tests of the name -> policy registry (policy/policy_registry.h): every
// row parses back to itself and builds a policy that answers to its name,
// the choice strings are the rows' names, and an unknown name is an error
// that lists the registry's names.
#include "policy/policy_registry.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace kvtier {
namespace {

TEST(PolicyRegistryTest, EveryEvictionPolicyParsesAndBuildsUnderItsName) {
  std::set<std::string_view> names;
  for (const EvictionPolicyEntry& row : kEvictionPolicies) {
    SCOPED_TRACE(std::string(row.name));
    EXPECT_TRUE(names.insert(row.name).second) << "names are unique";
    EXPECT_FALSE(row.description.empty());
    auto id = ParseEvictionPolicy(row.name);
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    EXPECT_EQ(*id, row.id);
    EXPECT_EQ(EvictionPolicyName(row.id), row.name);
    auto policy = MakeEvictionPolicy(row.id);
    ASSERT_NE(policy, nullptr);
    EXPECT_EQ(policy->name(), row.name);
    auto by_name = MakeEvictionPolicy(row.name);
    ASSERT_NE(by_name, nullptr);
    EXPECT_EQ(by_name->name(), row.name);
  }
  EXPECT_EQ(names.size(), 6u);
}

TEST(PolicyRegistryTest, UnknownEvictionPolicyListsTheNames) {
  auto id = ParseEvictionPolicy("clock");
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(id.status().message().find("'clock'"), std::string::npos) << id.status().message();
  for (const EvictionPolicyEntry& row : kEvictionPolicies) {
    EXPECT_NE(id.status().message().find(std::string(row.name)), std::string::npos) << id.status().message();
  }
  EXPECT_EQ(MakeEvictionPolicy("clock"), nullptr);
  EXPECT_FALSE(ParseEvictionPolicy("LRU").ok()) << "names are case-sensitive";
  EXPECT_FALSE(ParseEvictionPolicy("").ok());
}

TEST(PolicyRegistryTest, ChoiceStringsAreTheRowsNames) {
  EXPECT_EQ(kEvictionPolicyChoices, "lru|fifo|lru2|s3fifo|arc|queue_aware");
  EXPECT_EQ(kNvmeAdmissionChoices, "all|second_hit|dwpd");
  EXPECT_EQ(kRemoteAdmissionChoices, "all|second_hit|rate");
  EXPECT_EQ(ListChoices(kNvmeAdmissionChoices), "all, second_hit, dwpd");
  std::string joined;
  for (const EvictionPolicyEntry& row : kEvictionPolicies) {
    joined += (joined.empty() ? "" : "|") + std::string(row.name);
  }
  EXPECT_EQ(kEvictionPolicyChoices, joined);
}

TEST(PolicyRegistryTest, AdmissionPoliciesParseForTheirTiersOnly) {
  for (const AdmissionPolicyEntry& row : kAdmissionPolicies) {
    SCOPED_TRACE(std::string(row.name));
    EXPECT_FALSE(row.description.empty());
    EXPECT_EQ(AdmissionPolicyName(row.id), row.name);
    for (uint8_t use : {uint8_t{kAdmissionForNvme}, uint8_t{kAdmissionForRemote}}) {
      auto id = ParseAdmissionPolicy(row.name, use);
      EXPECT_EQ(id.ok(), (row.uses & use) != 0);
      if (id.ok()) {
        EXPECT_EQ(*id, row.id);
      }
    }
  }
  auto rate = ParseAdmissionPolicy("rate", kAdmissionForNvme);
  ASSERT_FALSE(rate.ok());
  EXPECT_NE(rate.status().message().find("all, second_hit, dwpd"), std::string::npos) << rate.status().message();
  auto dwpd = ParseAdmissionPolicy("dwpd", kAdmissionForRemote);
  ASSERT_FALSE(dwpd.ok());
  EXPECT_NE(dwpd.status().message().find("all, second_hit, rate"), std::string::npos) << dwpd.status().message();
}

TEST(PolicyRegistryTest, AdmissionFactoriesBuildEachPolicyAndCheckTheirBudgets) {
  AdmissionParams params;
  params.dwpd.drive_capacity_bytes = uint64_t{1} << 40;
  params.rate_bytes_per_second = 1 << 20;
  for (const AdmissionPolicyEntry& row : kAdmissionPolicies) {
    SCOPED_TRACE(std::string(row.name));
    auto made = MakeAdmissionPolicy(row.id, params, 0);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    EXPECT_EQ((*made)->name(), row.name);
  }
  EXPECT_FALSE(MakeAdmissionPolicy(AdmissionPolicyId::kRate, AdmissionParams{}, 0).ok()) << "a zero rate";
  EXPECT_FALSE(MakeAdmissionPolicy(AdmissionPolicyId::kDwpd, AdmissionParams{}, 0).ok()) << "no drive size";
}

TEST(PolicyRegistryTest, NoneAdmitsNothingForcedOrNotAndNoConfiguredTierOffersIt) {
  auto none = MakeAdmissionPolicy(AdmissionPolicyId::kNone, AdmissionParams{}, 0);
  ASSERT_TRUE(none.ok());
  AdmissionCandidate hot{1 << 20, AdmissionClass::kShared, true};
  EXPECT_NE((*none)->Decide(hot, 0), AdmissionOutcome::kAdmitted);
  EXPECT_FALSE((*none)->Force(1 << 20, 0));
  EXPECT_FALSE(ParseAdmissionPolicy("none", kAdmissionForNvme).ok());
  EXPECT_FALSE(ParseAdmissionPolicy("none", kAdmissionForRemote).ok());
}

}  // namespace
}  // namespace kvtier
