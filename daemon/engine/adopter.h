// Adopter: takes the blocks of a kept host arena (a previous daemon's, that
// survived it: tiers/host/host_journal.h) into the index after checking
// their bytes, on a thread of its own, while the daemon already serves.
//
// Each block HostTier::Open claimed is hashed where it lies (its checksum,
// and its layers' when the journal says it had layer checksums), then
// committed (BlockIndex::CommitAdopted: visible, published in the block
// directory, a KV event, ranked by the policy as a new block). A block
// whose bytes do not match what was committed, or whose key a client put
// again meanwhile, is given back (its extent and journal slot freed).
// Until its turn comes a block is not visible: a lookup misses it. An
// Erase or a DropNamespace meanwhile forgets it (Forget, ForgetNamespace),
// and a put that finds no room takes waiting blocks' space (GiveBack, the
// last in line first): either way it is given back, never committed.
//
// Thread-safe. The thread takes one shard's lock at a time, for the commit
// only, and the adopter's own mutex inside it (before the host tier's and
// the journal's, which FreeAdopted takes); the destructor stops it: blocks
// not yet checked keep their journal records, so the next start adopts
// them.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/counters.h"
#include "common/mutex.h"
#include "policy/eviction_policy.h"
#include "tiers/host/host_tier.h"

namespace kvtier {

class BlockIndex;

class Adopter {
 public:
  struct Hooks {
    std::function<BlockHandle()> next_handle;      // the engine's policy handles
    std::function<void(const BlockKey&)> corrupt;  // a kept block that failed its check (may be empty)
  };

  // Borrows the shards, the host tier and the clock (they outlive it).
  // Takes the host tier's adopted blocks now (they wait: Start).
  Adopter(const std::vector<std::unique_ptr<BlockIndex>>& shards, HostTier& host, const Clock& clock, Hooks hooks);
  ~Adopter();
  Adopter(const Adopter&) = delete;
  Adopter& operator=(const Adopter&) = delete;

  // Starts the thread (once; none when no block waits).
  void Start();
  // Stops the thread (blocks not yet checked keep their journal records).
  // Idempotent; the destructor calls it.
  void Stop();
  // Forgets the waiting blocks among `keys` of `ns` (an Erase: call it
  // before looking in the index). Returns how many there were.
  size_t Forget(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) EXCLUDES(mu_);
  // Forgets every waiting block of `ns` (a DropNamespace); how many.
  size_t ForgetNamespace(const NamespaceFingerprint& ns) EXCLUDES(mu_);
  // Gives back waiting blocks not yet started, the last in line first,
  // until `bytes` of extents are free (an allocation nothing evictable
  // could serve). Returns the bytes freed (0: none waits).
  uint64_t GiveBack(uint64_t bytes) EXCLUDES(mu_);

  // host.adopt.{blocks, bytes, corrupt, duplicates, forgotten, given_back}
  // and the gauge host.adopt.pending (blocks not yet checked).
  void VisitCounters(CounterVisitor& v) const;

 private:
  struct Waiting {
    NamespaceFingerprint ns;
    size_t index = 0;        // in blocks_
    bool forgotten = false;  // erased while being checked: the thread gives it back
  };
  void Run() EXCLUDES(mu_);
  // Checks block `i`'s bytes; commits it or gives it back.
  void Adopt(size_t i) EXCLUDES(mu_);
  // Gives back `it`'s block now (it has not been started). Erases `it`.
  void FreeLocked(std::unordered_map<BlockKey, Waiting>::iterator it) REQUIRES(mu_);

  const std::vector<std::unique_ptr<BlockIndex>>& shards_;
  HostTier& host_;
  const Clock& clock_;
  const Hooks hooks_;
  const std::vector<AdoptedBlock> blocks_;  // in the order the thread takes them
  std::atomic<bool> stopping_{false};
  mutable Mutex mu_;
  // The blocks not yet resolved, by key. Absent: committed or given back.
  std::unordered_map<BlockKey, Waiting> waiting_ GUARDED_BY(mu_);
  size_t next_ GUARDED_BY(mu_) = 0;  // the next index the thread takes; those below are its
  size_t end_ GUARDED_BY(mu_) = 0;   // GiveBack took every index from here on
  std::atomic<int64_t> pending_{0}, blocks_done_{0}, bytes_{0}, corrupt_{0}, duplicates_{0}, forgotten_{0},
      given_back_{0};
  std::thread thread_;
};

}  // namespace kvtier
