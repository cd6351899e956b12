// CorruptionCheck: blocks a client's verified read found not matching
// their checksums (a corruption report: an Erase with `corrupt`), checked
// again by the daemon before anything is dropped, so a report can never
// evict a sound block.
//
// Check pins each reported block the host tier holds under the reported
// namespace (Hooks::pin, with every layer's checksum) at once, on the
// caller's thread, then hashes it again on the `io` mover (off the
// request thread) against the checksums recorded when it was committed:
// the whole block's and, for a block of several layers, each layer's. A
// block that disagrees is removed from the host tier (a pinned block
// becomes a zombie its last release frees) if it is still the block that
// was hashed (same namespace, extent and checksum); one that agrees is
// kept. Copies in the tiers below stay (each verifies its own on read).
// Every pin is released (Hooks::release) once its block is checked.
// `done` runs exactly once with the number of blocks dropped: inline when
// no reported block is in the host tier (or the report is refused), else
// on the mover's thread once every block is checked, so the reporter's
// answer (and failed read) comes after the drop. Refused: InvalidArgument
// past kMaxReportedKeys keys, Busy (nothing checked) when the mover's
// queue is full.
//
// Counters (EngineCounters): corrupt_reports (blocks checked),
// corrupt_drops (found corrupt and dropped), corrupt_reports_refuted
// (found intact). The job counts as I/O in flight (Hooks::io_started,
// io_finished) from its submission until `done` has run.
//
// Thread-safe, no lock of its own: one shard lock at a time, held across
// Hooks::pin only; none across hashing, `release` or `done`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "common/clock.h"
#include "daemon/engine/engine_counters.h"
#include "daemon/engine/engine_types.h"
#include "daemon/engine/mover.h"
#include "kvtier/block_key.h"
#include "kvtier/client.h"
#include "kvtier/result.h"
#include "tiers/host/host_tier.h"

namespace kvtier {

class BlockIndex;

class CorruptionCheck {
 public:
  struct Hooks {
    // I/O in flight: before the check's job is queued, and after `done`.
    std::function<void()> io_started, io_finished;
    // Pins the committed host block `key` of `shard` for the check, with
    // every layer's checksum. Called with the shard's lock held.
    std::function<PinGrant(BlockIndex& shard, const BlockKey& key, uint64_t now_us)> pin;
    // Releases a pin `pin` gave. Called with no lock held.
    std::function<void(LeaseId lease)> release;
    // A block found corrupt and dropped; called under the shard's lock
    // (it may take only a leaf lock). May be empty.
    std::function<void(const BlockKey&)> corrupt;
  };
  static constexpr size_t kMaxReportedKeys = 64;

  // Every reference is borrowed and outlives the check; `io` runs the
  // hashing (the owner destroys it, running its queued jobs, first).
  CorruptionCheck(const std::vector<std::unique_ptr<BlockIndex>>& shards, const HostTier& host, const Clock& clock,
                  Mover& io, EngineCounters& counters, Hooks hooks);
  CorruptionCheck(const CorruptionCheck&) = delete;
  CorruptionCheck& operator=(const CorruptionCheck&) = delete;

  // Checks the reported `keys` of `ns` (see above).
  void Check(const NamespaceFingerprint& ns, std::span<const BlockKey> keys, std::function<void(Result<size_t>)> done);

 private:
  // A reported block, pinned until checked.
  struct Reported {
    BlockKey key;
    PinGrant pin;  // with the checksum of every layer
  };
  // On the mover's thread: hashes each of `held` and drops those that
  // disagree; returns how many were dropped. Releases every pin.
  size_t CheckHeld(const NamespaceFingerprint& ns, std::vector<Reported>& held);
  BlockIndex& ShardFor(const BlockKey& key) const;

  const std::vector<std::unique_ptr<BlockIndex>>& shards_;
  const HostTier& host_;
  const Clock& clock_;
  Mover& io_;
  EngineCounters& counters_;
  const Hooks hooks_;
};

}  // namespace kvtier
