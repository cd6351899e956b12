// NvmeTier reads (nvme_tier.h): the record header and the aligned cover of
// a layer range read into staging (a large whole block straight into the
// caller's memory), verified on a verifier thread and copied out; a record
// that fails verification is dropped. Also the blocking whole-record read
// of start-up and of the reclaim scan, and the cache of record headers
// that makes a layer-by-layer read one I/O a layer.
#include <cstring>

#include "common/logging.h"
#include "common/mutex.h"
#include "tiers/nvme/nvme_tier.h"

namespace kvtier {
namespace {

// From this size on, a read skips the staging copy (see Read).
constexpr uint64_t kDirectReadMinBytes = 1ull << 20;

uint64_t AlignDown(uint64_t v, uint64_t a) { return v / a * a; }
uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// The record on the device is the one the index entry describes.
bool HeaderMatches(const RecordHeader& h, const BlockKey& key, const IndexEntry& e) {
  return h.key == key && h.ns == e.ns && h.region_generation == e.region_generation &&
         h.payload_bytes == e.payload_bytes && h.layer_count == e.layer_count &&
         h.payload_checksum == e.payload_checksum;
}

}  // namespace

// One read in flight: the staging span holds the header at [0, 4 KiB) and
// the aligned cover of the payload range from `payload_at` on.
struct NvmeTier::ReadOp {
  BlockKey key;
  IndexEntry entry;
  uint32_t first = 0, last = 0;
  ByteRange range;            // inside the payload
  uint64_t cover_offset = 0;  // payload offset the staged payload bytes start at
  std::span<std::byte> staging;
  size_t payload_at = 0;  // where in `staging` the payload cover starts
  bool direct = false;    // the payload is read straight into `dst`
  std::span<std::byte> dst;
  ReadDone done;
  LayerReadDone layer_done;               // instead of `done`: ReadWithLayerChecksums
  std::vector<uint64_t> layer_checksums;  // for layer_done, once verified
  Mutex mu;                               // a leaf: the I/Os' completions count down under it
  int pending GUARDED_BY(mu) = 0;         // I/Os not yet completed
  Status failure GUARDED_BY(mu);          // first I/O failure

  // Before the I/Os go out: how many will complete.
  void Expect(int ios) EXCLUDES(mu) {
    MutexLock lock(mu);
    pending = ios;
  }
  // The first I/O failure, once the last one completed.
  Status Failure() EXCLUDES(mu) {
    MutexLock lock(mu);
    return failure;
  }
  std::optional<RecordHeader> header;  // from the header cache: no header I/O
};

Status NvmeTier::ReadRecordSync(const BlockKey& key, const IndexEntry& entry, std::span<std::byte> staging) {
  const uint64_t bytes = RecordBytes(entry.payload_bytes, device_->alignment_bytes());
  auto read = ReadSync(*device_, entry.offset, staging.first(bytes));
  if (!read.ok()) return read.status();
  if (*read != bytes) return IoError("short read");
  auto header = DecodeRecordHeader(staging.first(kRecordHeaderBytes));
  if (!header.ok()) return header.status();
  if (!HeaderMatches(*header, key, entry)) return Corruption("record header describes another block");
  return VerifyLayers(*header, 0, header->layer_count, staging.subspan(kRecordHeaderBytes, entry.payload_bytes));
}

Status NvmeTier::Read(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
                      ReadDone done) {
  return StartRead(key, first_layer, last_layer, dst, std::move(done), nullptr);
}

Status NvmeTier::ReadWithLayerChecksums(const BlockKey& key, uint32_t first_layer, uint32_t last_layer,
                                        std::span<std::byte> dst, LayerReadDone done) {
  return StartRead(key, first_layer, last_layer, dst, nullptr, std::move(done));
}

Status NvmeTier::StartRead(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
                           ReadDone done, LayerReadDone layer_done) {
  auto op = std::make_shared<ReadOp>();
  const uint64_t align = device_->alignment_bytes();
  {
    MutexLock lock(mu_);
    auto it = entries_.find(key);
    if (it == entries_.end()) return NotFound("block is not on the nvme tier");
    op->key = key;
    op->entry = it->second;
    auto cached = header_cache_.find(key);
    if (cached != header_cache_.end() && cached->second.offset == op->entry.offset &&
        cached->second.region_generation == op->entry.region_generation) {
      op->header = cached->second.header;
    }
  }
  RecordHeader geometry;  // enough of a header to compute the range
  geometry.layer_count = op->entry.layer_count;
  geometry.layer_bytes = op->entry.payload_bytes / op->entry.layer_count;
  auto range = LayerRange(geometry, first_layer, last_layer);
  if (!range.ok()) return range.status();
  if (dst.size() < range->length) {
    return InvalidArgument("destination of " + std::to_string(dst.size()) + " bytes is smaller than the " +
                           std::to_string(range->length) + " bytes asked for");
  }
  op->first = first_layer;
  op->last = last_layer;
  op->range = *range;
  op->dst = dst;
  op->done = std::move(done);
  op->layer_done = std::move(layer_done);
  op->cover_offset = AlignDown(range->offset, align);
  const uint64_t cover_bytes = AlignUp(range->offset + range->length, align) - op->cover_offset;
  // A cached header leaves only the payload cover to read (one I/O).
  op->payload_at = op->header ? 0 : kRecordHeaderBytes;
  // Large whole-block reads go straight into `dst` when it can take the
  // aligned cover (no staging copy, at the price of a second I/O for the
  // header); small ones read header and payload in one I/O and copy.
  op->direct = cover_bytes >= kDirectReadMinBytes && op->cover_offset == 0 && range->offset == 0 &&
               dst.size() >= cover_bytes && reinterpret_cast<uintptr_t>(dst.data()) % align == 0;
  const uint64_t staged_bytes = op->payload_at + (op->direct ? 0 : cover_bytes);
  {
    // Reads take at most their share of the staging pool (see WriteRecord).
    MutexLock lock(mu_);
    const bool over_share = staged_for_reads_ > 0 && staged_for_reads_ + staged_bytes > StagingShare();
    auto staged = over_share ? std::nullopt : staging_->Allocate(staged_bytes);
    if (!staged) return Busy("no nvme staging memory free for a read");
    op->staging = *staged;
    staged_for_reads_ += staged->size();
    BeginIo();
  }
  const uint64_t payload_device_offset = op->entry.offset + kRecordHeaderBytes;
  auto on_io = [this, op](Result<size_t> r, size_t want) {
    bool last;
    {
      MutexLock lock(op->mu);
      if (op->failure.ok()) {
        if (!r.ok())
          op->failure = r.status();
        else if (*r != want)
          op->failure = IoError("short read: " + std::to_string(*r) + " of " + std::to_string(want));
      }
      last = --op->pending == 0;
    }
    if (last) verifiers_.Post([this, op] { OnRead(op); });
  };
  if (op->header && op->direct) {
    op->Expect(1);
    device_->Read(payload_device_offset, dst.first(cover_bytes),
                  [on_io, cover_bytes](Result<size_t> r) { on_io(r, cover_bytes); });
  } else if (op->header) {
    op->Expect(1);
    device_->Read(payload_device_offset + op->cover_offset, op->staging.first(cover_bytes),
                  [on_io, cover_bytes](Result<size_t> r) { on_io(r, cover_bytes); });
  } else if (op->direct) {
    op->Expect(2);
    device_->Read(op->entry.offset, op->staging.first(kRecordHeaderBytes),
                  [on_io](Result<size_t> r) { on_io(r, kRecordHeaderBytes); });
    device_->Read(payload_device_offset, dst.first(cover_bytes),
                  [on_io, cover_bytes](Result<size_t> r) { on_io(r, cover_bytes); });
  } else if (op->cover_offset == 0) {  // header and payload cover are contiguous: one I/O
    op->Expect(1);
    const size_t bytes = kRecordHeaderBytes + cover_bytes;
    device_->Read(op->entry.offset, op->staging.first(bytes), [on_io, bytes](Result<size_t> r) { on_io(r, bytes); });
  } else {
    op->Expect(2);
    device_->Read(op->entry.offset, op->staging.first(kRecordHeaderBytes),
                  [on_io](Result<size_t> r) { on_io(r, kRecordHeaderBytes); });
    device_->Read(payload_device_offset + op->cover_offset, op->staging.subspan(kRecordHeaderBytes, cover_bytes),
                  [on_io, cover_bytes](Result<size_t> r) { on_io(r, cover_bytes); });
  }
  return Status::Ok();
}

void NvmeTier::OnRead(std::shared_ptr<ReadOp> op) {
  Status outcome = op->Failure();
  std::span<const std::byte> layers;
  if (outcome.ok()) {
    Result<RecordHeader> header =
        op->header ? Result<RecordHeader>(*op->header) : DecodeRecordHeader(op->staging.first(kRecordHeaderBytes));
    if (!header.ok()) {
      outcome = header.status();
    } else if (!HeaderMatches(*header, op->key, op->entry)) {
      outcome = Corruption("record header describes another block");
    } else {
      layers = op->direct
                   ? std::span<const std::byte>(op->dst.first(op->range.length))
                   : op->staging.subspan(op->payload_at + (op->range.offset - op->cover_offset), op->range.length);
      outcome = VerifyLayers(*header, op->first, op->last, layers);
      // A partial read is likely one of several of the block (layer by
      // layer): keep its header for the next ones.
      const bool partial = op->first != 0 || op->last != header->layer_count;
      if (outcome.ok() && partial && !op->header) CacheHeader(op->key, op->entry, *header);
      if (outcome.ok() && op->layer_done) {
        if (!header->layer_checksums.empty()) {
          op->layer_checksums.assign(header->layer_checksums.begin() + op->first,
                                     header->layer_checksums.begin() + op->last);
        } else {  // too many layers for the header: hash the verified bytes
          for (uint32_t i = 0; i < op->last - op->first; ++i) {
            op->layer_checksums.push_back(BlockChecksum(layers.subspan(i * header->layer_bytes, header->layer_bytes)));
          }
        }
      }
      if (outcome.code() == StatusCode::kFailedPrecondition) {
        // No per-layer checksums (very many layers): the range cannot be
        // verified alone. Reported as corruption-free failure: read it whole.
        outcome = Unimplemented(outcome.message());
      }
    }
  }
  Result<size_t> result = size_t{0};
  if (outcome.ok() && !op->direct) std::memcpy(op->dst.data(), layers.data(), layers.size());  // outside mu_
  {
    MutexLock lock(mu_);
    if (!outcome.ok()) result = outcome;
    if (outcome.ok()) {
      result = layers.size();
      ++counters_.reads;
      if (op->header) ++counters_.header_cache_hits;
      // A use of the block even if a copy forward moved it meanwhile (its
      // entry then counts it: the same reads-since-written whichever of
      // the read and the move ends first). A use reads the first layer: a
      // block read layer by layer counts once, not once a layer.
      auto it = op->first == 0 ? entries_.find(op->key) : entries_.end();
      if (it != entries_.end()) {
        ++it->second.hits;
        it->second.last_use_us = static_cast<int64_t>(clock_.NowUs());
        reclaim_.OnRead(op->key, clock_.NowUs());
      }
    } else if (outcome.code() == StatusCode::kCorruption) {
      if (regions_.Generation(op->entry.region) != op->entry.region_generation) {
        ++counters_.reclaimed_reads;  // the region was reused under the read: a plain miss
        result = NotFound("block was reclaimed from the nvme tier during the read");
      } else {
        ++counters_.corrupt_reads;
        spdlog::warn("nvme: block {:016x}{:016x} at offset {} failed verification ({}); dropped", op->key.hi,
                     op->key.lo, op->entry.offset, outcome.message());
        DropIfCurrent(op->key, op->entry);
      }
    } else {
      ++counters_.read_failures;
    }
  }
  staging_->Free(op->staging);
  {
    MutexLock lock(mu_);
    staged_for_reads_ -= op->staging.size();
  }
  if (op->layer_done) {
    if (result.ok()) {
      op->layer_done(LayerRead{*result, std::move(op->layer_checksums)});
    } else {
      op->layer_done(result.status());
    }
  } else {
    op->done(std::move(result));
  }
  EndIo();
}

void NvmeTier::CacheHeader(const BlockKey& key, const IndexEntry& entry, const RecordHeader& header) {
  MutexLock lock(mu_);
  auto [it, inserted] =
      header_cache_.insert_or_assign(key, CachedHeader{entry.offset, entry.region_generation, header});
  if (!inserted) return;
  header_cache_order_.push_back(key);
  while (header_cache_order_.size() > kHeaderCacheEntries) {
    header_cache_.erase(header_cache_order_.front());
    header_cache_order_.pop_front();
  }
}

void NvmeTier::DropIfCurrent(const BlockKey& key, const IndexEntry& entry) {
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.offset != entry.offset ||
      it->second.region_generation != entry.region_generation) {
    return;
  }
  if (dropped_) dropped_(entry.ns, key);
  Account(entry, -1);
  region_keys_[entry.region].erase(key);
  entries_.erase(it);
  reclaim_.OnDropped(key);
  // Only this record's entry: a reinsertion's copy of the block, indexed
  // behind this delete, takes over in memory and must keep its entry. If
  // it stays (a failed write), the next start-up or read drops it again.
  PostIndex([this, key, entry] { return index_->DeleteIfCurrent(key, entry); });
}

}  // namespace kvtier
