// ConnectionUsage: what one client connection holds of the daemon (leases,
// reservations, queued requests, namespace registrations) against its
// per-connection limits, so one connection cannot pin a block a million
// times, reserve the whole arena, or keep a reservation forever; and the
// memory each stands for, charged to the connection's ClientMemoryAccount
// (its tenant's and the daemon's bound). The RequestHandler asks before it
// calls the engine and tells it what the engine granted; the connection's
// timer asks which reservations expired and aborts them.
//
// Thread-compatible: its connection's thread (a Pin's completion, which may
// run on a tier thread, is ordered before the connection's next request).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <unordered_map>
#include <vector>

#include "daemon/server/client_memory.h"
#include "kvtier/block_key.h"

namespace kvtier {

// The per-connection limits (server.* options). Defaults are kvtierd's.
struct ConnectionLimits {
  uint32_t max_connections = 4096;
  // With tenants: the % of max_connections split equally among the tenants
  // and the operator, each part kept for its owner (ConnectionSlots).
  uint32_t reserved_connections_percent = 50;
  // A connection that has sent no whole request this long after accept is
  // closed (separate from idle_timeout, which starts at the last request).
  std::chrono::milliseconds first_request_timeout{5000};
  uint64_t max_leases = 65536;
  uint64_t max_reserved_bytes = 0;  // 0: AutoMaxReservedBytes of the (tenant's) arena
  std::chrono::seconds reservation_timeout{60};
  std::chrono::seconds idle_timeout{600};  // 0: never
  std::chrono::milliseconds frame_timeout{10000};
  uint64_t partial_frame_bytes = 256ull << 20;  // all connections together
  // Client state (ClientMemory): all connections together, the % of it
  // kept in equal parts per tenant and the operator, and per connection.
  uint64_t client_memory_bytes = 1ull << 30;
  uint32_t reserved_client_memory_percent = 50;
  uint64_t max_client_memory_per_connection = 64ull << 20;
};

// server.max_reserved_bytes_per_connection = 0 for an arena of
// `arena_bytes`: half of it, whatever its size, so a connection that
// reserves all it may leaves the other half to everyone else (a fixed
// floor in bytes would hand one connection the whole of a small arena).
// The floor is a block, not bytes: a connection holding no reservation may
// always reserve one block (RequestHandler::HandleReserve), so a block
// larger than half the arena still goes in. Never 0 (0 means no limit).
inline uint64_t AutoMaxReservedBytes(uint64_t arena_bytes) { return std::max<uint64_t>(arena_bytes / 2, 1); }

class ConnectionUsage {
 public:
  using Clock = std::chrono::steady_clock;

  // `max_reserved_bytes` 0: no limit (the Server resolves the option's 0,
  // AutoMaxReservedBytes, before it makes connections). `account` is
  // borrowed (null: memory is not charged) and outlives this.
  ConnectionUsage(uint64_t max_leases, uint64_t max_reserved_bytes, std::chrono::seconds reservation_timeout,
                  ClientMemoryAccount* account = nullptr)
      : max_leases_(max_leases),
        max_reserved_bytes_(max_reserved_bytes == 0 ? UINT64_MAX : max_reserved_bytes),
        reservation_timeout_(reservation_timeout),
        account_(account) {}

  // Leases: how many more this connection may take now (0: at its limit).
  uint64_t LeaseRoom() const { return leases_ >= max_leases_ ? 0 : max_leases_ - leases_; }
  // Makes room for up to `wanted` leases: within LeaseRoom and charged to
  // the account (ClientStateCost::kLease each); returns how many. Then
  // Leased says how many of them the engine granted (the rest are given
  // back).
  uint64_t TakeLeaseRoom(uint64_t wanted);
  void Leased(uint64_t granted, uint64_t room_taken);
  void Released(uint64_t count);
  uint64_t leases() const { return leases_; }

  // Makes room for up to `wanted` reservations in the account
  // (ClientStateCost::kReservation each); returns how many. Each the
  // engine granted is then Reserved; GiveBackReservationRoom returns the
  // room of those it did not.
  uint64_t TakeReservationRoom(uint64_t wanted);
  void GiveBackReservationRoom(uint64_t count);
  // Whether `bytes` more may be reserved now (within max_reserved_bytes).
  bool ReserveFits(uint64_t bytes) const {
    return bytes <= max_reserved_bytes_ - std::min(reserved_bytes_, max_reserved_bytes_);
  }
  // The engine granted `key` a reservation of `bytes` at `now`, its room
  // taken before (a key reserved again gives back the room it took).
  void Reserved(const BlockKey& key, uint64_t bytes, Clock::time_point now);
  // `key`'s reservation ended (committed, aborted, refused at commit).
  void Ended(const BlockKey& key);
  // The reservations older than the timeout at `now`; they are forgotten
  // (the caller aborts them in the engine).
  std::vector<BlockKey> TakeExpired(Clock::time_point now);
  // When the oldest reservation expires (nullopt: none held). Drops the
  // stale entries in front of it.
  std::optional<Clock::time_point> NextExpiry();
  uint64_t reserved_bytes() const { return reserved_bytes_; }
  size_t reservations() const { return reservations_.size(); }
  // Entries of the expiry queue (live reservations, and stale ones not yet
  // dropped).
  size_t expiry_records() const { return by_age_.size(); }

  // A layer-wise load of `blocks` blocks: whether its leases and state fit
  // (charged when they do; else Busy naming the limit). Then LoadBegun
  // when the engine started it, or LoadRefused when it did not.
  Status TakeLoadRoom(uint64_t blocks);
  void LoadRefused(uint64_t blocks);
  // The load holds its `blocks` leases until it ends.
  void LoadBegun(uint64_t load, uint64_t blocks);
  void LoadEnded(uint64_t load);

  // Queued request `request` of the connection now names `keys` keys (0:
  // it left the queue). Charges or gives back the difference
  // (ClientStateCost::kQueuedRequest + kQueuedKey per key); Busy, changing
  // nothing, when the growth does not fit.
  Status SetQueued(uint64_t request, uint64_t keys);
  // The keys `request` names now (0: not queued).
  uint64_t queued_keys(uint64_t request) const;

  // Why the account refused room for `what` (a Busy message).
  std::string MemoryRefusal(std::string_view what) const {
    return account_ == nullptr ? std::string() : account_->Refusal(what);
  }

  // Namespace registrations of `bytes` (their ClientStateCost and
  // strings), held until the connection closes: Busy when they do not fit.
  Status ChargeNamespaces(uint64_t bytes);

  // Whether the connection holds anything a close would take away.
  bool holds_anything() const { return leases_ > 0 || !reservations_.empty(); }
  uint64_t max_leases() const { return max_leases_; }
  uint64_t max_reserved_bytes() const { return max_reserved_bytes_; }

 private:
  struct Reservation {
    uint64_t bytes;
    Clock::time_point at;
  };
  // Gives back `units` pieces of `unit_bytes` to the account (if any).
  void GiveBack(uint64_t units, uint64_t unit_bytes);

  const uint64_t max_leases_;
  const uint64_t max_reserved_bytes_;
  const std::chrono::seconds reservation_timeout_;
  ClientMemoryAccount* const account_;
  uint64_t leases_ = 0;
  uint64_t reserved_bytes_ = 0;
  std::unordered_map<BlockKey, Reservation> reservations_;
  // Reservations in the order they were made (times only grow), so expiry
  // looks at the oldest only. An entry whose reservation ended, or was made
  // again later, is skipped when it comes up.
  std::deque<std::pair<Clock::time_point, BlockKey>> by_age_;
  std::unordered_map<uint64_t, uint64_t> loads_;   // load id -> blocks it holds
  std::unordered_map<uint64_t, uint64_t> queued_;  // request id -> keys it names
};

}  // namespace kvtier
