// LeaseTable: the leases of one index shard. A lease is one connection's
// hold on one block (by key and the policy's handle, or a layer read's
// extent): while it lives the block's bytes stay where the grant said.
// Release checks the owner; a closing connection takes all of its own.
//
// Lease ids carry their shard in the low kLeaseShardBits bits, so Release
// goes straight to the one shard (and the one table) that holds it.
//
// Not thread-safe: the shard's mutex guards it (daemon/engine/block_index.h).
#pragma once

#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "daemon/engine/block_entry.h"
#include "kvtier/block_key.h"
#include "kvtier/result.h"
#include "policy/eviction_policy.h"

namespace kvtier {

// A lease's number (LeaseTable::Grant); the one definition of the type.
using LeaseId = uint64_t;

constexpr int kLeaseShardBits = 8;

// The shard a lease id names.
inline size_t LeaseShard(LeaseId lease) { return lease & ((1u << kLeaseShardBits) - 1); }

struct LeaseRecord {
  ConnectionId connection = 0;
  BlockKey key;
  BlockHandle handle = 0;
};

class LeaseTable {
 public:
  // Lease numbers count up from `first_sequence` (>= 1), shifted above the
  // shard bits. The engine starts every daemon's tables at a random point,
  // so a number from before a restart (a client's stale raw Release) names
  // no lease of the new daemon.
  LeaseTable(size_t shard_index, uint64_t first_sequence) : shard_index_(shard_index), next_(first_sequence) {}

  // A new lease of `connection` on the block `key` with `handle`.
  LeaseId Grant(ConnectionId connection, const BlockKey& key, BlockHandle handle);
  // Ends `lease` for its holder. NotFound when it is not held (never
  // granted, or released already); PermissionDenied, leaving it held, when
  // another connection holds it.
  Result<LeaseRecord> Take(ConnectionId connection, LeaseId lease);
  // Ends every lease `connection` holds here and returns them.
  std::vector<LeaseRecord> TakeAll(ConnectionId connection);

  size_t size() const { return leases_.size(); }

 private:
  size_t shard_index_;
  uint64_t next_;
  std::unordered_map<LeaseId, LeaseRecord> leases_;
  std::unordered_map<ConnectionId, std::unordered_set<LeaseId>> by_connection_;
};

}  // namespace kvtier
