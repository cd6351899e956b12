#include "tools/replay_sim.h"

#include <chrono>
#include <cmath>
#include <memory>
#include <unordered_map>

#include "policy/eviction_policy.h"

namespace kvtier::tools {

Result<Capacity> ParseCapacity(const std::string& text, uint64_t bytes_per_token) {
  Capacity c;
  if (text == "inf") {
    c.infinite = true;
    return c;
  }
  size_t used = 0;
  double number = 0;
  try {
    number = std::stod(text, &used);
  } catch (...) {
    used = 0;
  }
  const std::string unit = text.substr(used);
  if (used == 0 || !std::isfinite(number) || number < 0) {
    return InvalidArgument("capacity '" + text + "': expected a number and a unit (1e6tok, 50000blk, 64GiB, inf)");
  }
  double scale = 1;
  if (unit == "tok") {
    c.unit = Capacity::Unit::kTokens;
  } else if (unit == "blk") {
    c.unit = Capacity::Unit::kBlocks;
  } else {
    const std::pair<const char*, double> bytes[] = {{"B", 1},          {"KiB", 1024.0},       {"MiB", 1048576.0},
                                                    {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}, {"KB", 1e3},
                                                    {"MB", 1e6},       {"GB", 1e9},           {"TB", 1e12}};
    bool found = false;
    for (const auto& [name, factor] : bytes) {
      if (unit == name) {
        found = true;
        scale = factor;
      }
    }
    if (!found) return InvalidArgument("capacity '" + text + "': unknown unit '" + unit + "' (tok, blk, B..TiB, inf)");
    if (bytes_per_token == 0) {
      return InvalidArgument("capacity '" + text + "' is in bytes: give --bytes-per-token to convert it to tokens");
    }
    c.unit = Capacity::Unit::kTokens;
    scale /= double(bytes_per_token);
  }
  const double amount = std::floor(number * scale);
  if (amount > 1.8e19) return InvalidArgument("capacity '" + text + "' is too large");
  c.amount = static_cast<uint64_t>(amount);
  return c;
}

std::string CapacityText(const Capacity& c) {
  if (c.infinite) return "inf";
  return std::to_string(c.amount) + (c.unit == Capacity::Unit::kTokens ? "tok" : "blk");
}

namespace {

struct SimBlock {
  BlockKey key;
  uint64_t held = 0;        // what it takes of the capacity while resident
  bool resident = false;
  uint64_t pinned_by = 0;   // the request (1-based) that pins it now, 0: none
};

class Simulator {
 public:
  Simulator(const Trace& trace, const ReplayOptions& options, std::unique_ptr<EvictionPolicy> policy)
      : trace_(trace), options_(options), policy_(std::move(policy)) {}

  ReplayResult Run() {
    const auto started = std::chrono::steady_clock::now();
    const size_t n = trace_.requests.size();
    const auto warm = static_cast<size_t>(std::floor(options_.warmup * double(n)));
    std::vector<uint32_t> ids;
    for (size_t r = 0; r < n; ++r) {
      const TraceRequest& req = trace_.requests[r];
      ids.clear();
      for (const BlockKey& key : req.blocks) ids.push_back(IdOf(key));
      Serve(req, ids, r + 1, r >= warm);
    }
    result_.policy = options_.policy;
    result_.host = options_.host;
    result_.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return result_;
  }

 private:
  uint32_t IdOf(const BlockKey& key) {
    auto [it, fresh] = index_.try_emplace(key, static_cast<uint32_t>(blocks_.size()));
    if (fresh) blocks_.push_back(SimBlock{key});
    return it->second;
  }

  uint64_t Cost(const TraceRequest& req, size_t i) const {
    return options_.host.unit == Capacity::Unit::kBlocks ? 1 : BlockTokens(req, i, trace_.block_tokens);
  }

  void Serve(const TraceRequest& req, const std::vector<uint32_t>& ids, uint64_t request, bool measured) {
    const uint64_t now = req.arrival_us;
    result_.lookups += ids.size();
    size_t hit = 0;
    uint64_t hit_tokens = 0;
    while (hit < ids.size() && blocks_[ids[hit]].resident) {
      hit_tokens += BlockTokens(req, hit, trace_.block_tokens);
      ++hit;
    }
    if (measured) {
      ++result_.requests;
      result_.blocks += ids.size();
      result_.tokens += req.input_tokens;
      result_.hit_blocks += hit;
      result_.hit_tokens += hit_tokens;
    }
    // Resident blocks are used and pinned. Room is made for the new ones
    // root first, so a request larger than the tier keeps its prefix (a
    // tail without it could never hit); the first that does not fit ends
    // it. They go in leaf first, pinned, and unpinning leaf first leaves
    // the root the most recent.
    for (size_t i = ids.size(); i-- > 0;) {
      SimBlock& b = blocks_[ids[i]];
      if (!b.resident || b.pinned_by == request) continue;
      policy_->OnAccess(ids[i], now);
      policy_->OnPin(ids[i]);
      b.pinned_by = request;
    }
    size_t kept = 0;  // new blocks [0, kept) of the chain fit
    for (; kept < ids.size(); ++kept) {
      SimBlock& b = blocks_[ids[kept]];
      if (b.resident || b.pinned_by == request) continue;
      const uint64_t cost = Cost(req, kept);
      if (!MakeRoom(cost)) break;
      b.held = cost;
      b.pinned_by = request;  // reserved: not resident yet
      used_ += cost;
    }
    for (size_t i = kept; i < ids.size(); ++i) {
      if (!blocks_[ids[i]].resident && blocks_[ids[i]].pinned_by != request) ++result_.not_kept;
    }
    for (size_t i = kept; i-- > 0;) {
      SimBlock& b = blocks_[ids[i]];
      if (b.resident) continue;
      policy_->OnInsertKeyed(ids[i], b.key, now);
      policy_->OnPin(ids[i]);
      b.resident = true;
    }
    for (size_t i = ids.size(); i-- > 0;) {
      SimBlock& b = blocks_[ids[i]];
      if (b.pinned_by != request) continue;
      policy_->OnUnpin(ids[i], now);
      b.pinned_by = 0;
    }
  }

  // Evicts until `cost` more fits; false if it cannot (too large, or the
  // rest is pinned by the request itself).
  bool MakeRoom(uint64_t cost) {
    if (options_.host.infinite) return true;
    if (cost > options_.host.amount) return false;
    while (used_ + cost > options_.host.amount) {
      auto victim = policy_->Victim();
      if (!victim) return false;
      SimBlock& v = blocks_[victim->handle];
      policy_->OnRemove(victim->handle);
      v.resident = false;
      used_ -= v.held;
      v.held = 0;
      ++result_.evictions;
    }
    return true;
  }

  const Trace& trace_;
  const ReplayOptions& options_;
  std::unique_ptr<EvictionPolicy> policy_;
  std::unordered_map<BlockKey, uint32_t> index_;
  std::vector<SimBlock> blocks_;
  uint64_t used_ = 0;
  ReplayResult result_;
};

}  // namespace

Result<ReplayResult> Replay(const Trace& trace, const ReplayOptions& options) {
  auto policy = MakeEvictionPolicy(options.policy);
  if (policy == nullptr) return InvalidArgument("unknown policy '" + options.policy + "' (lru, fifo, queue_aware)");
  if (!(options.warmup >= 0 && options.warmup < 1)) {
    return InvalidArgument("warm-up fraction must be in [0, 1), got " + std::to_string(options.warmup));
  }
  Simulator sim(trace, options, std::move(policy));
  return sim.Run();
}

}  // namespace kvtier::tools
