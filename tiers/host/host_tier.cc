#include "tiers/host/host_tier.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <utility>

#include "common/check.h"
#include "common/logging.h"

namespace kvtier {

namespace {

void CloseKept(const HostKeep& keep) {
  if (keep.arena_fd >= 0) ::close(keep.arena_fd);
  if (keep.journal_fd >= 0) ::close(keep.journal_fd);
}

// The kept arena and journal of `keep` when both are there and fit `o`;
// nulls (after one log line saying why, and release_kept) when they do
// not: anything wrong with a kept pair starts the tier empty. One failure
// fails the start instead, keeping the pair: the machine lacks the memory
// the kept arena has yet to allocate (NoSpace). A new arena would need at
// least as much once the kept one is freed, so it would fail as well, and
// the kept blocks would be lost for nothing; the next start, with the
// memory there, adopts them. Takes the fds.
Result<std::pair<std::unique_ptr<HostArena>, std::unique_ptr<HostJournal>>> OpenKept(const HostArenaOptions& o,
                                                                                     const HostKeep& keep) {
  std::pair<std::unique_ptr<HostArena>, std::unique_ptr<HostJournal>> out;
  if (keep.arena_fd < 0 && keep.journal_fd < 0) return out;
  const auto reject = [&](const std::string& why) {
    spdlog::warn("{}: {}; starting empty", o.name, why);
    if (keep.release_kept) keep.release_kept();
  };
  if (keep.arena_fd < 0 || keep.journal_fd < 0 || !keep.journal) {
    CloseKept(keep);
    reject(!keep.journal ? "keeping is off" : "a kept arena came without its journal (or the other way round)");
    return out;
  }
  auto journal = HostJournal::Attach(keep.journal_fd, o.capacity_bytes);
  if (!journal.ok()) {
    ::close(keep.arena_fd);
    reject(journal.status().message());
    return out;
  }
  HostArenaOptions kept = o;
  kept.kept_fd = keep.arena_fd;
  auto arena = HostArena::Open(kept);
  if (!arena.ok() && arena.status().code() == StatusCode::kNoSpace) {
    return NoSpace(arena.status().message() +
                   " (the kept arena and its blocks stay kept for the next start: free memory; a new "
                   "host.capacity_bytes would drop them)");
  }
  if (!arena.ok()) {
    reject("the kept arena cannot be mapped: " + arena.status().message());
    return out;
  }
  out.first = std::move(*arena);
  out.second = std::move(*journal);
  return out;
}

}  // namespace

Result<std::unique_ptr<HostTier>> HostTier::Open(const HostArenaOptions& o, uint32_t directory_slots,
                                                 const HostKeep& keep) {
  if (o.capacity_bytes < ArenaAllocator::kAlignmentBytes) {
    CloseKept(keep);
    return InvalidArgument("host tier capacity_bytes " + std::to_string(o.capacity_bytes) +
                           " is below the minimum of " + std::to_string(ArenaAllocator::kAlignmentBytes));
  }
  auto opened_kept = OpenKept(o, keep);
  if (!opened_kept.ok()) return opened_kept.status();
  auto [arena, journal] = std::move(*opened_kept);
  const bool adopted = arena != nullptr;
  if (!adopted) {
    auto opened = HostArena::Open(o);
    if (!opened.ok()) return opened.status();
    arena = std::move(*opened);
    if (keep.journal) {
      auto created = HostJournal::Create(o.capacity_bytes, o.name + "-journal");
      if (!created.ok()) return created.status();
      journal = std::move(*created);
    }
  }
  std::unique_ptr<HostDirectory> directory;
  if (directory_slots > 0) {
    auto opened = HostDirectory::Open(directory_slots);
    if (!opened.ok()) return opened.status();
    directory = std::move(*opened);
  }
  std::unique_ptr<HostTier> tier(new HostTier(std::move(arena), std::move(directory), std::move(journal)));
  if (adopted) tier->ClaimRecovered(o.name);
  return tier;
}

HostTier::HostTier(std::unique_ptr<HostArena> arena, std::unique_ptr<HostDirectory> directory,
                   std::unique_ptr<HostJournal> journal)
    : arena_(std::move(arena)),
      directory_(std::move(directory)),
      journal_(std::move(journal)),
      capacity_bytes_(arena_->capacity_bytes() / ArenaAllocator::kAlignmentBytes * ArenaAllocator::kAlignmentBytes),
      allocator_(arena_->capacity_bytes(), arena_->allocated_bytes()) {}

void HostTier::ClaimRecovered(const std::string& name) {
  adopted_ = true;
  MutexLock lock(mu_);
  uint64_t overlapping = 0;
  for (const HostJournal::Recovered& r : journal_->recovered()) {
    const Extent extent{r.record.offset, ArenaAllocator::ClassSize(r.record.size)};
    // Outside what the arena has allocated (HostArena reads it off the kept
    // memfd) or over another block: not a record this tier wrote.
    if (!allocator_.Claim(extent)) {
      journal_->Remove(r.slot);
      ++overlapping;
      continue;
    }
    adopted_blocks_.push_back({r.slot, r.record, extent});
  }
  spdlog::info("{}: adopted a kept arena of {} bytes with {} recorded blocks ({} being written when it stopped{})",
               name, capacity_bytes_, adopted_blocks_.size(), journal_->torn(),
               overlapping > 0 ? ", " + std::to_string(overlapping) + " overlapping dropped" : std::string());
}

std::vector<AdoptedBlock> HostTier::TakeAdopted() {
  MutexLock lock(mu_);
  return std::exchange(adopted_blocks_, {});
}

void HostTier::FreeAdopted(const AdoptedBlock& block) {
  journal_->Remove(block.slot);
  Free(block.extent);
}

Result<HostTier::Extent> HostTier::Allocate(uint64_t bytes) {
  if (!CanEverHold(bytes)) {
    return InvalidArgument("host tier allocation of " + std::to_string(bytes) +
                           " bytes can never fit: its size class must be at most the " +
                           std::to_string(capacity_bytes_) + "-byte arena");
  }
  uint64_t free_bytes = 0;
  uint64_t largest_free_bytes = 0;
  {
    const uint64_t allocated = arena_->allocated_bytes();
    MutexLock lock(mu_);
    allocator_.Grow(allocated);
    if (auto extent = allocator_.Allocate(bytes)) return *extent;
    free_bytes = allocator_.free_bytes();
    largest_free_bytes = allocator_.largest_free_bytes();
  }
  return NoSpace("host tier cannot allocate " + std::to_string(bytes) + " bytes (class " +
                 std::to_string(ArenaAllocator::ClassSize(bytes)) + "): free " + std::to_string(free_bytes) +
                 " bytes, largest free range " + std::to_string(largest_free_bytes) + " bytes");
}

bool HostTier::AwaitGrowth(std::chrono::milliseconds timeout) const {
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  uint64_t usable = 0;  // what the last Allocate could hand out
  {
    MutexLock lock(mu_);
    usable = allocator_.usable_bytes();
  }
  // Growth that landed since that Allocate counts too.
  while (arena_->allocated_bytes() <= usable) {
    if (!arena_->growing() || std::chrono::steady_clock::now() >= give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

bool HostTier::CanEverHold(uint64_t bytes) const {
  return bytes > 0 && bytes <= capacity_bytes_ && ArenaAllocator::ClassSize(bytes) <= capacity_bytes_;
}

void HostTier::Free(const Extent& e) {
  MutexLock lock(mu_);
  allocator_.Free(e);
}

std::span<std::byte> HostTier::Bytes(const Extent& e) const {
  KVTIER_CHECK(e.offset <= capacity_bytes_ && e.length <= capacity_bytes_ - e.offset, "extent outside the host arena");
  return {arena_->base() + e.offset, static_cast<size_t>(e.length)};
}

uint64_t HostTier::used_bytes() const {
  MutexLock lock(mu_);
  return allocator_.used_bytes();
}

void HostTier::VisitCounters(CounterVisitor& v) const {
  arena_->VisitCounters(v);
  {
    MutexLock lock(mu_);
    allocator_.VisitCounters(v);
  }
  if (directory_ != nullptr) directory_->VisitCounters(v);
  if (journal_ != nullptr) {
    v.VisitGauge("host.journal.records", static_cast<int64_t>(journal_->live()));
    v.VisitGauge("host.journal.slots", static_cast<int64_t>(journal_->slot_count()));
  }
}

void HostTier::CheckHealth(HealthFindings& out) const {
  if (!locked()) out.AddWarning("the host arena is not locked in memory (RLIMIT_MEMLOCK): the kernel may swap it");
  if (arena_->warm_failed() && arena_->allocated_bytes() < arena_->capacity_bytes()) {
    out.AddWarning("the host arena could allocate only " + std::to_string(arena_->allocated_bytes()) + " of its " +
                   std::to_string(arena_->capacity_bytes()) +
                   " bytes (see the log: the machine ran short of memory): the host tier holds that much");
  } else if (arena_->warm_failed()) {
    out.AddWarning("the host arena's warm-up stopped at " + std::to_string(arena_->warm_bytes()) + " of " +
                   std::to_string(arena_->capacity_bytes()) +
                   " bytes (see the log): the rest is mapped as it is written");
  }
}

}  // namespace kvtier
