// PeerHolders: what the peer tier is told of which member holds which
// blocks, beyond its probes' answers: the members' KV events
// (daemon/setup/peer_setup.h adapts subscriber/held_directory.h). With it
// a probe asks the members that hold the prefix first, and skips those
// known not to hold it when the fan-out is spent (PeerTierOptions).
//
// Members are named by their resolved address ("host:port", "[v6]:port").
// Thread-safety: any thread (the peer tier calls it from its UCX thread,
// so its calls must not block for long).
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>

#include "common/counters.h"
#include "kvtier/block_key.h"

namespace kvtier {

class PeerHolders {
 public:
  virtual ~PeerHolders() = default;
  // Member `member` connected and publishes its KV events at these
  // endpoints (its Welcome said so; a wildcard host already replaced by
  // the member's): follow them. Called again after each reconnection.
  virtual void Follow(const std::string& member, const std::string& endpoint, const std::string& replay_endpoint) = 0;
  // Its connection failed or it left: forget what it holds.
  virtual void Unfollow(const std::string& member) = 0;
  // How many of `keys`, from the first, `member` holds in its tiers;
  // nullopt when nothing is known of it.
  virtual std::optional<size_t> Leading(const std::string& member, std::span<const BlockKey> keys) const = 0;
  // Its own counters, reported with the peer tier's.
  virtual void VisitCounters(CounterVisitor& v) const {}
};

}  // namespace kvtier
