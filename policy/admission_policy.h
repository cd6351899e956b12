// Admission policies: whether a block leaving a faster tier may be written
// to a slower one (today: host -> NVMe). Pure and synchronous like the
// eviction policies; the engine and the replay tool drive the same classes.
//
//   all         admit everything (no endurance control)
//   second_hit  admit blocks with evidence of reuse (classes up to kReused)
//               whose parent is cached; no write budget
//   dwpd        second_hit's rules plus a DWPD write budget (dwpd_budget.h)
//               and a class cutoff that narrows when the eligible blocks ask
//               for more than the budget allows
//   rate        second_hit's rules plus a bytes/s cap (a token bucket
//               holding one second of it): the remote tier's, whose cost is
//               network and the shared store's memory, not wear
//
// Prefix closure: a block is worth storing only if its prefix can be found
// too, so second_hit and dwpd refuse a block whose parent is not cached.
// "Cached" (AdmissionCandidate::parent_cached) is the caller's call: the
// parent is on the target tier, in a faster one (it will be offered in its
// turn), or was admitted just before it. Eviction takes a chain's tail
// first, so requiring the parent on the target tier alone would admit only
// chain roots.
//
// Not thread-safe: the caller serializes.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string_view>

#include "common/counters.h"
#include "common/health_findings.h"
#include "kvtier/result.h"
#include "policy/dwpd_budget.h"

namespace kvtier {

// Why a block deserves a place, most deserving first. The engine derives it
// from what it knows of the block's use.
enum class AdmissionClass : uint8_t {
  kShared = 0,       // used by >= 2 requests or sessions, or pinned
  kOpenSessionTail,  // the tail of a session still open (its next turn will want it)
  kReused,           // seen twice, or hit while in DRAM
  kFirstSighting,    // written once, never read: never admitted by second_hit / dwpd
  kClosedSession,    // its session closed or expired: never admitted by second_hit / dwpd
};

// What the cache knows of a block's conversation (queue and session hints).
enum class ConversationState : uint8_t { kUnknown, kOpen, kClosed };

// The class of a block from its uses in the tier above (reads, not the
// writer's put) and its conversation:
//   2 or more uses          -> shared
//   else a closed one       -> closed session
//   else an open one        -> open-session tail
//   else 1 use              -> reused
//   else                    -> first sighting
// The daemon's engine (daemon/engine/tier_admission.h) and the replay
// (tools/replay/replay_sim.h) both classify with this.
AdmissionClass ClassifyBlock(uint64_t uses, ConversationState conversation);

enum class AdmissionOutcome : uint8_t {
  kAdmitted = 0,
  kFirstSighting,  // rejected: class kFirstSighting
  kClosedSession,  // rejected: class kClosedSession
  kBelowCutoff,    // rejected: class below the current cutoff (dwpd)
  kNoBudget,       // rejected: the write budget's bucket is short (dwpd, rate)
  kParentMissing,  // rejected: prefix closure
};
inline constexpr size_t kAdmissionOutcomes = 6;
// "admitted", "first_sighting", ... (counter names).
std::string_view AdmissionOutcomeName(AdmissionOutcome o);

struct AdmissionCandidate {
  uint64_t bytes = 0;  // what writing it costs the device (record with header)
  AdmissionClass cls = AdmissionClass::kFirstSighting;
  bool parent_cached = true;  // a chain root, or its parent is cached (see above)
};

class AdmissionPolicy {
 public:
  virtual ~AdmissionPolicy() = default;
  // Decides, and when admitting takes the bytes from the budget (if any).
  virtual AdmissionOutcome Decide(const AdmissionCandidate& c, uint64_t now_us) = 0;
  // The device's total bytes written since the tier opened, all causes
  // included (the budget's W); call at least once per update interval.
  virtual void OnDeviceWritten(uint64_t total_bytes, uint64_t now_us) {}
  // A write the tier makes without asking (reinsertion at reclaim): paid
  // from the budget, if any, so it counts against the same 24 h bound.
  virtual void Charge(uint64_t bytes, uint64_t now_us) {}
  // A write made whatever the block's class (a queued request needs it
  // soon): true, with its bytes taken from the budget, if the budget can
  // pay it; false (nothing taken) when it cannot, so no cause of writes
  // gets past the budget. Counted as forced / forced_refused.
  bool Force(uint64_t bytes, uint64_t now_us);
  // The tier's write totals, before each decision (the engine's
  // TierAdmission and the replay both call it): `device_bytes` written so
  // far, all causes (OnDeviceWritten), and `reinserted_bytes`, the part
  // reinsertion wrote, of which what was not charged yet is charged now.
  void CatchUp(uint64_t device_bytes, uint64_t reinserted_bytes, uint64_t now_us);
  // Counters under `prefix` (e.g. "nvme.admission"): decisions by outcome
  // and, for dwpd, the budget's state.
  virtual void VisitCounters(std::string_view prefix, CounterVisitor& v, uint64_t now_us) const;
  // Adds what an operator should know of the policy's decisions to `out`,
  // naming its counters under `prefix`: for dwpd, a warning once its
  // budget refused a write. The others add nothing.
  virtual void CheckHealth(std::string_view prefix, HealthFindings& out) const {}
  virtual std::string_view name() const = 0;

 protected:
  void Count(AdmissionOutcome o, uint64_t bytes);
  // The decisions counted with outcome `o` so far.
  int64_t decisions(AdmissionOutcome o) const { return decisions_[static_cast<size_t>(o)]; }
  // Force's budget: whether `bytes` can be paid now (and are taken).
  virtual bool TakeForced(uint64_t bytes, uint64_t now_us) { return true; }

 private:
  std::array<int64_t, kAdmissionOutcomes> decisions_{};
  int64_t admitted_bytes_ = 0;
  int64_t forced_ = 0, forced_refused_ = 0;
  uint64_t reinserted_charged_ = 0;
};

std::unique_ptr<AdmissionPolicy> MakeAdmitAllPolicy();
std::unique_ptr<AdmissionPolicy> MakeSecondHitPolicy();
// Admits nothing, forced or not (each refusal counted as kNoBudget: its
// budget is zero bytes): the gate of a tier that is only read.
std::unique_ptr<AdmissionPolicy> MakeAdmitNonePolicy();
// InvalidArgument for a zero cap. `now_us` is t0.
Result<std::unique_ptr<AdmissionPolicy>> MakeRatePolicy(uint64_t bytes_per_second, uint64_t now_us);
// InvalidArgument when the options do not validate. `now_us` is t0.
Result<std::unique_ptr<AdmissionPolicy>> MakeDwpdPolicy(const DwpdOptions& options, uint64_t now_us);

}  // namespace kvtier
