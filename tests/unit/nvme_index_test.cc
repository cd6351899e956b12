// NvmeIndex: the persistent key -> record map and region table survive a
// reopen, reset atomically, and refuse a second owner.
#include "tiers/nvme/nvme_index.h"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <vector>

#include "tests/testing/test_daemon.h"

namespace kvtier {
namespace {

using ::kvtier::testing::MakeTempDir;
using ::kvtier::testing::RemoveTree;

IndexEntry Entry(uint32_t region, uint64_t offset) {
  IndexEntry e;
  e.ns = BlockKey{0xabc, region};
  e.payload_checksum = 0x1234567890abcdefULL ^ offset;
  e.region = region;
  e.offset = offset;
  e.payload_bytes = 3 * 4096 + 17;
  e.layer_count = 3 + region;
  e.region_generation = 7 + region;
  e.flags = 0x5;
  e.hits = 99;
  e.last_use_us = -12345;  // any value round-trips, negative included
  return e;
}

class NvmeIndexTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = MakeTempDir(); }
  void TearDown() override { RemoveTree(dir_); }
  std::unique_ptr<NvmeIndex> Open() {
    auto index = NvmeIndex::Open(dir_ + "/index", /*sync_writes=*/false);
    EXPECT_TRUE(index.ok()) << index.status().ToString();
    return index.ok() ? std::move(*index) : nullptr;
  }
  std::string dir_;
};

TEST_F(NvmeIndexTest, PutGetDeleteAndReopen) {
  const BlockKey a{1, 2}, b{0xffffffffffffffffULL, 0}, missing{5, 5};
  {
    auto index = Open();
    ASSERT_NE(index, nullptr);
    ASSERT_TRUE(index->Put(a, Entry(0, 4096)).ok());
    ASSERT_TRUE(index->Put(b, Entry(3, 8192)).ok());
    auto got = index->Get(a);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, Entry(0, 4096));
    EXPECT_EQ(index->Get(missing).status().code(), StatusCode::kNotFound);
    ASSERT_TRUE(index->Put(a, Entry(1, 0)).ok());  // overwrite
    ASSERT_TRUE(index->PutRegion(RegionState{3, 10, RegionStatus::kSealed, 777}).ok());
    ASSERT_TRUE(index->PutRegion(RegionState{1, 2, RegionStatus::kOpen, 0}).ok());
  }
  auto index = Open();  // what returned before the close is there after it
  ASSERT_NE(index, nullptr);
  EXPECT_EQ(*index->Get(a), Entry(1, 0));
  EXPECT_EQ(*index->Get(b), Entry(3, 8192));
  std::vector<RegionState> regions;
  ASSERT_TRUE(index->ForEachRegion([&](const RegionState& r) { regions.push_back(r); }).ok());
  ASSERT_EQ(regions.size(), 2u);
  EXPECT_EQ(regions[0], (RegionState{1, 2, RegionStatus::kOpen, 0}));  // region order
  EXPECT_EQ(regions[1], (RegionState{3, 10, RegionStatus::kSealed, 777}));
  ASSERT_TRUE(index->Delete(a).ok());
  EXPECT_EQ(index->Get(a).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(index->Delete(missing).ok()) << "deleting an absent key is not an error";
}

TEST_F(NvmeIndexTest, ForEachEntryVisitsAllInKeyOrderAndNoRegions) {
  auto index = Open();
  ASSERT_NE(index, nullptr);
  std::map<std::pair<uint64_t, uint64_t>, IndexEntry> want;
  for (uint64_t i = 0; i < 200; ++i) {
    const BlockKey k{i * 0x9e3779b97f4a7c15ULL, ~i};
    want[{k.hi, k.lo}] = Entry(static_cast<uint32_t>(i % 7), i * 4096);
    ASSERT_TRUE(index->Put(k, want[{k.hi, k.lo}]).ok());
  }
  ASSERT_TRUE(index->PutRegion(RegionState{0, 1, RegionStatus::kOpen, 0}).ok());
  std::vector<std::pair<std::pair<uint64_t, uint64_t>, IndexEntry>> seen;
  ASSERT_TRUE(index->ForEachEntry([&](const BlockKey& k, const IndexEntry& e) {
                     seen.push_back({{k.hi, k.lo}, e});
                   })
                  .ok());
  ASSERT_EQ(seen.size(), want.size());
  auto it = want.begin();
  for (const auto& s : seen) {
    EXPECT_EQ(s.first, it->first);
    EXPECT_EQ(s.second, it->second);
    ++it;
  }
}

TEST_F(NvmeIndexTest, ResetRegionDropsItsEntriesAndBumpsItInOneWrite) {
  std::vector<BlockKey> in_region = {{1, 1}, {1, 2}, {1, 3}};
  const BlockKey elsewhere{2, 1};
  {
    auto index = Open();
    ASSERT_NE(index, nullptr);
    for (const auto& k : in_region) ASSERT_TRUE(index->Put(k, Entry(4, 0)).ok());
    ASSERT_TRUE(index->Put(elsewhere, Entry(5, 0)).ok());
    ASSERT_TRUE(index->ResetRegion(RegionState{4, 12, RegionStatus::kOpen, 0}, in_region).ok());
  }
  auto index = Open();
  ASSERT_NE(index, nullptr);
  for (const auto& k : in_region) EXPECT_EQ(index->Get(k).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(index->Get(elsewhere).ok());
  std::vector<RegionState> regions;
  ASSERT_TRUE(index->ForEachRegion([&](const RegionState& r) { regions.push_back(r); }).ok());
  ASSERT_EQ(regions.size(), 1u);
  EXPECT_EQ(regions[0].generation, 12u);
}

// The index is keyed by block: by the time a reclaim's reset is applied, a
// key it names may already describe a newer record of the block (a
// reinsertion's copy in another region, or a record in the region's new
// generation). Those stay; only the region's old records go.
TEST_F(NvmeIndexTest, ResetRegionKeepsEntriesThatMovedOnSinceTheResetWasDecided) {
  const BlockKey old_record{1, 1}, copied_away{1, 2}, rewritten_here{1, 3}, absent{1, 4};
  IndexEntry copy = Entry(6, 6 << 20);
  IndexEntry new_generation = Entry(4, 4 << 20);
  new_generation.region_generation = 12;
  {
    auto index = Open();
    ASSERT_NE(index, nullptr);
    ASSERT_TRUE(index->Put(old_record, Entry(4, 0)).ok());  // generation 11
    ASSERT_TRUE(index->Put(copied_away, copy).ok());
    ASSERT_TRUE(index->Put(rewritten_here, new_generation).ok());
    const std::vector<BlockKey> keys = {old_record, copied_away, rewritten_here, absent};
    ASSERT_TRUE(index->ResetRegion(RegionState{4, 12, RegionStatus::kOpen, 0}, keys).ok());
    ASSERT_TRUE(index->ResetRegion(RegionState{5, 3, RegionStatus::kOpen, 0}, {}).ok()) << "no keys";
  }
  auto index = Open();
  ASSERT_NE(index, nullptr);
  EXPECT_EQ(index->Get(old_record).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(index->Get(absent).status().code(), StatusCode::kNotFound);
  auto kept = index->Get(copied_away);
  ASSERT_TRUE(kept.ok()) << "the copy in region 6 was deleted for region 4's reset";
  EXPECT_EQ(*kept, copy);
  auto rewritten = index->Get(rewritten_here);
  ASSERT_TRUE(rewritten.ok()) << "a record of region 4's new generation was deleted by its reset";
  EXPECT_EQ(*rewritten, new_generation);
  std::vector<RegionState> regions;
  ASSERT_TRUE(index->ForEachRegion([&](const RegionState& r) { regions.push_back(r); }).ok());
  ASSERT_EQ(regions.size(), 2u);
  EXPECT_EQ(regions[0], (RegionState{4, 12, RegionStatus::kOpen, 0}));
  EXPECT_EQ(regions[1], (RegionState{5, 3, RegionStatus::kOpen, 0}));
}

TEST_F(NvmeIndexTest, DeleteIfCurrentDeletesOnlyTheRecordItNames) {
  auto index = Open();
  ASSERT_NE(index, nullptr);
  const BlockKey k{3, 3}, absent{3, 4};
  const IndexEntry old_record = Entry(2, 2 << 20);
  const IndexEntry copy = Entry(5, 5 << 20);
  ASSERT_TRUE(index->Put(k, copy).ok());  // the block moved on since the delete was decided
  ASSERT_TRUE(index->DeleteIfCurrent(k, old_record).ok());
  ASSERT_TRUE(index->Get(k).ok()) << "another record's entry was deleted";
  EXPECT_EQ(*index->Get(k), copy);
  IndexEntry other_generation = copy;
  other_generation.region_generation += 1;
  ASSERT_TRUE(index->DeleteIfCurrent(k, other_generation).ok());
  EXPECT_TRUE(index->Get(k).ok()) << "same place, another life of the region";
  ASSERT_TRUE(index->DeleteIfCurrent(k, copy).ok());
  EXPECT_EQ(index->Get(k).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(index->DeleteIfCurrent(absent, copy).ok()) << "deleting an absent key is not an error";
}

TEST_F(NvmeIndexTest, SecondOpenOfTheSameIndexIsRefused) {
  auto first = Open();
  ASSERT_NE(first, nullptr);
  auto second = NvmeIndex::Open(dir_ + "/index", false);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kIoError);
  EXPECT_NE(second.status().message().find(dir_ + "/index"), std::string::npos) << second.status().message();
}

std::string Octal(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode & 0777));
  return text;
}

// The permission bits of every file under `dir` that others (not the owner)
// could open: "path mode" lines, empty when none. A file is reachable only
// through directories that let others search them.
std::string ReachableByOthers(const std::string& dir) {
  std::string reachable;
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return "cannot stat " + dir;
  if ((st.st_mode & 0005) == 0 && (st.st_mode & 0050) == 0) return "";  // others and the group cannot enter
  reachable += dir + " " + Octal(st.st_mode) + "\n";
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.is_directory()) {
      reachable += ReachableByOthers(entry.path());
    } else if (::lstat(entry.path().c_str(), &st) == 0 && (st.st_mode & 0044) != 0) {
      reachable += entry.path().string() + " " + Octal(st.st_mode) + "\n";
    }
  }
  return reachable;
}

// RocksDB creates its files (WAL, SST, MANIFEST, LOG) 0644 and its
// directory 0755 under the usual umask; the index keeps others out by its
// directory, 0700, so no file of it, now or later, is theirs to read.
TEST_F(NvmeIndexTest, NothingUnderTheIndexIsReadableByOthers) {
  const mode_t old_umask = ::umask(022);  // the usual umask: RocksDB's own modes show
  {
    auto index = Open();
    ASSERT_NE(index, nullptr);
    for (uint32_t i = 0; i < 64; ++i) ASSERT_TRUE(index->Put(BlockKey{i, 1}, Entry(1, 4096 * i)).ok());
  }
  {
    auto reopened = Open();  // the WAL becomes an SST, a new MANIFEST and LOG are written
    ASSERT_NE(reopened, nullptr);
    ASSERT_TRUE(reopened->Put(BlockKey{99, 1}, Entry(2, 0)).ok());
    struct stat st {};
    ASSERT_EQ(::stat((dir_ + "/index").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    EXPECT_EQ(ReachableByOthers(dir_ + "/index"), "");
  }
  ::umask(old_umask);
}

// An index directory that exists open to others (made by an older kvtierd,
// or by hand) is made private when the index opens.
TEST_F(NvmeIndexTest, AnIndexDirectoryOpenToOthersIsMadePrivate) {
  const std::string path = dir_ + "/index";
  ASSERT_EQ(::mkdir(path.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(path.c_str(), 0755), 0);
  auto index = Open();
  ASSERT_NE(index, nullptr);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

// The index is opened without following a symbolic link, and what is not a
// directory is refused with its name.
TEST_F(NvmeIndexTest, ASymlinkOrAFileAsTheIndexIsRefused) {
  const std::string target = dir_ + "/elsewhere";
  ASSERT_EQ(::mkdir(target.c_str(), 0700), 0);
  const std::string link = dir_ + "/index";
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  auto through_link = NvmeIndex::Open(link, false);
  ASSERT_FALSE(through_link.ok());
  EXPECT_EQ(through_link.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(through_link.status().message().find(link + " is a symbolic link"), std::string::npos)
      << through_link.status().message();
  const std::string file = dir_ + "/file";
  { std::ofstream(file) << "x"; }
  auto on_file = NvmeIndex::Open(file, false);
  ASSERT_FALSE(on_file.ok());
  EXPECT_NE(on_file.status().message().find(file + " is not a directory"), std::string::npos)
      << on_file.status().message();
}

TEST_F(NvmeIndexTest, UnwritablePathIsAClearError) {
  auto index = NvmeIndex::Open("/proc/kvtier-index-cannot-live-here", false);
  ASSERT_FALSE(index.ok());
  EXPECT_NE(index.status().message().find("/proc/kvtier-index-cannot-live-here"), std::string::npos);
}

}  // namespace
}  // namespace kvtier
