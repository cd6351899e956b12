// Tests of the admission policies: all, second_hit, dwpd (classes, prefix
// closure, the budget, the class cutoff moving both ways) and their counters.
#include "policy/admission_policy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kvtier {
namespace {

constexpr uint64_t kSecondUs = 1'000'000;
constexpr uint64_t kMiB = 1 << 20;

using C = AdmissionClass;
using O = AdmissionOutcome;

AdmissionCandidate Candidate(C cls, uint64_t bytes = kMiB, bool parent_cached = true) {
  return AdmissionCandidate{bytes, cls, parent_cached};
}

std::map<std::string, int64_t> Counters(const AdmissionPolicy& p, uint64_t now_us = 0) {
  CounterCollector c;
  p.VisitCounters("nvme.admission", c, now_us);
  std::map<std::string, int64_t> out;
  for (const auto& [name, value] : c.counters()) out[name] = value;
  return out;
}

TEST(AdmissionPolicyTest, ClassifyBlockRanksUsesThenConversation) {
  using C = ConversationState;
  EXPECT_EQ(ClassifyBlock(0, C::kUnknown), AdmissionClass::kFirstSighting);
  EXPECT_EQ(ClassifyBlock(1, C::kUnknown), AdmissionClass::kReused);
  EXPECT_EQ(ClassifyBlock(2, C::kUnknown), AdmissionClass::kShared);
  EXPECT_EQ(ClassifyBlock(0, C::kOpen), AdmissionClass::kOpenSessionTail);
  EXPECT_EQ(ClassifyBlock(1, C::kOpen), AdmissionClass::kOpenSessionTail) << "a tail outranks one reuse";
  EXPECT_EQ(ClassifyBlock(1, C::kClosed), AdmissionClass::kClosedSession);
  EXPECT_EQ(ClassifyBlock(7, C::kClosed), AdmissionClass::kShared) << "shared beats closed";
}

TEST(AdmissionPolicyTest, AllAdmitsEverything) {
  auto p = MakeAdmitAllPolicy();
  EXPECT_EQ(p->name(), "all");
  EXPECT_EQ(p->Decide(Candidate(C::kFirstSighting), 0), O::kAdmitted);
  EXPECT_EQ(p->Decide(Candidate(C::kClosedSession), 0), O::kAdmitted);
  EXPECT_EQ(p->Decide(Candidate(C::kReused, kMiB, /*parent_cached=*/false), 0), O::kAdmitted);
  auto c = Counters(*p);
  EXPECT_EQ(c["nvme.admission.admitted"], 3);
  EXPECT_EQ(c["nvme.admission.admitted_bytes"], int64_t(3 * kMiB));
}

TEST(AdmissionPolicyTest, SecondHitWantsEvidenceOfReuseAndTheParent) {
  auto p = MakeSecondHitPolicy();
  EXPECT_EQ(p->name(), "second_hit");
  EXPECT_EQ(p->Decide(Candidate(C::kShared), 0), O::kAdmitted);
  EXPECT_EQ(p->Decide(Candidate(C::kOpenSessionTail), 0), O::kAdmitted);
  EXPECT_EQ(p->Decide(Candidate(C::kReused), 0), O::kAdmitted);
  EXPECT_EQ(p->Decide(Candidate(C::kFirstSighting), 0), O::kFirstSighting);
  EXPECT_EQ(p->Decide(Candidate(C::kClosedSession), 0), O::kClosedSession);
  // Prefix closure: even a shared block needs its parent.
  EXPECT_EQ(p->Decide(Candidate(C::kShared, kMiB, false), 0), O::kParentMissing);
  auto c = Counters(*p);
  EXPECT_EQ(c["nvme.admission.admitted"], 3);
  EXPECT_EQ(c["nvme.admission.rejected_first_sighting"], 1);
  EXPECT_EQ(c["nvme.admission.rejected_closed_session"], 1);
  EXPECT_EQ(c["nvme.admission.rejected_parent_missing"], 1);
  EXPECT_EQ(c["nvme.admission.rejected_no_budget"], 0);
  EXPECT_EQ(c["nvme.admission.rejected_below_cutoff"], 0);
}

DwpdOptions Drive(uint64_t bucket_bytes = 16 * kMiB) {
  DwpdOptions o;
  o.drive_capacity_bytes = 864ull * 1'000'000'000;  // R = 10 MB/s exactly
  o.bucket_bytes = bucket_bytes;
  o.update_interval_us = 60 * kSecondUs;
  return o;
}

std::unique_ptr<AdmissionPolicy> Dwpd(const DwpdOptions& o) {
  auto p = MakeDwpdPolicy(o, 0);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return std::move(p).value();
}

TEST(AdmissionPolicyTest, DwpdRejectsBadOptions) {
  DwpdOptions o = Drive();
  o.share = 0;
  auto p = MakeDwpdPolicy(o, 0);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
}

TEST(AdmissionPolicyTest, DwpdAppliesTheSecondHitRulesFirst) {
  auto p = MakeDwpdPolicy(Drive(), 0);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)->name(), "dwpd");
  EXPECT_EQ((*p)->Decide(Candidate(C::kFirstSighting), 0), O::kFirstSighting);
  EXPECT_EQ((*p)->Decide(Candidate(C::kClosedSession), 0), O::kClosedSession);
  EXPECT_EQ((*p)->Decide(Candidate(C::kReused, kMiB, false), 0), O::kParentMissing);
  EXPECT_EQ((*p)->Decide(Candidate(C::kReused), 0), O::kAdmitted);
}

TEST(AdmissionPolicyTest, DwpdRefusesWhatTheBucketCannotPayFor) {
  auto p = Dwpd(Drive(16 * kMiB));
  for (int i = 0; i < 16; ++i) ASSERT_EQ(p->Decide(Candidate(C::kShared), 0), O::kAdmitted) << i;
  EXPECT_EQ(p->Decide(Candidate(C::kShared), 0), O::kNoBudget);
  // R = 10 MB/s: after 1 s, 9 more MiB-blocks fit, not 10.
  int admitted = 0;
  for (int i = 0; i < 12; ++i) admitted += p->Decide(Candidate(C::kShared), kSecondUs) == O::kAdmitted;
  EXPECT_EQ(admitted, 9);
  auto c = Counters(*p, kSecondUs);
  EXPECT_EQ(c["nvme.admission.admitted"], 25);
  EXPECT_EQ(c["nvme.admission.rejected_no_budget"], 4);
  EXPECT_EQ(c["nvme.admission.budget_bytes_per_day"], 864'000'000'000);
  EXPECT_EQ(c["nvme.admission.allowed_rate_bytes_per_s"], 10'000'000);
}

// Offers `bytes_per_s` of class `cls` every second of [from_s, to_s).
void Offer(AdmissionPolicy& p, C cls, uint64_t bytes_per_s, uint64_t from_s, uint64_t to_s) {
  for (uint64_t s = from_s; s < to_s; ++s) {
    for (uint64_t b = 0; b < bytes_per_s; b += kMiB) p.Decide(Candidate(cls), s * kSecondUs);
  }
}

TEST(AdmissionPolicyTest, DwpdCutoffNarrowsUnderDemandAndWidensWhenItFalls) {
  auto p = Dwpd(Drive());
  EXPECT_EQ(Counters(*p)["nvme.admission.cutoff_class"], int64_t(C::kReused));
  // Minute 0: the reused class alone asks for 3x r (30 MB/s vs 10).
  Offer(*p, C::kReused, 30 * kMiB, 0, 60);
  // At minute 1 the cutoff narrows to open-session tails: reused blocks are
  // now below it, tails still pass (budget permitting).
  EXPECT_EQ(p->Decide(Candidate(C::kReused), 60 * kSecondUs), O::kBelowCutoff);
  EXPECT_EQ(Counters(*p, 60 * kSecondUs)["nvme.admission.cutoff_class"], int64_t(C::kOpenSessionTail));
  EXPECT_EQ(p->Decide(Candidate(C::kOpenSessionTail), 61 * kSecondUs), O::kAdmitted);
  // Tails alone still ask for 2x: the next minute only shared blocks pass.
  Offer(*p, C::kOpenSessionTail, 20 * kMiB, 61, 120);
  EXPECT_EQ(p->Decide(Candidate(C::kOpenSessionTail), 120 * kSecondUs), O::kBelowCutoff);
  EXPECT_EQ(Counters(*p, 120 * kSecondUs)["nvme.admission.cutoff_class"], int64_t(C::kShared));
  // It never narrows past shared blocks, however much they ask for.
  Offer(*p, C::kShared, 30 * kMiB, 120, 240);
  EXPECT_EQ(Counters(*p, 240 * kSecondUs)["nvme.admission.cutoff_class"], int64_t(C::kShared));
  // Demand between 70% and 110% of r holds the cutoff where it is.
  Offer(*p, C::kShared, 9 * kMiB, 240, 300);  // 9.4 MB/s of 10
  p->Decide(Candidate(C::kShared), 300 * kSecondUs);
  EXPECT_EQ(Counters(*p, 300 * kSecondUs)["nvme.admission.cutoff_class"], int64_t(C::kShared));
  // Quiet minutes widen it one class per interval.
  p->Decide(Candidate(C::kShared), 360 * kSecondUs);
  EXPECT_EQ(Counters(*p, 360 * kSecondUs)["nvme.admission.cutoff_class"], int64_t(C::kOpenSessionTail));
  p->Decide(Candidate(C::kShared), 420 * kSecondUs);
  EXPECT_EQ(Counters(*p, 420 * kSecondUs)["nvme.admission.cutoff_class"], int64_t(C::kReused));
  p->Decide(Candidate(C::kShared), 480 * kSecondUs);  // and no further: first sightings never pass
  EXPECT_EQ(Counters(*p, 480 * kSecondUs)["nvme.admission.cutoff_class"], int64_t(C::kReused));
  EXPECT_EQ(p->Decide(Candidate(C::kFirstSighting), 481 * kSecondUs), O::kFirstSighting);
  EXPECT_GT(Counters(*p, 481 * kSecondUs)["nvme.admission.rejected_below_cutoff"], 0);
}

TEST(AdmissionPolicyTest, DwpdReportsTheDaysWritesAndDriveLife) {
  auto p = Dwpd(Drive());
  // Exactly R for an hour: projected life = the planned 5 years.
  p->OnDeviceWritten(10'000'000ull * 3600, 3600 * kSecondUs);
  auto c = Counters(*p, 3600 * kSecondUs);
  EXPECT_EQ(c["nvme.admission.written_today_bytes"], 36'000'000'000);
  EXPECT_NEAR(double(c["nvme.admission.projected_life_days"]), 5 * 365.0, 1.0);
}

// CatchUp charges only the reinsertion bytes not charged before, and
// reports the device total: a bucket of 16 MiB-blocks, 10 MiB of them
// reinserted (reported twice), leaves room for 6 admissions.
TEST(AdmissionPolicyTest, CatchUpChargesEachReinsertedByteOnce) {
  auto p = Dwpd(Drive(16 * kMiB));
  p->CatchUp(10 * kMiB, 10 * kMiB, 0);
  p->CatchUp(10 * kMiB, 10 * kMiB, 0);  // nothing new
  int admitted = 0;
  for (int i = 0; i < 10; ++i) admitted += p->Decide(Candidate(C::kShared), 0) == O::kAdmitted;
  EXPECT_EQ(admitted, 6);
  p->CatchUp(36'000'000'000ull, 10 * kMiB, 3600 * kSecondUs);
  EXPECT_EQ(Counters(*p, 3600 * kSecondUs)["nvme.admission.written_today_bytes"], 36'000'000'000);
}

// rate: second_hit's rules, then a token bucket of `rate` bytes/s that
// holds one second of it (one block, when a block is larger).
std::unique_ptr<AdmissionPolicy> Rate(uint64_t bytes_per_second) {
  auto p = MakeRatePolicy(bytes_per_second, 0);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return std::move(p).value();
}

TEST(AdmissionPolicyTest, RateRejectsAZeroCap) {
  auto p = MakeRatePolicy(0, 0);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
}

TEST(AdmissionPolicyTest, RateAdmitsOneSecondOfItsRateThenRefuses) {
  auto p = Rate(10 * kMiB);
  EXPECT_EQ(p->name(), "rate");
  for (int i = 0; i < 10; ++i) ASSERT_EQ(p->Decide(Candidate(C::kReused), 0), O::kAdmitted) << i;
  EXPECT_EQ(p->Decide(Candidate(C::kShared), 0), O::kNoBudget);
  EXPECT_EQ(p->Decide(Candidate(C::kShared, 1), 0), O::kNoBudget) << "not a byte left";
  auto c = Counters(*p);
  EXPECT_EQ(c["nvme.admission.admitted"], 10);
  EXPECT_EQ(c["nvme.admission.admitted_bytes"], int64_t(10 * kMiB));
  EXPECT_EQ(c["nvme.admission.rejected_no_budget"], 2);
  EXPECT_EQ(c["nvme.admission.rate_bytes_per_second"], int64_t(10 * kMiB));
}

TEST(AdmissionPolicyTest, RateRefillsWithTimeUpToOneSecond) {
  auto p = Rate(10 * kMiB);
  for (int i = 0; i < 10; ++i) ASSERT_EQ(p->Decide(Candidate(C::kReused), 0), O::kAdmitted) << i;
  // Half a second pays for half the rate.
  int admitted = 0;
  for (int i = 0; i < 8; ++i) admitted += p->Decide(Candidate(C::kReused), kSecondUs / 2) == O::kAdmitted;
  EXPECT_EQ(admitted, 5);
  // A long quiet spell fills the bucket to one second, no more.
  admitted = 0;
  for (int i = 0; i < 30; ++i) admitted += p->Decide(Candidate(C::kReused), 60 * kSecondUs) == O::kAdmitted;
  EXPECT_EQ(admitted, 10);
  // Time going backwards (callers' clocks) refills nothing.
  EXPECT_EQ(p->Decide(Candidate(C::kReused), 59 * kSecondUs), O::kNoBudget);
}

TEST(AdmissionPolicyTest, RateAppliesTheSecondHitRulesFirst) {
  auto p = Rate(2 * kMiB);
  EXPECT_EQ(p->Decide(Candidate(C::kFirstSighting), 0), O::kFirstSighting);
  EXPECT_EQ(p->Decide(Candidate(C::kClosedSession), 0), O::kClosedSession);
  EXPECT_EQ(p->Decide(Candidate(C::kShared, kMiB, /*parent_cached=*/false), 0), O::kParentMissing);
  // The refusals took nothing from the bucket.
  EXPECT_EQ(p->Decide(Candidate(C::kShared), 0), O::kAdmitted);
  EXPECT_EQ(p->Decide(Candidate(C::kOpenSessionTail), 0), O::kAdmitted);
  // With the bucket empty, an ineligible block is still refused for what it is.
  EXPECT_EQ(p->Decide(Candidate(C::kFirstSighting), 0), O::kFirstSighting);
  EXPECT_EQ(p->Decide(Candidate(C::kReused, kMiB, false), 0), O::kParentMissing);
  EXPECT_EQ(p->Decide(Candidate(C::kReused), 0), O::kNoBudget);
  auto c = Counters(*p);
  EXPECT_EQ(c["nvme.admission.rejected_first_sighting"], 2);
  EXPECT_EQ(c["nvme.admission.rejected_closed_session"], 1);
  EXPECT_EQ(c["nvme.admission.rejected_parent_missing"], 2);
  EXPECT_EQ(c["nvme.admission.rejected_no_budget"], 1);
  EXPECT_EQ(c["nvme.admission.admitted"], 2);
}

TEST(AdmissionPolicyTest, RateAdmitsABlockLargerThanOneSecondFromAFullBucketAndPaysItBack) {
  auto p = Rate(kMiB);
  const uint64_t big = 5 * kMiB / 2;  // 2.5 s of the rate
  // A full bucket (one second) admits any one block...
  EXPECT_EQ(p->Decide(Candidate(C::kShared, big), 0), O::kAdmitted);
  // ...and the debt (1.5 s) is paid back before anything else passes.
  EXPECT_EQ(p->Decide(Candidate(C::kShared, 1024), kSecondUs), O::kNoBudget);
  EXPECT_EQ(p->Decide(Candidate(C::kShared, 1024), 3 * kSecondUs / 2 + 1000), O::kAdmitted);
  // Waiting long refills one second, never more: one big block, then none.
  EXPECT_EQ(p->Decide(Candidate(C::kShared, big), 100 * kSecondUs), O::kAdmitted);
  EXPECT_EQ(p->Decide(Candidate(C::kShared, big), 100 * kSecondUs), O::kNoBudget);
  // Over 100 s the cap held: 2 big blocks + 1 KiB <= 100 s x 1 MiB/s + the first second.
  EXPECT_EQ(Counters(*p)["nvme.admission.admitted_bytes"], int64_t(2 * big + 1024));
}

TEST(AdmissionPolicyTest, RateForceDrawsOnTheSameBucket) {
  auto p = Rate(10 * kMiB);
  EXPECT_TRUE(p->Force(4 * kMiB, 0));
  EXPECT_TRUE(p->Force(4 * kMiB, 0));
  EXPECT_EQ(p->Decide(Candidate(C::kShared), 0), O::kAdmitted);
  EXPECT_EQ(p->Decide(Candidate(C::kShared), 0), O::kAdmitted);
  EXPECT_EQ(p->Decide(Candidate(C::kShared), 0), O::kNoBudget) << "forced writes spent the second";
  EXPECT_FALSE(p->Force(kMiB, 0)) << "and a forced write gets past no budget";
  EXPECT_TRUE(p->Force(kMiB, kSecondUs / 10));
  auto c = Counters(*p, kSecondUs / 10);
  EXPECT_EQ(c["nvme.admission.forced"], 3);
  EXPECT_EQ(c["nvme.admission.forced_refused"], 1);
  EXPECT_EQ(c["nvme.admission.admitted_bytes"], int64_t(11 * kMiB));
}

// The DWPD budget's refusals are a warning (`kvtier health`), named by the
// counter under the prefix it is given; a rate cap refusing writes is
// doing its job, and the other policies refuse for the block's class.
TEST(AdmissionPolicyTest, OnlyTheDwpdBudgetsRefusalsAreAWarning) {
  auto dwpd = Dwpd(Drive(16 * kMiB));
  HealthFindings fresh;
  dwpd->CheckHealth("nvme.admission", fresh);
  EXPECT_TRUE(fresh.warnings.empty());
  for (int i = 0; i < 16; ++i) ASSERT_EQ(dwpd->Decide(Candidate(C::kShared), 0), O::kAdmitted) << i;
  ASSERT_EQ(dwpd->Decide(Candidate(C::kShared), 0), O::kNoBudget);
  ASSERT_EQ(dwpd->Decide(Candidate(C::kShared), 0), O::kNoBudget);
  HealthFindings refused;
  dwpd->CheckHealth("nvme.admission", refused);
  EXPECT_TRUE(refused.problems.empty());
  EXPECT_EQ(refused.warnings,
            std::vector<std::string>{"the DWPD budget refused 2 writes to NVMe (nvme.admission.rejected_no_budget)"});

  auto rate = Rate(kMiB);
  ASSERT_EQ(rate->Decide(Candidate(C::kShared), 0), O::kAdmitted);
  ASSERT_EQ(rate->Decide(Candidate(C::kShared), 0), O::kNoBudget);
  auto second_hit = MakeSecondHitPolicy();
  ASSERT_EQ(second_hit->Decide(Candidate(C::kFirstSighting), 0), O::kFirstSighting);
  HealthFindings others;
  rate->CheckHealth("remote.admission", others);
  second_hit->CheckHealth("nvme.admission", others);
  EXPECT_TRUE(others.problems.empty());
  EXPECT_TRUE(others.warnings.empty());
}

}  // namespace
}  // namespace kvtier
