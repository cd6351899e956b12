// ClientMemory: the memory kvtierd holds for what its clients ask of it
// (queue hints and their keys, leases, reservations, namespace
// registrations and their strings, layer-wise loads, partial frames and
// responses waiting to be sent), charged to the connection that asked and
// to its party (a tenant, or the operator) against three bounds:
//
// - per connection: server.max_client_memory_per_connection;
// - per party: server.client_memory_bytes split as connection slots are
//   (PartedBudget): server.reserved_client_memory_percent of it divided
//   equally among the parties, each part kept for its owner, the rest
//   shared first come;
// - in total: server.client_memory_bytes.
//
// A charge past any bound is refused for the connection that asked alone
// (its request is answered Busy); what one tenant's connections hold never
// takes another tenant's part. What each piece of state costs is a
// constant measured on kvtierd and rounded up (ClientStateCost), so the
// charged total bounds the resident memory it stands for
// (docs/RELIABILITY.md, "Client state").
//
// Thread-safe. ClientMemoryAccount, one per connection, is thread-safe too
// (a Pin's completion may charge from a tier thread).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/mutex.h"
#include "daemon/server/parted_budget.h"
#include "kvtier/status.h"

namespace kvtier {

// Bytes of daemon memory one piece of client state stands for: measured as
// kvtierd's resident growth per piece and rounded up
// (tests/python/test_client_memory.py checks the bound they give).
struct ClientStateCost {
  // A queued request: its map entry, its shard list, each shard policy's
  // record of it.
  static constexpr uint64_t kQueuedRequest = 1024;
  // Each key of a queued chain: the request's copy, the queued-key count,
  // the shard policy's record, the lineage entry.
  static constexpr uint64_t kQueuedKey = 320;
  // A lease (the lease table's entry and the connection's index of it,
  // the block's pin count) and its share of the Pin response naming it.
  static constexpr uint64_t kLease = 256;
  // A reservation: the block's index entry, the connection's record.
  static constexpr uint64_t kReservation = 384;
  // A namespace registration (its engine record, metric series), plus the
  // bytes of its strings.
  static constexpr uint64_t kNamespace = 2048;
  // Each block of a layer-wise load: its state per load beyond the lease.
  static constexpr uint64_t kLoadBlock = 128;
};

class ClientMemory {
 public:
  // `total_bytes` is split among `parties` (>= 1) with `reserved_percent`
  // kept in equal parts (PartedBudget).
  ClientMemory(uint64_t total_bytes, size_t parties, uint32_t reserved_percent);

  uint64_t used() const EXCLUDES(mu_);
  uint64_t used_of(size_t party) const EXCLUDES(mu_);
  uint64_t total() const { return total_; }
  uint64_t part() const { return part_; }
  // Charges refused so far (at any of the three bounds).
  int64_t refusals() const { return refusals_.load(std::memory_order_relaxed); }

 private:
  friend class ClientMemoryAccount;
  // Takes up to `want` whole units of `unit` bytes for `party`, as many
  // as its room allows; returns how many.
  uint64_t TakeUnits(size_t party, uint64_t want, uint64_t unit) EXCLUDES(mu_);
  void TakeSpent(size_t party, uint64_t bytes) EXCLUDES(mu_);
  void Give(size_t party, uint64_t bytes) EXCLUDES(mu_);
  void CountRefusal() { refusals_.fetch_add(1, std::memory_order_relaxed); }

  const uint64_t total_;
  const uint64_t part_;
  mutable Mutex mu_;
  PartedBudget budget_ GUARDED_BY(mu_);
  std::atomic<int64_t> refusals_{0};
};

class ClientMemoryAccount {
 public:
  // `memory` is borrowed (null: no party or daemon bound); `limit_bytes`
  // bounds this connection (0: no bound of its own).
  ClientMemoryAccount(ClientMemory* memory, size_t party, uint64_t limit_bytes);
  ~ClientMemoryAccount();  // gives back everything it holds
  ClientMemoryAccount(const ClientMemoryAccount&) = delete;
  ClientMemoryAccount& operator=(const ClientMemoryAccount&) = delete;

  // Charges `bytes` when the connection, its party and the daemon all have
  // room; false (nothing charged) when not: the caller answers
  // Busy(Refusal(what)).
  bool TryCharge(uint64_t bytes) { return ChargeUpTo(1, bytes) == 1; }
  // Charges as many of `units` pieces of `unit_bytes` each as fit under
  // every bound; returns how many (0..units).
  uint64_t ChargeUpTo(uint64_t units, uint64_t unit_bytes);
  // Charges `bytes` past every bound: memory already spent that must be
  // counted (a response built and waiting for the peer to read it).
  void ChargeSpent(uint64_t bytes);
  // Gives back `bytes` charged before (at most what is held).
  void Release(uint64_t bytes);

  uint64_t held() const { return held_.load(std::memory_order_relaxed); }
  uint64_t limit() const { return limit_; }
  // Why the last refused charge was refused, for a Busy message: which
  // bound (the connection's own, or its tenant's or the daemon's).
  std::string Refusal(std::string_view what) const;

 private:
  // The connection's own room now.
  uint64_t OwnRoom() const;

  ClientMemory* const memory_;
  const size_t party_;
  const uint64_t limit_;  // UINT64_MAX: none
  std::atomic<uint64_t> held_{0};
  std::atomic<bool> own_bound_{false};  // the last refusal was the connection's own bound
};

}  // namespace kvtier
