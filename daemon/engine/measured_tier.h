// MeasuredTier: a BlockTier that forwards every call to the tier it wraps
// and measures what passes: read and write latency (from the call to its
// completion, so queueing in the tier counts), payload bytes read and
// written, completed and failed operations. The engine wraps every tier of
// its stack in one, so each tier reports the same families whatever it is:
//   tier.read_seconds{tier="<name>"}, tier.write_seconds{...} (histograms),
//   tier.read_bytes{...}, tier.written_bytes{...}, tier.reads{...},
//   tier.writes{...}, tier.read_errors{...}, tier.write_errors{...}
//   (counters), tier.capacity_bytes{...}, tier.used_bytes{...} (gauges),
// then the wrapped tier's own counters.
//
// A read that failed verification (Corruption) puts the key in the tier's
// Quarantine (quarantine.h): Find and ForEachBlock hide it from then on, so
// the engine never serves that copy again, until a write of the key here
// succeeds (a synchronous tier's bad copy is erased first; an asynchronous
// one's write replaces it) or, for the remote tier (the cluster's, and
// peers' memory: others write there), kSharedTierQuarantineUs passes.
//
// With an EventTap it also reports what the tier holds (block_events.h):
// a write that completed stores the block in `reported`, an Erase that
// found it and a read that found it gone (NotFound) or bad (Corruption,
// which drops it) remove it.
//
// Thread-safety: as the wrapped tier; the measurements are atomics.
#pragma once

#include <atomic>
#include <string>

#include "common/histogram.h"
#include "daemon/engine/block_events.h"
#include "daemon/engine/quarantine.h"
#include "tiers/forwarding_tier.h"

namespace kvtier {

// How long the remote tier's copies stay in quarantine (others may write a
// good copy there meanwhile).
inline constexpr uint64_t kSharedTierQuarantineUs = 60'000'000;

class MeasuredTier final : public ForwardingTier {
 public:
  // `inner` and `events` (may be null) are borrowed and outlive this.
  explicit MeasuredTier(BlockTier& inner, const EventTap* events = nullptr, Tier reported = Tier::kNone);

  // Measured; everything else is forwarded as it is (ForwardingTier).
  Status Write(const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layer_count,
               std::span<const std::byte> payload, WriteDone done,
               std::optional<uint64_t> payload_checksum = std::nullopt) override;
  Status Read(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
              ReadDone done) override;
  Status ReadWithLayerChecksums(const BlockKey& key, uint32_t first_layer, uint32_t last_layer,
                                std::span<std::byte> dst, LayerReadDone done) override;
  Status Erase(const BlockKey& key) override;
  // The inner tier's, but nothing for a quarantined key.
  std::optional<BlockInfo> Find(const BlockKey& key) const override;
  void ForEachBlock(const BlockVisitor& visit) const override;
  void VisitCounters(CounterVisitor& visitor) const override;

  const Quarantine& quarantine() const { return quarantine_; }
  Tier reported() const { return reported_; }

 private:
  // The namespace of `key` here, for a removal's event (nothing without events).
  std::optional<NamespaceFingerprint> NamespaceForEvents(const BlockKey& key) const;
  // A read that ended with `status`, started at write sequence `writes`
  // (Quarantine::WriteSequence): a block gone or dropped is removed, a bad
  // copy quarantined, unless a write of the key landed meanwhile (then
  // neither: the fresh copy is there).
  void ReadEnded(const BlockKey& key, const std::optional<NamespaceFingerprint>& ns, const Status& status,
                 uint64_t writes) const;

  const EventTap* const events_;
  const Tier reported_;
  const std::string label_;  // {tier="<name>"}
  LatencyHistogram read_latency_, write_latency_;
  std::atomic<int64_t> reads_{0}, writes_{0}, read_errors_{0}, write_errors_{0};
  std::atomic<int64_t> read_bytes_{0}, written_bytes_{0};
  // Mutable: a read's completion (const ReadEnded) adds to it.
  mutable Quarantine quarantine_;
};

}  // namespace kvtier
