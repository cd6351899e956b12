#include "policy/policy_registry.h"

#include "common/check.h"
#include "policy/queue_aware_policy.h"

namespace kvtier {

std::string ListChoices(std::string_view choices) {
  std::string out;
  for (char c : choices) {
    if (c == '|') {
      out += ", ";
    } else {
      out += c;
    }
  }
  return out;
}

Result<EvictionPolicyId> ParseEvictionPolicy(std::string_view name) {
  for (const auto& row : kEvictionPolicies) {
    if (row.name == name) return row.id;
  }
  return InvalidArgument("unknown eviction policy '" + std::string(name) + "' (" + ListChoices(kEvictionPolicyChoices) +
                         ")");
}

std::string_view EvictionPolicyName(EvictionPolicyId id) {
  for (const auto& row : kEvictionPolicies) {
    if (row.id == id) return row.name;
  }
  KVTIER_CHECK(false, "an id outside the registry");
  return "";
}

std::unique_ptr<EvictionPolicy> MakeEvictionPolicy(EvictionPolicyId id) {
  switch (id) {
    case EvictionPolicyId::kLru:
      return MakeLruPolicy();
    case EvictionPolicyId::kFifo:
      return MakeFifoPolicy();
    case EvictionPolicyId::kLru2:
      return MakeLru2Policy();
    case EvictionPolicyId::kS3Fifo:
      return MakeS3FifoPolicy();
    case EvictionPolicyId::kArc:
      return MakeArcPolicy();
    case EvictionPolicyId::kQueueAware:
      return MakeQueueAwarePolicy();
  }
  KVTIER_CHECK(false, "an id outside the registry");
  return nullptr;
}

std::unique_ptr<EvictionPolicy> MakeEvictionPolicy(std::string_view name) {
  auto id = ParseEvictionPolicy(name);
  if (!id.ok()) return nullptr;
  return MakeEvictionPolicy(*id);
}

Result<AdmissionPolicyId> ParseAdmissionPolicy(std::string_view name, uint8_t use) {
  std::string names;
  for (const auto& row : kAdmissionPolicies) {
    if ((row.uses & use) == 0) continue;
    if (row.name == name) return row.id;
    names += (names.empty() ? "" : ", ") + std::string(row.name);
  }
  return InvalidArgument("unknown admission policy '" + std::string(name) + "' (" + names + ")");
}

std::string_view AdmissionPolicyName(AdmissionPolicyId id) {
  for (const auto& row : kAdmissionPolicies) {
    if (row.id == id) return row.name;
  }
  KVTIER_CHECK(false, "an id outside the registry");
  return "";
}

Result<std::unique_ptr<AdmissionPolicy>> MakeAdmissionPolicy(AdmissionPolicyId id, const AdmissionParams& params,
                                                             uint64_t now_us) {
  switch (id) {
    case AdmissionPolicyId::kAll:
      return MakeAdmitAllPolicy();
    case AdmissionPolicyId::kSecondHit:
      return MakeSecondHitPolicy();
    case AdmissionPolicyId::kDwpd:
      return MakeDwpdPolicy(params.dwpd, now_us);
    case AdmissionPolicyId::kRate:
      return MakeRatePolicy(params.rate_bytes_per_second, now_us);
    case AdmissionPolicyId::kNone:
      return MakeAdmitNonePolicy();
  }
  KVTIER_CHECK(false, "an id outside the registry");
  return InvalidArgument("unknown admission policy");
}

}  // namespace kvtier
