// TierAdmission: the engine's gate in front of one tier of its stack (the
// NVMe tier's DWPD budget, for one). It runs the configured admission
// policy (policy/admission_policy.h) on each block evicted from the tier
// above, with the block's class derived from what the engine knows,
// and keeps the policy's view of the device current: before each decision
// it reports the tier's device bytes written (the DWPD budget's W) and
// charges what reinsertion wrote since the last one.
//
// Class (ClassOf: policy/admission_policy.h's ClassifyBlock, which the
// replay runs too), from what the engine knows of the block: its uses in
// the host tier (Pin grants and directory reads, the writer's Put not
// included) and its conversation from queue hints (daemon/engine/lineage.h).
// Prefix closure: the engine says whether the block's parent (from the
// chain a queued request named) is held anywhere: in DRAM, being demoted,
// or in any tier below. A block with no known parent counts as a root.
//
// Thread-safe (one mutex around the policy).
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "common/clock.h"
#include "common/counters.h"
#include "common/health_findings.h"
#include "common/mutex.h"
#include "daemon/engine/lineage.h"
#include "kvtier/result.h"
#include "policy/admission_policy.h"
#include "policy/policy_registry.h"

namespace kvtier {

class BlockTier;

class TierAdmission {
 public:
  // Policy `id` (kDwpd needs dwpd to validate, kRate a positive
  // `rate_bytes_per_second`). `tier` and `clock` are borrowed.
  // InvalidArgument naming the problem.
  static Result<std::unique_ptr<TierAdmission>> Create(AdmissionPolicyId id, const DwpdOptions& dwpd,
                                                       uint64_t rate_bytes_per_second, const BlockTier& tier,
                                                       const Clock& clock);

  // What the engine knows of an evicted block.
  struct Facts {
    uint64_t uses = 0;
    Lineage::State conversation = Lineage::State::kUnknown;
    bool parent_held = true;
  };
  static AdmissionClass ClassOf(const Facts& facts);
  // Whether a block of `payload_bytes` may be written to the tier (what it
  // costs there: BlockTier::StoredBytes); an
  // admitted block's record bytes are taken from the budget.
  bool Admit(uint64_t payload_bytes, const Facts& facts);
  // A write made whatever the class (a block a queued request needs soon):
  // true, with its bytes taken from the budget, when the budget (if any)
  // can pay it; false when it cannot (the block then goes through Admit
  // like any other, which refuses it for the same reason).
  bool Force(uint64_t payload_bytes);
  // <tier name>.admission.*: the policy's counters.
  void VisitCounters(CounterVisitor& v) const;
  // The policy's health (AdmissionPolicy::CheckHealth) under the same
  // names: a DWPD budget's refusals are a warning.
  void CheckHealth(HealthFindings& out) const;

 private:
  TierAdmission(std::unique_ptr<AdmissionPolicy> policy, const BlockTier& tier, const Clock& clock);
  // Reports the tier's device bytes and charges new reinsertion bytes.
  // Caller holds mu_ (the tier's own lock is taken inside, briefly: it is
  // a leaf).
  void CatchUp(uint64_t now_us) REQUIRES(mu_);

  const BlockTier& tier_;
  const Clock& clock_;
  mutable Mutex mu_;
  std::unique_ptr<AdmissionPolicy> policy_ GUARDED_BY(mu_);
};

}  // namespace kvtier
