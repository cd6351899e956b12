// Writer: the write path into the host arena, a client's put. Reserve
// claims each key in its shard (BlockIndex::Reserve: kReserved, invisible)
// and then finds it arena room (Hooks::allocate, the evictor's Allocate,
// which may evict); the client writes the bytes in place; Commit checks
// the size, records the block's checksums (hashing the bytes when it must)
// and publishes it (BlockIndex::CommitReserved: kCommitted, visible).
// Abort drops reservations, their space returning to the arena (a closing
// connection's go with its leases: Pinner::EndConnection). A reservation
// belongs to the connection that made it: only it may commit or abort it.
//
// Thread-safe, and no thread of its own: it runs on the caller's thread.
// It takes one shard lock at a time and holds none across an allocation
// (the evictor takes shard locks itself), a hash of a block's bytes or a
// hook other than `next_handle`. Between a key's claim and its commit
// only its writer touches the reservation, so its bytes are hashed with
// no lock held. Lock order: a shard's lock, then the host tier's (a
// leaf: a dropped reservation frees its extent); the lineage and the
// hooks `allocate` and `layer_count` are called with no lock held.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <memory>
#include <span>
#include <vector>

#include "common/clock.h"
#include "daemon/engine/engine_counters.h"
#include "daemon/engine/engine_types.h"
#include "daemon/engine/lineage.h"
#include "kvtier/block_key.h"
#include "kvtier/result.h"
#include "policy/eviction_policy.h"
#include "tiers/host/host_tier.h"

namespace kvtier {

class BlockIndex;

class Writer {
 public:
  struct Hooks {
    // `bytes` of arena space, evicting to make room (Evictor::Allocate);
    // NoSpace when there is none. Called with no lock held.
    std::function<Result<HostTier::Extent>(uint64_t bytes)> allocate;
    // How many layers a block of `size` bytes of `ns` has (its namespace's
    // layout; 1 for another size). Called with no lock held.
    std::function<uint32_t(const NamespaceFingerprint& ns, uint64_t size)> layer_count;
    // A fresh policy handle for a block entering the committed set; called
    // with a shard's lock held, so it takes no lock.
    std::function<BlockHandle()> next_handle;
  };

  // Every reference is borrowed and outlives the Writer: the shards of the
  // host tier's index, the arena they hold, the lineage a chained Reserve
  // records its links in, the clock (commit times) and the counters.
  // `verify_commits`: EngineOptions::verify_commits.
  Writer(const std::vector<std::unique_ptr<BlockIndex>>& shards, HostTier& host, Lineage& lineage, const Clock& clock,
         bool verify_commits, EngineCounters& counters, Hooks hooks);
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // Reserves arena space for each key (sizes[i] bytes) for `connection`'s
  // write under `ns`. Per key: ok with the slot, AlreadyExists (committed
  // or being written), NoSpace (nothing left to evict), InvalidArgument
  // (size 0 or larger than the arena). With `links.chain` the keys'
  // parents are recorded as lineage (ReserveChain), so admission's prefix
  // closure holds without queue hints (engine.chain_links).
  // Precondition: keys.size() == sizes.size().
  std::vector<SlotGrant> Reserve(ConnectionId connection, const NamespaceFingerprint& ns,
                                 std::span<const BlockKey> keys, std::span<const uint64_t> sizes,
                                 const ReserveChain& links = {});

  // Publishes reserved blocks after checking that sizes[i] equals the
  // reserved size, recording each block's xxh3-64: checksums[i] as the
  // client computed it, or the writer's own hash of the bytes when
  // `checksums` is empty. With `verify_commits` it hashes every block and
  // compares.
  // A block of its namespace's block size with layer_count > 1 also
  // records the checksum of each layer (common/checksum.h) when the client
  // sent them in `layer_checksums` (every such block's layers in key
  // order; ignored unless it holds exactly that many), as sent, or checked
  // against the bytes with verify_commits (in the same pass as the block).
  // Layers are never hashed otherwise: a block committed without them has
  // none (readers that verify check such a block whole). Per key: ok,
  // FailedPrecondition (no reservation by this connection under `ns`),
  // InvalidArgument (size mismatch), Corruption (verify_commits and the
  // bytes do not match a checksum sent); on the last two the reservation
  // is dropped and its space returns.
  // Precondition: keys.size() == sizes.size(), and checksums is empty or
  // as long.
  std::vector<Status> Commit(ConnectionId connection, const NamespaceFingerprint& ns, std::span<const BlockKey> keys,
                             std::span<const uint64_t> sizes, std::span<const uint64_t> checksums = {},
                             std::span<const uint64_t> layer_checksums = {});

  // Drops this connection's reservations of `keys`; returns how many were
  // (engine.aborts). Others' reservations and committed blocks stay.
  size_t Abort(ConnectionId connection, std::span<const BlockKey> keys);

  // Where `connection`'s reservation of `key` under `ns` lies, once it
  // has arena space, and its reserved size; nullopt when it holds none
  // (committed, dropped, or another's). Takes the key's shard lock.
  std::optional<std::pair<HostTier::Extent, uint64_t>> Reserved(ConnectionId connection, const NamespaceFingerprint& ns,
                                                                const BlockKey& key) const;

 private:
  BlockIndex& ShardFor(const BlockKey& key) const;
  // Hashes the reserved bytes of one block and commits it: the rest of
  // Commit for keys[i] once its reservation checked out (`bytes` of it,
  // `sent` its client's checksum, if any, `sent_layers` its layer
  // checksums as sent, `layers` its layer count).
  Status CommitOne(ConnectionId connection, const BlockKey& key, std::span<const std::byte> bytes, const uint64_t* sent,
                   std::span<const uint64_t> sent_layers, uint32_t layers);

  const std::vector<std::unique_ptr<BlockIndex>>& shards_;
  HostTier& host_;
  Lineage& lineage_;
  const Clock& clock_;
  const bool verify_commits_;
  EngineCounters& counters_;
  const Hooks hooks_;
};

}  // namespace kvtier
