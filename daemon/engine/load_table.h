// LoadRecord and LoadTable: the layer-wise loads (Engine::BeginLoad) open
// on each connection.
//
// A LoadRecord is one open load as the daemon sees it: what its board in
// the arena shows (kept here, never read back: the client can write the
// board), its pins, and the blocks it holds in place in the tier above.
// LoadTable numbers the loads and finds them by (connection, id); at most
// a set number are open per connection.
//
// Thread-safe. LoadTable's mutex and each record's mutex are leaves;
// nothing else is taken under either.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/load_board.h"
#include "common/mutex.h"
#include "daemon/engine/block_entry.h"
#include "daemon/engine/lease_table.h"
#include "kvtier/block_key.h"
#include "kvtier/result.h"
#include "tiers/host/host_tier.h"

namespace kvtier {

struct LoadRecord {
  ConnectionId connection = 0;
  uint64_t id = 0;
  uint32_t layers = 1;
  uint64_t layer_bytes = 0;
  bool verify = false;  // the board has the layer checksum table

  Mutex mu;
  // The board's arena space: set when the load opens, freed (and cleared)
  // by whoever sees it ended with every block resolved.
  HostTier::Extent board_extent GUARDED_BY(mu);
  // Guarded by mu, but for in_place, ns and keys: set before the load is
  // shared, read-only after.
  LoadBoardWriter board GUARDED_BY(mu);
  std::vector<uint32_t> pending GUARDED_BY(mu);  // per layer: blocks neither with it in place nor failed
  std::vector<uint8_t> counted GUARDED_BY(mu);   // block * layers + layer: taken out of `pending`
  std::vector<LeaseId> leases GUARDED_BY(mu);    // per block: the load's pin, 0 for none
  // In place (BeginLoad's `in_place`): the keys, and the blocks held in
  // the tier above at their offsets there (released at the end).
  bool in_place = false;
  NamespaceFingerprint ns;
  std::vector<BlockKey> keys;
  std::vector<std::pair<size_t, uint64_t>> held GUARDED_BY(mu);
  size_t unresolved GUARDED_BY(mu) = 0;  // blocks not yet loaded or failed
  uint32_t ready GUARDED_BY(mu) = 0;     // layers published
  bool ended GUARDED_BY(mu) = false;

  // Takes layer `layer` of `block` out of `pending` (once). mu held.
  void Count(size_t block, uint32_t layer) REQUIRES(mu);
  // Publishes on the board the layers now in place in every block. mu held.
  void Advance() REQUIRES(mu);
};

class LoadTable {
 public:
  explicit LoadTable(size_t max_per_connection) : max_per_connection_(max_per_connection) {}

  // Takes a load slot on `connection` and numbers it; Busy when the
  // connection holds max_per_connection loads (open or opening). The slot
  // is empty (Find misses it) until Fill, or freed by Abandon.
  Result<uint64_t> Open(ConnectionId connection);
  void Fill(ConnectionId connection, uint64_t id, std::shared_ptr<LoadRecord> load);
  void Abandon(ConnectionId connection, uint64_t id);
  // Removes and returns the filled load `id` of `connection`; null when
  // there is none (unknown, still opening, or taken already).
  std::shared_ptr<LoadRecord> Take(ConnectionId connection, uint64_t id);
  // The ids of `connection`'s loads (to end them all).
  std::vector<uint64_t> Ids(ConnectionId connection) const;
  // Loads open (or opening) on every connection.
  int64_t OpenCount() const;

 private:
  const size_t max_per_connection_;
  mutable Mutex mu_;
  // Each connection's loads by id; null while opening.
  std::unordered_map<ConnectionId, std::unordered_map<uint64_t, std::shared_ptr<LoadRecord>>> loads_ GUARDED_BY(mu_);
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
};

}  // namespace kvtier
