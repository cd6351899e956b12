// IndexRebuilder: what a router's indexer does with kvtierd's KV events
// (docs/OPERATIONS.md, "Joining late, restarts, gaps"): what every tier
// holds, from a snapshot (its batches all carry S, the last stream batch
// they include) and then the stream's batches after S, applied to an
// EventIndex: its own set of (tier, namespace, key) for `kvtier events
// --rebuild`, or one the caller gives (the peer tier's HeldDirectory).
//
// OnStream applies one batch of the stream: a seq at or before the
// stream's previous one means another run of the daemon (a new snapshot is
// taken); one at or before the last applied (the snapshot's S, or a
// replay's) is skipped; one after a gap first has the gap replayed from the
// replay socket. A gap the replay buffer no longer covers is
// FailedPrecondition, as is a payload that does not decode (the index is
// then not trustworthy), and whatever error the index answers.
//
// Not thread-safe; `source` (and a given `index`) are borrowed and outlive it.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <span>
#include <tuple>
#include <vector>

#include "kvtier/client.h"
#include "subscriber/event_source.h"
#include "subscriber/kv_event_batch.h"

namespace kvtier::events {

// Where IndexRebuilder applies what the events say. Its errors stop the
// rebuild (IndexRebuilder returns them).
class EventIndex {
 public:
  virtual ~EventIndex() = default;
  // Nothing is held any more (a snapshot follows, or AllBlocksCleared).
  virtual void Clear() = 0;
  virtual Status Stored(Tier tier, const NamespaceFingerprint& ns, std::span<const BlockKey> keys) = 0;
  virtual void Removed(Tier tier, const NamespaceFingerprint& ns, std::span<const BlockKey> keys) = 0;
};

// Every (tier, namespace, key) held, for `kvtier events --rebuild`.
class BlockSetIndex final : public EventIndex {
 public:
  void Clear() override { index_.clear(); }
  Status Stored(Tier tier, const NamespaceFingerprint& ns, std::span<const BlockKey> keys) override;
  void Removed(Tier tier, const NamespaceFingerprint& ns, std::span<const BlockKey> keys) override;
  // The index, in the form `kvtier ls --blocks` lists.
  std::vector<HeldBlockInfo> Blocks() const;

 private:
  std::set<std::tuple<Tier, NamespaceFingerprint, BlockKey>> index_;
};

class IndexRebuilder {
 public:
  // Into a BlockSetIndex of its own (Blocks()).
  explicit IndexRebuilder(EventRequests& source) : source_(source), index_(own_) {}
  IndexRebuilder(EventRequests& source, EventIndex& index) : source_(source), index_(index) {}

  // Takes a snapshot: the index becomes the daemon's contents now.
  Status Resync();
  // Applies `batch` of the stream (above); returns how many of its events
  // were applied (0 for a skipped one).
  Result<size_t> OnStream(const SeqPayload& batch);
  // Its own index's blocks (the first constructor's), in the form `kvtier
  // ls --blocks` lists.
  std::vector<HeldBlockInfo> Blocks() const { return own_.Blocks(); }
  int restarts() const { return restarts_; }
  // Whether a snapshot was applied whole (after an error from OnStream the
  // index is not trustworthy whatever this says: take a new snapshot).
  bool synced() const { return synced_; }

 private:
  Status Apply(const KvEventBatch& batch);
  Status ApplyPayload(const std::string& payload, int64_t seq);

  EventRequests& source_;
  BlockSetIndex own_;
  EventIndex& index_;
  int64_t last_ = -1;                   // the last batch applied (or included by the snapshot)
  std::optional<int64_t> stream_last_;  // the last seq the stream brought
  int restarts_ = 0;
  bool synced_ = false;
};

}  // namespace kvtier::events
