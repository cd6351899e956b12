// NvmeTier writes (nvme_tier.h): a record staged, checksummed from the
// staged copy and written through the device, then indexed (RocksDB first,
// then memory) once the write completed. A reinsertion is the same write,
// taking over from the record it copied.
#include <cstring>

#include "common/logging.h"
#include "tiers/nvme/nvme_tier.h"

namespace kvtier {

Status NvmeTier::Write(const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layer_count,
                       std::span<const std::byte> payload, WriteDone done, std::optional<uint64_t> payload_checksum) {
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
      MaybeScanNextVictim();  // the next victim may wait for its turn (Gate)
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
  device_->Write(
      entry.offset, staging.first(record_bytes),
      [this, key, entry, staging, record_bytes, done = std::move(done), replaced](Result<size_t> r) {
        if (r.ok() && *r != record_bytes) {
          r = IoError("short write: " + std::to_string(*r) + " of " + std::to_string(record_bytes) + " bytes");
        }
        OnWritten(key, entry, staging, std::move(r), done, replaced);
      });
  return Status::Ok();
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
          ++counters_.writes;                       // a reinsertion counts as such
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

}  // namespace kvtier
