// Tests of DwpdBudget: the daily rate, r(t), the token bucket, the day's
// accounting and, with a fake clock, the 24 h bound under a write-heavy load.
#include "policy/dwpd_budget.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <algorithm>
#include <vector>

namespace kvtier {
namespace {

constexpr uint64_t kSecondUs = 1'000'000;
constexpr uint64_t kDayS = 86400;
constexpr uint64_t kStart = 5 * kSecondUs;  // t0 need not be 0

DwpdOptions SmallDrive() {
  DwpdOptions o;
  o.drive_capacity_bytes = 100ull << 30;  // 100 GiB, 1 DWPD, 5 of 5 years: R = 1.24 MB/s
  return o;
}

TEST(DwpdBudgetTest, DailyRateFollowsTheFormula) {
  DwpdOptions o;
  o.drive_capacity_bytes = 3'840'000'000'000;
  o.dwpd = 1;
  o.warranty_years = 5;
  o.planned_years = 5;
  EXPECT_NEAR(DwpdBudget(o, 0).daily_rate(), 3.84e12 / 86400, 1);  // ~44 MB/s: 3.84 TB a day
  o.planned_years = 10;                                            // lasting twice the warranty halves the rate
  EXPECT_NEAR(DwpdBudget(o, 0).daily_rate(), 3.84e12 / 86400 / 2, 1);
  o.share = 0.25;
  o.dwpd = 3;
  EXPECT_NEAR(DwpdBudget(o, 0).daily_rate(), 0.25 * 3.84e12 * 3 / 2 / 86400, 1);
  EXPECT_EQ(DwpdBudget(o, 0).budget_bytes_per_day(), uint64_t(0.25 * 3.84e12 * 3 / 2));
}

TEST(DwpdBudgetTest, ValidationNamesTheBadOption) {
  const auto message = [](DwpdOptions o) { return ValidateDwpdOptions(o).message(); };
  EXPECT_TRUE(ValidateDwpdOptions(SmallDrive()).ok());
  DwpdOptions o = SmallDrive();
  o.drive_capacity_bytes = 0;
  EXPECT_NE(message(o).find("capacity"), std::string::npos);
  o = SmallDrive();
  o.dwpd = 0;
  EXPECT_NE(message(o).find("DWPD"), std::string::npos);
  o = SmallDrive();
  o.warranty_years = -1;
  EXPECT_NE(message(o).find("warranty"), std::string::npos);
  o = SmallDrive();
  o.planned_years = 0;
  EXPECT_NE(message(o).find("planned"), std::string::npos);
  o = SmallDrive();
  o.share = 1.5;
  EXPECT_NE(message(o).find("share"), std::string::npos);
  o = SmallDrive();
  o.max_write_rate = -1;
  EXPECT_NE(message(o).find("maximum write rate"), std::string::npos);
  o = SmallDrive();
  o.update_interval_us = 0;
  EXPECT_NE(message(o).find("interval"), std::string::npos);
}

TEST(DwpdBudgetTest, StartsAtTheDailyRateWithAFullBucket) {
  DwpdBudget b(SmallDrive(), kStart);
  EXPECT_DOUBLE_EQ(b.allowed_rate(), b.daily_rate());
  EXPECT_DOUBLE_EQ(b.max_rate(), 2 * b.daily_rate());
  EXPECT_EQ(b.bucket_bytes(), uint64_t(b.daily_rate() * 60));  // one minute of R (74.5 MB here)
  DwpdOptions tiny = SmallDrive();
  tiny.drive_capacity_bytes = 1ull << 30;
  EXPECT_EQ(DwpdBudget(tiny, kStart).bucket_bytes(), 64ull << 20);  // at least 64 MiB
  EXPECT_TRUE(b.TryTake(b.bucket_bytes(), kStart));
  EXPECT_FALSE(b.TryTake(1, kStart));
  // One second later, R bytes have come back (not more).
  const auto r = static_cast<uint64_t>(b.daily_rate());
  EXPECT_FALSE(b.TryTake(r + 2, kStart + kSecondUs));
  EXPECT_TRUE(b.TryTake(r - 2, kStart + kSecondUs));
  EXPECT_FALSE(b.TryTake(16, kStart + kSecondUs));
  // An idle hour refills the bucket to its depth, no further.
  const uint64_t later = kStart + 3600 * kSecondUs;
  EXPECT_FALSE(b.TryTake(b.bucket_bytes() + 1, later));
  EXPECT_TRUE(b.TryTake(b.bucket_bytes(), later));
}

TEST(DwpdBudgetTest, ChargesGoIntoDebtThatHoldsAdmissionsOff) {
  DwpdOptions o = SmallDrive();
  o.bucket_bytes = 10'000'000;
  DwpdBudget b(o, kStart);
  b.Charge(15'000'000, kStart);  // 5 MB of debt
  const double r = b.daily_rate();
  // The debt is repaid first: 5 MB / R seconds before even 1 byte fits.
  const auto repaid_s = uint64_t(5'000'000 / r);
  EXPECT_FALSE(b.TryTake(1, kStart + (repaid_s - 1) * kSecondUs));
  EXPECT_TRUE(b.TryTake(1, kStart + (repaid_s + 1) * kSecondUs));
}

TEST(DwpdBudgetTest, ARefusedTakeLeavesTheBucketAlone) {
  DwpdOptions o = SmallDrive();
  o.bucket_bytes = 1000;
  DwpdBudget b(o, kStart);
  EXPECT_FALSE(b.TryTake(1001, kStart));  // larger than the bucket: never
  EXPECT_TRUE(b.TryTake(1000, kStart));
}

TEST(DwpdBudgetTest, WritingAheadOfTheBudgetLowersTheRate) {
  DwpdOptions o = SmallDrive();
  DwpdBudget b(o, kStart);
  const double r = b.daily_rate();
  // A whole day's budget written in the first minute: r(t) = R * 60 / 86400.
  b.OnDeviceWritten(b.budget_bytes_per_day(), kStart + 60 * kSecondUs);
  EXPECT_NEAR(b.allowed_rate(), r * 60 / 86400, r * 1e-6);
  // Two days' worth: the allowance is negative, the rate 0.
  b.OnDeviceWritten(2 * b.budget_bytes_per_day(), kStart + 120 * kSecondUs);
  EXPECT_EQ(b.allowed_rate(), 0);
  // The rate is recomputed at most once per interval.
  b.OnDeviceWritten(2 * b.budget_bytes_per_day(), kStart + 150 * kSecondUs);
  EXPECT_EQ(b.allowed_rate(), 0);
  // W never goes back.
  b.OnDeviceWritten(0, kStart + 200 * kSecondUs);
  EXPECT_EQ(b.allowed_rate(), 0);
}

TEST(DwpdBudgetTest, IdleTimeAccruesButIsSpentNoFasterThanTheMaximum) {
  DwpdOptions o = SmallDrive();
  DwpdBudget b(o, kStart);
  // Three idle days: the allowance is four days, r would be 4R; R_max = 2R.
  b.OnDeviceWritten(0, kStart + 3 * kDayS * kSecondUs);
  EXPECT_DOUBLE_EQ(b.allowed_rate(), b.max_rate());
  o.max_write_rate = 3 * b.daily_rate();
  DwpdBudget c(o, kStart);
  c.OnDeviceWritten(0, kStart + 3 * kDayS * kSecondUs);
  EXPECT_DOUBLE_EQ(c.allowed_rate(), 3 * c.daily_rate());
}

TEST(DwpdBudgetTest, CountsTodaysWritesAndProjectsTheDriveLife) {
  DwpdOptions o = SmallDrive();
  o.planned_years = 7;
  DwpdBudget b(o, kStart);
  EXPECT_EQ(b.projected_life_years(kStart), 0);
  const double r = b.daily_rate();
  // Exactly R for 1.5 days: the drive lasts the planned years.
  const uint64_t t1 = kStart + kDayS * kSecondUs;
  b.OnDeviceWritten(uint64_t(r * kDayS), t1 - 1);
  EXPECT_EQ(b.written_today(t1 - 1), uint64_t(r * kDayS));
  EXPECT_EQ(b.written_today(t1), 0u);  // a new day, nothing reported in it yet
  const uint64_t t2 = t1 + kDayS * kSecondUs / 2;
  b.OnDeviceWritten(uint64_t(r * kDayS * 1.5), t2);
  EXPECT_NEAR(double(b.written_today(t2)), r * kDayS * 0.5, 2);
  EXPECT_NEAR(b.projected_life_years(t2), 7.0, 1e-3);
  // Twice the rate halves it.
  b.OnDeviceWritten(uint64_t(r * kDayS * 3), t2);
  EXPECT_NEAR(b.projected_life_years(t2), 3.5, 1e-3);
}

// A writer that wants far more than the budget, one fake second at a time:
// it offers blocks of `block` record bytes while the bucket takes them. The
// device also writes `overhead` of every admitted byte on its own
// (reinsertion, padding): charged to the budget when `charged`, behind its
// back otherwise. The device reports what it wrote `lag_s` seconds late
// (granted writes still queued). Returns W sampled once a minute.
std::vector<uint64_t> HeavyLoad(const DwpdOptions& o, uint64_t block, double overhead, bool charged, uint64_t days,
                                uint64_t lag_s = 0) {
  DwpdBudget b(o, kStart);
  std::vector<uint64_t> w_per_minute{0};
  std::vector<uint64_t> w_per_second{0};
  uint64_t written = 0;
  double extra = 0;
  for (uint64_t s = 1; s <= days * kDayS; ++s) {
    const uint64_t now = kStart + s * kSecondUs;
    // Offered: 20 blocks per second, many times R for these drives.
    for (int i = 0; i < 20 && b.TryTake(block, now); ++i) {
      written += block;
      extra += overhead * double(block);
    }
    const auto whole = uint64_t(extra);
    extra -= double(whole);
    written += whole;
    if (charged && whole > 0) b.Charge(whole, now);
    w_per_second.push_back(written);
    b.OnDeviceWritten(w_per_second[s >= lag_s ? s - lag_s : 0], now);
    if (s % 60 == 0) w_per_minute.push_back(written);
  }
  return w_per_minute;
}

// The bytes written in each 24 h window (sliding by a minute) of `w`,
// starting at minute `from`.
std::vector<double> DayWindows(const std::vector<uint64_t>& w, size_t from = 0) {
  const size_t day_minutes = kDayS / 60;
  std::vector<double> out;
  for (size_t m = from; m + day_minutes < w.size(); ++m) out.push_back(double(w[m + day_minutes] - w[m]));
  return out;
}

void ExpectEveryDayWithinBudget(const DwpdOptions& o, uint64_t block, double overhead, uint64_t lag_s = 0) {
  const DwpdBudget reference(o, kStart);
  const std::vector<double> windows = DayWindows(HeavyLoad(o, block, overhead, /*charged=*/true, 5, lag_s));
  const double limit = double(reference.budget_bytes_per_day() + reference.bucket_bytes());
  for (size_t m = 0; m < windows.size(); ++m) {
    ASSERT_LE(windows[m], limit) << "24 h window starting at minute " << m;
  }
  // And the budget is used, not hoarded: every day-long window gets most of it.
  EXPECT_GE(*std::min_element(windows.begin(), windows.end()), 0.9 * double(reference.budget_bytes_per_day()));
  EXPECT_GT(*std::max_element(windows.begin(), windows.end()), 0.99 * double(reference.budget_bytes_per_day()));
}

TEST(DwpdBudgetTest, AnyDayUnderHeavyLoadStaysWithinBudgetPlusOneBucket) {
  ExpectEveryDayWithinBudget(SmallDrive(), 1 << 20, 0.0);
}

TEST(DwpdBudgetTest, ChargedOverheadIsPaidForOutOfTheSameBudget) {
  // 10% more written by the tier on its own (reinsertion), charged: within.
  ExpectEveryDayWithinBudget(SmallDrive(), 1 << 20, 0.10);
}

TEST(DwpdBudgetTest, GrantedWritesCountBeforeTheDeviceReportsThem) {
  // The engine's demoter queues admitted writes, so the device's count lags
  // the bucket's grants. A small bucket and a five-minute lag: the bound
  // still holds, because r(t) counts what was granted, not only what landed.
  DwpdOptions o = SmallDrive();
  o.bucket_bytes = 2 << 20;
  o.update_interval_us = 10 * kSecondUs;
  ExpectEveryDayWithinBudget(o, 1 << 20, 0.0, /*lag_s=*/300);
}

TEST(DwpdBudgetTest, UnchargedOverheadLowersTheRateUntilTheAverageIsBackAtR) {
  // 10% written behind the bucket's back: the first day overshoots (the
  // class comment says why), r(t) then settles so that a day is R * 86400.
  const DwpdOptions o = SmallDrive();
  const DwpdBudget reference(o, kStart);
  const double budget = double(reference.budget_bytes_per_day());
  const std::vector<uint64_t> w = HeavyLoad(o, 1 << 20, 0.10, /*charged=*/false, 6);
  const std::vector<double> late = DayWindows(w, 4 * kDayS / 60);  // days 5 and 6
  for (size_t m = 0; m < late.size(); ++m) {
    ASSERT_LE(late[m], 1.01 * budget + double(reference.bucket_bytes())) << "minute " << m;
    ASSERT_GE(late[m], 0.98 * budget) << "minute " << m;
  }
  // Over the whole run: at most one day's allowance ahead of R.
  EXPECT_LE(double(w.back()), 7 * budget);
}

TEST(DwpdBudgetTest, BoundHoldsForOtherDrivesAndBuckets) {
  DwpdOptions o;
  o.drive_capacity_bytes = 2'000'000'000'000;  // 2 TB
  o.dwpd = 3;
  o.warranty_years = 5;
  o.planned_years = 8;
  o.share = 0.3;
  o.bucket_bytes = 256ull << 20;
  o.update_interval_us = 10 * kSecondUs;
  ExpectEveryDayWithinBudget(o, 8 << 20, 0.05);
}

}  // namespace
}  // namespace kvtier
