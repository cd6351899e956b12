#include "policy/admission_policy.h"

#include <algorithm>
#include <string>

namespace kvtier {

AdmissionClass ClassifyBlock(uint64_t uses, ConversationState conversation) {
  if (uses >= 2) return AdmissionClass::kShared;
  if (conversation == ConversationState::kClosed) return AdmissionClass::kClosedSession;
  if (conversation == ConversationState::kOpen) return AdmissionClass::kOpenSessionTail;
  if (uses == 1) return AdmissionClass::kReused;
  return AdmissionClass::kFirstSighting;
}

std::string_view AdmissionOutcomeName(AdmissionOutcome o) {
  switch (o) {
    case AdmissionOutcome::kAdmitted:
      return "admitted";
    case AdmissionOutcome::kFirstSighting:
      return "first_sighting";
    case AdmissionOutcome::kClosedSession:
      return "closed_session";
    case AdmissionOutcome::kBelowCutoff:
      return "below_cutoff";
    case AdmissionOutcome::kNoBudget:
      return "no_budget";
    case AdmissionOutcome::kParentMissing:
      return "parent_missing";
  }
  return "unknown";
}

void AdmissionPolicy::Count(AdmissionOutcome o, uint64_t bytes) {
  ++decisions_[static_cast<size_t>(o)];
  if (o == AdmissionOutcome::kAdmitted) admitted_bytes_ += static_cast<int64_t>(bytes);
}

void AdmissionPolicy::CatchUp(uint64_t device_bytes, uint64_t reinserted_bytes, uint64_t now_us) {
  if (reinserted_bytes > reinserted_charged_) {
    Charge(reinserted_bytes - reinserted_charged_, now_us);
    reinserted_charged_ = reinserted_bytes;
  }
  OnDeviceWritten(device_bytes, now_us);
}

bool AdmissionPolicy::Force(uint64_t bytes, uint64_t now_us) {
  const bool paid = TakeForced(bytes, now_us);
  ++(paid ? forced_ : forced_refused_);
  if (paid) admitted_bytes_ += static_cast<int64_t>(bytes);
  return paid;
}

void AdmissionPolicy::VisitCounters(std::string_view prefix, CounterVisitor& v, uint64_t) const {
  const std::string p(prefix);
  for (size_t i = 0; i < kAdmissionOutcomes; ++i) {
    const auto o = static_cast<AdmissionOutcome>(i);
    const std::string_view what = AdmissionOutcomeName(o);
    v.Visit(o == AdmissionOutcome::kAdmitted ? p + ".admitted" : p + ".rejected_" + std::string(what), decisions_[i]);
  }
  // The same decisions as one family across tiers, labelled by tier (the
  // prefix's first component) and by the class refused.
  const std::string tier(prefix.substr(0, prefix.find('.')));
  for (size_t i = 1; i < kAdmissionOutcomes; ++i) {
    v.Visit("admission.refusals{tier=\"" + tier + "\",class=\"" +
                std::string(AdmissionOutcomeName(static_cast<AdmissionOutcome>(i))) + "\"}",
            decisions_[i]);
  }
  v.Visit(p + ".admitted_bytes", admitted_bytes_);
  v.Visit(p + ".forced", forced_);
  v.Visit(p + ".forced_refused", forced_refused_);
}

namespace {

class AdmitAllPolicy final : public AdmissionPolicy {
 public:
  AdmissionOutcome Decide(const AdmissionCandidate& c, uint64_t) override {
    Count(AdmissionOutcome::kAdmitted, c.bytes);
    return AdmissionOutcome::kAdmitted;
  }
  std::string_view name() const override { return "all"; }
};

class AdmitNonePolicy final : public AdmissionPolicy {
 public:
  AdmissionOutcome Decide(const AdmissionCandidate& c, uint64_t) override {
    Count(AdmissionOutcome::kNoBudget, c.bytes);
    return AdmissionOutcome::kNoBudget;
  }
  std::string_view name() const override { return "none"; }

 protected:
  bool TakeForced(uint64_t, uint64_t) override { return false; }
};

// The rules every selective policy shares: the classes never admitted and
// prefix closure. kAdmitted means "eligible".
AdmissionOutcome Eligibility(const AdmissionCandidate& c) {
  if (c.cls == AdmissionClass::kFirstSighting) return AdmissionOutcome::kFirstSighting;
  if (c.cls == AdmissionClass::kClosedSession) return AdmissionOutcome::kClosedSession;
  if (!c.parent_cached) return AdmissionOutcome::kParentMissing;
  return AdmissionOutcome::kAdmitted;
}

class SecondHitPolicy final : public AdmissionPolicy {
 public:
  AdmissionOutcome Decide(const AdmissionCandidate& c, uint64_t) override {
    const AdmissionOutcome o = Eligibility(c);
    Count(o, c.bytes);
    return o;
  }
  std::string_view name() const override { return "second_hit"; }
};

// Eligibility, then the class cutoff, then the budget. Every update
// interval the cutoff compares what the admissible classes asked for with
// r(t): above 110% it narrows by one class (never past kShared), below 70%
// it widens by one (never past kReused).
class DwpdPolicy final : public AdmissionPolicy {
 public:
  DwpdPolicy(const DwpdOptions& o, uint64_t now_us)
      : interval_us_(o.update_interval_us), window_start_us_(now_us), dwpd_(o, now_us) {}

  AdmissionOutcome Decide(const AdmissionCandidate& c, uint64_t now_us) override {
    Roll(now_us);
    AdmissionOutcome o = Eligibility(c);
    if (o == AdmissionOutcome::kAdmitted && c.cls > cutoff_) o = AdmissionOutcome::kBelowCutoff;
    if (o == AdmissionOutcome::kAdmitted) {
      demand_bytes_ += c.bytes;
      if (!dwpd_.TryTake(c.bytes, now_us)) o = AdmissionOutcome::kNoBudget;
    }
    Count(o, c.bytes);
    return o;
  }

  void OnDeviceWritten(uint64_t total_bytes, uint64_t now_us) override {
    Roll(now_us);
    dwpd_.OnDeviceWritten(total_bytes, now_us);
  }

  void Charge(uint64_t bytes, uint64_t now_us) override {
    Roll(now_us);
    dwpd_.Charge(bytes, now_us);
    charged_bytes_ += static_cast<int64_t>(bytes);
  }

 protected:
  bool TakeForced(uint64_t bytes, uint64_t now_us) override {
    Roll(now_us);
    return dwpd_.TryTake(bytes, now_us);
  }

 public:
  void VisitCounters(std::string_view prefix, CounterVisitor& v, uint64_t now_us) const override {
    AdmissionPolicy::VisitCounters(prefix, v, now_us);
    const std::string p(prefix);
    v.VisitGauge(p + ".cutoff_class", static_cast<int64_t>(cutoff_));
    v.Visit(p + ".charged_bytes", charged_bytes_);
    v.VisitGauge(p + ".budget_bytes_per_day", static_cast<int64_t>(dwpd_.budget_bytes_per_day()));
    v.VisitGauge(p + ".written_today_bytes", static_cast<int64_t>(dwpd_.written_today(now_us)));
    v.VisitGauge(p + ".allowed_rate_bytes_per_s", static_cast<int64_t>(dwpd_.allowed_rate()));
    v.VisitGauge(p + ".projected_life_days", static_cast<int64_t>(dwpd_.projected_life_years(now_us) * 365.0));
  }

  // The budget's refusals: the drive's write budget, not the blocks, kept
  // them off NVMe.
  void CheckHealth(std::string_view prefix, HealthFindings& out) const override {
    const int64_t refused = decisions(AdmissionOutcome::kNoBudget);
    if (refused == 0) return;
    out.AddWarning("the DWPD budget refused " + std::to_string(refused) + " writes to NVMe (" + std::string(prefix) +
                   ".rejected_no_budget)");
  }

  std::string_view name() const override { return "dwpd"; }

 private:
  void Roll(uint64_t now_us) {
    if (now_us < window_start_us_ + interval_us_) return;
    const double seconds = double(now_us - window_start_us_) / 1e6;
    const double asked = double(demand_bytes_) / seconds;
    const double allowed = dwpd_.allowed_rate();
    if (asked > 1.1 * allowed && cutoff_ > AdmissionClass::kShared) {
      cutoff_ = static_cast<AdmissionClass>(static_cast<uint8_t>(cutoff_) - 1);
    } else if (asked < 0.7 * allowed && cutoff_ < AdmissionClass::kReused) {
      cutoff_ = static_cast<AdmissionClass>(static_cast<uint8_t>(cutoff_) + 1);
    }
    demand_bytes_ = 0;
    window_start_us_ = now_us;
  }

  uint64_t interval_us_;
  uint64_t window_start_us_;
  uint64_t demand_bytes_ = 0;
  int64_t charged_bytes_ = 0;
  AdmissionClass cutoff_ = AdmissionClass::kReused;
  DwpdBudget dwpd_;
};

// second_hit's eligibility, then a token bucket of `rate` bytes/s holding
// at most one second of it. A block larger than one second is admitted
// when the bucket is full and leaves it in debt, paid back by refill before
// anything else passes: the cap holds over time whatever the block sizes.
class RatePolicy final : public AdmissionPolicy {
 public:
  RatePolicy(uint64_t bytes_per_second, uint64_t now_us) : rate_(bytes_per_second), last_us_(now_us) {
    tokens_ = static_cast<double>(rate_);
  }
  AdmissionOutcome Decide(const AdmissionCandidate& c, uint64_t now_us) override {
    AdmissionOutcome o = Eligibility(c);
    if (o == AdmissionOutcome::kAdmitted && !Take(c.bytes, now_us)) o = AdmissionOutcome::kNoBudget;
    Count(o, c.bytes);
    return o;
  }
  void VisitCounters(std::string_view prefix, CounterVisitor& v, uint64_t now_us) const override {
    AdmissionPolicy::VisitCounters(prefix, v, now_us);
    v.VisitGauge(std::string(prefix) + ".rate_bytes_per_second", static_cast<int64_t>(rate_));
  }
  std::string_view name() const override { return "rate"; }

 protected:
  bool TakeForced(uint64_t bytes, uint64_t now_us) override { return Take(bytes, now_us); }

 private:
  bool Take(uint64_t bytes, uint64_t now_us) {
    const double cap = static_cast<double>(rate_);
    if (now_us > last_us_) {
      tokens_ = std::min(cap, tokens_ + cap * static_cast<double>(now_us - last_us_) / 1e6);
      last_us_ = now_us;
    }
    if (tokens_ < std::min(cap, static_cast<double>(bytes))) return false;
    tokens_ -= static_cast<double>(bytes);  // below 0 only for a block larger than the cap
    return true;
  }

  const uint64_t rate_;
  uint64_t last_us_;
  double tokens_;
};

}  // namespace

Result<std::unique_ptr<AdmissionPolicy>> MakeRatePolicy(uint64_t bytes_per_second, uint64_t now_us) {
  if (bytes_per_second == 0) return InvalidArgument("rate admission needs a positive bytes/s cap");
  return std::unique_ptr<AdmissionPolicy>(std::make_unique<RatePolicy>(bytes_per_second, now_us));
}

std::unique_ptr<AdmissionPolicy> MakeAdmitAllPolicy() { return std::make_unique<AdmitAllPolicy>(); }
std::unique_ptr<AdmissionPolicy> MakeSecondHitPolicy() { return std::make_unique<SecondHitPolicy>(); }
std::unique_ptr<AdmissionPolicy> MakeAdmitNonePolicy() { return std::make_unique<AdmitNonePolicy>(); }

Result<std::unique_ptr<AdmissionPolicy>> MakeDwpdPolicy(const DwpdOptions& options, uint64_t now_us) {
  if (Status s = ValidateDwpdOptions(options); !s.ok()) return s;
  return std::unique_ptr<AdmissionPolicy>(std::make_unique<DwpdPolicy>(options, now_us));
}

}  // namespace kvtier
