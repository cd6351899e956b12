// Tests of the block directory (common/block_directory.h): the table
// against a model under colliding keys and wrap-around, its load limit,
// the reader's format checks, the daemon-side memfd (read-only for
// clients), and the seqlock copy under a writer that recycles extents.
#include "common/block_directory.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client_lib/directory_path.h"
#include "common/checksum.h"
#include "tests/testing/test_daemon.h"
#include "tiers/host/host_directory.h"

namespace kvtier {
namespace {

using ::kvtier::testing::CheckBlockBytes;
using ::kvtier::testing::FillBlockBytes;

constexpr NamespaceFingerprint kNs{0x1111, 0x2222};
constexpr NamespaceFingerprint kOtherNs{0x3333, 0x4444};

// A zeroed buffer formatted as a directory of `slots` slots.
struct Table {
  explicit Table(uint32_t slots)
      : memory(DirectoryBytes(slots) / sizeof(uint64_t) + 1),
        writer(Base(), slots),
        reader(*DirectoryReader::Attach(Base(), DirectoryBytes(slots))) {}
  std::byte* Base() { return reinterpret_cast<std::byte*>(memory.data()); }

  std::vector<uint64_t> memory;  // 8-byte aligned, zeroed
  DirectoryWriter writer;
  DirectoryReader reader;
};

DirectoryReader::Outcome Find(const Table& t, const BlockKey& key, DirectoryEntry* e,
                              const NamespaceFingerprint& ns = kNs) {
  return t.reader.Find(ns, key, e);
}

TEST(BlockDirectory, PublishFindWithdraw) {
  Table t(16);
  const BlockKey a{1, 5}, b{2, 5 + 16};  // same home slot
  ASSERT_TRUE(t.writer.Publish(kNs, a, 4096, 100, 0xaa));
  ASSERT_TRUE(t.writer.Publish(kNs, b, 8192, 200, 0xbb));
  DirectoryEntry e;
  ASSERT_EQ(Find(t, b, &e), DirectoryReader::Outcome::kHit);
  EXPECT_EQ(e.offset, 8192u);
  EXPECT_EQ(e.length, 200u);
  EXPECT_EQ(e.checksum, 0xbbu);
  EXPECT_EQ(Find(t, b, &e, kOtherNs), DirectoryReader::Outcome::kMiss) << "another namespace's block";
  EXPECT_EQ(Find(t, BlockKey{3, 5}, &e), DirectoryReader::Outcome::kMiss);
  EXPECT_TRUE(t.reader.MissesAreFinal());
  t.writer.Withdraw(a);  // b shifts back into a's slot
  EXPECT_EQ(Find(t, a, &e), DirectoryReader::Outcome::kMiss);
  ASSERT_EQ(Find(t, b, &e), DirectoryReader::Outcome::kHit);
  EXPECT_EQ(e.slot, 5u) << "b moved to its home slot";
  EXPECT_EQ(t.writer.entries(), 1u);
}

TEST(BlockDirectory, StillPublishedTurnsFalseWhenTheEntryChanges) {
  Table t(16);
  const BlockKey a{1, 3}, b{2, 3};
  ASSERT_TRUE(t.writer.Publish(kNs, a, 0, 10, 1));
  ASSERT_TRUE(t.writer.Publish(kNs, b, 64, 10, 2));
  DirectoryEntry ea, eb;
  ASSERT_EQ(Find(t, a, &ea), DirectoryReader::Outcome::kHit);
  ASSERT_EQ(Find(t, b, &eb), DirectoryReader::Outcome::kHit);
  EXPECT_TRUE(t.reader.StillPublished(ea));
  t.writer.Withdraw(a);
  EXPECT_FALSE(t.reader.StillPublished(ea)) << "withdrawn";
  EXPECT_FALSE(t.reader.StillPublished(eb)) << "moved by the backward shift";
  ASSERT_TRUE(t.writer.Publish(kNs, a, 0, 10, 1));
  EXPECT_FALSE(t.reader.StillPublished(ea)) << "republished: a new seq, never the old one";
}

TEST(BlockDirectory, LoadLimitCountsUnpublishedAndMakesMissesUncertain) {
  Table t(8);  // holds 6
  for (uint64_t i = 0; i < 6; ++i) ASSERT_TRUE(t.writer.Publish(kNs, BlockKey{9, i}, i * 64, 64, i));
  EXPECT_FALSE(t.writer.Publish(kNs, BlockKey{9, 6}, 6 * 64, 64, 6));
  EXPECT_EQ(t.writer.unpublished(), 1u);
  EXPECT_FALSE(t.reader.MissesAreFinal()) << "the refused block is cached but not listed";
  t.writer.ForgetUnpublished();
  EXPECT_TRUE(t.reader.MissesAreFinal());
  t.writer.SetLowerTiers(true);
  EXPECT_FALSE(t.reader.MissesAreFinal()) << "a host miss may be an NVMe hit";
}

TEST(BlockDirectory, AttachRejectsWhatIsNotADirectory) {
  std::vector<uint64_t> zeros(DirectoryBytes(8) / sizeof(uint64_t));
  auto* base = reinterpret_cast<std::byte*>(zeros.data());
  EXPECT_EQ(DirectoryReader::Attach(base, zeros.size() * 8).status().code(), StatusCode::kProtocolError);
  EXPECT_EQ(DirectoryReader::Attach(base, 10).status().code(), StatusCode::kProtocolError);
  DirectoryWriter writer(base, 8);
  EXPECT_TRUE(DirectoryReader::Attach(base, DirectoryBytes(8)).ok());
  EXPECT_EQ(DirectoryReader::Attach(base, DirectoryBytes(8) - 64).status().code(), StatusCode::kProtocolError)
      << "slots beyond the mapping";
}

// Random publish/withdraw against a std::map, with keys crowded onto a few
// home slots at the end of the table (clusters that wrap around): every
// key's presence and fields must match the model after every operation.
TEST(BlockDirectory, MatchesAModelUnderCollisionsAndWrapAround) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  constexpr uint32_t kSlots = 64;
  Table t(kSlots);
  std::map<BlockKey, uint64_t> model;  // key -> offset
  std::vector<BlockKey> universe;
  for (uint64_t i = 0; i < 120; ++i) universe.push_back(BlockKey{i, kSlots * i + (kSlots - 4) + i % 8});
  for (int op = 0; op < 5000; ++op) {
    const BlockKey& key = universe[rng() % universe.size()];
    if (model.count(key) != 0) {
      t.writer.Withdraw(key);
      model.erase(key);
    } else if (t.writer.Publish(kNs, key, op * 4096, 4096, key.hi)) {
      model[key] = op * 4096;
    } else {
      ASSERT_EQ(model.size(), kSlots / 4 * 3) << "refused below the load limit";
      t.writer.ForgetUnpublished();
    }
    for (const BlockKey& k : universe) {
      DirectoryEntry e;
      auto found = t.reader.Find(kNs, k, &e);
      auto it = model.find(k);
      if (it == model.end()) {
        ASSERT_EQ(found, DirectoryReader::Outcome::kMiss) << "op " << op << " key " << k.ToHex();
      } else {
        ASSERT_EQ(found, DirectoryReader::Outcome::kHit) << "op " << op << " key " << k.ToHex();
        ASSERT_EQ(e.offset, it->second);
        ASSERT_EQ(e.checksum, k.hi);
      }
    }
  }
}

TEST(HostDirectory, ClientsCanOnlyMapItReadOnly) {
  auto dir = HostDirectory::Open(1024);
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  const BlockKey key{7, 7};
  ASSERT_TRUE((*dir)->Publish(kNs, key, 4096, 512, 99));
  void* writable = ::mmap(nullptr, (*dir)->bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, (*dir)->fd(), 0);
  EXPECT_EQ(writable, MAP_FAILED) << "F_SEAL_FUTURE_WRITE must refuse a writable mapping";
  EXPECT_EQ(errno, EPERM);
  void* mapped = ::mmap(nullptr, (*dir)->bytes(), PROT_READ, MAP_SHARED, (*dir)->fd(), 0);
  ASSERT_NE(mapped, MAP_FAILED);
  auto reader = DirectoryReader::Attach(static_cast<const std::byte*>(mapped), (*dir)->bytes());
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  DirectoryEntry e;
  ASSERT_EQ(reader->Find(kNs, key, &e), DirectoryReader::Outcome::kHit);
  EXPECT_EQ(e.length, 512u);
  (*dir)->Withdraw(key);
  EXPECT_EQ(reader->Find(kNs, key, &e), DirectoryReader::Outcome::kMiss) << "a shared mapping sees the change";
  ::munmap(mapped, (*dir)->bytes());
}

TEST(HostDirectory, SizesAndBounds) {
  EXPECT_EQ(HostDirectory::DefaultSlots(1ull << 20), 1024u) << "floor";
  EXPECT_EQ(HostDirectory::DefaultSlots(2ull << 30), 65536u) << "2 GiB / 48 KiB rounded up";
  EXPECT_EQ(HostDirectory::DefaultSlots(1ull << 50), 1u << 24) << "ceiling";
  EXPECT_EQ(HostDirectory::Open(1000).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(HostDirectory::Open(1).status().code(), StatusCode::kInvalidArgument);
}

// One writer recycles a small arena's extents as fast as it can (withdraw,
// overwrite with another block's bytes, publish) while readers copy through
// the directory: every copy the reader accepts must be exactly the block it
// asked for. Without the post-copy StillPublished check torn copies pass.
TEST(BlockDirectory, ValidatedCopiesAreNeverTornWhileExtentsAreRecycled) {
  constexpr uint32_t kExtents = 16;
  constexpr size_t kBlock = 2048;
  constexpr uint64_t kWrites = 40000;
  Table t(64);
  std::vector<std::byte> arena(kExtents * kBlock);
  auto key_of = [](uint64_t i) { return BlockKey{0xfeed0000 + i, i * 0x9e3779b97f4a7c15ULL}; };
  std::atomic<uint64_t> written{0};
  std::atomic<bool> done{false};
  std::atomic<uint64_t> accepted{0}, torn{0};
  std::thread writer([&] {
    for (uint64_t i = 0; i < kWrites; ++i) {
      const uint64_t extent = i % kExtents;
      if (i >= kExtents) t.writer.Withdraw(key_of(i - kExtents));  // the block that lived there
      std::span<std::byte> bytes(arena.data() + extent * kBlock, kBlock);
      FillBlockBytes(key_of(i), 0, bytes);
      ASSERT_TRUE(t.writer.Publish(kNs, key_of(i), extent * kBlock, kBlock, BlockChecksum(bytes)));
      written.store(i + 1, std::memory_order_release);
    }
    done = true;
  });
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&, r] {
      std::vector<std::byte> dst(kBlock);
      std::mt19937_64 rng(r);
      while (!done) {
        const uint64_t newest = written.load(std::memory_order_acquire);
        if (newest == 0) continue;
        const uint64_t i = newest - 1 - rng() % std::min<uint64_t>(newest, kExtents + 4);
        auto copied = internal::CopyFromDirectory(t.reader, arena, kNs, key_of(i), dst, /*verify=*/false);
        if (!copied || !copied->ok()) continue;
        accepted++;
        if (**copied != kBlock || !CheckBlockBytes(key_of(i), 0, dst)) torn++;
      }
    });
  }
  writer.join();
  for (auto& r : readers) r.join();
  EXPECT_EQ(torn.load(), 0u) << "of " << accepted.load() << " accepted copies";
  EXPECT_GT(accepted.load(), 0u);
}

}  // namespace
}  // namespace kvtier
