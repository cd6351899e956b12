// The replay simulator: a block trace through kvtier's own eviction policy
// classes (policy/eviction_policy.h, the objects the daemon's engine runs),
// with the semantics of docs/REPLAY.md:
// - requests in file order, ties kept;
// - a request hits the longest prefix of resident blocks (the first miss
//   ends it);
// - afterwards all its blocks are resident and most recently used, parents
//   more recent than children (a chain loses its tail first): the blocks
//   are touched leaf first at the request's arrival time, and new ones are
//   inserted leaf first, the request's own blocks pinned meanwhile so
//   making room never evicts them;
// - a request larger than the tier keeps the longest prefix that fits
//   (room is made root first; the first block that does not fit ends it:
//   a tail without its prefix could never hit);
// - output tokens create no blocks;
// - metrics skip the first `warmup` fraction of requests.
//
// Not thread-safe; runs are independent objects, so a sweep runs them on
// separate threads.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/result.h"
#include "policy/dwpd_budget.h"
#include "policy/option_defaults.h"
#include "tools/replay/replay_trace.h"

namespace kvtier::tools {

// A tier's capacity: in tokens (bytes convert through bytes per token) or
// in blocks; unlimited when `infinite`.
struct Capacity {
  enum class Unit : uint8_t { kTokens, kBlocks } unit = Unit::kTokens;
  uint64_t amount = 0;
  bool infinite = false;
};

// "1e6tok", "50000blk", "64GiB" (bytes: needs bytes_per_token > 0),
// "inf". InvalidArgument naming the text otherwise.
Result<Capacity> ParseCapacity(const std::string& text, uint64_t bytes_per_token);
std::string CapacityText(const Capacity& c);

// The tiers, fastest first, placed as kvtierd places them:
// - the host tier runs the eviction policy;
// - the NVMe tier is the daemon's log (tools/replay/replay_log.h: RegionManager,
//   the reclaim order nvme_eviction with reinsertion, the daemon's record
//   sizes); with policy belady, or an infinite capacity, it is a tier that
//   can evict any block instead (Belady's order: the ideal a log cannot
//   reach);
// - the remote tier runs the eviction policy; each node writes to it
//   through its own admission (`remote_admission`, kvtierd's
//   remote.admission; the replay's default `all` admits everything);
// - a host victim goes to the first tier below that holds it (no write)
//   or takes it: one a queued request needs within lookahead_us is forced
//   into the first tier when its budget can pay (queue_aware), any other
//   passes each tier's admission in turn (the NVMe tier's: `admission`,
//   charged the record bytes; the remote tier's: `remote_admission`,
//   charged the payload and the remote value's header); a block the NVMe
//   log evicts is offered to the remote tier, through its admission;
// - a request's blocks held only below are promoted into the host tier
//   (the slower copy kept) and pinned with its resident ones, root first,
//   before room is made for its new blocks;
// - with the engine model and a tier below, the prefetch planner
//   (policy/prefetch_planner.h) reads queued requests' prefixes into the
//   host tier when the daemon's engine plans (Engine::SchedulePrefetch):
//   after each queue hint (Enqueue), after a queued request starts
//   (Dequeue), after a pin uses a prefetched block, and again after a plan
//   that read something (its reads landing), until a plan reads nothing.
//   A prefetched block is used when a request pins it (at its commit, see
//   below), as the daemon counts it.
enum SimTier : uint8_t { kHostTier = 0, kNvmeTier = 1, kRemoteTier = 2, kSimTiers = 3 };
std::string_view SimTierName(int tier);

// Several nodes (ReplayOptions::nodes): each kvtier node has its own host
// and NVMe tiers, placed as above with its own NVMe admission (and drive
// budget), write channels, engines and queue, and its own view of a block
// (the requests of its own that found it, the conversations it closed);
// the remote tier is one, shared. A request is served by one node, chosen
// by the router, and hits the longest prefix resident in that node's own
// tiers or the remote tier; blocks it promotes land in that node's host
// tier, and that node's victims go to its NVMe tier or the shared remote
// tier, so a block reaches the other nodes only once evicted (or, with
// the peer tier, ReplayOptions::peer, read from the node that holds it). With the
// engine model, requests start in time order across nodes (ties: file
// order).
//   round_robin:     request i (file order, from 0) to node i mod N;
//   prefix_affinity: by a hash of the request's first `affinity_blocks`
//                    blocks (SplitMix64 over their keys, mod N; fewer
//                    when the request has fewer), so requests opening with
//                    the same blocks (a conversation's turns, a common
//                    system prompt) land on the same node; a request
//                    without blocks goes to node 0. With one block and a
//                    system prompt every request opens with (Mooncake's
//                    conversation trace), every request lands on one node.
//   kv_aware:        at each request's arrival, to the node where its first
//                    token can start soonest by what KV events and the
//                    nodes' estimates say (tools/replay/replay_router.h);
//                    needs the engine model.
enum class Router : uint8_t { kRoundRobin, kPrefixAffinity, kKvAware };
std::string_view RouterName(Router router);
// "round_robin" | "prefix_affinity" | "kv_aware"; nullopt otherwise.
std::optional<Router> ParseRouter(std::string_view name);
// How a node's KV load meets its engine queue (engine model):
//   kSerial:  a request loads its hit once its engine is free, then
//             prefills (TTFT = wait + load + prefill);
//   kOverlap: the load starts at its arrival on the node's read channel of
//             each tier (one per tier per node, after the loads of its
//             requests started before), beside the wait; the engine then
//             prefills from max(free, loaded) (TTFT = max(Q, R) + C).
enum class FetchModel : uint8_t { kSerial, kOverlap };
// The node (0..nodes-1) serving each request of `trace`, in file order.
// `nodes` and `affinity_blocks` must be at least 1; `router` must not be
// kv_aware (it routes inside the run).
std::vector<uint32_t> RouteRequests(const Trace& trace, uint32_t nodes, Router router, uint32_t affinity_blocks = 1);
// The most nodes a run takes: each node keeps about 40 bytes per distinct
// block of the trace.
inline constexpr uint32_t kMaxNodes = 256;

struct ReplayOptions {
  Capacity host;                   // per node
  std::optional<Capacity> nvme;    // per node; none: no NVMe tier
  std::optional<Capacity> remote;  // shared by all nodes; none: no remote tier
  // The nodes (1..kMaxNodes) and how requests are spread over them.
  uint32_t nodes = 1;
  Router router = Router::kPrefixAffinity;
  uint32_t affinity_blocks = 1;  // prefix_affinity: the leading blocks hashed (at least 1)
  // kv_aware: its KV events arrive this late, or are lost at this rate
  // ([0, 1], drawn from event_seed).
  uint64_t event_delay_us = 10'000;
  double event_loss = 0;
  uint64_t event_seed = 1;
  // The engine model's fetch; unset: kOverlap for kv_aware, else kSerial
  // (FetchModelOf).
  std::optional<FetchModel> fetch;
  // lru | fifo | lru2 | s3fifo | arc | queue_aware (the daemon's
  // classes), or belady (the offline rule of tools/replay/replay_belady.h, which
  // reads the trace's future: simulation only)
  std::string policy = "lru";
  std::string admission = "all";  // NVMe admission: all | second_hit | dwpd
  // The remote tier's admission, each node's own (kvtierd's
  // remote.admission and remote.write_rate): all | second_hit | rate
  // (second_hit's rules within remote_write_rate bytes/s per node, a
  // one-second token bucket). kvtierd defaults to rate; the replay to all,
  // so runs that do not ask keep their figures.
  std::string remote_admission = "all";
  uint64_t remote_write_rate = 4ull << 30;  // bytes/s per node (rate): kvtierd's remote.write_rate default
  // The NVMe log (kvtierd's nvme.* options). nvme_eviction: the reclaim
  // order (fifo | lru | lru2 | s3fifo | arc | queue_aware); empty: the
  // policy's name. nvme_region_bytes 0: 64 MiB (kvtierd's default), or a
  // sixteenth of the device when that is smaller (so a small simulated
  // drive still has regions), rounded down to the alignment.
  std::string nvme_eviction;
  uint64_t nvme_region_bytes = 0;
  uint32_t nvme_alignment_bytes = 4096;
  double nvme_reinsert_share = 0.1;  // nvme.reinsert_percent / 100
  // A host victim a queued request needs within this is forced into the
  // first tier below (engine.lookahead_ms).
  uint64_t lookahead_us = 2'000'000;
  // Prefetch (engine model, a tier below and bytes per token): each plan
  // reads into at most this share of the host tier (engine.prefetch_percent
  // / 100; 0: off), skipping prefixes shorter than prefetch_min_blocks.
  double prefetch_share = defaults::kPrefetchPercent / 100.0;
  uint32_t prefetch_min_blocks = defaults::kPrefetchMinBlocks;
  DwpdOptions dwpd;              // for dwpd (drive_capacity_bytes required)
  uint64_t bytes_per_token = 0;  // byte counts (and the DWPD budget) need it
  double warmup = 0;             // [0, 1): the fraction of requests not measured
  // The engine model, on when engines > 0: that many engine instances,
  // each prefilling prefill_tps tokens/s. A request waits (in arrival
  // order) for a free engine, then holds it for its KV load (hit bytes at
  // each tier's read bandwidth; 0 without bytes per token) plus the
  // prefill of its missed tokens; decode is not modelled. TTFT = wait +
  // load + prefill. The hit is found at the start; the request's blocks
  // become resident when its prefill ends (requests starting meanwhile do
  // not see them). The requests waiting at a start are the queue the
  // policies see (Enqueue hints, each expected a mean service per engine
  // after the one before it).
  uint32_t engines = 0;
  double prefill_tps = 0;
  // Each tier's read bandwidth: a hit's load time, and the prefetch
  // planner's estimate of the tiers below (the daemon's measured one; it
  // starts at defaults::kInitialReadBytesPerS).
  std::array<double, kSimTiers> read_bytes_per_s = {20e9, 5e9, 1e9};
  // Writes into the NVMe and remote tiers (demotions) go through one
  // channel per tier at this rate. A demotion that must wait behind
  // earlier ones waits as the daemon's demoter holds it: it is dropped
  // when it would wait longer than max_write_backlog_us (the daemon's
  // Demoter::kQueuedDemotionWaitUs), or when the bytes queued in the channel
  // ahead of it and its own pass demotion_buffer_bytes (the daemon's
  // engine.demotion_buffer_bytes; 0: a demotion that must wait is dropped).
  // 0 for a tier: no limit.
  std::array<double, kSimTiers> write_bytes_per_s = {0, 2e9, 1e9};
  uint64_t max_write_backlog_us = defaults::kQueuedDemotionWaitMs * 1000;
  uint64_t demotion_buffer_bytes = defaults::kDemotionBufferBytes;
  // Engine model, one node: keep the run's schedule (ReplayResult::
  // schedule), for a live replay to drive a daemon through (replay_live.h).
  bool record_schedule = false;
  // The peer tier (kvtierd's [peer]; off by default): each node reads the
  // other nodes' host and NVMe tiers directly, as kvtierd's PeerTier does.
  // It is asked after the node's own host and NVMe tiers and before the
  // remote tier: a lookup that the node's own tiers miss probes the other
  // nodes (the probe sees every node's tiers as they are); a block another
  // node holds is a peer hit, and the request's pin pulls it from that
  // node (the lowest-numbered node holding it in its host tier, else on
  // its NVMe tier) into its own host tier, like any promotion. The pull is
  // a pin on the source: a use of the block there (host: a pin and its
  // release for the eviction policy; NVMe: a read of the log). The peer
  // tier is never written (its admission is "none"); a victim walks it as
  // any tier below: a block the node learned at a probe within
  // peer_known_us that a peer held counts as held there, so it is not
  // written further down (the daemon's PeerTier::Find). Timing: a
  // request's bytes from peers at peer_bytes_per_s, after one
  // peer_rtt_us (its pins out, their grants back). Several nodes only;
  // the kv_aware router's estimate does not see peers' copies, and the
  // prefetch planner does not read from peers (a queued request's keys
  // are not probed).
  bool peer = false;
  double peer_bytes_per_s = 10e9;
  uint64_t peer_rtt_us = 50;
  uint64_t peer_known_us = 10'000'000;  // kvtierd's PeerTierOptions::known_for
};

// One step of an engine-model run on one node, in the order the run took
// them, times never decreasing: what a client of the daemon does at that
// time to drive it as the run drove its tiers (tools/replay/replay_live.h).
struct ScheduleEvent {
  enum class Kind : uint8_t {
    kEnqueue,  // a queue hint for `request`, expected to start at `start_us`
    kDequeue,  // a hinted request starts: it leaves the queue
    kStart,    // `request` starts: the lookup of its chain (its hit)
    kCommit,   // `request`'s prefill ends: its pins, new blocks and releases
  };
  Kind kind = Kind::kStart;
  uint64_t at_us = 0;     // on the trace's clock
  size_t request = 0;     // in file order, from 0
  uint64_t start_us = 0;  // kEnqueue only
};

struct TierResult {
  uint64_t hits = 0;  // measured prompt blocks served from this tier
  uint64_t hit_tokens = 0;
  uint64_t bytes_read = 0;     // measured hit bytes it served
  uint64_t bytes_written = 0;  // bytes written into it, warm-up included
  uint64_t evictions = 0;
  uint64_t dropped_busy = 0;  // demotions into it dropped: its write channel was backed up
};

// One node's share of a run (measured requests only).
struct NodeResult {
  uint64_t requests = 0;
  uint64_t tokens = 0;             // their prompt tokens
  uint64_t local_hit_tokens = 0;   // hit tokens its own host and NVMe tiers served
  uint64_t shared_hit_tokens = 0;  // hit tokens the shared remote tier served
  uint64_t peer_hit_tokens = 0;    // hit tokens the other nodes' tiers served (the peer tier)
  uint64_t peer_bytes_served = 0;  // bytes the other nodes pulled from its tiers, warm-up included
};

struct ReplayResult {
  ReplayOptions options;
  uint64_t requests = 0;  // measured (after warm-up)
  uint64_t blocks = 0;    // measured prompt blocks
  uint64_t tokens = 0;    // measured prompt tokens
  uint64_t hit_blocks = 0;
  uint64_t hit_tokens = 0;
  std::array<TierResult, kSimTiers> tiers{};  // all nodes together
  // The peer tier (ReplayOptions::peer): hits (measured), their tokens and
  // bytes (bytes_read: the hit bytes, what crosses between nodes for
  // them); never written. pulled_bytes: the bytes the pins pulled from
  // peers into the nodes' host tiers, warm-up included; peer_pulls: the
  // measured requests that read from peers (each paid one peer_rtt_us).
  TierResult peer;
  uint64_t peer_pulled_bytes = 0;
  uint64_t peer_pulls = 0;
  std::vector<NodeResult> nodes;          // one per node
  uint64_t not_kept = 0;                  // blocks past the prefix that fits a request larger than the host tier
  uint64_t admission_refused = 0;         // victims the NVMe admission refused (the remote tier may still take them)
  uint64_t remote_admission_refused = 0;  // blocks the nodes' remote admissions refused (dropped)
  uint64_t ssd_budget_bytes = 0;          // dwpd: R x the trace's span (at least a day) x nodes; 0 otherwise
  uint64_t forced_demotions = 0;          // host victims a queued request needed, forced into the first tier below
  uint64_t nvme_reinserted = 0;           // blocks the NVMe log copied forward
  // Bytes written to the NVMe tier, what the drive's write budget counts:
  // the log's records, copies forward included (payload bytes when the
  // tier is not a log).
  uint64_t nvme_device_bytes = 0;
  // Blocks the prefetch plans started reading into the host tier, as the
  // daemon's engine.prefetches counts them (a read whose own room pushed
  // its block out below misses, and is counted too), and their bytes.
  uint64_t prefetches = 0;
  uint64_t prefetch_bytes = 0;
  uint64_t prefetch_used = 0;           // of those, blocks a request then found in the host tier
  uint64_t events_published = 0;        // kv_aware: KV events the nodes published
  uint64_t events_lost = 0;             // of those, lost on the way to the router
  uint64_t span_us = 0;                 // first to last arrival
  uint64_t lookups = 0;                 // block lookups, warm-up included (the speed figure's unit)
  std::vector<double> ttft_ms;          // measured requests' TTFT (engine model only), in start order
  std::vector<ScheduleEvent> schedule;  // with ReplayOptions::record_schedule
  // Engine model: requests waiting (arrived, not started) at each measured
  // start, averaged; 0 without it.
  double mean_queue = 0;
  // The share of the LRU-to-Belady gap in token hit rate this run closes,
  // (this - lru) / (belady - lru), set by SetGapClosed; nullopt when the
  // two reference runs are missing or Belady is less than kMinGap above
  // LRU (a ratio over a gap that small says nothing).
  std::optional<double> gap_closed;
  double wall_seconds = 0;
  // The p-th percentile of ttft_ms (Percentile); nullopt when empty.
  std::optional<double> ttft_percentile(double p) const;
  double block_hit_rate() const { return blocks == 0 ? 0 : double(hit_blocks) / double(blocks); }
  double token_hit_rate() const { return tokens == 0 ? 0 : double(hit_tokens) / double(tokens); }
  double hit_share(int tier) const { return hit_blocks == 0 ? 0 : double(tiers[tier].hits) / double(hit_blocks); }
  // The hit rates split by where the hit came from: local, the serving
  // node's own host and NVMe tiers; peer, the other nodes' (the peer
  // tier, 0 without it); shared, the remote tier. They add up to the block
  // and token hit rates.
  double local_block_hit_rate() const {
    return blocks == 0 ? 0 : double(tiers[kHostTier].hits + tiers[kNvmeTier].hits) / double(blocks);
  }
  double shared_block_hit_rate() const { return blocks == 0 ? 0 : double(tiers[kRemoteTier].hits) / double(blocks); }
  double local_token_hit_rate() const {
    return tokens == 0 ? 0 : double(tiers[kHostTier].hit_tokens + tiers[kNvmeTier].hit_tokens) / double(tokens);
  }
  double shared_token_hit_rate() const {
    return tokens == 0 ? 0 : double(tiers[kRemoteTier].hit_tokens) / double(tokens);
  }
  double peer_block_hit_rate() const { return blocks == 0 ? 0 : double(peer.hits) / double(blocks); }
  double peer_token_hit_rate() const { return tokens == 0 ? 0 : double(peer.hit_tokens) / double(tokens); }
};

// The p-th percentile (nearest rank) of `samples`; 0 when empty.
double Percentile(std::vector<double> samples, double p);

// The smallest LRU-to-Belady gap in token hit rate that gap_closed is
// reported for: a tenth of a point.
inline constexpr double kMinGap = 0.001;

// Sets `gap_closed` of every run for which `runs` holds an "lru" and a
// "belady" run with the same options but the policy (the same capacities,
// engine model, admission, bandwidths and warm-up).
void SetGapClosed(std::vector<ReplayResult>& runs);

// The NVMe tier's reclaim order a run uses ("ideal" when it is not a log:
// belady, or an infinite tier).
std::string NvmeEvictionOf(const ReplayOptions& options);

FetchModel FetchModelOf(const ReplayOptions& options);
std::string_view FetchModelName(FetchModel model);  // "serial" | "overlap"

// Whether two runs differ only in their policy.
bool SameSetting(const ReplayOptions& a, const ReplayOptions& b);

// Runs `trace` once. InvalidArgument for a node count outside
// [1, kMaxNodes], affinity_blocks 0, an unknown policy, admission, remote
// admission or NVMe eviction, a remote admission other than all without a
// remote tier, rate with a zero remote_write_rate, an NVMe geometry the daemon would refuse (fewer than 2
// regions, a region not a multiple of the alignment), bad DWPD options, a
// warm-up outside [0, 1), an NVMe or remote tier (or dwpd) without bytes
// per token, engines without a positive prefill rate, record_schedule
// without the engine model or with several nodes, a read bandwidth
// not above 0, or the peer tier with fewer than 2 nodes or a peer
// bandwidth not above 0.
Result<ReplayResult> Replay(const Trace& trace, const ReplayOptions& options);

}  // namespace kvtier::tools
