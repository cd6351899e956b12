// The peer tier in the replay (ReplayOptions::peer, replay_simulator.h):
// which node serves a pull, what a node's probes learn, and the use a pull
// makes on its source, as kvtierd's PeerTier (tiers/peer/peer_tier.h) and
// the serving node's EnginePeerSource (daemon/setup/peer_setup.cc) do.
#include <algorithm>
#include <cmath>

#include "tools/replay/replay_simulator.h"

namespace kvtier::tools {

SimNode* Simulator::PeerSource(const SimNode& n, uint32_t id) {
  if (!options_.peer) return nullptr;
  // A serving node answers for its host and NVMe tiers (Locator::Where:
  // never what it would itself read from a peer or the remote tier).
  for (SimNode& m : nodes_) {
    if (&m != &n && m.host.in[id]) return &m;
  }
  for (SimNode& m : nodes_) {
    if (&m != &n && m.nvme.in[id]) return &m;
  }
  return nullptr;
}

void Simulator::Probe(SimNode& n, const std::vector<uint32_t>& ids, size_t from, uint64_t now) {
  // The daemon asks every member about the rest of the chain at once
  // (at most kMaxPeerQueryKeys of it; the replay's chains are shorter).
  for (size_t i = from; i < ids.size(); ++i) {
    if (PeerSource(n, ids[i]) != nullptr) n.blocks[ids[i]].peer_learned_us = now;
  }
}

int Simulator::Place(SimNode& n, const std::vector<uint32_t>& ids, size_t i, uint64_t now, bool& probed) {
  const uint32_t id = ids[i];
  if (n.host.in[id]) return kHostTier;
  if (n.nvme.in[id]) return kNvmeTier;
  if (options_.peer && !probed) {
    // Locator::LookupSome: the rest of the chain, in one round trip.
    Probe(n, ids, i, now);
    probed = true;
  }
  if (PeerSource(n, id) != nullptr) return kPeerLevel;
  return remote_.in[id] ? kRemoteTier : -1;
}

uint64_t Simulator::PeerReadDone(SimNode& n, uint64_t arrival_us, uint64_t bytes) {
  uint64_t& free = n.peer_read_free_us;
  const uint64_t begin = std::max(arrival_us, free);
  free =
      begin + options_.peer_rtt_us + static_cast<uint64_t>(std::ceil(double(bytes) / options_.peer_bytes_per_s * 1e6));
  return free;
}

bool Simulator::PeerKnown(const SimNode& n, uint32_t id, uint64_t now) const {
  const uint64_t learned = n.blocks[id].peer_learned_us;
  return learned != kNeverLearned && now - learned <= options_.peer_known_us;
}

void Simulator::ServePull(SimNode& source, uint32_t id, uint64_t now) {
  // EnginePeerSource::Pin: a pin of the whole block's layers. A host block
  // is pinned in place (a use: its hits, its policy's recency; a
  // prefetched block's use); one held only on NVMe is read into transient
  // space, not promoted (a read of the log, a use for its order).
  const uint64_t bytes = Bytes(blocks_[id]);
  result_.nodes[source.index].peer_bytes_served += bytes;
  if (source.host.in[id]) {
    ++source.blocks[id].uses;
    source.host.policy->OnPin(id);
    source.host.policy->OnUnpin(id, now);
    if (source.blocks[id].prefetched) {
      ++result_.prefetch_used;
      EndPrefetched(source, id);
      PlanPrefetches(source, now);
    }
  } else if (source.log) {
    source.log->Read(id, now);
  } else {
    source.nvme.policy->OnAccess(id, now);
  }
}

}  // namespace kvtier::tools
