// Engine: the block index over the tiers, plus the policies that decide
// what stays. It is the daemon's only stateful core; the wire adapters
// (session.cc) translate requests into these calls.
//
// Thread-safe. The index is split into shards by key hash; each shard has its
// own mutex and its own eviction policy instance. No shard lock is held while
// another shard is locked, and none across I/O. Lock order: shard -> host
// tier (the tier's own mutex is a leaf).
//
// Block life cycle in the host tier:
//   Reserve -> [reserved, invisible] -> Commit -> [committed, visible]
//   committed + Pin -> [pinned: never evicted] -> Release -> committed
//   Erase of a pinned block -> [zombie: invisible] -> last Release -> freed
// A session's uncommitted reservations and leases die with CloseSession.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/counters.h"
#include "kvtier/block_key.h"
#include "kvtier/client.h"
#include "kvtier/result.h"
#include "tiers/host/host_tier.h"

namespace kvtier {

using SessionId = uint64_t;
using LeaseId = uint64_t;

struct EngineOptions {
  uint32_t shards = 8;          // 1..256
  std::string eviction = "lru"; // "lru" | "fifo"
};

struct SlotGrant {
  Status status;  // ok, AlreadyExists, NoSpace, InvalidArgument
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct PinGrant {
  Status status;  // ok or NotFound
  uint64_t offset = 0;
  uint64_t length = 0;
  LeaseId lease = 0;
  uint64_t checksum = 0;
};

struct LookupOutcome {
  size_t prefix_blocks = 0;
  std::vector<Tier> tiers;
};

struct EngineShard;

class Engine {
 public:
  // `host` and `clock` are borrowed and must outlive the Engine.
  // InvalidArgument for a bad shard count or policy name.
  static Result<std::unique_ptr<Engine>> Create(const EngineOptions& options, HostTier& host,
                                                const Clock& clock);
  ~Engine();

  // Longest prefix of `keys` committed under namespace `ns`, with tiers.
  // Does not count as a use for eviction.
  LookupOutcome Lookup(const NamespaceFingerprint& ns, std::span<const BlockKey> keys);

  // Reserves arena space for each key (sizes[i] bytes). Per key: ok with the
  // slot, AlreadyExists (committed or being written), NoSpace (nothing left
  // to evict), InvalidArgument (size 0 or larger than the arena).
  // Precondition: keys.size() == sizes.size().
  std::vector<SlotGrant> Reserve(SessionId session, const NamespaceFingerprint& ns,
                                 std::span<const BlockKey> keys, std::span<const uint64_t> sizes);

  // Publishes reserved blocks after checking that sizes[i] equals the
  // reserved size and recording the xxh3-64 of the bytes. Per key: ok,
  // FailedPrecondition (no reservation by this session), InvalidArgument
  // (size mismatch; the reservation is dropped and its space returns).
  std::vector<Status> Commit(SessionId session, const NamespaceFingerprint& ns,
                             std::span<const BlockKey> keys, std::span<const uint64_t> sizes);

  // Drops this session's reservations of `keys`; returns how many existed.
  size_t Abort(SessionId session, std::span<const BlockKey> keys);

  // Pins committed blocks and hands out one lease per block. Per key: ok or
  // NotFound. A pin is a use (recency, hit counters).
  std::vector<PinGrant> Pin(SessionId session, const NamespaceFingerprint& ns,
                            std::span<const BlockKey> keys);

  // Per lease: ok, NotFound (unknown or already released), PermissionDenied
  // (held by another session).
  std::vector<Status> Release(SessionId session, std::span<const LeaseId> leases);

  // Removes committed blocks; returns how many there were.
  size_t Erase(const NamespaceFingerprint& ns, std::span<const BlockKey> keys);

  // Frees every reservation and lease of `session`. Idempotent.
  void CloseSession(SessionId session);

  void VisitCounters(CounterVisitor& v) const;

 private:
  Engine(const EngineOptions& options, HostTier& host, const Clock& clock);

  EngineShard& ShardFor(const BlockKey& key);
  // Allocates `bytes`, evicting least-valuable unpinned blocks as needed.
  Result<HostTier::Extent> AllocateWithEviction(uint64_t bytes);
  // Evicts the globally oldest victim among the shards' policies; false when
  // nothing is evictable.
  bool EvictOne();

  HostTier& host_;
  const Clock& clock_;
  std::vector<std::unique_ptr<EngineShard>> shards_;
  std::atomic<uint64_t> next_lease_{1};
  std::atomic<uint64_t> next_handle_{1};

  // Monotonic event counters (gauges are computed from the shards).
  struct Counters {
    std::atomic<int64_t> lookups{0}, lookup_keys{0}, lookup_hit_blocks{0};
    std::atomic<int64_t> reserves{0}, reserve_failures{0};
    std::atomic<int64_t> commits{0}, commit_failures{0}, aborts{0};
    std::atomic<int64_t> pins{0}, pin_misses{0}, releases{0}, release_failures{0};
    std::atomic<int64_t> erases{0}, evictions{0}, eviction_failures{0};
    std::atomic<int64_t> sessions_closed{0};
  };
  mutable Counters counters_;
};

}  // namespace kvtier
