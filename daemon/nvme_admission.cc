#include "daemon/nvme_admission.h"

#include "tiers/nvme/block_record.h"
#include "tiers/nvme/nvme_tier.h"

namespace kvtier {

Result<std::unique_ptr<NvmeAdmission>> NvmeAdmission::Create(const std::string& name, const DwpdOptions& dwpd,
                                                              const NvmeTier& tier, const Clock& clock) {
  std::unique_ptr<AdmissionPolicy> policy;
  if (name == "all") {
    policy = MakeAdmitAllPolicy();
  } else if (name == "second_hit") {
    policy = MakeSecondHitPolicy();
  } else if (name == "dwpd") {
    auto made = MakeDwpdPolicy(dwpd, clock.NowUs());
    if (!made.ok()) return made.status();
    policy = std::move(made).value();
  } else {
    return InvalidArgument("unknown nvme admission policy '" + name + "' (all, second_hit, dwpd)");
  }
  return std::unique_ptr<NvmeAdmission>(new NvmeAdmission(std::move(policy), tier, clock));
}

NvmeAdmission::NvmeAdmission(std::unique_ptr<AdmissionPolicy> policy, const NvmeTier& tier, const Clock& clock)
    : tier_(tier), clock_(clock), policy_(std::move(policy)) {}

AdmissionClass NvmeAdmission::ClassOf(const Facts& facts) {
  if (facts.uses >= 2) return AdmissionClass::kShared;
  if (facts.conversation == Lineage::State::kClosed) return AdmissionClass::kClosedSession;
  if (facts.conversation == Lineage::State::kOpen) return AdmissionClass::kOpenSessionTail;
  if (facts.uses == 1) return AdmissionClass::kReused;
  return AdmissionClass::kFirstSighting;
}

void NvmeAdmission::CatchUp(uint64_t now_us) {
  const NvmeTier::WriteTotals totals = tier_.write_totals();
  if (totals.reinserted_bytes > reinserted_charged_) {
    policy_->Charge(totals.reinserted_bytes - reinserted_charged_, now_us);
    reinserted_charged_ = totals.reinserted_bytes;
  }
  policy_->OnDeviceWritten(totals.device_bytes, now_us);
}

bool NvmeAdmission::Admit(uint64_t payload_bytes, const Facts& facts) {
  const uint64_t now = clock_.NowUs();
  AdmissionCandidate candidate;
  candidate.bytes = RecordBytes(payload_bytes, tier_.device().alignment_bytes());
  candidate.cls = ClassOf(facts);
  candidate.parent_cached = facts.parent_held;
  std::lock_guard lock(mu_);
  CatchUp(now);
  return policy_->Decide(candidate, now) == AdmissionOutcome::kAdmitted;
}

void NvmeAdmission::Force(uint64_t payload_bytes) {
  const uint64_t now = clock_.NowUs();
  std::lock_guard lock(mu_);
  CatchUp(now);
  policy_->Charge(RecordBytes(payload_bytes, tier_.device().alignment_bytes()), now);
}

void NvmeAdmission::VisitCounters(CounterVisitor& v) const {
  std::lock_guard lock(mu_);
  policy_->VisitCounters("nvme.admission", v, clock_.NowUs());
}

}  // namespace kvtier
