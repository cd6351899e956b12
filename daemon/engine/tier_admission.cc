#include "daemon/engine/tier_admission.h"

#include "policy/policy_registry.h"
#include "tiers/tier.h"

namespace kvtier {

Result<std::unique_ptr<TierAdmission>> TierAdmission::Create(AdmissionPolicyId id, const DwpdOptions& dwpd,
                                                             uint64_t rate_bytes_per_second, const BlockTier& tier,
                                                             const Clock& clock) {
  // Any admission may guard any level of the engine's stack; which ones an
  // operator may name per tier is the config's business.
  Result<std::unique_ptr<AdmissionPolicy>> policy =
      MakeAdmissionPolicy(id, AdmissionParams{dwpd, rate_bytes_per_second}, clock.NowUs());
  if (!policy.ok()) return policy.status();
  return std::unique_ptr<TierAdmission>(new TierAdmission(std::move(policy).value(), tier, clock));
}

TierAdmission::TierAdmission(std::unique_ptr<AdmissionPolicy> policy, const BlockTier& tier, const Clock& clock)
    : tier_(tier), clock_(clock), policy_(std::move(policy)) {}

AdmissionClass TierAdmission::ClassOf(const Facts& facts) { return ClassifyBlock(facts.uses, facts.conversation); }

void TierAdmission::CatchUp(uint64_t now_us) {
  const BlockTier::WriteTotals totals = tier_.write_totals();
  policy_->CatchUp(totals.device_bytes, totals.reinserted_bytes, now_us);
}

bool TierAdmission::Admit(uint64_t payload_bytes, const Facts& facts) {
  const uint64_t now = clock_.NowUs();
  AdmissionCandidate candidate;
  candidate.bytes = tier_.StoredBytes(payload_bytes);
  candidate.cls = ClassOf(facts);
  candidate.parent_cached = facts.parent_held;
  MutexLock lock(mu_);
  CatchUp(now);
  return policy_->Decide(candidate, now) == AdmissionOutcome::kAdmitted;
}

bool TierAdmission::Force(uint64_t payload_bytes) {
  const uint64_t now = clock_.NowUs();
  MutexLock lock(mu_);
  CatchUp(now);
  return policy_->Force(tier_.StoredBytes(payload_bytes), now);
}

void TierAdmission::VisitCounters(CounterVisitor& v) const {
  MutexLock lock(mu_);
  policy_->VisitCounters(std::string(tier_.name()) + ".admission", v, clock_.NowUs());
}

void TierAdmission::CheckHealth(HealthFindings& out) const {
  MutexLock lock(mu_);
  policy_->CheckHealth(std::string(tier_.name()) + ".admission", out);
}

}  // namespace kvtier
