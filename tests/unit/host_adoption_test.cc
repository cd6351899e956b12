// A host tier that outlives its daemon (tiers/host/host_tier.h HostKeep,
// daemon/engine/adopter.h): the arena and journal of one engine, kept past
// it as the fd store keeps them, are adopted by the next: every committed
// block not erased is a host hit again with its bytes, a block whose bytes
// changed is dropped and counted, a reservation never committed is
// reclaimed, a block put again meanwhile keeps the new copy, and a kept
// pair of another size starts empty.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <thread>

#include "daemon/engine/engine.h"
#include "tests/testing/counter_of.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/test_daemon.h"
#include "tiers/host/host_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::CounterOf;
using ::kvtier::testing::FakeClock;

constexpr uint64_t kBlockBytes = 12288;
constexpr uint64_t kArenaBytes = 1 << 20;
constexpr NamespaceFingerprint kNs{0xad0, 0x97};
constexpr ConnectionId kWriter = 7;

BlockKey Key(uint64_t i) { return BlockKey{0xad09, i}; }

// What the fd store holds between two daemons.
struct Kept {
  int arena = -1;
  int journal = -1;
};

class HostAdoptionTest : public ::testing::Test {
 protected:
  // Opens a host tier (adopting `kept` when given) and an engine over it.
  void Start(Kept kept = {}, uint64_t arena_bytes = kArenaBytes) {
    HostArenaOptions arena;
    arena.capacity_bytes = arena_bytes;
    arena.lock = HostArenaOptions::LockMode::kOff;
    arena.name = "kvtier-test-arena";
    arena.warm_in_background = allocate_at_open_ != UINT64_MAX;
    arena.allocate_at_open_bytes = allocate_at_open_;
    auto host = HostTier::Open(arena, 64, HostKeep{true, kept.arena, kept.journal});
    ASSERT_TRUE(host.ok()) << host.status().ToString();
    host_ = std::move(*host);
    auto engine = Engine::Create(EngineOptions{2, EvictionPolicyId::kLru}, *host_, clock_);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(*engine);
    if (adopt_at_once_) engine_->StartAdoption();
  }

  // Keeps the arena and journal, then ends the engine and the tier as a
  // kill would: nothing is withdrawn.
  Kept Stop() {
    Kept kept{::dup(host_->memfd()), ::dup(host_->journal()->fd())};
    engine_.reset();
    host_.reset();
    return kept;
  }

  void WaitAdopted() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (CounterOf(*engine_, "host.adopt.pending") > 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_EQ(CounterOf(*engine_, "host.adopt.pending"), 0);
  }

  Status Put(uint64_t i) {
    return ::kvtier::testing::PutFilledBlock(*engine_, *host_, kWriter, kNs, Key(i), kBlockBytes);
  }

  // Whether key i is a host hit with the bytes PutFilledBlock wrote.
  bool HostHitWithItsBytes(uint64_t i) {
    if (::kvtier::testing::LookupTier(*engine_, kNs, Key(i)) != Tier::kHost) return false;
    const BlockKey key = Key(i);
    std::vector<PinGrant> pins = engine_->Pin(kWriter, kNs, {&key, 1});
    if (pins.size() != 1 || !pins[0].status.ok()) return false;
    const bool exact = ::kvtier::testing::CheckBlockBytes(
        key, 0, ::kvtier::testing::SlotBytes(*host_, pins[0].offset, pins[0].length).first(kBlockBytes));
    engine_->Release(kWriter, {&pins[0].lease, 1});
    return exact;
  }

  void TearDown() override {
    engine_.reset();
    host_.reset();
  }

  bool adopt_at_once_ = true;  // false: the test calls StartAdoption
  // Set: Start allocates this much of the arena and the rest behind it.
  uint64_t allocate_at_open_ = UINT64_MAX;
  FakeClock clock_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(HostAdoptionTest, EveryCommittedBlockNotErasedIsAHostHitAfterARestart) {
  Start();
  for (uint64_t i = 0; i < 20; ++i) ASSERT_TRUE(Put(i).ok()) << i;
  const BlockKey erased[] = {Key(3), Key(11)};
  EXPECT_EQ(engine_->Erase(kNs, erased), 2u);
  EXPECT_EQ(host_->journal()->live(), 18u);
  const uint64_t used = host_->used_bytes();
  Start(Stop());
  EXPECT_TRUE(host_->adopted());
  WaitAdopted();
  EXPECT_EQ(CounterOf(*engine_, "host.adopt.blocks"), 18);
  EXPECT_EQ(CounterOf(*engine_, "host.adopt.bytes"), int64_t{18} * kBlockBytes);
  EXPECT_EQ(CounterOf(*engine_, "host.adopt.corrupt"), 0);
  EXPECT_EQ(host_->used_bytes(), used);
  for (uint64_t i = 0; i < 20; ++i) {
    if (i == 3 || i == 11) {
      EXPECT_EQ(::kvtier::testing::LookupTier(*engine_, kNs, Key(i)), Tier::kNone) << i;
    } else {
      EXPECT_TRUE(HostHitWithItsBytes(i)) << i;
    }
  }
  // New puts land around the adopted blocks, and a second restart keeps both.
  for (uint64_t i = 20; i < 30; ++i) ASSERT_TRUE(Put(i).ok()) << i;
  Start(Stop());
  WaitAdopted();
  EXPECT_EQ(CounterOf(*engine_, "host.adopt.blocks"), 28);
  for (uint64_t i = 0; i < 30; ++i) {
    if (i != 3 && i != 11) {
      EXPECT_TRUE(HostHitWithItsBytes(i)) << i;
    }
  }
}

// The next daemon allocates only the first page of a kept arena before it
// serves (the rest behind it): the blocks recorded past that page lie in
// what the previous daemon allocated, which the kept memfd shows, and are
// adopted all the same.
TEST_F(HostAdoptionTest, BlocksPastThePartAllocatedAtStartAreAdopted) {
  constexpr uint64_t kLarge = uint64_t{64} << 20;
  Start({}, kLarge);
  for (uint64_t i = 0; i < 20; ++i) ASSERT_TRUE(Put(i).ok()) << i;
  allocate_at_open_ = 4096;
  Start(Stop(), kLarge);
  ASSERT_TRUE(host_->adopted());
  WaitAdopted();
  EXPECT_EQ(CounterOf(*engine_, "host.adopt.blocks"), 20);
  for (uint64_t i = 0; i < 20; ++i) EXPECT_TRUE(HostHitWithItsBytes(i)) << i;
  for (uint64_t i = 20; i < 40; ++i) ASSERT_TRUE(Put(i).ok()) << i;
  for (uint64_t i = 0; i < 40; ++i) EXPECT_TRUE(HostHitWithItsBytes(i)) << i;
}

TEST_F(HostAdoptionTest, ABlockWhoseBytesChangedIsDroppedAndCounted) {
  Start();
  for (uint64_t i = 0; i < 6; ++i) ASSERT_TRUE(Put(i).ok());
  const BlockKey key = Key(4);
  std::vector<PinGrant> pin = engine_->Pin(kWriter, kNs, {&key, 1});
  ASSERT_TRUE(pin[0].status.ok());
  const uint64_t offset = pin[0].offset;
  engine_->Release(kWriter, {&pin[0].lease, 1});
  Kept kept = Stop();
  // A client with a writable mapping scribbled on block 4 after its commit.
  void* map = ::mmap(nullptr, kArenaBytes, PROT_READ | PROT_WRITE, MAP_SHARED, kept.arena, 0);
  ASSERT_NE(map, MAP_FAILED);
  static_cast<std::byte*>(map)[offset + 100] ^= std::byte{1};
  ::munmap(map, kArenaBytes);
  Start(kept);
  WaitAdopted();
  EXPECT_EQ(CounterOf(*engine_, "host.adopt.corrupt"), 1);
  EXPECT_EQ(CounterOf(*engine_, "host.adopt.blocks"), 5);
  EXPECT_EQ(::kvtier::testing::LookupTier(*engine_, kNs, Key(4)), Tier::kNone);
  for (uint64_t i = 0; i < 6; ++i) {
    if (i != 4) {
      EXPECT_TRUE(HostHitWithItsBytes(i)) << i;
    }
  }
  EXPECT_EQ(host_->journal()->live(), 5u);
}

TEST_F(HostAdoptionTest, AReservationNeverCommittedIsReclaimed) {
  Start();
  ASSERT_TRUE(Put(0).ok());
  const BlockKey half = Key(1);
  const uint64_t size = kBlockBytes;
  std::vector<SlotGrant> grant = engine_->Reserve(kWriter, kNs, {&half, 1}, {&size, 1});
  ASSERT_TRUE(grant[0].status.ok());
  ::kvtier::testing::FillBlockBytes(half, 0, ::kvtier::testing::SlotBytes(*host_, grant[0].offset, kBlockBytes));
  Start(Stop());  // killed between the copy and the commit
  WaitAdopted();
  EXPECT_TRUE(HostHitWithItsBytes(0));
  EXPECT_EQ(::kvtier::testing::LookupTier(*engine_, kNs, half), Tier::kNone);
  EXPECT_EQ(host_->used_bytes(), ArenaAllocator::ClassSize(kBlockBytes));
  ASSERT_TRUE(Put(1).ok());  // written again, it commits
  EXPECT_TRUE(HostHitWithItsBytes(1));
}

// What happens to a kept block before its turn comes: an Erase or a
// DropNamespace forgets it for good, and a put of its key wins over it.
TEST_F(HostAdoptionTest, ErasedDroppedOrPutAgainBeforeItsTurnAKeptBlockNeverComesBack) {
  constexpr NamespaceFingerprint kOther{0xad0, 0x98};
  Start();
  for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE(Put(i).ok());
  for (uint64_t i = 8; i < 12; ++i) {
    ASSERT_TRUE(::kvtier::testing::PutFilledBlock(*engine_, *host_, kWriter, kOther, Key(i), kBlockBytes).ok());
  }
  adopt_at_once_ = false;
  Start(Stop());
  EXPECT_EQ(CounterOf(*engine_, "host.adopt.pending"), 12);
  const BlockKey erased[] = {Key(1), Key(2)};
  EXPECT_EQ(engine_->Erase(kNs, erased), 2u);
  engine_->DropNamespace(kOther);
  // Key 3 is put again, with other bytes, before its kept copy is checked.
  const BlockKey again = Key(3);
  const uint64_t size = kBlockBytes;
  std::vector<SlotGrant> grant = engine_->Reserve(kWriter, kNs, {&again, 1}, {&size, 1});
  ASSERT_TRUE(grant[0].status.ok()) << grant[0].status.ToString();
  ::kvtier::testing::FillBlockBytes(again, 1, ::kvtier::testing::SlotBytes(*host_, grant[0].offset, kBlockBytes));
  ASSERT_TRUE(engine_->Commit(kWriter, kNs, {&again, 1}, {&size, 1})[0].ok());
  engine_->StartAdoption();
  WaitAdopted();
  EXPECT_EQ(CounterOf(*engine_, "host.adopt.forgotten"), 6);
  EXPECT_EQ(CounterOf(*engine_, "host.adopt.duplicates"), 1);
  EXPECT_EQ(CounterOf(*engine_, "host.adopt.blocks"), 5);
  for (uint64_t i : {1, 2}) EXPECT_EQ(::kvtier::testing::LookupTier(*engine_, kNs, Key(i)), Tier::kNone) << i;
  for (uint64_t i = 8; i < 12; ++i) EXPECT_EQ(::kvtier::testing::LookupTier(*engine_, kOther, Key(i)), Tier::kNone);
  std::vector<PinGrant> pin = engine_->Pin(kWriter, kNs, {&again, 1});
  ASSERT_TRUE(pin[0].status.ok());
  EXPECT_TRUE(::kvtier::testing::CheckBlockBytes(
      again, 1, ::kvtier::testing::SlotBytes(*host_, pin[0].offset, pin[0].length).first(kBlockBytes)));
  engine_->Release(kWriter, {&pin[0].lease, 1});
  for (uint64_t i : {0, 4, 5, 6, 7}) EXPECT_TRUE(HostHitWithItsBytes(i)) << i;
  // Nothing leaked: the arena holds exactly the six blocks now visible.
  EXPECT_EQ(host_->used_bytes(), 6 * ArenaAllocator::ClassSize(kBlockBytes));
  EXPECT_EQ(host_->journal()->live(), 6u);
}

// A kept block waiting to be checked cannot be evicted; a put that finds
// the arena full of them takes the space of the last in line instead of
// failing, and the rest are adopted.
TEST_F(HostAdoptionTest, APutIntoAnArenaFullOfWaitingBlocksTakesTheLastInLine) {
  Start();
  const uint64_t fit = kArenaBytes / ArenaAllocator::ClassSize(kBlockBytes);
  for (uint64_t i = 0; i < fit; ++i) ASSERT_TRUE(Put(i).ok()) << i;
  adopt_at_once_ = false;
  Start(Stop());
  ASSERT_TRUE(Put(1000).ok());
  EXPECT_EQ(CounterOf(*engine_, "host.adopt.given_back"), 1);
  engine_->StartAdoption();
  WaitAdopted();
  EXPECT_EQ(CounterOf(*engine_, "host.adopt.blocks"), static_cast<int64_t>(fit) - 1);
  EXPECT_EQ(::kvtier::testing::LookupTier(*engine_, kNs, Key(fit - 1)), Tier::kNone);
  EXPECT_TRUE(HostHitWithItsBytes(1000));
  for (uint64_t i = 0; i + 1 < fit; ++i) EXPECT_TRUE(HostHitWithItsBytes(i)) << i;
}

TEST_F(HostAdoptionTest, AKeptPairOfAnotherSizeStartsEmpty) {
  Start();
  ASSERT_TRUE(Put(0).ok());
  Start(Stop(), 2 * kArenaBytes);
  EXPECT_FALSE(host_->adopted());
  EXPECT_EQ(CounterOf(*engine_, "host.adopt.blocks"), 0);
  EXPECT_EQ(::kvtier::testing::LookupTier(*engine_, kNs, Key(0)), Tier::kNone);
  EXPECT_EQ(host_->used_bytes(), 0u);
  ASSERT_TRUE(Put(0).ok());
}

}  // namespace
}  // namespace kvtier
