// HostBlockTier: the host tier seen through the BlockTier interface
// (tiers/tier.h), so that whatever stacks on it -- a tier above it (the
// HBM tier), a tool, the tier contract tests -- reads, writes, finds and
// erases host blocks exactly as it would NVMe's or a remote tier's.
//
// The host tier is the arena the Engine indexes itself (pins, leases and
// the client directory need its index), so this face is the Engine's:
// Engine::host_tier() owns one. What it does, in the engine's terms:
//   Find   a visible (committed or pinned) block; layers per its
//          namespace's registered layout.
//   Write  Reserve + copy + Commit under kHostTierConnection, in the
//          caller's thread (the bytes are copied before it returns); the
//          checksums recorded (the block's and its layers') are those of
//          the bytes stored, hashed as they are copied. Making room
//          evicts (and demotes) like a client's put.
//   Read   pins the block, then on a mover thread copies the asked layers
//          and checks the copy against their recorded checksums (the
//          block's checksum for a block of one layer), releases the pin.
//          A mismatch drops the block (Corruption).
//          ReadWithLayerChecksums hands out those recorded checksums.
//   Erase  this tier only; the tiers below keep their copies.
// Completions run on the engine's host-I/O mover (one thread), never
// inline; when its queue is full, Write and Read answer Busy.
#pragma once

#include <atomic>

#include "tiers/tier.h"

namespace kvtier {

class Engine;

class HostBlockTier final : public BlockTier {
 public:
  explicit HostBlockTier(Engine& engine) : engine_(engine) {}

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
  Engine& engine_;
  std::atomic<uint64_t> written_bytes_{0};
  std::atomic<int64_t> writes_{0}, reads_{0}, read_bytes_{0}, corrupt_reads_{0}, erases_{0};
};

}  // namespace kvtier
