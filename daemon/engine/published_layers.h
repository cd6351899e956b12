// PublishedLayers: the layers of reserved, not yet committed blocks that
// their writer published as it wrote them (a layer-wise save with
// LayerSave::PublishToPeers): per block, where it lies in the arena, its
// layer count and the checksum of each layer published so far, layers
// [0, ready). It is what this node serves its peers of a prefix still
// being computed (daemon/setup/peer_setup.h), so a decode node can read
// layer 0 before the prefill node has written the last one.
//
// Nothing here makes a block visible to lookups, pins or the block
// directory: a reserved block stays invisible on this node until its
// commit. A reader on another node verifies each layer against the
// checksum published with it; if the writer aborts meanwhile and the
// space is reused, the bytes no longer match and the read fails.
//
// An entry lasts while its block is reserved by its writer: Find drops it
// once the reservation is gone (committed: the block is then found as a
// committed block; aborted), EndConnection drops its writer's, and at most
// `max_blocks` are kept (the oldest goes).
//
// Hand-offs: a writer may publish a block as handed off (free_when_taken,
// a prefill node whose decode node takes the block): once a peer reader
// reports it took the block whole (Taken), the block's mark says it may
// leave this node, at once when committed, else at its commit
// (Committed). The marks outlive the reservation (a reader takes a block
// after its commit too); at most `max_blocks` are kept (the oldest goes:
// that block then simply stays).
//
// Thread-safe; its lock is a leaf, never held while the writer's hook
// (which takes a shard's lock) or the listener runs.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "daemon/engine/engine_types.h"
#include "kvtier/block_key.h"
#include "tiers/host/host_tier.h"

namespace kvtier {

class Writer;
class NamespaceRegistry;

class PublishedLayers {
 public:
  // Where `writer`'s reservation of `key` under `ns` lies (extent and
  // reserved size), if it still has one. Takes a shard's lock.
  struct Reserved {
    HostTier::Extent extent;
    uint64_t size = 0;
  };
  using FindReserved =
      std::function<std::optional<Reserved>(ConnectionId writer, const NamespaceFingerprint& ns, const BlockKey& key)>;
  // Layers of a block of `size` bytes of `ns` (its namespace's layout).
  using LayerCount = std::function<uint32_t(const NamespaceFingerprint& ns, uint64_t size)>;
  PublishedLayers(FindReserved find, LayerCount layer_count, size_t max_blocks = 65536);
  // Over an engine's writer and namespace registry (both borrowed, outliving it).
  PublishedLayers(const Writer& writer, const NamespaceRegistry& namespaces);

  // Layers [first, end) of each of `keys` are written; `layer_checksums`
  // holds end - first per key, key-major. Per key: ok; InvalidArgument
  // when `writer` holds no reservation of it under `ns`, when `first` is
  // not what was published of it so far, when `end` passes its layers,
  // or (for the whole request) checksums of another count.
  // `free_when_taken`: the blocks published are handed off (marked, see above).
  std::vector<Status> Publish(ConnectionId writer, const NamespaceFingerprint& ns, std::span<const BlockKey> keys,
                              uint32_t first, uint32_t end, std::span<const uint64_t> layer_checksums,
                              bool free_when_taken = false) EXCLUDES(mu_);

  // A peer reader took `keys` of `ns` whole. Returns those handed off and
  // no longer reserved (committed): their marks go and the caller erases
  // them. A handed-off block still reserved keeps its mark, as taken, for
  // Committed. Keys never handed off are ignored.
  std::vector<BlockKey> Taken(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) EXCLUDES(mu_);
  // `writer` committed `keys` of `ns`: returns those a reader took while
  // they were reserved (their marks go; the caller erases them).
  std::vector<BlockKey> Committed(ConnectionId writer, const NamespaceFingerprint& ns, std::span<const BlockKey> keys)
      EXCLUDES(mu_);

  struct Partial {
    NamespaceFingerprint ns;
    uint64_t offset = 0;  // of the block in the arena
    uint64_t bytes = 0;
    uint32_t layer_count = 0;
    std::vector<uint64_t> layer_checksums;  // of layers [0, ready): ready = size()
  };
  // The layers published of `key` while its writer still holds its
  // reservation (checked now); nullopt otherwise (and the entry goes).
  std::optional<Partial> Find(const NamespaceFingerprint& ns, const BlockKey& key) EXCLUDES(mu_);

  // `writer`'s reservations of `keys` ended without a commit (aborted, or
  // a commit refused): their hand-off marks go.
  void Aborted(ConnectionId writer, std::span<const BlockKey> keys) EXCLUDES(mu_);
  // Every entry of `writer` goes (its connection closed), and the marks of
  // its blocks taken while reserved (those reservations end uncommitted).
  void EndConnection(ConnectionId writer) EXCLUDES(mu_);

  // Who hears that more layers of a block were published: after each
  // Publish, once per key, with no lock held. Empty clears it; its owner
  // clears it before going away.
  using Listener = std::function<void(const BlockKey& key)>;
  void SetListener(Listener listener) EXCLUDES(mu_);

  size_t size() const EXCLUDES(mu_);
  size_t handoffs() const EXCLUDES(mu_);  // hand-off marks kept
  // Whether a block taken while reserved waits for its commit (a relaxed
  // read: a commit checks it before Committed).
  bool taken_while_reserved() const { return taken_reserved_.load(std::memory_order_relaxed) != 0; }
  bool has_handoffs() const { return marks_.load(std::memory_order_relaxed) != 0; }  // a relaxed read

 private:
  struct Entry {
    ConnectionId writer = 0;
    Partial partial;
  };
  struct Handoff {
    ConnectionId writer = 0;
    NamespaceFingerprint ns;
    uint64_t offset = 0;  // of the reservation: a mark names one save of its key
    bool taken = false;   // taken while reserved: freed at its commit
  };
  // A publication of `key` by `writer` (its reservation at `offset`):
  // keeps this save's mark, drops another save's, and marks it when
  // `free_when_taken`.
  void MarkHandoff(ConnectionId writer, const NamespaceFingerprint& ns, const BlockKey& key, uint64_t offset,
                   bool free_when_taken) REQUIRES(mu_);
  void DropMark(std::unordered_map<BlockKey, Handoff>::iterator it) REQUIRES(mu_);

  const FindReserved find_;
  const LayerCount layer_count_;
  const size_t max_blocks_;
  mutable Mutex mu_;
  std::unordered_map<BlockKey, Entry> entries_ GUARDED_BY(mu_);
  std::deque<BlockKey> order_ GUARDED_BY(mu_);  // insertion order, for the bound (may hold keys gone since)
  std::shared_ptr<Listener> listener_ GUARDED_BY(mu_);
  std::unordered_map<BlockKey, Handoff> handoffs_ GUARDED_BY(mu_);
  std::deque<BlockKey> handoff_order_ GUARDED_BY(mu_);  // marking order, for the bound (may hold keys gone since)
  std::atomic<size_t> marks_{0};                        // handoffs_.size(), read without the lock
  std::atomic<size_t> taken_reserved_{0};               // marks with `taken` set: Committed looks only then
};

}  // namespace kvtier
