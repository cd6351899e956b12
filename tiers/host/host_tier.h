// HostTier: the host (DRAM) tier the daemon engine uses. A HostArena plus an
// ArenaAllocator behind one mutex. It stores bytes and reports usage; it
// decides nothing: when Allocate fails with NoSpace, the caller evicts and
// retries.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/counters.h"
#include "common/health_findings.h"
#include "common/mutex.h"
#include "kvtier/result.h"
#include "tiers/host/arena_allocator.h"
#include "tiers/host/host_arena.h"
#include "tiers/host/host_directory.h"
#include "tiers/host/host_journal.h"

namespace kvtier {

// What survives a restart (docs/OPERATIONS.md "Restarts"): with `journal`
// the tier records its committed blocks in a HostJournal, so that the arena
// and the journal, kept by systemd's file descriptor store, can be adopted
// by the next daemon: given both fds, Open maps that arena and claims the
// extents of the journal's blocks, for the engine to verify and take
// (TakeAdopted). A kept pair that does not fit (another size, format or
// version) is dropped with one log line and the tier starts empty. A kept
// arena the machine lacks the memory to complete fails Open (NoSpace) and
// stays kept: release_kept is not called.
struct HostKeep {
  bool journal = false;  // record committed blocks (needed to keep anything)
  int arena_fd = -1;     // a kept arena and its journal (Open takes both fds)
  int journal_fd = -1;
  // Called when the kept pair is not adopted, before a new arena is
  // allocated: whoever keeps a copy lets go of it (its memory is freed).
  std::function<void()> release_kept;
};

// A block of a kept arena that Open claimed: its extent is allocated and
// its journal slot taken until the engine commits it or gives it back
// (FreeAdopted).
struct AdoptedBlock {
  uint32_t slot = 0;
  JournalRecord record;
  ArenaAllocator::Extent extent;
};

// Thread-safe: every method may be called from any thread. Bytes() hands out
// a view without locking; the caller makes sure the extent stays allocated
// (e.g. pinned) while it reads or writes through it.
class HostTier {
 public:
  using Extent = ArenaAllocator::Extent;

  // Opens the arena (see HostArena::Open for errors). Also InvalidArgument
  // when capacity_bytes < ArenaAllocator::kAlignmentBytes. Usable capacity is
  // capacity_bytes rounded down to kAlignmentBytes. With `directory_slots`
  // > 0 the tier also opens a block directory of that many slots (see
  // HostDirectory::Open for its errors); 0 opens none.
  // `keep` as HostKeep says (its fds are taken on every path).
  static Result<std::unique_ptr<HostTier>> Open(const HostArenaOptions& o, uint32_t directory_slots = 0,
                                                const HostKeep& keep = {});

  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;

  // Reserves ArenaAllocator::ClassSize(bytes) bytes of the part of the
  // arena allocated so far (HostArena::allocated_bytes(), which may grow
  // behind the socket after a start: see AwaitGrowth). Never waits. Returns
  //   InvalidArgument  !CanEverHold(bytes);
  //   NoSpace          no free range fits; the message gives the requested
  //                    bytes, the class size, free bytes and the largest
  //                    free range. Evict and retry.
  Result<Extent> Allocate(uint64_t bytes);

  // While the arena is still being allocated: waits until it has
  // allocated more than the last Allocate could hand out, at most
  // `timeout`; true when it has (at once when that growth landed already:
  // an Allocate that failed may then succeed), false when it has not and
  // the arena is no longer growing. For
  // the evictor, so that no block is evicted for want of room that is
  // about to come.
  bool AwaitGrowth(std::chrono::milliseconds timeout) const;

  // Whether a block of `bytes` fits the arena when it is empty (its size
  // class, not only its size, must fit). Allocate refuses the others.
  bool CanEverHold(uint64_t bytes) const;

  // Returns `e`, exactly as Allocate returned it. Aborts on a double free or
  // an extent this tier did not hand out.
  void Free(const Extent& e);

  // The bytes of `e` inside the arena. Aborts unless `e` lies within the
  // capacity. Does not check that `e` is live.
  std::span<std::byte> Bytes(const Extent& e) const;

  // The arena's memfd, to pass to clients (owned by this tier).
  int memfd() const { return arena_->fd(); }
  uint64_t capacity_bytes() const { return capacity_bytes_; }
  // The part of the arena allocated so far (HostArena::allocated_bytes()).
  uint64_t allocated_bytes() const { return arena_->allocated_bytes(); }
  uint64_t used_bytes() const;
  // Whether the arena is locked in memory (see HostArenaOptions::lock).
  bool locked() const { return arena_->locked(); }
  // The block directory published next to the arena; null when none.
  HostDirectory* directory() const { return directory_.get(); }
  // The journal of committed blocks (HostKeep::journal); null when none.
  HostJournal* journal() const { return journal_.get(); }
  // Whether Open adopted a kept arena (its blocks are TakeAdopted's).
  bool adopted() const { return adopted_; }
  // The blocks of the kept arena Open claimed, once (later calls: none).
  std::vector<AdoptedBlock> TakeAdopted();
  // An adopted block that will not be committed: its slot and extent go.
  void FreeAdopted(const AdoptedBlock& block);

  // host.arena.*, host.alloc.*, then host.directory.* and host.journal.*
  // (records, slots) of those there are.
  void VisitCounters(CounterVisitor& v) const;
  // A warning when the arena is not locked in memory (it may be swapped).
  void CheckHealth(HealthFindings& out) const;

 private:
  HostTier(std::unique_ptr<HostArena> arena, std::unique_ptr<HostDirectory> directory,
           std::unique_ptr<HostJournal> journal);
  // Claims the extent of every whole record of the adopted journal that
  // lies in what the arena has allocated; logs what it found under the
  // arena's `name`.
  void ClaimRecovered(const std::string& name);

  const std::unique_ptr<HostArena> arena_;          // immutable after construction
  const std::unique_ptr<HostDirectory> directory_;  // may be null; thread-safe itself
  const std::unique_ptr<HostJournal> journal_;      // may be null; thread-safe itself
  bool adopted_ = false;                            // set by Open
  const uint64_t capacity_bytes_;                   // the allocator's (rounded) capacity
  mutable Mutex mu_;
  // Its usable part follows the arena's allocated_bytes() (Allocate).
  ArenaAllocator allocator_ GUARDED_BY(mu_);
  std::vector<AdoptedBlock> adopted_blocks_ GUARDED_BY(mu_);
};

}  // namespace kvtier
