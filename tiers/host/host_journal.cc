#include "tiers/host/host_journal.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <limits>

#include "common/logging.h"

namespace kvtier {

namespace {

struct JournalHeader {
  uint64_t magic = 0;
  uint32_t version = 0;
  uint32_t slot_count = 0;
  uint64_t arena_bytes = 0;
  uint64_t slot_bytes = 0;  // sizeof(JournalSlot), so another layout is refused
  uint64_t reserved[4] = {};
};
static_assert(sizeof(JournalHeader) == 64);

// The record as stored: 64 bytes, every field an 8-byte atomic.
struct JournalSlot {
  std::atomic<uint64_t> seq{0};
  std::atomic<uint64_t> key_hi{0}, key_lo{0}, ns_hi{0}, ns_lo{0};
  std::atomic<uint64_t> size{0};  // 0: free
  std::atomic<uint64_t> checksum{0};
  // The offset in 4 KiB pages (low 32 bits: up to 16 TiB of arena) and the
  // layer count (high 32 bits).
  std::atomic<uint64_t> page_and_layers{0};
};
static_assert(sizeof(JournalSlot) == 64);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

Status SysError(const char* what) {
  return IoError(std::string(what) + " of the host journal: " + std::strerror(errno));
}

uint64_t BytesFor(uint32_t slot_count) { return sizeof(JournalHeader) + uint64_t{slot_count} * sizeof(JournalSlot); }

JournalSlot& SlotAt(std::byte* base, uint32_t slot) {
  return *reinterpret_cast<JournalSlot*>(base + sizeof(JournalHeader) + uint64_t{slot} * sizeof(JournalSlot));
}

}  // namespace

HostJournal::HostJournal(int fd, std::byte* base, uint64_t bytes, uint32_t slot_count)
    : fd_(fd), base_(base), bytes_(bytes), slot_count_(slot_count) {}

HostJournal::~HostJournal() {
  ::munmap(base_, bytes_);
  ::close(fd_);
}

Result<std::unique_ptr<HostJournal>> HostJournal::Map(int fd, uint64_t bytes, uint32_t slot_count) {
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    Status s = SysError("mmap");
    ::close(fd);
    return s;
  }
  return std::unique_ptr<HostJournal>(new HostJournal(fd, static_cast<std::byte*>(base), bytes, slot_count));
}

Result<std::unique_ptr<HostJournal>> HostJournal::Create(uint64_t arena_bytes, const std::string& name) {
  const uint64_t slots = arena_bytes / kJournalBytesPerSlot + 1;
  if (arena_bytes == 0 || slots >= std::numeric_limits<uint32_t>::max()) {
    return InvalidArgument("host journal: no slot count for an arena of " + std::to_string(arena_bytes) + " bytes");
  }
  const int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return SysError("memfd_create");
  const uint64_t bytes = BytesFor(static_cast<uint32_t>(slots));
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    Status s = SysError("ftruncate / seal");
    ::close(fd);
    return s;
  }
  auto journal = Map(fd, bytes, static_cast<uint32_t>(slots));
  if (!journal.ok()) return journal.status();
  JournalHeader header;
  header.magic = kJournalMagic;
  header.version = kJournalVersion;
  header.slot_count = static_cast<uint32_t>(slots);
  header.arena_bytes = arena_bytes;
  header.slot_bytes = sizeof(JournalSlot);
  std::memcpy((*journal)->base_, &header, sizeof(header));
  return journal;
}

Result<std::unique_ptr<HostJournal>> HostJournal::Attach(int fd, uint64_t arena_bytes) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    Status s = SysError("fstat");
    ::close(fd);
    return s;
  }
  JournalHeader header;
  const auto mismatch = [fd](const std::string& why) {
    ::close(fd);
    return FailedPrecondition("the kept host journal " + why);
  };
  if (static_cast<uint64_t>(st.st_size) < sizeof(header) || ::pread(fd, &header, sizeof(header), 0) != sizeof(header)) {
    return mismatch("is too short to have a header");
  }
  if (header.magic != kJournalMagic) return mismatch("is not a kvtier host journal");
  if (header.version != kJournalVersion || header.slot_bytes != sizeof(JournalSlot)) {
    return mismatch("has format version " + std::to_string(header.version) + ", this kvtierd writes " +
                    std::to_string(kJournalVersion));
  }
  if (header.arena_bytes != arena_bytes) {
    return mismatch("is for an arena of " + std::to_string(header.arena_bytes) + " bytes, this one has " +
                    std::to_string(arena_bytes));
  }
  const uint64_t bytes = BytesFor(header.slot_count);
  if (header.slot_count != arena_bytes / kJournalBytesPerSlot + 1 || static_cast<uint64_t>(st.st_size) != bytes) {
    return mismatch("has " + std::to_string(header.slot_count) + " slots in " + std::to_string(st.st_size) + " bytes");
  }
  auto mapped = Map(fd, bytes, header.slot_count);
  if (!mapped.ok()) return mapped.status();
  HostJournal& journal = **mapped;
  MutexLock lock(journal.mu_);
  // Only the pages holding data are read (SEEK_DATA), each up to its own
  // end: touching a hole through the mapping would allocate it.
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  constexpr uint64_t kHeader = sizeof(JournalHeader);
  constexpr uint64_t kSlot = sizeof(JournalSlot);
  std::vector<uint32_t> stale;  // slots read that hold no whole record: cleared below
  uint64_t next = 0;
  while (next < journal.slot_count_) {
    const off_t data = ::lseek(fd, static_cast<off_t>(kHeader + next * kSlot), SEEK_DATA);
    if (data < 0) break;  // ENXIO: no data past it
    const uint64_t page_end = (static_cast<uint64_t>(data) / page + 1) * page;
    const uint64_t first = std::max(next, (std::max<uint64_t>(data, kHeader) - kHeader + kSlot - 1) / kSlot);
    const uint64_t end = std::min<uint64_t>(journal.slot_count_, (page_end - kHeader) / kSlot);
    for (uint64_t s = first; s < end; ++s) {
      const JournalSlot& stored = SlotAt(journal.base_, static_cast<uint32_t>(s));
      const uint64_t seq = stored.seq.load(std::memory_order_acquire);
      const uint64_t size = stored.size.load(std::memory_order_relaxed);
      if (seq % 2 == 1) {
        ++journal.torn_;
        stale.push_back(static_cast<uint32_t>(s));
        continue;
      }
      if (size == 0) continue;
      Recovered r;
      r.slot = static_cast<uint32_t>(s);
      r.record.key = {stored.key_hi.load(std::memory_order_relaxed), stored.key_lo.load(std::memory_order_relaxed)};
      r.record.ns = {stored.ns_hi.load(std::memory_order_relaxed), stored.ns_lo.load(std::memory_order_relaxed)};
      r.record.size = size;
      r.record.checksum = stored.checksum.load(std::memory_order_relaxed);
      const uint64_t packed = stored.page_and_layers.load(std::memory_order_relaxed);
      r.record.offset = (packed & 0xffffffffu) * kJournalBytesPerSlot;
      r.record.layer_count = static_cast<uint32_t>(packed >> 32);
      if (r.record.offset > arena_bytes || r.record.size > arena_bytes - r.record.offset) {
        ++journal.torn_;
        stale.push_back(static_cast<uint32_t>(s));
        continue;
      }
      journal.recovered_.push_back(r);
    }
    next = std::max(end, next + 1);
  }
  // Slots taken: the recovered ones; every other slot below the highest is
  // free. What a torn or bad record left is cleared, so it is free next
  // time too (slots never read are holes: zero, and left unallocated).
  uint32_t high = 0;
  for (const Recovered& r : journal.recovered_) high = std::max(high, r.slot + 1);
  journal.high_water_ = high;
  for (uint32_t slot : stale) journal.Write(slot, JournalRecord{});
  size_t taken = 0;
  for (uint32_t s = 0; s < high; ++s) {
    if (taken < journal.recovered_.size() && journal.recovered_[taken].slot == s) {
      ++taken;
      continue;
    }
    journal.free_slots_.push_back(s);
  }
  std::make_heap(journal.free_slots_.begin(), journal.free_slots_.end(), std::greater<>());
  journal.live_ = journal.recovered_.size();
  return mapped;
}

void HostJournal::Write(uint32_t slot, const JournalRecord& r) {
  JournalSlot& stored = SlotAt(base_, slot);
  const uint64_t seq = stored.seq.load(std::memory_order_relaxed);
  stored.seq.store(seq | 1, std::memory_order_relaxed);  // odd: being written
  std::atomic_thread_fence(std::memory_order_release);
  stored.key_hi.store(r.key.hi, std::memory_order_relaxed);
  stored.key_lo.store(r.key.lo, std::memory_order_relaxed);
  stored.ns_hi.store(r.ns.hi, std::memory_order_relaxed);
  stored.ns_lo.store(r.ns.lo, std::memory_order_relaxed);
  stored.checksum.store(r.checksum, std::memory_order_relaxed);
  stored.page_and_layers.store((uint64_t{r.layer_count} << 32) | (r.offset / kJournalBytesPerSlot),
                               std::memory_order_relaxed);
  stored.size.store(r.size, std::memory_order_relaxed);
  stored.seq.store((seq | 1) + 1, std::memory_order_release);  // even: whole
}

uint32_t HostJournal::Add(const JournalRecord& record) {
  MutexLock lock(mu_);
  uint32_t slot = kNoSlot;
  if (!free_slots_.empty()) {
    std::pop_heap(free_slots_.begin(), free_slots_.end(), std::greater<>());
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else if (high_water_ < slot_count_) {
    slot = high_water_++;
  } else {
    if (!full_logged_) spdlog::error("host journal: all {} slots taken; a block was not recorded", slot_count_);
    full_logged_ = true;
    return kNoSlot;
  }
  Write(slot, record);
  ++live_;
  return slot;
}

void HostJournal::Remove(uint32_t slot) {
  if (slot == kNoSlot || slot >= slot_count_) return;
  MutexLock lock(mu_);
  Write(slot, JournalRecord{});
  free_slots_.push_back(slot);
  std::push_heap(free_slots_.begin(), free_slots_.end(), std::greater<>());
  --live_;
}

uint64_t HostJournal::live() const {
  MutexLock lock(mu_);
  return live_;
}

}  // namespace kvtier
