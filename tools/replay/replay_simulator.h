// The replay simulator's machinery (tools/replay/replay_sim.h is its interface):
// one Simulator runs one trace under one ReplayOptions, over one node or
// several (options.nodes) sharing the remote tier.
//   replay_simulator.cc  the request loop: routing, engine model, queue
//                        hints, lookups, a request's pins and new blocks
//   replay_placement.cc  where blocks go: eviction, demotion through
//                        admission, promotion, the NVMe log's hooks, prefetch
//   replay_peer.cc       the peer tier (ReplayOptions::peer): a lookup's
//                        places and probe, a pull's source and its use there
// Internal to tools/; not thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <queue>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "policy/admission_policy.h"
#include "policy/eviction_policy.h"
#include "tools/replay/replay_belady.h"
#include "tools/replay/replay_log.h"
#include "tools/replay/replay_router.h"
#include "tools/replay/replay_sim.h"

namespace kvtier::tools {

inline constexpr uint32_t kNoParent = UINT32_MAX;
// The peer tier as a level of a node's stack (ReplayOptions::peer): between
// its NVMe tier and the remote tier, never written. Not a SimTier: it has
// no residency of its own (the other nodes' tiers are its contents).
inline constexpr int kPeerLevel = kSimTiers;
inline constexpr uint64_t kNeverLearned = UINT64_MAX;

// What every node sees alike of a block.
struct SimBlock {
  BlockKey key;
  uint64_t tokens = 0;          // from the latest request naming it
  uint64_t pinned_by = 0;       // the request (1-based) pinning it in its node's host tier, 0: none
  uint32_t parent = kNoParent;  // the block before it in the latest chain
  uint64_t session = 0;         // the conversation of the latest request naming it
};

// What one node knows of a block besides where it is.
struct NodeBlock {
  // This node's requests that used it since it last entered the node's
  // host tier (its admission class, as the daemon's BlockEntry::hits).
  uint64_t uses = 0;
  bool prefetched = false;  // read into this node's host tier by a prefetch plan and not used since
  uint64_t arrives_us = 0;  // prefetched: when its read lands
  // The peer tier: when a probe of this node's last found another node
  // holding it (kNeverLearned: never), what the daemon's PeerTier::Find
  // answers from for peer_known_us.
  uint64_t peer_learned_us = kNeverLearned;
};

// A tier: run by an eviction policy over a capacity (host, remote, and the
// NVMe tier when it is not a log), or the NVMe log (no policy; its node's
// `log`). Residency is the tier's own: a node's tiers are its alone, the
// remote tier is one object every node reads and writes. `in` and `held`
// are indexed by block id and grow with the block table.
struct SimTierState {
  const Capacity* capacity = nullptr;  // null: the tier is absent
  std::unique_ptr<EvictionPolicy> policy;
  uint64_t used = 0;
  std::vector<uint8_t> in;     // resident here
  std::vector<uint64_t> held;  // what it takes of this (policy-run) tier's capacity
};

// One kvtier node: its host and NVMe tiers (of the per-node capacities),
// its NVMe admission and write channels, its view of each block, its
// requests and engines, and the requests queued on them.
struct SimNode {
  uint32_t index = 0;
  SimTierState host, nvme;
  std::unique_ptr<SimLog> log;                         // the NVMe tier, when it is a log
  std::unique_ptr<AdmissionPolicy> admission;          // its NVMe tier's
  std::unique_ptr<AdmissionPolicy> remote_admission;   // its writes into the shared remote tier (when there is one)
  std::array<uint64_t, kSimTiers> write_busy_until{};  // its write channels (into its NVMe tier, the remote tier)
  NodeIo io;                                           // its read channels (FetchModel::kOverlap)
  uint64_t peer_read_free_us = 0;                      // and its channel from the peers
  uint64_t nvme_bytes_written = 0;                     // payload bytes into its NVMe tier
  uint64_t still_prefetched = 0;                       // bytes of its blocks with `prefetched`
  std::vector<NodeBlock> blocks;                       // by block id
  std::unordered_set<uint64_t> closed;                 // conversations whose last turn it served
  // Belady only: per block, the next request of this node naming it (its
  // own tiers' future; routes known before the run only: kv_aware's nodes
  // read Simulator::next_use_), and the instances in its tiers.
  std::vector<uint64_t> next_use;
  std::array<BeladyPolicy*, kSimTiers> belady{};
  // Its requests (file order), the position of the next to start and of
  // the next to hint, and its engines (when each is free next).
  std::vector<size_t> requests;
  size_t next = 0;
  size_t next_queued = 0;
  std::priority_queue<uint64_t, std::vector<uint64_t>, std::greater<>> free_at;
  double mean_service_us = 0;
  // Queued requests (hinted, not started): their blocks, expected starts,
  // and each block's count of queued chains naming it.
  std::unordered_map<size_t, std::vector<uint32_t>> queued;
  std::unordered_map<size_t, uint64_t> expected_start;
  std::unordered_map<uint32_t, uint32_t> queued_count;
};

class Simulator {
 public:
  // `admissions`: one NVMe admission per node (options.nodes of them);
  // `remote_admissions`: one remote admission per node with a remote
  // tier, none without. `log`: the NVMe log's options when the NVMe tier
  // is one (validated by the caller), nullopt otherwise.
  Simulator(const Trace& trace, const ReplayOptions& options, std::vector<std::unique_ptr<AdmissionPolicy>> admissions,
            std::vector<std::unique_ptr<AdmissionPolicy>> remote_admissions, const std::optional<SimLogOptions>& log);
  ReplayResult Run();

 private:
  // A request's KV load as its start finds it (engine model; zeros without).
  struct Load {
    double landing_us = 0;                    // the wait for prefetch reads still landing
    double load_us = 0;                       // the hit's bytes at each tier's read bandwidth, in turn
    double prefill_us = 0;                    // the missed tokens' prefill
    std::array<uint64_t, kSimTiers> bytes{};  // the hit's bytes by the tier read
    uint64_t peer_bytes = 0;                  // and from the peers (after one peer_rtt_us)
  };
  // A running prefill: its blocks become resident when it ends.
  struct Pending {
    uint64_t done_us;
    size_t request;
    std::vector<uint32_t> ids;
    bool operator>(const Pending& o) const { return done_us != o.done_us ? done_us > o.done_us : request > o.request; }
  };
  using PendingQueue = std::priority_queue<Pending, std::vector<Pending>, std::greater<>>;

  // replay_simulator.cc
  void MakeTiers(SimNode& n, const std::optional<SimLogOptions>& log);
  uint32_t IdOf(const BlockKey& key);
  void IndexFuture();
  // The node whose next request starts first (the engine model's time,
  // then file order; file order alone without it); null when all started.
  SimNode* NextToStart();
  // kv_aware: routes every request arriving before the next start (the
  // prefills ended by each arrival committed first).
  void RouteArrivals(PendingQueue& pending);
  void RouteOne(size_t r);
  // kv_aware: `n`'s event that `id` entered (`stored`) or left tier `tier`.
  void Emit(const SimNode& n, int tier, uint32_t id, bool stored, uint64_t now) {
    if (router_) router_->Publish(KvEvent{now, n.index, static_cast<uint8_t>(tier), id, stored});
  }
  // FetchModel::kOverlap: `load` read on `n`'s channels since `arrival_us`;
  // how long after `start` the last of it (or a prefetch read) lands.
  double OverlapWait(SimNode& n, uint64_t arrival_us, uint64_t start, const Load& load);
  uint64_t StartOf(const SimNode& n) const;
  // Starts `n`'s next request (its queue hints, the prefills ended by
  // then, its lookup), and commits it or sets its prefill running.
  void Start(SimNode& n, PendingQueue& pending, size_t warm, double& queue_sum);
  void CommitNext(PendingQueue& pending);
  // Appends to the schedule (ReplayOptions::record_schedule).
  void Record(ScheduleEvent::Kind kind, uint64_t at_us, size_t request, uint64_t start_us = 0);
  void Hint(SimNode& n, size_t r, uint64_t now, uint64_t expected_start_us);
  void Unhint(SimNode& n, size_t r, uint64_t now);
  Load Lookup(SimNode& n, size_t r, const std::vector<uint32_t>& ids, uint64_t start, bool measured);
  void Commit(SimNode& n, const std::vector<uint32_t>& ids, uint64_t request, uint64_t now);
  void CommitBlocks(SimNode& n, const std::vector<uint32_t>& ids, uint64_t request, uint64_t now);
  void Finish();

  // replay_placement.cc
  // Node `n`'s view of tier `tier`: its own host or NVMe tier, or the
  // shared remote tier.
  SimTierState& Tier(SimNode& n, int tier) { return tier == kHostTier ? n.host : tier == kNvmeTier ? n.nvme : remote_; }
  bool Present(SimNode& n, int tier) { return Tier(n, tier).capacity != nullptr; }
  // Whether `id` is resident in any tier `n` sees.
  bool Anywhere(const SimNode& n, uint32_t id) const { return n.host.in[id] || n.nvme.in[id] || remote_.in[id]; }
  uint64_t Cost(const SimTierState& t, const SimBlock& b) const;
  uint64_t Bytes(const SimBlock& b) const { return b.tokens * options_.bytes_per_token; }
  bool MakeRoom(SimNode& n, int tier, uint64_t cost, uint64_t now);
  // The class of `id` as admission sees it, by `uses` (the uses the tier
  // it leaves counted) and `n`'s view of its conversation.
  AdmissionClass ClassOf(const SimNode& n, uint32_t id, uint64_t uses) const;
  // `n`'s NVMe admission's answer for `id`, used `uses` times: Force
  // (`forced`: a queued request needs it) or Decide (a refusal is counted).
  bool NvmeAdmits(SimNode& n, uint32_t id, bool forced, uint64_t now, uint64_t uses);
  // The same for `n`'s remote admission (TierAdmission over the remote
  // tier: the candidate costs its payload and the remote value's header).
  bool RemoteAdmits(SimNode& n, uint32_t id, bool forced, uint64_t now, uint64_t uses);
  // Tier `tier`'s admission (NVMe or remote) as `n` asks it.
  bool Admits(SimNode& n, int tier, uint32_t id, bool forced, uint64_t now, uint64_t uses) {
    return tier == kNvmeTier ? NvmeAdmits(n, id, forced, now, uses) : RemoteAdmits(n, id, forced, now, uses);
  }
  // A victim of `n`'s tier `from`; `needed`: a queued request needs it
  // within the lookahead. `uses`: the uses the tier it leaves counted, as
  // the daemon's admission weighs them (the NVMe log's reads since the
  // block was written there, BlockTier::Evicted::hits); unset, `n`'s uses
  // since the block last entered its host tier (BlockEntry::hits).
  void Demote(SimNode& n, int from, uint32_t id, uint64_t now, bool needed, std::optional<uint64_t> uses = {});
  // Writes `id` into tier `to` (`n`'s write channel, then the tier's
  // room); false when it did not land.
  bool WriteBelow(SimNode& n, int to, uint32_t id, uint64_t now);
  // Reads `id` from the highest tier below `n`'s host tier holding it into
  // the host tier (room made first): its NVMe tier, then (`from_peers`,
  // with the peer tier) another node's (PeerSource, a use there:
  // ServePull), then the remote tier; false when it is held nowhere below
  // (any more) or does not fit.
  bool Promote(SimNode& n, uint32_t id, uint64_t now, bool from_peers = true);
  // The peer tier (replay_peer.cc). The node a pull of `id` by `n` reads:
  // the lowest-numbered other node holding it in its host tier, else on
  // its NVMe tier; null when none does or the peer tier is off.
  SimNode* PeerSource(const SimNode& n, uint32_t id);
  // `n`'s probe at `now` of `ids` from position `from` (the rest of a
  // chain its own tiers miss): each block another node holds is learned.
  void Probe(SimNode& n, const std::vector<uint32_t>& ids, size_t from, uint64_t now);
  // Where `n`'s lookup finds ids[i] (started at `now`), in its stack's
  // order: its host tier, its NVMe tier, the peer tier (kPeerLevel), the
  // remote tier; -1 when none holds it. At the first block its own tiers
  // miss, it probes the peers for the rest of the chain (`probed` is set).
  int Place(SimNode& n, const std::vector<uint32_t>& ids, size_t i, uint64_t now, bool& probed);
  // FetchModel::kOverlap: `bytes` pulled from the peers on `n`'s channel
  // from them since `arrival_us` (after the pulls before, then one round
  // trip); when they land.
  uint64_t PeerReadDone(SimNode& n, uint64_t arrival_us, uint64_t bytes);
  // Whether the peer tier of `n` holds `id` as the daemon's Find answers:
  // learned at a probe within peer_known_us of `now`.
  bool PeerKnown(const SimNode& n, uint32_t id, uint64_t now) const;
  // `source` serves a pull of `id` at `now`: a pin and its release in its
  // host tier (a use: its uses, its policy; a prefetched block's use), or
  // a read of its NVMe tier; its bytes counted as served.
  void ServePull(SimNode& source, uint32_t id, uint64_t now);
  // Whether `id` is held in any tier `n`'s admission sees (the daemon's
  // Evictor::HeldAnywhere): its own, the peer tier's knowledge, the remote.
  bool HeldAnywhere(const SimNode& n, uint32_t id, uint64_t now) const {
    return Anywhere(n, id) || (options_.peer && PeerKnown(n, id, now));
  }
  void EndPrefetched(SimNode& n, uint32_t id);
  // One prefetch plan over `n`'s queued requests, at `now`; whether it
  // started reads and the last of them landed.
  bool Prefetch(SimNode& n, uint64_t now);
  // What one of the daemon's triggers (Engine::SchedulePrefetch) starts: a
  // plan, and another each time the last read of a plan lands (the
  // replay's reads land at once).
  void PlanPrefetches(SimNode& n, uint64_t now) {
    while (Prefetch(n, now)) {
    }
  }
  SimLog::Hooks LogHooks(SimNode& n);

  const Trace& trace_;
  const ReplayOptions& options_;
  std::vector<uint32_t> route_;            // per request, the node serving it (kv_aware: once routed)
  std::unique_ptr<KvAwareRouter> router_;  // kv_aware only
  size_t next_route_ = 0;                  // kv_aware: the next request to route
  std::vector<SimNode> nodes_;             // never resized after construction (the log hooks hold pointers)
  SimTierState remote_;                    // shared by all nodes
  uint64_t now_us_ = 0;                    // the time of the event in progress (the log's hooks)
  std::unordered_map<BlockKey, uint32_t> index_;
  std::vector<SimBlock> blocks_;
  std::unordered_map<uint64_t, size_t> last_turn_;  // conversation -> its last request
  std::vector<QueuedBlock> hint_chain_;             // Hint's scratch
  std::vector<size_t> scratch_pinned_;              // CommitBlocks' scratch
  std::vector<uint32_t> scratch_ids_;               // Start's scratch
  // Belady only: per block, its next use by any node (the remote tier's
  // future, and every node's under kv_aware; a request index) and its
  // depth; per request block, the request after it naming the block, on
  // any node and (routes known before the run) on the same node.
  std::vector<uint64_t> next_use_;
  std::vector<uint32_t> depth_;
  std::vector<uint64_t> future_;
  std::vector<uint64_t> node_future_;
  std::vector<size_t> future_begin_;
  BeladyPolicy* remote_belady_ = nullptr;
  ReplayResult result_;
};

}  // namespace kvtier::tools
