#include "daemon/server/connection_usage.h"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

using std::chrono::seconds;

TEST(ConnectionUsage, LeasesAreCountedAgainstTheLimit) {
  ConnectionUsage usage(10, 1 << 20, seconds(60));
  EXPECT_EQ(usage.LeaseRoom(), 10u);
  EXPECT_EQ(usage.TakeLeaseRoom(7), 7u);
  usage.Leased(7, 7);
  EXPECT_EQ(usage.LeaseRoom(), 3u);
  EXPECT_EQ(usage.TakeLeaseRoom(5), 3u) << "within max_leases";
  usage.Leased(3, 3);
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

namespace {

TEST(ConnectionUsage, EveryPieceOfStateIsChargedAndGivenBack) {
  ClientMemory memory(1 << 20, 1, 50);
  {
    ClientMemoryAccount account(&memory, 0, 0);
    ConnectionUsage usage(100, 1 << 20, seconds(60), &account);
    // Leases: room taken up front, what the engine did not grant given back.
    EXPECT_EQ(usage.TakeLeaseRoom(10), 10u);
    usage.Leased(6, 10);
    EXPECT_EQ(account.held(), 6 * ClientStateCost::kLease);
    usage.Released(6);
    EXPECT_EQ(account.held(), 0u);
    // Reservations: one record per key, even reserved again.
    const BlockKey a{1, 1};
    const auto now = ConnectionUsage::Clock::now();
    EXPECT_EQ(usage.TakeReservationRoom(2), 2u);
    usage.Reserved(a, 10, now);
    usage.Reserved(a, 10, now);
    EXPECT_EQ(account.held(), ClientStateCost::kReservation);
    usage.Ended(a);
    EXPECT_EQ(account.held(), 0u);
    // Queued requests: charged by their keys, the difference on replace.
    EXPECT_TRUE(usage.SetQueued(7, 100).ok());
    EXPECT_EQ(account.held(), ClientStateCost::kQueuedRequest + 100 * ClientStateCost::kQueuedKey);
    EXPECT_TRUE(usage.SetQueued(7, 10).ok());
    EXPECT_EQ(account.held(), ClientStateCost::kQueuedRequest + 10 * ClientStateCost::kQueuedKey);
    EXPECT_TRUE(usage.SetQueued(7, 0).ok());
    EXPECT_EQ(account.held(), 0u);
    // Loads: their blocks' leases and state until they end.
    EXPECT_TRUE(usage.TakeLoadRoom(4).ok());
    usage.LoadBegun(9, 4);
    EXPECT_EQ(account.held(), 4 * (ClientStateCost::kLease + ClientStateCost::kLoadBlock));
    usage.LoadEnded(9);
    EXPECT_EQ(account.held(), 0u);
    EXPECT_TRUE(usage.ChargeNamespaces(5000).ok());
    EXPECT_EQ(memory.used(), 5000u);
  }
  EXPECT_EQ(memory.used(), 0u) << "a closed connection gives back all it held";
}

TEST(ConnectionUsage, StatePastTheMemoryBoundIsRefusedAndChangesNothing) {
  const uint64_t one_request = ClientStateCost::kQueuedRequest + 1000 * ClientStateCost::kQueuedKey;
  ClientMemory memory(one_request + one_request / 2, 1, 50);
  ClientMemoryAccount account(&memory, 0, 0);
  ConnectionUsage usage(1u << 20, 1 << 20, seconds(60), &account);
  ASSERT_TRUE(usage.SetQueued(1, 1000).ok());
  const Status refused = usage.SetQueued(2, 1000);
  EXPECT_EQ(refused.code(), StatusCode::kBusy);
  EXPECT_NE(refused.message().find("server.client_memory_bytes"), std::string::npos) << refused.message();
  EXPECT_EQ(usage.queued_keys(2), 0u);
  EXPECT_EQ(account.held(), one_request);
  // A replacement that grows past the bound leaves the request as it was.
  EXPECT_EQ(usage.SetQueued(1, 5000).code(), StatusCode::kBusy);
  EXPECT_EQ(usage.queued_keys(1), 1000u);
  // Leases fit by the room left: as many as the bound allows.
  const uint64_t left = memory.total() - memory.used();
  EXPECT_EQ(usage.TakeLeaseRoom(1u << 20), left / ClientStateCost::kLease);
  EXPECT_EQ(usage.TakeLoadRoom(1).code(), StatusCode::kBusy);
}

TEST(ConnectionUsage, ReservingAndAbortingInALoopDoesNotPileUpRecords) {
  ConnectionUsage usage(10, 1 << 20, seconds(60));
  const auto now = ConnectionUsage::Clock::now();
  usage.Reserved(BlockKey{9, 9}, 10, now);  // held throughout
  for (uint64_t i = 0; i < 100000; ++i) {
    usage.Reserved(BlockKey{i, 0}, 10, now);
    usage.Ended(BlockKey{i, 0});
  }
  EXPECT_EQ(usage.reservations(), 1u);
  EXPECT_LE(usage.expiry_records(), 2 * usage.reservations() + 65);
}

TEST(ConnectionUsage, ARefusalNamesTheBoundThatRefused) {
  ClientMemory memory(1 << 20, 1, 50);
  ClientMemoryAccount account(&memory, 0, 4096);
  ConnectionUsage usage(100, 1 << 20, seconds(60), &account);
  const Status own = usage.SetQueued(1, 1000);  // past the connection's 4 KiB, with room left in it
  EXPECT_EQ(own.code(), StatusCode::kBusy);
  EXPECT_NE(own.message().find("server.max_client_memory_per_connection"), std::string::npos) << own.message();
  ClientMemory small(4096, 1, 50);
  ClientMemoryAccount roomy(&small, 0, 1 << 20);
  ConnectionUsage other(100, 1 << 20, seconds(60), &roomy);
  const Status total = other.SetQueued(1, 1000);
  EXPECT_EQ(total.code(), StatusCode::kBusy);
  EXPECT_NE(total.message().find("server.client_memory_bytes"), std::string::npos) << total.message();
}

}  // namespace
}  // namespace kvtier
