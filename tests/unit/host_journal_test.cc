// The host journal (tiers/host/host_journal.h): what it records comes back
// after the memfd changes hands, a record being written when the daemon
// died or naming bytes outside the arena is skipped and its slot freed,
// slots are reused lowest first, and a journal of another arena or format
// is refused.
#include "tiers/host/host_journal.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <memory>

namespace kvtier {
namespace {

constexpr uint64_t kArenaBytes = 1 << 20;
constexpr uint64_t kHeaderBytes = 64;
constexpr uint64_t kSlotBytes = 64;

JournalRecord Record(uint64_t i) {
  JournalRecord r;
  r.ns = {0xabc, i};
  r.key = {0x1234, i};
  r.offset = i * 8192;
  r.size = 5000 + i;
  r.checksum = 0xfeed0000 + i;
  r.layer_count = i % 2 == 0 ? 0 : 4;
  return r;
}

void ExpectSame(const JournalRecord& a, const JournalRecord& b) {
  EXPECT_EQ(a.ns, b.ns);
  EXPECT_EQ(a.key, b.key);
  EXPECT_EQ(a.offset, b.offset);
  EXPECT_EQ(a.size, b.size);
  EXPECT_EQ(a.checksum, b.checksum);
  EXPECT_EQ(a.layer_count, b.layer_count);
}

// The journal's memfd, kept past the journal (as the fd store keeps it).
int Keep(const HostJournal& journal) { return ::dup(journal.fd()); }

TEST(HostJournal, RecordsComeBackAfterTheMemfdChangesHandsAndRemovedOnesDoNot) {
  auto journal = HostJournal::Create(kArenaBytes, "test-journal");
  ASSERT_TRUE(journal.ok()) << journal.status().ToString();
  EXPECT_EQ((*journal)->slot_count(), kArenaBytes / kJournalBytesPerSlot + 1);
  EXPECT_TRUE((*journal)->recovered().empty());
  std::vector<uint32_t> slots;
  for (uint64_t i = 0; i < 5; ++i) slots.push_back((*journal)->Add(Record(i)));
  EXPECT_EQ(slots, (std::vector<uint32_t>{0, 1, 2, 3, 4}));
  (*journal)->Remove(slots[1]);
  (*journal)->Remove(slots[3]);
  EXPECT_EQ((*journal)->live(), 3u);
  const int kept = Keep(**journal);
  journal->reset();

  auto again = HostJournal::Attach(kept, kArenaBytes);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  const auto& found = (*again)->recovered();
  ASSERT_EQ(found.size(), 3u);
  EXPECT_EQ(found[0].slot, 0u);
  EXPECT_EQ(found[1].slot, 2u);
  EXPECT_EQ(found[2].slot, 4u);
  ExpectSame(found[0].record, Record(0));
  ExpectSame(found[1].record, Record(2));
  ExpectSame(found[2].record, Record(4));
  EXPECT_EQ((*again)->torn(), 0u);
  EXPECT_EQ((*again)->live(), 3u);
  // The freed slots are handed out again, lowest first, then new ones.
  EXPECT_EQ((*again)->Add(Record(7)), 1u);
  EXPECT_EQ((*again)->Add(Record(8)), 3u);
  EXPECT_EQ((*again)->Add(Record(9)), 5u);
}

TEST(HostJournal, ARecordBeingWrittenOrOutsideTheArenaIsSkippedAndItsSlotFreed) {
  auto journal = HostJournal::Create(kArenaBytes, "test-journal");
  ASSERT_TRUE(journal.ok());
  for (uint64_t i = 0; i < 4; ++i) (*journal)->Add(Record(i));
  const int fd = (*journal)->fd();
  // Slot 1 died mid-write: its seqlock is odd.
  const uint64_t odd = 3;
  ASSERT_EQ(::pwrite(fd, &odd, sizeof(odd), kHeaderBytes + 1 * kSlotBytes), 8);
  // Slot 2 names bytes past the arena's end: its size (the sixth word).
  const uint64_t huge = kArenaBytes;
  ASSERT_EQ(::pwrite(fd, &huge, sizeof(huge), kHeaderBytes + 2 * kSlotBytes + 5 * 8), 8);
  const int kept = Keep(**journal);
  journal->reset();

  auto again = HostJournal::Attach(kept, kArenaBytes);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_EQ((*again)->recovered().size(), 2u);
  EXPECT_EQ((*again)->recovered()[0].slot, 0u);
  EXPECT_EQ((*again)->recovered()[1].slot, 3u);
  EXPECT_EQ((*again)->torn(), 2u);
  EXPECT_EQ((*again)->Add(Record(5)), 1u);
  EXPECT_EQ((*again)->Add(Record(6)), 2u);
  // What was skipped is cleared: a third start finds the two added, not the torn ones.
  const int third = Keep(**again);
  again->reset();
  auto last = HostJournal::Attach(third, kArenaBytes);
  ASSERT_TRUE(last.ok());
  EXPECT_EQ((*last)->recovered().size(), 4u);
  EXPECT_EQ((*last)->torn(), 0u);
}

TEST(HostJournal, AJournalOfAnotherArenaOrFormatIsRefused) {
  auto journal = HostJournal::Create(kArenaBytes, "test-journal");
  ASSERT_TRUE(journal.ok());
  (*journal)->Add(Record(0));
  auto other = HostJournal::Attach(Keep(**journal), 2 * kArenaBytes);
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(other.status().message().find("arena of"), std::string::npos) << other.status().ToString();

  const uint32_t version = 99;
  ASSERT_EQ(::pwrite((*journal)->fd(), &version, sizeof(version), 8), 4);
  auto newer = HostJournal::Attach(Keep(**journal), kArenaBytes);
  ASSERT_FALSE(newer.ok());
  EXPECT_EQ(newer.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(newer.status().message().find("version 99"), std::string::npos) << newer.status().ToString();

  const uint64_t garbage = 42;
  ASSERT_EQ(::pwrite((*journal)->fd(), &garbage, sizeof(garbage), 0), 8);
  auto foreign = HostJournal::Attach(Keep(**journal), kArenaBytes);
  ASSERT_FALSE(foreign.ok());
  EXPECT_EQ(foreign.status().code(), StatusCode::kFailedPrecondition);
}

TEST(HostJournal, EveryBlockTheArenaCanHoldHasASlot) {
  constexpr uint64_t kSmall = 16 * kJournalBytesPerSlot;
  auto journal = HostJournal::Create(kSmall, "test-journal");
  ASSERT_TRUE(journal.ok());
  for (uint64_t i = 0; i < kSmall / kJournalBytesPerSlot; ++i) {
    JournalRecord r = Record(i);
    r.offset = i * kJournalBytesPerSlot;
    r.size = kJournalBytesPerSlot;
    EXPECT_NE((*journal)->Add(r), HostJournal::kNoSlot) << i;
  }
  EXPECT_EQ((*journal)->live(), kSmall / kJournalBytesPerSlot);
}

// Attach reads only the pages that hold records: the rest of the memfd
// (one slot per 4 KiB of arena) stays unallocated, so a kept journal costs
// about 64 bytes per block ever live at once, not 1/64 of the arena.
TEST(HostJournal, AttachLeavesThePagesNoRecordTouchedUnallocated) {
  constexpr uint64_t kBig = uint64_t{256} << 20;  // 65537 slots: 4 MiB of journal
  auto journal = HostJournal::Create(kBig, "test-journal");
  ASSERT_TRUE(journal.ok());
  std::vector<uint32_t> slots;
  for (uint64_t i = 0; i < 1000; ++i) {
    JournalRecord r = Record(i);
    r.offset = i * kJournalBytesPerSlot;
    slots.push_back((*journal)->Add(r));
  }
  for (size_t i = 1; i + 1 < slots.size(); ++i) (*journal)->Remove(slots[i]);
  const auto allocated = [](int fd) {
    struct stat st {};
    EXPECT_EQ(::fstat(fd, &st), 0);
    return static_cast<uint64_t>(st.st_blocks) * 512;
  };
  const uint64_t before = allocated((*journal)->fd());
  EXPECT_LE(before, uint64_t{20} * 4096);
  const int kept = Keep(**journal);
  journal->reset();
  auto again = HostJournal::Attach(kept, kBig);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_EQ((*again)->recovered().size(), 2u);
  EXPECT_EQ((*again)->recovered()[0].slot, 0u);
  EXPECT_EQ((*again)->recovered()[1].slot, 999u);
  EXPECT_EQ(allocated((*again)->fd()), before);
  // And again: nothing more is allocated by reading.
  const int third = Keep(**again);
  again->reset();
  auto last = HostJournal::Attach(third, kBig);
  ASSERT_TRUE(last.ok());
  EXPECT_EQ((*last)->recovered().size(), 2u);
  EXPECT_EQ(allocated((*last)->fd()), before);
}

}  // namespace
}  // namespace kvtier
