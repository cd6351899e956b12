#include "tiers/nvme/nvme_tier.h"

#include <algorithm>
#include <cstring>

#include "common/check.h"
#include "common/logging.h"

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
  ByteRange range;             // inside the payload
  uint64_t cover_offset = 0;   // payload offset the staged payload bytes start at
  std::span<std::byte> staging;
  size_t payload_at = 0;       // where in `staging` the payload cover starts
  bool direct = false;         // the payload is read straight into `dst`
  std::span<std::byte> dst;
  ReadDone done;
  LayerReadDone layer_done;  // instead of `done`: ReadWithLayerChecksums
  std::vector<uint64_t> layer_checksums;  // for layer_done, once verified
  std::mutex mu;
  int pending = 0;             // I/Os not yet completed
  Status failure;              // first I/O failure
  std::optional<RecordHeader> header;  // from the header cache: no header I/O
};

NvmeTier::NvmeTier(std::unique_ptr<BlockDevice> device, std::unique_ptr<NvmeIndex> index,
                   std::unique_ptr<StagingPool> staging, const NvmeTierOptions& options, Clock& clock)
    : device_(std::move(device)),
      index_(std::move(index)),
      staging_(std::move(staging)),
      options_(options),
      clock_(clock),
      regions_(device_->capacity_bytes(), options.region_bytes, device_->alignment_bytes()),
      region_keys_(regions_.region_count()),
      shareable_bytes_(regions_.region_count() > 3 ? (regions_.region_count() - 3) * options.region_bytes : 0),
      reinsert_budget_(options.reinsert_share, options.region_bytes),
      reclaim_(options.reclaim),
      verifiers_(options.verify_threads) {}

Result<std::unique_ptr<NvmeTier>> NvmeTier::Open(std::unique_ptr<BlockDevice> device, std::unique_ptr<NvmeIndex> index,
                                                 const NvmeTierOptions& options, Clock& clock) {
  if (Status s = RegionManager::Validate(device->capacity_bytes(), options.region_bytes, device->alignment_bytes());
      !s.ok()) {
    return s;
  }
  auto staging = StagingPool::Create(options.staging_bytes, *device);
  if (!staging.ok()) return staging.status();
  std::unique_ptr<NvmeTier> tier(new NvmeTier(std::move(device), std::move(index), std::move(*staging), options, clock));
  if (Status s = tier->Recover(); !s.ok()) return s;
  return tier;
}

NvmeTier::~NvmeTier() { WaitForIdle(); }

void NvmeTier::WaitForIdle() const {
  MutexLock lock(mu_);
  while (io_in_flight_ != 0) idle_cv_.Wait(mu_);
}

void NvmeTier::BeginIo() { ++io_in_flight_; }  // caller holds mu_

void NvmeTier::EndIo() {
  MutexLock lock(mu_);
  if (--io_in_flight_ == 0) idle_cv_.NotifyAll();
}

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

void NvmeTier::PersistRegions(const RegionManager::Allocation& a) {
  for (const RegionState& state : a.changed) {
    if (a.reclaimed && state.region == *a.reclaimed) {
      // In log order: the policy's state after the drops does not depend on
      // a hash set's order (the replay drops them in the same order).
      std::vector<std::pair<uint64_t, BlockKey>> by_offset;
      by_offset.reserve(region_keys_[state.region].size());
      for (const BlockKey& k : region_keys_[state.region]) by_offset.emplace_back(entries_[k].offset, k);
      std::sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      std::vector<BlockKey> dropped;
      dropped.reserve(by_offset.size());
      for (const auto& [offset, k] : by_offset) dropped.push_back(k);
      counters_.reclaim_dropped += static_cast<int64_t>(dropped.size());
      for (const BlockKey& k : dropped) {
        Account(entries_[k], -1);
        entries_.erase(k);
        // A block whose reinsertion is in flight (the only writes of a key
        // the tier holds) stays in the policy: the copy may land (a failed
        // one drops it then, in OnWritten).
        if (writing_.count(k) == 0) reclaim_.OnDropped(k);
      }
      region_keys_[state.region].clear();
      PostIndex([this, state, dropped = std::move(dropped)] { return index_->ResetRegion(state, dropped); });
    } else {
      PostIndex([this, state] { return index_->PutRegion(state); });
    }
  }
}

void NvmeTier::PostIndex(std::function<Status()> mutation) {
  BeginIo();
  index_writer_.Post([this, mutation = std::move(mutation)] {
    Status s = mutation();
    if (!s.ok()) {
      // The in-memory index is right; the persistent one may keep a stale
      // entry (dropped at the next start-up or read, which verify against
      // the record) or miss a region's state (its entries then load as
      // stale): a restart may lose blocks, never serve wrong ones.
      spdlog::warn("nvme index write failed: {}", s.ToString());
      MutexLock lock(mu_);
      ++counters_.index_failures;
    }
    EndIo();
  });
}

Status NvmeTier::Write(const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layer_count,
                       std::span<const std::byte> payload, WriteDone done,
                       std::optional<uint64_t> payload_checksum) {
  return WriteRecord(ns, key, layer_count, payload, std::move(done), payload_checksum, nullptr);
}

Status NvmeTier::WriteRecord(const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layer_count,
                             std::span<const std::byte> payload, WriteDone done,
                             std::optional<uint64_t> payload_checksum, const IndexEntry* replaces) {
  if (payload.empty() || layer_count == 0 || payload.size() % layer_count != 0) {
    return InvalidArgument("a block of " + std::to_string(payload.size()) + " bytes cannot be split into " +
                           std::to_string(layer_count) + " equal layers");
  }
  const uint64_t record_bytes = RecordBytes(payload.size(), device_->alignment_bytes());
  std::span<std::byte> staging;
  IndexEntry entry;
  {
    MutexLock lock(mu_);
    const auto reject = [this](Status s) {
      mu_.AssertHeld();  // called only below, under `lock`
      ++counters_.write_rejections;
      return s;
    };
    if (full_ && static_cast<int64_t>(clock_.NowUs()) < full_until_us_) {
      return reject(NoSpace("the nvme tier is full (its file system returned ENOSPC); retrying later"));
    }
    if (writing_.count(key) != 0 || (replaces == nullptr && entries_.count(key) != 0)) {
      return reject(AlreadyExists("block is already on the nvme tier"));
    }
    if (shares_ && replaces == nullptr && !ShareRoomFor(ns, record_bytes)) {
      ++counters_.share_refusals;
      return reject(NoSpace("the nvme tier's room is held by the tenants' protected shares (" +
                            std::to_string(shareable_bytes_) + " bytes on the device); nothing may be evicted"));
    }
    if (replaces != nullptr) {
      auto current = entries_.find(key);
      if (current == entries_.end() || current->second.offset != replaces->offset ||
          current->second.region_generation != replaces->region_generation) {
        return NotFound("block left the nvme tier before its reinsertion");
      }
    }
    // Writes take at most their share of the staging pool, so reads always
    // find room (and the other way round).
    const bool over_share = staged_for_writes_ > 0 && staged_for_writes_ + record_bytes > StagingShare();
    auto staged = over_share ? std::nullopt : staging_->Allocate(record_bytes);
    if (!staged) return reject(Busy("no nvme staging memory free for " + std::to_string(record_bytes) + " bytes"));
    const RegionManager::ReclaimGate gate = Gate();
    if (shares_ && replaces == nullptr) {
      // A client write first gives the reserve back its region, if a copy took it.
      if (auto restored = regions_.RestoreReserve(gate)) PersistRegions(*restored);
    }
    auto allocation = regions_.Allocate(
        record_bytes, replaces == nullptr ? RegionManager::Purpose::kWrite : RegionManager::Purpose::kCopy, gate);
    if (!allocation.ok()) {
      staging_->Free(*staged);
      if (shares_) MaybeScanNextVictim();  // the next victim may wait for its scan
      return reject(allocation.status());
    }
    PersistRegions(*allocation);
    staging = *staged;
    staged_for_writes_ += staged->size();
    entry.region = allocation->placement.region;
    entry.offset = allocation->placement.offset;
    entry.payload_bytes = payload.size();
    entry.layer_count = layer_count;
    entry.region_generation = allocation->placement.generation;
    entry.last_use_us = static_cast<int64_t>(clock_.NowUs());
    regions_.WriteStarted(entry.region);
    writing_.insert(key);
    counters_.submitted.device_bytes += record_bytes;
    if (replaces != nullptr) counters_.submitted.reinserted_bytes += record_bytes;
    BeginIo();
    if (replaces == nullptr) reinsert_budget_.OnWrite(record_bytes);
    MaybeScanNextVictim();
  }
  // Copy first, then checksum the copy: the record describes the bytes it
  // stores even if the source changes meanwhile.
  std::memcpy(staging.data() + kRecordHeaderBytes, payload.data(), payload.size());
  std::memset(staging.data() + kRecordHeaderBytes + payload.size(), 0,
              record_bytes - kRecordHeaderBytes - payload.size());
  RecordHeader header;
  header.ns = ns;
  header.key = key;
  header.payload_bytes = payload.size();
  header.layer_count = layer_count;
  header.layer_bytes = payload.size() / layer_count;
  header.region_generation = entry.region_generation;
  ChecksumPayload(staging.subspan(kRecordHeaderBytes, payload.size()), header);
  if (payload_checksum && *payload_checksum != header.payload_checksum) {
    // The source changed after its checksum was taken: nothing is written,
    // and the region space taken stays dead until the region is reclaimed.
    staging_->Free(staging);
    {
      MutexLock lock(mu_);
      staged_for_writes_ -= staging.size();
      regions_.WriteFinished(entry.region);
      writing_.erase(key);
      cancelled_.erase(key);
      if (replaces != nullptr && entries_.count(key) == 0) reclaim_.OnDropped(key);  // its region went meanwhile
      counters_.submitted.device_bytes -= record_bytes;
      if (replaces != nullptr) counters_.submitted.reinserted_bytes -= record_bytes;
      ++counters_.write_checksum_mismatches;
      ++counters_.write_rejections;
    }
    EndIo();
    return Corruption("block " + key.ToHex() + " changed after its checksum was taken; not written");
  }
  entry.ns = ns;
  entry.payload_checksum = header.payload_checksum;
  EncodeRecordHeader(header, staging.first(kRecordHeaderBytes));
  std::optional<IndexEntry> replaced;
  if (replaces != nullptr) replaced = *replaces;
  device_->Write(entry.offset, staging.first(record_bytes),
                 [this, key, entry, staging, record_bytes, done = std::move(done), replaced](Result<size_t> r) {
                   if (r.ok() && *r != record_bytes) {
                     r = IoError("short write: " + std::to_string(*r) + " of " + std::to_string(record_bytes) +
                                 " bytes");
                   }
                   OnWritten(key, entry, staging, std::move(r), done, replaced);
                 });
  return Status::Ok();
}

void NvmeTier::SetNeededHint(NeededHint needed) {
  MutexLock lock(mu_);
  needed_ = std::move(needed);
}

void NvmeTier::SetEvictionSink(EvictionSink sink) {
  MutexLock lock(mu_);
  eviction_sink_ = std::move(sink);
}

uint64_t NvmeTier::used_bytes() const {
  MutexLock lock(mu_);
  return static_cast<uint64_t>(counters_.stored_bytes);
}

void NvmeTier::OnWritten(const BlockKey& key, const IndexEntry& entry, std::span<std::byte> staging,
                         Result<size_t> result, const WriteDone& done, std::optional<IndexEntry> replaces) {
  staging_->Free(staging);
  Status outcome = result.status();
  MutexLock lock(mu_);
  staged_for_writes_ -= staging.size();
  if (cancelled_.count(key) != 0 && outcome.ok()) outcome = Cancelled("block was erased while being written");
  if (outcome.code() == StatusCode::kNoSpace) {
    if (!full_) spdlog::warn("nvme tier full: {}", outcome.ToString());
    full_ = true;
    full_until_us_ = static_cast<int64_t>(clock_.NowUs()) + options_.full_retry.count() * 1000;
    ++counters_.enospc;
  }
  if (outcome.ok() && replaces) {
    // A reinsertion takes over only from the record it copied (which a
    // reclaim may have dropped meanwhile); anything else won.
    auto current = entries_.find(key);
    if (current != entries_.end() && (current->second.offset != replaces->offset ||
                                      current->second.region_generation != replaces->region_generation)) {
      outcome = Cancelled("block changed during its reinsertion");
    }
  }
  if (outcome.ok()) {
    if (full_) spdlog::info("nvme tier accepts writes again");
    full_ = false;
  }
  // Visible only after the data write completed, and the index entry
  // before the in-memory one, so a crash never leaves an indexed block
  // unreadable. The entry goes through the index writer, behind every
  // mutation decided before it (its region's opening among them);
  // meanwhile the key stays in writing_ (an Erase marks it cancelled) and
  // the region keeps its write in flight (it cannot be reclaimed).
  index_writer_.Post([this, key, entry = IndexEntry(entry), outcome, done, replaces]() mutable {
    if (outcome.ok()) outcome = index_->Put(key, entry);
    bool undo = false;
    {
      MutexLock lock(mu_);
      regions_.WriteFinished(entry.region);
      writing_.erase(key);
      if (cancelled_.erase(key) != 0 && outcome.ok()) {
        undo = true;
        outcome = Cancelled("block was erased while being written");
      }
      if (outcome.ok() && replaces) {
        auto current = entries_.find(key);
        if (current != entries_.end()) {
          // Reads that ended during the move were reads of the copy.
          if (current->second.hits > replaces->hits) entry.hits = current->second.hits - replaces->hits;
          region_keys_[current->second.region].erase(key);
          Account(current->second, -1);
          entries_.erase(current);
        }
        ++counters_.reinserted;
        counters_.reinserted_bytes += static_cast<int64_t>(entry.payload_bytes);
      }
      if (outcome.ok()) {
        entries_[key] = entry;
        region_keys_[entry.region].insert(key);
        Account(entry, +1);
        if (!replaces) {
          ++counters_.writes;  // a reinsertion counts as such
          reclaim_.OnWritten(key, clock_.NowUs());  // a moved block keeps its place in the policy
        }
      } else {
        ++counters_.write_failures;
        if (replaces && entries_.count(key) == 0) reclaim_.OnDropped(key);  // its region went meanwhile
      }
    }
    // Erased while being indexed (we are the index writer: nothing comes
    // between). A failed delete (a broken index) would let the block
    // reappear after a restart, as a failed Erase would.
    if (undo) index_->Delete(key).IgnoreError();
    done(outcome);
    EndIo();
  });
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
      std::lock_guard lock(op->mu);
      if (op->failure.ok()) {
        if (!r.ok()) op->failure = r.status();
        else if (*r != want) op->failure = IoError("short read: " + std::to_string(*r) + " of " + std::to_string(want));
      }
      last = --op->pending == 0;
    }
    if (last) verifiers_.Post([this, op] { OnRead(op); });
  };
  if (op->header && op->direct) {
    op->pending = 1;
    device_->Read(payload_device_offset, dst.first(cover_bytes), [on_io, cover_bytes](Result<size_t> r) {
      on_io(r, cover_bytes);
    });
  } else if (op->header) {
    op->pending = 1;
    device_->Read(payload_device_offset + op->cover_offset, op->staging.first(cover_bytes),
                  [on_io, cover_bytes](Result<size_t> r) { on_io(r, cover_bytes); });
  } else if (op->direct) {
    op->pending = 2;
    device_->Read(op->entry.offset, op->staging.first(kRecordHeaderBytes),
                  [on_io](Result<size_t> r) { on_io(r, kRecordHeaderBytes); });
    device_->Read(payload_device_offset, dst.first(cover_bytes), [on_io, cover_bytes](Result<size_t> r) {
      on_io(r, cover_bytes);
    });
  } else if (op->cover_offset == 0) {  // header and payload cover are contiguous: one I/O
    op->pending = 1;
    const size_t bytes = kRecordHeaderBytes + cover_bytes;
    device_->Read(op->entry.offset, op->staging.first(bytes), [on_io, bytes](Result<size_t> r) { on_io(r, bytes); });
  } else {
    op->pending = 2;
    device_->Read(op->entry.offset, op->staging.first(kRecordHeaderBytes),
                  [on_io](Result<size_t> r) { on_io(r, kRecordHeaderBytes); });
    device_->Read(payload_device_offset + op->cover_offset, op->staging.subspan(kRecordHeaderBytes, cover_bytes),
                  [on_io, cover_bytes](Result<size_t> r) { on_io(r, cover_bytes); });
  }
  return Status::Ok();
}

void NvmeTier::OnRead(std::shared_ptr<ReadOp> op) {
  Status outcome = op->failure;
  std::span<const std::byte> layers;
  if (outcome.ok()) {
    Result<RecordHeader> header = op->header ? Result<RecordHeader>(*op->header)
                                             : DecodeRecordHeader(op->staging.first(kRecordHeaderBytes));
    if (!header.ok()) {
      outcome = header.status();
    } else if (!HeaderMatches(*header, op->key, op->entry)) {
      outcome = Corruption("record header describes another block");
    } else {
      layers = op->direct ? std::span<const std::byte>(op->dst.first(op->range.length))
                          : op->staging.subspan(op->payload_at + (op->range.offset - op->cover_offset),
                                                op->range.length);
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
  auto [it, inserted] = header_cache_.insert_or_assign(key, CachedHeader{entry.offset, entry.region_generation, header});
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
  Account(entry, -1);
  region_keys_[entry.region].erase(key);
  entries_.erase(it);
  reclaim_.OnDropped(key);
  // Only this record's entry: a reinsertion's copy of the block, indexed
  // behind this delete, takes over in memory and must keep its entry. If
  // it stays (a failed write), the next start-up or read drops it again.
  PostIndex([this, key, entry] { return index_->DeleteIfCurrent(key, entry); });
}

std::optional<NvmeTier::BlockInfo> NvmeTier::Find(const BlockKey& key) const {
  MutexLock lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return std::nullopt;
  return BlockInfo{it->second.ns, it->second.payload_bytes, it->second.layer_count, it->second.payload_checksum};
}

void NvmeTier::Account(const IndexEntry& entry, int sign) {
  counters_.stored_bytes += sign * static_cast<int64_t>(entry.payload_bytes);
  const HeldBytes bytes{entry.payload_bytes, RecordBytes(entry.payload_bytes, device_->alignment_bytes())};
  if (shares_) AccountOwner(entry.ns, bytes, sign);
  if (sign > 0) {
    namespace_bytes_[entry.ns].payload += bytes.payload;
    namespace_bytes_[entry.ns].record += bytes.record;
    return;
  }
  auto it = namespace_bytes_.find(entry.ns);
  KVTIER_CHECK(it != namespace_bytes_.end() && it->second.payload >= bytes.payload &&
                   it->second.record >= bytes.record,
               "nvme: a namespace's stored bytes went negative");
  it->second.payload -= bytes.payload;
  it->second.record -= bytes.record;
  if (it->second.payload == 0) namespace_bytes_.erase(it);
}

void NvmeTier::AccountOwner(const NamespaceFingerprint& ns, const HeldBytes& bytes, int sign) {
  const ShareOwner owner = shares_(ns);
  if (owner.owner == 0) return;
  OwnerBytes& o = owner_bytes_[owner.owner];
  o.share_bytes = owner.share_bytes;
  if (sign > 0) {
    o.held.payload += bytes.payload;
    o.held.record += bytes.record;
    return;
  }
  KVTIER_CHECK(o.held.payload >= bytes.payload && o.held.record >= bytes.record,
               "nvme: a share owner's stored bytes went negative");
  o.held.payload -= bytes.payload;
  o.held.record -= bytes.record;
  if (o.held.payload == 0) owner_bytes_.erase(owner.owner);
}

void NvmeTier::SetShares(ShareOf shares) {
  MutexLock lock(mu_);
  shares_ = std::move(shares);
  owner_bytes_.clear();
  if (shares_) {
    for (const auto& [ns, bytes] : namespace_bytes_) AccountOwner(ns, bytes, +1);
  }
  regions_.SetReserve(shares_ ? 1 : 0);
  regions_.EndCopies();
  cleared_ = {~0u, 0};
  reinsert_scanned_ = {~0u, 0};  // the next victim is scanned again, with the shares
}

uint64_t NvmeTier::shareable_bytes() const { return shareable_bytes_; }

bool NvmeTier::ShareRoomFor(const NamespaceFingerprint& ns, uint64_t record_bytes) {
  const ShareOwner owner = shares_(ns);
  if (owner.owner == 0) return true;  // its block is protected by no share: it may go again
  auto mine = owner_bytes_.find(owner.owner);
  const uint64_t held = mine == owner_bytes_.end() ? 0 : mine->second.held.record;
  if (held + record_bytes > owner.share_bytes) return true;  // over its share: its own blocks make room
  // O(owners): the bytes on the device that shares protect. With shares
  // that add up to at most shareable_bytes() (what kvtierd configures)
  // this always fits; the check keeps the log able to make room whatever
  // shares are installed.
  uint64_t guarded = 0;
  for (const auto& [id, o] : owner_bytes_) guarded += std::min(o.held.record, o.share_bytes);
  return guarded + record_bytes <= shareable_bytes_;
}

RegionManager::ReclaimGate NvmeTier::Gate() const {
  if (!shares_) return {};
  // Called by regions_, whose every use is under mu_.
  return [this](uint32_t region) {
    mu_.AssertHeld();
    return cleared_ == std::pair{region, regions_.Generation(region)};
  };
}

void NvmeTier::ForEachNamespaceBytes(const NamespaceBytesVisitor& visit) const {
  MutexLock lock(mu_);
  for (const auto& [ns, bytes] : namespace_bytes_) visit(ns, bytes.payload);
}

void NvmeTier::ForEachBlock(const BlockVisitor& visit) const {
  MutexLock lock(mu_);
  for (const auto& [key, e] : entries_) visit(key, BlockInfo{e.ns, e.payload_bytes, e.layer_count, e.payload_checksum});
  blocks_listed_.fetch_add(static_cast<int64_t>(entries_.size()), std::memory_order_relaxed);
}

Status NvmeTier::Erase(const BlockKey& key) {
  MutexLock lock(mu_);
  auto it = entries_.find(key);
  if (writing_.count(key) != 0) cancelled_.insert(key);  // a write or reinsertion in flight leaves nothing
  if (it == entries_.end() && writing_.count(key) != 0) {
    ++counters_.erases;
    return Status::Ok();
  }
  if (it == entries_.end()) return NotFound("block is not on the nvme tier");
  const IndexEntry entry = it->second;
  // Gone from memory at once; the index writer deletes the persistent
  // entry before any later write of the key indexes it again.
  PostIndex([this, key] { return index_->Delete(key); });
  Account(entry, -1);
  region_keys_[entry.region].erase(key);
  entries_.erase(it);
  reclaim_.OnDropped(key);
  ++counters_.erases;
  return Status::Ok();
}

NvmeTier::WriteTotals NvmeTier::write_totals() const {
  MutexLock lock(mu_);
  return counters_.submitted;
}

bool NvmeTier::full() const {
  MutexLock lock(mu_);
  return full_;
}

void NvmeTier::VisitCounters(CounterVisitor& v) const {
  {
    MutexLock lock(mu_);
    v.VisitGauge("nvme.blocks", static_cast<int64_t>(entries_.size()));
    v.VisitGauge("nvme.stored_bytes", counters_.stored_bytes);
    v.VisitGauge("nvme.capacity_bytes", static_cast<int64_t>(device_->capacity_bytes()));
    v.VisitGauge("nvme.full", full_ ? 1 : 0);
    v.Visit("nvme.writes", counters_.writes);
    v.Visit("nvme.write_failures", counters_.write_failures);
    v.Visit("nvme.write_rejections", counters_.write_rejections);
    v.Visit("nvme.index_failures", counters_.index_failures);
    v.Visit("nvme.enospc", counters_.enospc);
    v.Visit("nvme.reads", counters_.reads);
    v.Visit("nvme.header_cache_hits", counters_.header_cache_hits);
    v.Visit("nvme.blocks_listed", blocks_listed_.load(std::memory_order_relaxed));
    v.Visit("nvme.share_copies", counters_.share_copies);
    v.Visit("nvme.share_copy_failures", counters_.share_copy_failures);
    v.Visit("nvme.share_refusals", counters_.share_refusals);
    v.Visit("nvme.read_failures", counters_.read_failures);
    v.Visit("nvme.corrupt_reads", counters_.corrupt_reads);
    v.Visit("nvme.reclaimed_reads", counters_.reclaimed_reads);
    v.Visit("nvme.erases", counters_.erases);
    v.Visit("nvme.reinserted", counters_.reinserted);
    v.Visit("nvme.reinserted_bytes", counters_.reinserted_bytes);
    v.Visit("nvme.reinsert_failures", counters_.reinsert_failures);
    v.Visit("nvme.reinsert_over_budget", counters_.reinsert_over_budget);
    v.Visit("nvme.reinsert_needed", counters_.reinserted_needed);
    v.VisitGauge("nvme.policy_blocks", static_cast<int64_t>(reclaim_.tracked_blocks()));
    v.Visit("nvme.policy_spared", reclaim_.spared());
    v.Visit("nvme.evictions_offered", counters_.evictions_offered);
    v.Visit("nvme.eviction_read_failures", counters_.eviction_read_failures);
    v.Visit("nvme.evictions_missed", counters_.evictions_missed);
    v.Visit("nvme.write_checksum_mismatches", counters_.write_checksum_mismatches);
    v.Visit("nvme.recovery_loaded", recovery_.entries_loaded);
    v.Visit("nvme.recovery_dropped_stale", recovery_.dropped_stale);
    v.Visit("nvme.recovery_dropped_corrupt", recovery_.dropped_corrupt);
    // Blocks that left the tier, by why (the tier-independent family).
    v.Visit("tier.evictions{tier=\"nvme\",reason=\"capacity\"}", counters_.reclaim_dropped);
    v.Visit("tier.evictions{tier=\"nvme\",reason=\"corrupt\"}", counters_.corrupt_reads);
    v.Visit("tier.evictions{tier=\"nvme\",reason=\"erased\"}", counters_.erases);
    regions_.VisitCounters(v);
  }
  staging_->VisitCounters(v);
  device_->VisitCounters(v);
}

}  // namespace kvtier
