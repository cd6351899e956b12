// ConnectionUsage: what one client connection holds of the daemon (leases,
// reservations) against its per-connection limits, so one connection cannot
// pin a block a million times, reserve the whole arena, or keep a
// reservation forever. The RequestHandler asks before it calls the engine
// and tells it what the engine granted; the connection's timer asks which
// reservations expired and aborts them.
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
  // AutoMaxReservedBytes, before it makes connections).
  ConnectionUsage(uint64_t max_leases, uint64_t max_reserved_bytes, std::chrono::seconds reservation_timeout)
      : max_leases_(max_leases),
        max_reserved_bytes_(max_reserved_bytes == 0 ? UINT64_MAX : max_reserved_bytes),
        reservation_timeout_(reservation_timeout) {}

  // Leases: how many more this connection may take now (0: at its limit).
  uint64_t LeaseRoom() const { return leases_ >= max_leases_ ? 0 : max_leases_ - leases_; }
  void Leased(uint64_t count) { leases_ += count; }
  void Released(uint64_t count) { leases_ -= std::min(count, leases_); }
  uint64_t leases() const { return leases_; }

  // Whether `bytes` more may be reserved now (within max_reserved_bytes).
  bool ReserveFits(uint64_t bytes) const { return bytes <= max_reserved_bytes_ - std::min(reserved_bytes_, max_reserved_bytes_); }
  // The engine granted `key` a reservation of `bytes` at `now`.
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

  // A layer-wise load holding `blocks` leases until it ends.
  void LoadBegun(uint64_t load, uint64_t blocks);
  void LoadEnded(uint64_t load);

  // Whether the connection holds anything a close would take away.
  bool holds_anything() const { return leases_ > 0 || !reservations_.empty(); }
  uint64_t max_leases() const { return max_leases_; }
  uint64_t max_reserved_bytes() const { return max_reserved_bytes_; }

 private:
  struct Reservation {
    uint64_t bytes;
    Clock::time_point at;
  };
  const uint64_t max_leases_;
  const uint64_t max_reserved_bytes_;
  const std::chrono::seconds reservation_timeout_;
  uint64_t leases_ = 0;
  uint64_t reserved_bytes_ = 0;
  std::unordered_map<BlockKey, Reservation> reservations_;
  // Reservations in the order they were made (times only grow), so expiry
  // looks at the oldest only. An entry whose reservation ended, or was made
  // again later, is skipped when it comes up.
  std::deque<std::pair<Clock::time_point, BlockKey>> by_age_;
  std::unordered_map<uint64_t, uint64_t> loads_;  // load id -> blocks it holds
};

}  // namespace kvtier
