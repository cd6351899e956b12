// The policies chosen by name (kvtierd's engine.eviction, nvme.eviction,
// nvme.admission and remote.admission, `kvtier replay`, `kvtier bench
// policy`): one closed table each, in code. Every place that lists, checks
// or builds a policy by name goes through here; adding a policy is one row
// (and its factory case). Pure, no state: callable from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "kvtier/result.h"
#include "policy/admission_policy.h"
#include "policy/dwpd_budget.h"
#include "policy/eviction_policy.h"

namespace kvtier {

enum class EvictionPolicyId : uint8_t { kLru, kFifo, kLru2, kS3Fifo, kArc, kQueueAware };

struct EvictionPolicyEntry {
  EvictionPolicyId id;
  std::string_view name;         // as written in configs and flags
  std::string_view description;  // one line, for help texts
};

// Every eviction policy, in the order help texts list them.
inline constexpr EvictionPolicyEntry kEvictionPolicies[] = {
    {EvictionPolicyId::kLru, "lru", "least recently used"},
    {EvictionPolicyId::kFifo, "fifo", "first in, first out"},
    {EvictionPolicyId::kLru2, "lru2", "LRU-2: blocks used once go first"},
    {EvictionPolicyId::kS3Fifo, "s3fifo", "S3-FIFO: a small probation queue, a main queue and ghosts"},
    {EvictionPolicyId::kArc, "arc", "ARC: recency and frequency lists adapted by ghost hits"},
    {EvictionPolicyId::kQueueAware, "queue_aware",
     "closed conversations first, then the best of lru/lru2/arc lately; queued requests' blocks last"},
};

enum class AdmissionPolicyId : uint8_t { kAll, kSecondHit, kDwpd, kRate, kNone };

// Which tier an admission policy may guard (a bit set).
// kAdmissionForReadOnly: a tier only read from (the peer tier), which no
// configuration option names.
enum AdmissionUse : uint8_t { kAdmissionForNvme = 1, kAdmissionForRemote = 2, kAdmissionForReadOnly = 4 };

struct AdmissionPolicyEntry {
  AdmissionPolicyId id;
  std::string_view name;
  std::string_view description;
  uint8_t uses;  // AdmissionUse bits: where the daemon and the replay accept it
};

// Every admission policy (admission_policy.h describes them).
inline constexpr AdmissionPolicyEntry kAdmissionPolicies[] = {
    {AdmissionPolicyId::kAll, "all", "admit every block", kAdmissionForNvme | kAdmissionForRemote},
    {AdmissionPolicyId::kSecondHit, "second_hit", "blocks with evidence of reuse whose parent is cached",
     kAdmissionForNvme | kAdmissionForRemote},
    {AdmissionPolicyId::kDwpd, "dwpd", "second_hit's rules within the drive's DWPD write budget", kAdmissionForNvme},
    {AdmissionPolicyId::kRate, "rate", "second_hit's rules within a bytes/s cap", kAdmissionForRemote},
    {AdmissionPolicyId::kNone, "none", "admit nothing, forced or not: a tier that is only read", kAdmissionForReadOnly},
};

namespace registry_internal {

// The names of `table`'s rows (those whose uses include `use`, when the
// rows have uses), joined by '|', as a constant.
template <const auto& table, uint8_t use = 0xff>
constexpr auto JoinNames() {
  constexpr size_t size = [] {
    size_t n = 0;
    for (const auto& row : table) {
      if constexpr (requires { row.uses; }) {
        if ((row.uses & use) == 0) continue;
      }
      n += row.name.size() + (n == 0 ? 0 : 1);
    }
    return n;
  }();
  std::array<char, size> out{};
  size_t at = 0;
  for (const auto& row : table) {
    if constexpr (requires { row.uses; }) {
      if ((row.uses & use) == 0) continue;
    }
    if (at != 0) out[at++] = '|';
    for (char c : row.name) out[at++] = c;
  }
  return out;
}

template <const auto& table, uint8_t use = 0xff>
inline constexpr auto kJoined = JoinNames<table, use>();

}  // namespace registry_internal

// "lru|fifo|lru2|s3fifo|arc|queue_aware": the eviction policies' names.
inline constexpr std::string_view kEvictionPolicyChoices(registry_internal::kJoined<kEvictionPolicies>.data(),
                                                         registry_internal::kJoined<kEvictionPolicies>.size());
// "all|second_hit|dwpd": nvme.admission's names.
inline constexpr std::string_view kNvmeAdmissionChoices(
    registry_internal::kJoined<kAdmissionPolicies, kAdmissionForNvme>.data(),
    registry_internal::kJoined<kAdmissionPolicies, kAdmissionForNvme>.size());
// "all|second_hit|rate": remote.admission's names.
inline constexpr std::string_view kRemoteAdmissionChoices(
    registry_internal::kJoined<kAdmissionPolicies, kAdmissionForRemote>.data(),
    registry_internal::kJoined<kAdmissionPolicies, kAdmissionForRemote>.size());

// The id of eviction policy `name`; InvalidArgument "unknown eviction policy
// 'x' (lru, fifo, ...)" listing every name otherwise.
Result<EvictionPolicyId> ParseEvictionPolicy(std::string_view name);
std::string_view EvictionPolicyName(EvictionPolicyId id);
// A new instance of policy `id` (never null); the caller owns it.
std::unique_ptr<EvictionPolicy> MakeEvictionPolicy(EvictionPolicyId id);

// The id of admission policy `name` among those whose uses include `use`
// (AdmissionUse bits); InvalidArgument "unknown admission policy 'x'
// (all, second_hit, ...)" listing those names otherwise.
Result<AdmissionPolicyId> ParseAdmissionPolicy(std::string_view name, uint8_t use);
std::string_view AdmissionPolicyName(AdmissionPolicyId id);

// What the admission policies with a budget need.
struct AdmissionParams {
  DwpdOptions dwpd;                    // dwpd: must validate
  uint64_t rate_bytes_per_second = 0;  // rate: must be positive
};
// A new instance of policy `id` (the caller owns it), its budget starting
// at `now_us`; InvalidArgument when dwpd's options do not validate or
// rate's cap is zero.
Result<std::unique_ptr<AdmissionPolicy>> MakeAdmissionPolicy(AdmissionPolicyId id, const AdmissionParams& params,
                                                             uint64_t now_us);

// `choices` ("a|b|c") as "a, b, c" (for messages).
std::string ListChoices(std::string_view choices);

}  // namespace kvtier
