// IndexRebuilder: what a router's indexer does with kvtierd's KV events
// (docs/OPERATIONS.md, "Joining late, restarts, gaps"), for `kvtier events
// --rebuild`: the set of (tier, namespace, key) every tier holds, from a
// snapshot (its batches all carry S, the last stream batch they include)
// and then the stream's batches after S.
//
// OnStream applies one batch of the stream: a seq at or before the
// stream's previous one means another run of the daemon (a new snapshot is
// taken); one at or before the last applied (the snapshot's S, or a
// replay's) is skipped; one after a gap first has the gap replayed from the
// replay socket. A gap the replay buffer no longer covers is
// FailedPrecondition, as is a payload that does not decode (the index is
// then not trustworthy).
//
// Not thread-safe; `source` is borrowed and outlives it.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <tuple>
#include <vector>

#include "kvtier/client.h"
#include "tools/cli/event_source.h"
#include "tools/cli/kv_event_batch.h"

namespace kvtier::tools {

class IndexRebuilder {
 public:
  explicit IndexRebuilder(EventRequests& source) : source_(source) {}

  // Takes a snapshot: the index becomes the daemon's contents now.
  Status Resync();
  // Applies `batch` of the stream (above); returns how many of its events
  // were applied (0 for a skipped one).
  Result<size_t> OnStream(const SeqPayload& batch);
  // The index, in the form `kvtier ls --blocks` lists.
  std::vector<HeldBlockInfo> Blocks() const;
  int restarts() const { return restarts_; }

 private:
  Status Apply(const KvEventBatch& batch);
  Status ApplyPayload(const std::string& payload, int64_t seq);

  EventRequests& source_;
  std::set<std::tuple<Tier, NamespaceFingerprint, BlockKey>> index_;
  int64_t last_ = -1;                   // the last batch applied (or included by the snapshot)
  std::optional<int64_t> stream_last_;  // the last seq the stream brought
  int restarts_ = 0;
};

}  // namespace kvtier::tools
