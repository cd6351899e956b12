#include "subscriber/event_index.h"

#include <string>

namespace kvtier::events {

Status BlockSetIndex::Stored(Tier tier, const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  for (const BlockKey& k : keys) index_.emplace(tier, ns, k);
  return Status::Ok();
}

void BlockSetIndex::Removed(Tier tier, const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  for (const BlockKey& k : keys) index_.erase({tier, ns, k});
}

std::vector<HeldBlockInfo> BlockSetIndex::Blocks() const {
  std::vector<HeldBlockInfo> out;
  out.reserve(index_.size());
  for (const auto& [tier, ns, key] : index_) out.push_back(HeldBlockInfo{tier, ns, key, {}});
  return out;
}

Status IndexRebuilder::Apply(const KvEventBatch& batch) {
  for (const KvEvent& e : batch.events) {
    switch (e.kind) {
      case KvEventKind::kCleared:
        index_.Clear();
        break;
      case KvEventKind::kStored:
        if (Status s = index_.Stored(e.tier, e.ns, e.keys); !s.ok()) return s;
        break;
      case KvEventKind::kRemoved:
        index_.Removed(e.tier, e.ns, e.keys);
        break;
    }
  }
  return Status::Ok();
}

Status IndexRebuilder::ApplyPayload(const std::string& payload, int64_t seq) {
  auto batch = DecodeKvEventBatch(payload);
  if (!batch.ok()) {
    return FailedPrecondition("batch " + std::to_string(seq) + " does not decode: " + batch.status().message());
  }
  return Apply(*batch);
}

Status IndexRebuilder::Resync() {
  auto batches = source_.Snapshot();
  if (!batches.ok()) return batches.status();
  if (batches->empty()) return ProtocolError("a snapshot came with no batch (it always has one, saying its seq)");
  synced_ = false;
  index_.Clear();
  const int64_t seq = batches->front().seq;
  for (const SeqPayload& b : *batches) {
    if (b.seq != seq) return ProtocolError("a snapshot's batches name different points of the stream");
    if (Status s = ApplyPayload(b.payload, b.seq); !s.ok()) return s;
  }
  last_ = seq;
  synced_ = true;
  return Status::Ok();
}

Result<size_t> IndexRebuilder::OnStream(const SeqPayload& batch) {
  const bool went_back = stream_last_ && batch.seq <= *stream_last_;
  stream_last_ = batch.seq;
  if (went_back) {
    // A PUB stream never repeats a number: another run of the daemon. What
    // it holds now is its new snapshot (whose S says if it has this batch).
    ++restarts_;
    if (Status s = Resync(); !s.ok()) return s;
  }
  if (batch.seq <= last_) return size_t{0};  // the snapshot (or a replay) had it
  if (batch.seq > last_ + 1) {               // batches lost: replay them
    auto replayed = source_.Replay(static_cast<uint64_t>(last_ + 1));
    if (!replayed.ok()) return replayed.status();
    for (const SeqPayload& r : *replayed) {
      if (r.seq >= batch.seq) break;
      if (r.seq != last_ + 1) break;
      if (Status s = ApplyPayload(r.payload, r.seq); !s.ok()) return s;
      last_ = r.seq;
    }
    if (batch.seq != last_ + 1) {
      return FailedPrecondition("batches " + std::to_string(last_ + 1) + " to " + std::to_string(batch.seq - 1) +
                                " were lost and the replay buffer no longer has them (events.buffer_batches, "
                                "events.dropped_batches): the rebuilt index would be wrong");
    }
  }
  auto decoded = DecodeKvEventBatch(batch.payload);
  if (!decoded.ok()) {
    return FailedPrecondition("batch " + std::to_string(batch.seq) + " does not decode: " + decoded.status().message());
  }
  if (Status s = Apply(*decoded); !s.ok()) return s;
  last_ = batch.seq;
  return decoded->events.size();
}

}  // namespace kvtier::events
