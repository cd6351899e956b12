// HostBlockTier: the host tier seen through the BlockTier interface
// (tiers/tier.h), so that whatever stacks on it -- a tier above it (the
// HBM tier), a tool, the tier contract tests -- reads, writes, finds and
// erases host blocks exactly as it would NVMe's or a remote tier's.
//
// The host tier is the arena the Engine indexes itself (pins, leases and
// the client directory need its index), so this face works on the
// engine's parts: the index shards, the Writer (a put), the Pinner (a
// read's pin) and a mover for its completions; Engine::host_tier() owns
// one, its hooks built in engine_hooks.cc. What it does, in their terms:
//   Find   a visible (committed or pinned) block; layers per its
//          namespace's registered layout (Hooks::layer_count).
//   Write  Writer::Reserve + copy + Writer::Commit under
//          kHostTierConnection, in the caller's thread (the bytes are
//          copied before it returns); the checksums recorded (the block's
//          and its layers') are those of the bytes stored, hashed as they
//          are copied. Making room evicts (and demotes) like a client's
//          put.
//   Read   pins the block (Pinner::PinLocked), then on the mover copies
//          the asked layers and checks the copy against their recorded
//          checksums (the block's checksum for a block of one layer),
//          releases the pin. A mismatch drops the block (Corruption).
//          ReadWithLayerChecksums hands out those recorded checksums.
//   Erase  this tier only; the tiers below keep their copies.
// Completions run on the mover `io` (one thread), never inline, each
// counted as I/O in flight (Hooks::io_started, io_finished) from its
// submission until it ran; when its queue is full, Write and Read answer
// Busy.
//
// Thread-safe, no lock of its own: one shard lock at a time, held across
// Hooks::layer_count (a leaf lock) and Pinner::PinLocked only.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <vector>

#include "common/clock.h"
#include "daemon/engine/mover.h"
#include "daemon/engine/pinner.h"
#include "daemon/engine/writer.h"
#include "tiers/host/host_tier.h"
#include "tiers/tier.h"

namespace kvtier {

class BlockIndex;

class HostBlockTier final : public BlockTier {
 public:
  struct Hooks {
    // I/O in flight: before a completion is queued, and after it ran.
    std::function<void()> io_started, io_finished;
    // How many layers a block of `size` bytes of `ns` has (its namespace's
    // layout; 1 for another size). Called with or without a shard's lock
    // held: takes only a leaf lock.
    std::function<uint32_t(const NamespaceFingerprint& ns, uint64_t size)> layer_count;
    // A block a read found not matching its checksum (dropped); may be empty.
    std::function<void(const BlockKey&)> corrupt;
  };

  // Every reference is borrowed and outlives the face: the host tier's
  // index shards and arena, the clock (pin times), the writer and pinner
  // over them, and `io`, which runs the completions (its owner destroys
  // it, running its queued jobs, before the face).
  HostBlockTier(const std::vector<std::unique_ptr<BlockIndex>>& shards, HostTier& host, const Clock& clock,
                Writer& writer, Pinner& pinner, Mover& io, Hooks hooks);
  HostBlockTier(const HostBlockTier&) = delete;
  HostBlockTier& operator=(const HostBlockTier&) = delete;

  std::string_view name() const override { return "host"; }
  bool asynchronous() const override { return false; }
  uint64_t capacity_bytes() const override;
  uint64_t used_bytes() const override;
  std::optional<BlockInfo> Find(const BlockKey& key) const override;
  void ForEachBlock(const BlockVisitor& visit) const override;
  Status Write(const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layer_count,
               std::span<const std::byte> payload, WriteDone done,
               std::optional<uint64_t> payload_checksum = std::nullopt) override;
  Status Read(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
              ReadDone done) override;
  Status ReadWithLayerChecksums(const BlockKey& key, uint32_t first_layer, uint32_t last_layer,
                                std::span<std::byte> dst, LayerReadDone done) override;
  // Only for blocks that have them (else they are hashed from the copy).
  bool keeps_layer_checksums() const override { return false; }
  Status Erase(const BlockKey& key) override;
  WriteTotals write_totals() const override;
  // host.tier_* : writes, reads, read bytes, corrupt reads, erases through
  // this interface.
  void VisitCounters(CounterVisitor& visitor) const override;
  // The host tier's own (HostTier::CheckHealth: its arena).
  void CheckHealth(HealthFindings& out) const override;

 private:
  // Read and ReadWithLayerChecksums (`done` gets the layers' checksums).
  Status StartRead(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
                   LayerReadDone done);
  BlockIndex& ShardFor(const BlockKey& key) const;

  const std::vector<std::unique_ptr<BlockIndex>>& shards_;
  HostTier& host_;
  const Clock& clock_;
  Writer& writer_;
  Pinner& pinner_;
  Mover& io_;
  const Hooks hooks_;
  std::atomic<uint64_t> written_bytes_{0};
  std::atomic<int64_t> writes_{0}, reads_{0}, read_bytes_{0}, corrupt_reads_{0}, erases_{0};
};

}  // namespace kvtier
