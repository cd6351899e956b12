#include "daemon/connection_usage.h"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

using std::chrono::seconds;

TEST(ConnectionUsage, LeasesAreCountedAgainstTheLimit) {
  ConnectionUsage usage(10, 1 << 20, seconds(60));
  EXPECT_EQ(usage.LeaseRoom(), 10u);
  usage.Leased(7);
  EXPECT_EQ(usage.LeaseRoom(), 3u);
  usage.Leased(3);
  EXPECT_EQ(usage.LeaseRoom(), 0u);
  EXPECT_TRUE(usage.holds_anything());
  usage.Released(4);
  EXPECT_EQ(usage.LeaseRoom(), 4u);
  usage.Released(100);  // never below zero
  EXPECT_EQ(usage.leases(), 0u);
  EXPECT_FALSE(usage.holds_anything());
}

TEST(ConnectionUsage, LoadsHoldTheirBlocksUntilTheyEnd) {
  ConnectionUsage usage(10, 1 << 20, seconds(60));
  usage.LoadBegun(5, 6);
  EXPECT_EQ(usage.LeaseRoom(), 4u);
  usage.LoadEnded(99);  // not ours: nothing changes
  EXPECT_EQ(usage.LeaseRoom(), 4u);
  usage.LoadEnded(5);
  EXPECT_EQ(usage.LeaseRoom(), 10u);
  usage.LoadEnded(5);  // twice: nothing more
  EXPECT_EQ(usage.LeaseRoom(), 10u);
}

TEST(ConnectionUsage, ReservedBytesAreCountedUntilCommitAbortOrExpiry) {
  const auto t0 = ConnectionUsage::Clock::time_point{} + std::chrono::hours(1);
  ConnectionUsage usage(10, 100, seconds(60));
  EXPECT_TRUE(usage.ReserveFits(100));
  EXPECT_FALSE(usage.ReserveFits(101));
  usage.Reserved(BlockKey{1, 1}, 60, t0);
  EXPECT_FALSE(usage.ReserveFits(41));
  EXPECT_TRUE(usage.ReserveFits(40));
  usage.Reserved(BlockKey{2, 2}, 40, t0 + seconds(30));
  EXPECT_FALSE(usage.ReserveFits(1));
  EXPECT_EQ(usage.NextExpiry(), t0 + seconds(60));
  usage.Ended(BlockKey{1, 1});
  EXPECT_EQ(usage.reserved_bytes(), 40u);
  EXPECT_EQ(usage.NextExpiry(), t0 + seconds(90)) << "the ended one no longer counts";
  EXPECT_TRUE(usage.TakeExpired(t0 + seconds(89)).empty());
  const std::vector<BlockKey> expired = usage.TakeExpired(t0 + seconds(90));
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0], (BlockKey{2, 2}));
  EXPECT_EQ(usage.reserved_bytes(), 0u);
  EXPECT_FALSE(usage.NextExpiry().has_value());
  EXPECT_FALSE(usage.holds_anything());
}

TEST(ConnectionUsage, AKeyReservedAgainExpiresFromItsLatestReservation) {
  const auto t0 = ConnectionUsage::Clock::time_point{} + std::chrono::hours(1);
  ConnectionUsage usage(10, 100, seconds(60));
  usage.Reserved(BlockKey{1, 1}, 10, t0);
  usage.Ended(BlockKey{1, 1});
  usage.Reserved(BlockKey{1, 1}, 20, t0 + seconds(50));
  EXPECT_TRUE(usage.TakeExpired(t0 + seconds(70)).empty()) << "the first reservation ended; the second is young";
  EXPECT_EQ(usage.reserved_bytes(), 20u);
  EXPECT_EQ(usage.TakeExpired(t0 + seconds(110)).size(), 1u);
}

}  // namespace
TEST(ConnectionUsage, TheAutoReservedBytesLimitIsHalfTheArenaWhateverItsSize) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  EXPECT_EQ(AutoMaxReservedBytes(64ull << 30), 32ull << 30);
  EXPECT_EQ(AutoMaxReservedBytes(256 * kMiB), 128 * kMiB);
  EXPECT_EQ(AutoMaxReservedBytes(100 * kMiB), 50 * kMiB) << "no floor in bytes";
  EXPECT_EQ(AutoMaxReservedBytes(64 * kMiB), 32 * kMiB) << "never the whole of a small arena";
  EXPECT_EQ(AutoMaxReservedBytes(512 << 10), 256u << 10);
  EXPECT_EQ(AutoMaxReservedBytes(1), 1u) << "a limit, never 0 (no limit)";
}

TEST(ConnectionUsage, ZeroIsNoLimitForAHandlerGivenNoneResolved) {
  ConnectionUsage usage(10, 0, std::chrono::seconds(60));
  EXPECT_TRUE(usage.ReserveFits(uint64_t{1} << 62));
}

}  // namespace kvtier
