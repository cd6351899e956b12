#include "common/log_rate_limiter.h"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

using std::chrono::milliseconds;

TEST(LogRateLimiter, LetsABurstThroughPerPeriodAndCountsTheRest) {
  LogRateLimiter limiter(3, milliseconds(1000));
  const auto t0 = LogRateLimiter::Clock::time_point{} + std::chrono::hours(1);
  uint64_t suppressed = 99;
  int allowed = 0;
  for (int i = 0; i < 1000; ++i) allowed += limiter.Allow(t0 + milliseconds(i / 10), suppressed) ? 1 : 0;
  EXPECT_EQ(allowed, 3);
  EXPECT_EQ(suppressed, 0u);  // the three let through followed no refusal
  EXPECT_EQ(limiter.total_suppressed(), 997u);
  // The next period's first line says how many were held back.
  ASSERT_TRUE(limiter.Allow(t0 + milliseconds(1000), suppressed));
  EXPECT_EQ(suppressed, 997u);
  ASSERT_TRUE(limiter.Allow(t0 + milliseconds(1001), suppressed));
  EXPECT_EQ(suppressed, 0u);
}

}  // namespace
}  // namespace kvtier
