// DwpdBudget: how many bytes the NVMe tier may write, so that kvtier stays
// inside its share of the drive's endurance (docs/POLICIES.md).
//
//   R    = share * capacity * DWPD * warranty_years / planned_years / 86400
//          bytes/s: the daily rate the drive can take for the planned years.
//   r(t) = clamp((R * (t - t0 + 86400) - W(t)) / 86400, 0, R_max), where
//          W(t) is what the device wrote since t0 (headers, padding and
//          reinsertions included), or what the bucket granted and charged
//          if that is more (a granted write may still wait in a queue, so
//          the device has not reported it), recomputed every update
//          interval.
//   A token bucket of `bucket_bytes` is refilled at r(t); an admitted write
//   takes its bytes out of it or is refused (TryTake). Writes the device
//   must do anyway (reinsertion at reclaim) are charged (Charge), which may
//   leave the bucket in debt until refills repay it.
//
// At t0 the allowance A = R * 86400 - W is one day's budget, so r starts
// at R. When every device byte is taken or charged, A never shrinks under a
// load that always wants more than r (A' = R - r >= 0 while A <= R * 86400),
// so every 24 h window writes at most R * 86400 plus one bucket depth
// (tests/unit/dwpd_budget_test.cc checks this with a fake clock). Bytes
// written behind the bucket's back (padding it was not told of) lower r(t)
// instead: the average converges back to R within a few days, but a 24 h
// window may overshoot by what was not charged. Idle time accrues
// allowance, spent later no faster than R_max.
//
// Pure and synchronous: time is passed in (microseconds on any monotonic
// clock), no I/O. Not thread-safe: the caller serializes.
#pragma once

#include <cstdint>

#include "kvtier/result.h"
#include "policy/option_defaults.h"

namespace kvtier {

struct DwpdOptions {
  uint64_t drive_capacity_bytes = 0;                     // required: the drive's (not the tier's) capacity
  double dwpd = defaults::kDwpd;                         // rated drive writes per day
  double warranty_years = defaults::kDwpdWarrantyYears;  // the years the DWPD rating covers
  double planned_years = defaults::kDwpdPlannedYears;    // the years the operator wants the drive to last
  double share = defaults::kDwpdShare;                   // the part of the drive's writes kvtier may use, (0, 1]
  // R_max in bytes/s; 0: 2 * R (catching up after idle time at most twice
  // the daily rate).
  double max_write_rate = 0;
  // Token bucket depth; 0: one update interval of R, at least 64 MiB (so
  // one large block always fits). A block larger than this is refused.
  uint64_t bucket_bytes = 0;
  uint64_t update_interval_us = 60'000'000;  // how often r(t) is recomputed
};

// InvalidArgument naming the option when `o` cannot describe a budget.
Status ValidateDwpdOptions(const DwpdOptions& o);

// The bytes a day `o` allows kvtier to write (R * 86400: the drive's
// capacity x DWPD x share, scaled by warranty / planned years). `o` must
// validate.
double DwpdBytesPerDay(const DwpdOptions& o);

class DwpdBudget {
 public:
  static constexpr uint64_t kDayUs = 86'400'000'000;

  // `o` must validate. `start_us` is t0: the bucket starts full.
  DwpdBudget(const DwpdOptions& o, uint64_t start_us);

  // Records W: the bytes the device has written since t0, all causes
  // (monotonic; a smaller value is ignored). Recomputes r(t) when an update
  // interval has passed since the last recomputation.
  void OnDeviceWritten(uint64_t total_bytes, uint64_t now_us);
  // Takes `bytes` from the bucket (refilled to `now_us` first); false
  // leaves it untouched.
  bool TryTake(uint64_t bytes, uint64_t now_us);
  // Takes `bytes` whatever the bucket holds (it may go into debt, which
  // holds TryTake off until refills repay it).
  void Charge(uint64_t bytes, uint64_t now_us);

  double daily_rate() const { return daily_rate_; }      // R, bytes/s
  double allowed_rate() const { return allowed_rate_; }  // r(t) since the last update, bytes/s
  double max_rate() const { return max_rate_; }          // R_max, bytes/s
  uint64_t bucket_bytes() const { return bucket_bytes_; }
  uint64_t budget_bytes_per_day() const;  // R * 86400
  // Device bytes written since the start of the current day (days count
  // from t0), as last reported.
  uint64_t written_today(uint64_t now_us) const;
  // Years until kvtier's share of the drive's rated endurance is used up if
  // it kept writing at its average rate since t0 (planned_years exactly at
  // R); 0 before anything was written or measured.
  double projected_life_years(uint64_t now_us) const;

 private:
  // Brings r(t) (every update interval) and the bucket up to `now_us`.
  void Advance(uint64_t now_us);
  void Refill(uint64_t now_us);
  void Recompute(uint64_t now_us);

  DwpdOptions options_;
  double daily_rate_ = 0;
  double max_rate_ = 0;
  uint64_t bucket_bytes_ = 0;
  uint64_t start_us_ = 0;
  double allowed_rate_ = 0;
  double tokens_ = 0;
  uint64_t refilled_us_ = 0;
  uint64_t recomputed_us_ = 0;
  uint64_t written_ = 0;         // the device's W(t) as last reported
  double granted_ = 0;           // bytes taken and charged since t0
  uint64_t written_at_day_ = 0;  // W at the start of the day it was last reported in
  uint64_t day_ = 0;             // that day's number since t0
};

}  // namespace kvtier
