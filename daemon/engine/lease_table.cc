#include "daemon/engine/lease_table.h"

#include <string>

namespace kvtier {

LeaseId LeaseTable::Grant(ConnectionId connection, const BlockKey& key, BlockHandle handle) {
  const LeaseId lease = (next_++ << kLeaseShardBits) | shard_index_;
  leases_.emplace(lease, LeaseRecord{connection, key, handle});
  by_connection_[connection].insert(lease);
  return lease;
}

Result<LeaseRecord> LeaseTable::Take(ConnectionId connection, LeaseId lease) {
  auto it = leases_.find(lease);
  if (it == leases_.end()) {
    return NotFound("lease " + std::to_string(lease) + " is not held (unknown or already released)");
  }
  if (it->second.connection != connection) {
    return PermissionDenied("lease " + std::to_string(lease) + " belongs to another connection");
  }
  LeaseRecord record = it->second;
  leases_.erase(it);
  auto held = by_connection_.find(connection);
  held->second.erase(lease);
  if (held->second.empty()) by_connection_.erase(held);
  return record;
}

std::vector<LeaseRecord> LeaseTable::TakeAll(ConnectionId connection) {
  std::vector<LeaseRecord> out;
  auto node = by_connection_.extract(connection);
  if (node.empty()) return out;
  out.reserve(node.mapped().size());
  for (LeaseId lease : node.mapped()) {
    auto it = leases_.find(lease);
    out.push_back(it->second);
    leases_.erase(it);
  }
  return out;
}

}  // namespace kvtier
