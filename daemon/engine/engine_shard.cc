#include "daemon/engine/engine_shard.h"

#include "common/check.h"

namespace kvtier {

bool DropReservation(EngineShard& shard, HostTier& host, ConnectionId connection, const BlockKey& key) {
  auto it = shard.index.find(key);
  if (it == shard.index.end() || it->second.state != BlockState::kReserved || it->second.writer != connection) {
    return false;
  }
  if (it->second.allocated) host.Free(it->second.extent);
  shard.index.erase(it);
  EndReservation(shard, connection, key);
  return true;
}

void EndReservation(EngineShard& shard, ConnectionId connection, const BlockKey& key) {
  auto held = shard.reserved.find(connection);
  if (held == shard.reserved.end()) return;
  held->second.erase(key);
  if (held->second.empty()) shard.reserved.erase(held);
}

uint64_t Unpin(EngineShard& shard, HostTier& host, const LeaseRecord& lease, uint64_t now_us) {
  auto it = shard.index.find(lease.key);
  if (it != shard.index.end() && it->second.cached() && it->second.handle == lease.handle) {
    KVTIER_CHECK(it->second.state == BlockState::kPinned && it->second.pins > 0, "unpin of an unpinned block");
    if (--it->second.pins == 0) {
      shard.policy->OnUnpin(lease.handle, now_us);
      it->second.state = BlockState::kCommitted;
    }
    return 0;
  }
  auto z = shard.zombies.find(lease.handle);
  KVTIER_CHECK(z != shard.zombies.end(), "lease refers to no block");
  KVTIER_CHECK(z->second.pins > 0, "unpin of an unpinned zombie");
  if (--z->second.pins != 0) return 0;
  const uint64_t transient = z->second.state == BlockState::kLayerRead ? z->second.size : 0;
  host.Free(z->second.extent);
  shard.zombies.erase(z);
  return transient;
}

void Publish(HostTier& host, const BlockKey& key, BlockEntry& entry) {
  HostDirectory* dir = host.directory();
  if (dir != nullptr) entry.published = dir->Publish(entry.ns, key, entry.extent.offset, entry.size, entry.checksum);
}

void Withdraw(HostTier& host, const BlockKey& key, BlockEntry& entry) {
  HostDirectory* dir = host.directory();
  if (dir == nullptr) return;
  if (entry.published) {
    dir->Withdraw(key);
  } else {
    dir->ForgetUnpublished();
  }
  entry.published = false;
}

bool EndPrefetched(EngineShard& shard, BlockEntry& entry) {
  if (!entry.prefetched) return false;
  entry.prefetched = false;
  shard.prefetched_bytes -= entry.size;
  return true;
}

void RemoveCommitted(EngineShard& shard, HostTier& host,
                     std::unordered_map<BlockKey, BlockEntry>::iterator it) {
  BlockEntry& entry = it->second;
  EndPrefetched(shard, entry);
  Withdraw(host, it->first, entry);
  shard.policy->OnRemove(entry.handle);
  shard.committed.erase(entry.handle);
  shard.stored_bytes -= entry.size;
  if (entry.pins > 0) {
    entry.state = BlockState::kErasedWhilePinned;
    shard.zombies.emplace(entry.handle, std::move(entry));
  } else {
    host.Free(entry.extent);
  }
  shard.index.erase(it);
}

}  // namespace kvtier
