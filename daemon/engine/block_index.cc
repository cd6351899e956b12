#include "daemon/engine/block_index.h"

#include <string>

#include "common/check.h"

namespace kvtier {

Status BlockIndex::Reserve(const BlockKey& key, const NamespaceFingerprint& ns, uint64_t size,
                           ConnectionId connection) {
  auto [it, inserted] = index.try_emplace(key);
  if (!inserted) {
    return AlreadyExists("block " + key.ToHex() + " is " +
                         (it->second.cached()      ? "cached"
                          : it->second.promoting() ? "being read in"
                                                   : "being written"));
  }
  it->second.ns = ns;
  it->second.size = size;
  it->second.writer = connection;
  it->second.state_ = BlockState::kReserved;
  reserved[connection].insert(key);
  return Status::Ok();
}

bool BlockIndex::DropReservation(ConnectionId connection, const BlockKey& key) {
  auto it = index.find(key);
  if (it == index.end() || it->second.state_ != BlockState::kReserved || it->second.writer != connection) {
    return false;
  }
  if (it->second.allocated) host_.Free(it->second.extent);
  index.erase(it);
  EndReservation(connection, key);
  return true;
}

void BlockIndex::DropReservations(ConnectionId connection) {
  auto node = reserved.extract(connection);
  if (node.empty()) return;
  for (const BlockKey& key : node.mapped()) {
    auto it = index.find(key);
    if (it == index.end() || it->second.state_ != BlockState::kReserved || it->second.writer != connection) continue;
    if (it->second.allocated) host_.Free(it->second.extent);
    index.erase(it);
  }
}

void BlockIndex::CommitReserved(Entries::iterator it, ConnectionId connection, uint64_t checksum,
                                std::vector<uint64_t> layer_checksums, BlockHandle handle, uint64_t now_us) {
  BlockEntry& entry = it->second;
  KVTIER_CHECK(entry.state_ == BlockState::kReserved && entry.writer == connection, "commit of no reservation");
  entry.checksum = checksum;
  entry.layer_checksums = std::move(layer_checksums);
  entry.writer = 0;
  EndReservation(connection, it->first);
  Insert(it->first, entry, handle, now_us);
}

LeaseId BlockIndex::Pin(const BlockKey& key, BlockEntry& entry, ConnectionId connection, uint64_t now_us,
                        bool* was_prefetched) {
  KVTIER_CHECK(entry.cached(), "pin of a block not cached");
  if (entry.pins++ == 0) {
    policy->OnPin(entry.handle);
    entry.state_ = BlockState::kPinned;
  }
  entry.hits++;
  *was_prefetched = EndPrefetched(entry);
  entry.last_use_us = now_us;
  return leases.Grant(connection, key, entry.handle);
}

uint64_t BlockIndex::Unpin(const LeaseRecord& lease, uint64_t now_us) {
  auto it = index.find(lease.key);
  if (it != index.end() && it->second.cached() && it->second.handle == lease.handle) {
    KVTIER_CHECK(it->second.state_ == BlockState::kPinned && it->second.pins > 0, "unpin of an unpinned block");
    if (--it->second.pins == 0) {
      policy->OnUnpin(lease.handle, now_us);
      it->second.state_ = BlockState::kCommitted;
    }
    return 0;
  }
  auto z = zombies.find(lease.handle);
  KVTIER_CHECK(z != zombies.end(), "lease refers to no block");
  KVTIER_CHECK(z->second.pins > 0, "unpin of an unpinned zombie");
  if (--z->second.pins != 0) return 0;
  const uint64_t transient = z->second.state_ == BlockState::kLayerRead ? z->second.size : 0;
  host_.Free(z->second.extent);
  zombies.erase(z);
  return transient;
}

BlockEntry& BlockIndex::BeginPromotion(const BlockKey& key, const NamespaceFingerprint& ns, uint64_t size,
                                       bool prefetched) {
  auto [it, inserted] = index.try_emplace(key);
  KVTIER_CHECK(inserted, "promotion of a key the index holds");
  BlockEntry& entry = it->second;
  entry.ns = ns;
  entry.size = size;
  entry.state_ = BlockState::kPromoting;
  if (prefetched) {
    entry.prefetched = true;
    prefetched_bytes += size;
  }
  return entry;
}

void BlockIndex::CommitPromoted(Entries::iterator it, HostTier::Extent extent, uint64_t checksum,
                                std::vector<uint64_t> layer_checksums, BlockHandle handle, uint64_t now_us) {
  BlockEntry& entry = it->second;
  KVTIER_CHECK(entry.state_ == BlockState::kPromoting, "commit of a block not being promoted");
  entry.extent = extent;
  entry.allocated = true;
  entry.checksum = checksum;
  entry.layer_checksums = std::move(layer_checksums);
  Insert(it->first, entry, handle, now_us);
}

bool BlockIndex::CommitAdopted(const AdoptedBlock& block, std::vector<uint64_t> layer_checksums, BlockHandle handle,
                               uint64_t now_us) {
  auto [it, inserted] = index.try_emplace(block.record.key);
  if (!inserted) return false;
  BlockEntry& entry = it->second;
  entry.ns = block.record.ns;
  entry.extent = block.extent;
  entry.allocated = true;
  entry.size = block.record.size;
  entry.checksum = block.record.checksum;
  entry.layer_checksums = std::move(layer_checksums);
  entry.journal_slot = block.slot;
  Insert(it->first, entry, handle, now_us);
  return true;
}

void BlockIndex::FailPromotion(Entries::iterator it, HostTier::Extent extent) {
  KVTIER_CHECK(it->second.promoting(), "failed promotion of a block not being promoted");
  EndPrefetched(it->second);
  index.erase(it);
  if (extent.length != 0) host_.Free(extent);
}

void BlockIndex::EraseWhilePromoting(Entries::iterator it) {
  KVTIER_CHECK(it->second.promoting(), "erase during a promotion of a block not being promoted");
  it->second.state_ = BlockState::kErasedWhilePromoting;
}

void BlockIndex::RemoveCommitted(Entries::iterator it) {
  BlockEntry& entry = it->second;
  KVTIER_CHECK(entry.cached(), "removal of a block not cached");
  EndPrefetched(entry);
  Withdraw(it->first, entry);
  policy->OnRemove(entry.handle);
  committed.erase(entry.handle);
  stored_bytes -= entry.size;
  if (entry.pins > 0) {
    entry.state_ = BlockState::kErasedWhilePinned;
    zombies.emplace(entry.handle, std::move(entry));
  } else {
    host_.Free(entry.extent);
  }
  index.erase(it);
}

BlockEntry BlockIndex::BeginDemotion(Entries::iterator it, size_t level) {
  KVTIER_CHECK(it->second.state_ == BlockState::kCommitted, "demotion of a block pinned or not cached");
  BlockEntry entry = std::move(it->second);
  const BlockKey key = it->first;
  EndPrefetched(entry);
  Withdraw(key, entry);
  policy->OnRemove(entry.handle);
  committed.erase(entry.handle);
  stored_bytes -= entry.size;
  index.erase(it);
  Demoting& record = demoting[key];
  record.ns = entry.ns;
  record.level = level;
  record.bytes = entry.size;
  record.state_ = BlockState::kDemoting;
  entry.state_ = BlockState::kDemoting;
  return entry;
}

void BlockIndex::EraseWhileDemoting(std::unordered_map<BlockKey, Demoting>::iterator it) {
  KVTIER_CHECK(it->second.state_ == BlockState::kDemoting || it->second.state_ == BlockState::kErasedWhileDemoting,
               "erase during a demotion of a block not being demoted");
  it->second.state_ = BlockState::kErasedWhileDemoting;
}

std::optional<BlockIndex::Demoting> BlockIndex::EndDemotion(const BlockKey& key) {
  auto node = demoting.extract(key);
  if (node.empty()) return std::nullopt;
  return std::move(node.mapped());
}

LeaseId BlockIndex::AddLayerRead(const BlockKey& key, HostTier::Extent extent, uint64_t bytes, BlockHandle handle,
                                 ConnectionId connection) {
  // The transient extent lives as an invisible (zombie) entry held by one
  // lease: the last Release, or the connection's end, frees it.
  BlockEntry entry;
  entry.extent = extent;
  entry.size = bytes;
  entry.state_ = BlockState::kLayerRead;
  entry.allocated = true;
  entry.pins = 1;
  entry.handle = handle;
  const LeaseId lease = leases.Grant(connection, key, handle);
  zombies.emplace(handle, std::move(entry));
  return lease;
}

bool BlockIndex::EndPrefetched(BlockEntry& entry) {
  if (!entry.prefetched) return false;
  entry.prefetched = false;
  prefetched_bytes -= entry.size;
  return true;
}

void BlockIndex::EndReservation(ConnectionId connection, const BlockKey& key) {
  auto held = reserved.find(connection);
  if (held == reserved.end()) return;
  held->second.erase(key);
  if (held->second.empty()) reserved.erase(held);
}

void BlockIndex::Insert(const BlockKey& key, BlockEntry& entry, BlockHandle handle, uint64_t now_us) {
  entry.state_ = BlockState::kCommitted;
  entry.handle = handle;
  entry.last_use_us = now_us;
  committed.emplace(handle, key);
  policy->OnInsertKeyed(handle, key, now_us);
  stored_bytes += entry.size;
  Publish(key, entry);
  if (events_ != nullptr) events_->Stored(Tier::kHost, entry.ns, key);
}

void BlockIndex::Publish(const BlockKey& key, BlockEntry& entry) {
  if (quarantine_ != nullptr) quarantine_->Release(key);  // a good copy again (put, promoted, adopted)
  HostJournal* journal = host_.journal();
  if (journal != nullptr && entry.journal_slot == HostJournal::kNoSlot) {
    const auto layers = static_cast<uint32_t>(entry.layer_checksums.size());
    entry.journal_slot = journal->Add({entry.ns, key, entry.extent.offset, entry.size, entry.checksum, layers});
  }
  HostDirectory* dir = host_.directory();
  if (dir != nullptr) entry.published = dir->Publish(entry.ns, key, entry.extent.offset, entry.size, entry.checksum);
}

void BlockIndex::Withdraw(const BlockKey& key, BlockEntry& entry) {
  if (events_ != nullptr) events_->Removed(Tier::kHost, entry.ns, key);
  if (HostJournal* journal = host_.journal(); journal != nullptr) {
    journal->Remove(entry.journal_slot);
    entry.journal_slot = HostJournal::kNoSlot;
  }
  HostDirectory* dir = host_.directory();
  if (dir == nullptr) return;
  if (entry.published) {
    dir->Withdraw(key);
  } else {
    dir->ForgetUnpublished();
  }
  entry.published = false;
}

}  // namespace kvtier
