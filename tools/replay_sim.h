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
// This increment models one tier (host). Not thread-safe; runs are
// independent objects, so a sweep runs them on separate threads.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kvtier/result.h"
#include "tools/replay_trace.h"

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

struct ReplayOptions {
  Capacity host;
  std::string policy = "lru";  // lru | fifo | queue_aware
  double warmup = 0;           // [0, 1): the fraction of requests not measured
};

struct ReplayResult {
  std::string policy;
  Capacity host;
  uint64_t requests = 0;  // measured (after warm-up)
  uint64_t blocks = 0;    // measured prompt blocks
  uint64_t tokens = 0;    // measured prompt tokens
  uint64_t hit_blocks = 0;
  uint64_t hit_tokens = 0;
  uint64_t evictions = 0;
  uint64_t not_kept = 0;  // blocks past the prefix that fits a request larger than the tier
  uint64_t lookups = 0;   // block lookups, warm-up included (the speed figure's unit)
  double wall_seconds = 0;
  double block_hit_rate() const { return blocks == 0 ? 0 : double(hit_blocks) / double(blocks); }
  double token_hit_rate() const { return tokens == 0 ? 0 : double(hit_tokens) / double(tokens); }
};

// Runs `trace` once. InvalidArgument for an unknown policy or a warm-up
// outside [0, 1).
Result<ReplayResult> Replay(const Trace& trace, const ReplayOptions& options);

}  // namespace kvtier::tools
