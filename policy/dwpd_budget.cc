#include "policy/dwpd_budget.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace kvtier {
namespace {

constexpr double kDaySeconds = 86400.0;
constexpr double kYearSeconds = 365.0 * kDaySeconds;
constexpr uint64_t kMinBucketBytes = 64ull << 20;

bool Positive(double v) { return std::isfinite(v) && v > 0; }

}  // namespace

Status ValidateDwpdOptions(const DwpdOptions& o) {
  if (o.drive_capacity_bytes == 0) return InvalidArgument("dwpd: drive capacity must be set (bytes > 0)");
  if (!Positive(o.dwpd)) return InvalidArgument("dwpd: the drive's DWPD rating must be > 0");
  if (!Positive(o.warranty_years)) return InvalidArgument("dwpd: warranty years must be > 0");
  if (!Positive(o.planned_years)) return InvalidArgument("dwpd: planned service years must be > 0");
  if (!Positive(o.share) || o.share > 1)
    return InvalidArgument("dwpd: the share of the drive's writes must be in (0, 1]");
  if (!std::isfinite(o.max_write_rate) || o.max_write_rate < 0) {
    return InvalidArgument("dwpd: the maximum write rate must be >= 0 (0: twice the daily rate)");
  }
  if (o.update_interval_us == 0) return InvalidArgument("dwpd: the update interval must be > 0");
  return Status::Ok();
}

double DwpdBytesPerDay(const DwpdOptions& o) {
  return o.share * double(o.drive_capacity_bytes) * o.dwpd * o.warranty_years / o.planned_years;
}

DwpdBudget::DwpdBudget(const DwpdOptions& o, uint64_t start_us) : options_(o), start_us_(start_us) {
  daily_rate_ = DwpdBytesPerDay(o) / kDaySeconds;
  max_rate_ = o.max_write_rate > 0 ? o.max_write_rate : 2 * daily_rate_;
  const double interval_s = double(o.update_interval_us) / 1e6;
  bucket_bytes_ =
      o.bucket_bytes != 0 ? o.bucket_bytes : std::max<uint64_t>(kMinBucketBytes, uint64_t(daily_rate_ * interval_s));
  tokens_ = double(bucket_bytes_);
  refilled_us_ = recomputed_us_ = start_us;
  allowed_rate_ = std::min(daily_rate_, max_rate_);
}

uint64_t DwpdBudget::budget_bytes_per_day() const { return uint64_t(daily_rate_ * kDaySeconds); }

void DwpdBudget::Refill(uint64_t now_us) {
  if (now_us <= refilled_us_) return;
  tokens_ = std::min(double(bucket_bytes_), tokens_ + allowed_rate_ * double(now_us - refilled_us_) / 1e6);
  refilled_us_ = now_us;
}

void DwpdBudget::Recompute(uint64_t now_us) {
  // Refill at the old rate up to now first: the new rate applies from now.
  Refill(now_us);
  const double elapsed_s = double(now_us - start_us_) / 1e6;
  const double allowance = daily_rate_ * (elapsed_s + kDaySeconds) - std::max(double(written_), granted_);
  allowed_rate_ = std::clamp(allowance / kDaySeconds, 0.0, max_rate_);
  recomputed_us_ = now_us;
}

void DwpdBudget::OnDeviceWritten(uint64_t total_bytes, uint64_t now_us) {
  if (now_us < start_us_) now_us = start_us_;
  const uint64_t day = (now_us - start_us_) / kDayUs;
  if (day != day_) {
    written_at_day_ = written_;  // the last report before this day began
    day_ = day;
  }
  written_ = std::max(written_, total_bytes);
  if (now_us - recomputed_us_ >= options_.update_interval_us) Recompute(now_us);
}

void DwpdBudget::Advance(uint64_t now_us) {
  if (now_us < refilled_us_) now_us = refilled_us_;
  if (now_us - recomputed_us_ >= options_.update_interval_us) Recompute(now_us);
  Refill(now_us);
}

bool DwpdBudget::TryTake(uint64_t bytes, uint64_t now_us) {
  Advance(now_us);
  if (tokens_ < double(bytes)) return false;
  tokens_ -= double(bytes);
  granted_ += double(bytes);
  return true;
}

void DwpdBudget::Charge(uint64_t bytes, uint64_t now_us) {
  Advance(now_us);
  tokens_ -= double(bytes);
  granted_ += double(bytes);
}

uint64_t DwpdBudget::written_today(uint64_t now_us) const {
  const uint64_t day = now_us <= start_us_ ? 0 : (now_us - start_us_) / kDayUs;
  return day == day_ ? written_ - written_at_day_ : 0;
}

double DwpdBudget::projected_life_years(uint64_t now_us) const {
  if (written_ == 0 || now_us <= start_us_) return 0;
  const double average_rate = double(written_) / (double(now_us - start_us_) / 1e6);
  const double endurance =
      options_.share * double(options_.drive_capacity_bytes) * options_.dwpd * 365.0 * options_.warranty_years;
  return endurance / (average_rate * kYearSeconds);
}

}  // namespace kvtier
