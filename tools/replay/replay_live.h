// `kvtier replay --live`: drives a running kvtierd through the client
// library with a block trace, payloads of each block's size, and measures
// hit rates, throughput and latency. Per request, in file order:
//   1. Lookup of its chain: the hit is the resident prefix;
//   2. Pin of every block of the chain (the resident ones are read);
//   3. Reserve of each missing block root first, one at a time, stopping at
//      the first that does not fit (NoSpace): the prefix that fits is kept;
//   4. the reserved blocks are filled and committed leaf first;
//   5. the pins are released leaf first (the root ends the most recent).
// This is the order the simulator drives its policies in (replay_sim.h), so
// a daemon with the same host capacity and eviction policy and one engine
// shard gives the same hits as sim mode, and with an NVMe tier of the same
// geometry, reclaim order and admission the same hits in each tier, as
// long as its background work (demotion writes, a reclaim turn's copies)
// ends before the next step (LiveOptions::settle; tests check both).
// Without a schedule there is no timing model: requests run back to back
// as fast as the daemon serves them.
//
// With a schedule (LiveOptions::schedule: an engine-model run's,
// ReplayOptions::record_schedule) the requests follow the simulator's
// engines instead, step by step in its order: a queue hint is an Enqueue
// (request id: file position + 1, expected start relative to the step's
// time) and its start a Started, a request's start is step 1 and the end
// of its prefill steps 2 to 5. A daemon on a clock the caller moves to
// each step's time (LiveOptions::at) then plans its prefetches as the
// simulator does (replay_sim.h) and, settled, hits the same blocks.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvtier/result.h"
#include "tools/replay/replay_sim.h"
#include "tools/replay/replay_trace.h"

namespace kvtier::tools {

struct LiveOptions {
  std::string socket_path;
  uint64_t bytes_per_token = 0;  // > 0: a block's payload is its tokens times this
  double warmup = 0;             // [0, 1): requests run but not measured
  // When set: blocks are pinned one call per block (each promotion, and
  // its eviction, its own step), and this runs after every call that may
  // move blocks between tiers (pin, reserve, commit). A test running the
  // daemon in-process waits there for its background work, so the order
  // of the daemon's tier writes is the sim's (see above).
  std::function<void()> settle;
  // An engine-model run's schedule (ReplayResult::schedule) to follow;
  // empty: the trace in file order, as above.
  std::vector<ScheduleEvent> schedule;
  // With a schedule: called before each step with its time (the trace's
  // clock), to move the daemon's clock there. May be empty.
  std::function<void(uint64_t at_us)> at;
};

struct LiveResult {
  uint64_t requests = 0, blocks = 0, tokens = 0;  // measured
  uint64_t hit_blocks = 0, hit_tokens = 0;
  std::array<uint64_t, kSimTiers> tier_hits{};  // measured hit blocks by the tier Lookup named
  uint64_t put_blocks = 0, put_bytes = 0;       // all requests
  uint64_t not_kept = 0;                        // reservations refused for room (NoSpace)
  double seconds = 0;                           // all requests
  std::vector<double> lookup_us;                // measured requests' Lookup latency
  std::vector<double> request_us;               // measured requests' whole latency (steps 1-5; scheduled: start to end)
  double block_hit_rate() const { return blocks == 0 ? 0 : double(hit_blocks) / double(blocks); }
  double token_hit_rate() const { return tokens == 0 ? 0 : double(hit_tokens) / double(tokens); }
};

// Unavailable when no daemon answers; InvalidArgument for bad options (a
// schedule naming a request not in the trace); IoError naming the request
// when the daemon fails a step.
Result<LiveResult> ReplayLive(const Trace& trace, const LiveOptions& options);

}  // namespace kvtier::tools
