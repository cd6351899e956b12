#include "tools/replay/replay_sim.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "policy/admission_policy.h"
#include "policy/eviction_policy.h"
#include "common/check.h"
#include "policy/policy_registry.h"
#include "tiers/nvme/block_record.h"
#include "tools/replay/replay_simulator.h"

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
    const std::pair<const char*, double> bytes[] = {
        {"B", 1},    {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
        {"KB", 1e3}, {"MB", 1e6},     {"GB", 1e9},        {"TB", 1e12}};
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

double Percentile(std::vector<double> samples, double p) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  const auto rank = static_cast<size_t>(std::ceil(p / 100.0 * double(samples.size())));
  return samples[std::min(samples.size(), std::max<size_t>(rank, 1)) - 1];
}

std::optional<double> ReplayResult::ttft_percentile(double p) const {
  if (ttft_ms.empty()) return std::nullopt;
  return Percentile(ttft_ms, p);
}

std::string_view SimTierName(int tier) {
  switch (tier) {
    case kHostTier:
      return "host";
    case kNvmeTier:
      return "nvme";
    case kRemoteTier:
      return "remote";
  }
  return "?";
}

std::string_view RouterName(Router router) {
  switch (router) {
    case Router::kRoundRobin:
      return "round_robin";
    case Router::kPrefixAffinity:
      return "prefix_affinity";
    case Router::kKvAware:
      return "kv_aware";
  }
  return "?";
}

std::optional<Router> ParseRouter(std::string_view name) {
  if (name == "round_robin") return Router::kRoundRobin;
  if (name == "prefix_affinity") return Router::kPrefixAffinity;
  if (name == "kv_aware") return Router::kKvAware;
  return std::nullopt;
}

FetchModel FetchModelOf(const ReplayOptions& options) {
  if (options.fetch) return *options.fetch;
  return options.router == Router::kKvAware ? FetchModel::kOverlap : FetchModel::kSerial;
}

std::string_view FetchModelName(FetchModel model) { return model == FetchModel::kSerial ? "serial" : "overlap"; }

namespace {

// SplitMix64's finalizer: a fixed, well-spread hash (the same on every
// platform, unlike std::hash).
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

std::vector<uint32_t> RouteRequests(const Trace& trace, uint32_t nodes, Router router, uint32_t affinity_blocks) {
  KVTIER_CHECK(router != Router::kKvAware, "kv_aware routes inside the run");
  std::vector<uint32_t> route(trace.requests.size(), 0);
  if (nodes <= 1) return route;
  for (size_t r = 0; r < route.size(); ++r) {
    const std::vector<BlockKey>& blocks = trace.requests[r].blocks;
    if (router == Router::kRoundRobin) {
      route[r] = static_cast<uint32_t>(r % nodes);
    } else if (!blocks.empty()) {
      uint64_t h = Mix(blocks[0].hi ^ Mix(blocks[0].lo));
      for (size_t i = 1; i < std::min<size_t>(affinity_blocks, blocks.size()); ++i) {
        h = Mix(h ^ blocks[i].hi ^ Mix(blocks[i].lo));
      }
      route[r] = static_cast<uint32_t>(h % nodes);
    }
  }
  return route;
}

std::string NvmeEvictionOf(const ReplayOptions& options) {
  if (options.nvme && options.nvme->infinite) return "ideal";
  if (!options.nvme_eviction.empty()) return options.nvme_eviction;
  return options.policy == "belady" ? "ideal" : options.policy;
}

bool SameSetting(const ReplayOptions& a, const ReplayOptions& b) {
  auto same_cap = [](const Capacity& x, const Capacity& y) {
    return x.infinite == y.infinite && (x.infinite || (x.unit == y.unit && x.amount == y.amount));
  };
  auto same_opt = [&](const std::optional<Capacity>& x, const std::optional<Capacity>& y) {
    return x.has_value() == y.has_value() && (!x || same_cap(*x, *y));
  };
  const DwpdOptions& d = a.dwpd;
  const DwpdOptions& e = b.dwpd;
  return same_cap(a.host, b.host) && same_opt(a.nvme, b.nvme) && same_opt(a.remote, b.remote) &&
         a.admission == b.admission && d.drive_capacity_bytes == e.drive_capacity_bytes && d.dwpd == e.dwpd &&
         d.share == e.share && d.warranty_years == e.warranty_years && d.planned_years == e.planned_years &&
         a.bytes_per_token == b.bytes_per_token && a.warmup == b.warmup && a.engines == b.engines &&
         a.prefill_tps == b.prefill_tps && a.read_bytes_per_s == b.read_bytes_per_s &&
         a.write_bytes_per_s == b.write_bytes_per_s && a.max_write_backlog_us == b.max_write_backlog_us &&
         a.demotion_buffer_bytes == b.demotion_buffer_bytes && a.nvme_eviction == b.nvme_eviction &&
         a.nvme_region_bytes == b.nvme_region_bytes && a.nvme_alignment_bytes == b.nvme_alignment_bytes &&
         a.nvme_reinsert_share == b.nvme_reinsert_share && a.lookahead_us == b.lookahead_us &&
         a.prefetch_share == b.prefetch_share && a.prefetch_min_blocks == b.prefetch_min_blocks && a.nodes == b.nodes &&
         a.router == b.router && a.affinity_blocks == b.affinity_blocks && a.remote_admission == b.remote_admission &&
         a.remote_write_rate == b.remote_write_rate && a.event_delay_us == b.event_delay_us &&
         a.event_loss == b.event_loss && a.event_seed == b.event_seed && FetchModelOf(a) == FetchModelOf(b) &&
         a.peer == b.peer &&
         (!a.peer || (a.peer_bytes_per_s == b.peer_bytes_per_s && a.peer_rtt_us == b.peer_rtt_us &&
                      a.peer_known_us == b.peer_known_us));
}

void SetGapClosed(std::vector<ReplayResult>& runs) {
  for (ReplayResult& run : runs) {
    const ReplayResult* lru = nullptr;
    const ReplayResult* belady = nullptr;
    for (const ReplayResult& other : runs) {
      if (!SameSetting(run.options, other.options)) continue;
      if (other.options.policy == "lru") lru = &other;
      if (other.options.policy == "belady") belady = &other;
    }
    run.gap_closed.reset();
    if (lru == nullptr || belady == nullptr) continue;
    const double gap = belady->token_hit_rate() - lru->token_hit_rate();
    if (gap >= kMinGap) run.gap_closed = (run.token_hit_rate() - lru->token_hit_rate()) / gap;
  }
}

namespace {

// The NVMe log's options for `options`, nullopt when the NVMe tier is not a
// log (absent, infinite, or under Belady); InvalidArgument for a reclaim
// order or geometry the daemon would refuse.
Result<std::optional<SimLogOptions>> NvmeLogOptions(const Trace& trace, const ReplayOptions& options) {
  const std::string order_name = NvmeEvictionOf(options);
  if (!options.nvme || order_name == "ideal") return std::optional<SimLogOptions>();
  const std::optional<ReclaimOrder> order = ParseReclaimOrder(order_name);
  if (!order) {
    return InvalidArgument("unknown nvme eviction '" + order_name + "' (" + std::string(ReclaimOrderChoices()) + ")");
  }
  if (!(options.nvme_reinsert_share >= 0 && options.nvme_reinsert_share <= 1)) {
    return InvalidArgument("the nvme reinsert share must be in [0, 1]");
  }
  const uint32_t align = options.nvme_alignment_bytes;
  if (align == 0 || (align & (align - 1)) != 0) return InvalidArgument("the nvme alignment must be a power of two");
  SimLogOptions log;
  log.alignment_bytes = align;
  log.order = *order;
  log.reinsert_share = options.nvme_reinsert_share;
  const Capacity& cap = *options.nvme;
  const uint64_t block_bytes = uint64_t{trace.block_tokens} * options.bytes_per_token;
  log.device_bytes = cap.unit == Capacity::Unit::kTokens ? cap.amount * options.bytes_per_token
                                                         : cap.amount * RecordBytes(block_bytes, align);
  log.region_bytes = options.nvme_region_bytes;
  if (log.region_bytes == 0) {
    log.region_bytes = std::min<uint64_t>(64ull << 20, log.device_bytes / 16 / align * align);
    log.region_bytes = std::max<uint64_t>(log.region_bytes, RecordBytes(block_bytes, align));
  }
  if (Status s = RegionManager::Validate(log.device_bytes, log.region_bytes, align); !s.ok()) {
    return InvalidArgument("simulated nvme tier of " + std::to_string(log.device_bytes) + " bytes: " + s.message());
  }
  return std::optional<SimLogOptions>(log);
}

// The NVMe admission `options` names (one per node: each node's drive has
// its own budget); InvalidArgument for an unknown one or bad DWPD options.
Result<std::unique_ptr<AdmissionPolicy>> MakeAdmission(const Trace& trace, const ReplayOptions& options) {
  auto id = ParseAdmissionPolicy(options.admission, kAdmissionForNvme);
  if (!id.ok()) {
    return InvalidArgument("unknown admission '" + options.admission + "' (" + ListChoices(kNvmeAdmissionChoices) +
                           ")");
  }
  const uint64_t t0 = trace.requests.empty() ? 0 : trace.requests.front().arrival_us;
  return MakeAdmissionPolicy(*id, AdmissionParams{options.dwpd, 0}, t0);
}

// A node's remote admission (each kvtierd has its own, and its own write
// rate); InvalidArgument for an unknown one or a zero rate.
Result<std::unique_ptr<AdmissionPolicy>> MakeRemoteAdmission(const Trace& trace, const ReplayOptions& options) {
  auto id = ParseAdmissionPolicy(options.remote_admission, kAdmissionForRemote);
  if (!id.ok()) {
    return InvalidArgument("unknown remote admission '" + options.remote_admission + "' (" +
                           ListChoices(kRemoteAdmissionChoices) + ")");
  }
  const uint64_t t0 = trace.requests.empty() ? 0 : trace.requests.front().arrival_us;
  auto made = MakeAdmissionPolicy(*id, AdmissionParams{{}, options.remote_write_rate}, t0);
  if (!made.ok())
    return InvalidArgument("remote admission " + options.remote_admission + ": " + made.status().message());
  return made;
}

}  // namespace

Result<ReplayResult> Replay(const Trace& trace, const ReplayOptions& options) {
  if (options.nodes < 1 || options.nodes > kMaxNodes) {
    return InvalidArgument("nodes must be 1 to " + std::to_string(kMaxNodes) + ", got " +
                           std::to_string(options.nodes));
  }
  if (options.affinity_blocks < 1) return InvalidArgument("prefix affinity must hash at least 1 block");
  if (options.policy != "belady" && !ParseEvictionPolicy(options.policy).ok()) {
    return InvalidArgument("unknown policy '" + options.policy + "' (" + ListChoices(kEvictionPolicyChoices) +
                           ", belady)");
  }
  if (!(options.warmup >= 0 && options.warmup < 1)) {
    return InvalidArgument("warm-up fraction must be in [0, 1), got " + std::to_string(options.warmup));
  }
  if ((options.nvme || options.remote || options.admission == "dwpd") && options.bytes_per_token == 0) {
    return InvalidArgument("an nvme or remote tier, and dwpd admission, need bytes per token (--bytes-per-token)");
  }
  if (options.engines > 0 && !(options.prefill_tps > 0)) {
    return InvalidArgument("the engine model needs a prefill rate above 0 (--prefill-tps)");
  }
  if (options.router == Router::kKvAware && options.engines == 0) {
    return InvalidArgument("kv_aware routes by time: it needs the engine model (--engines, --prefill-tps)");
  }
  if (!(options.event_loss >= 0 && options.event_loss <= 1)) {
    return InvalidArgument("the event loss rate must be in [0, 1]");
  }
  if (options.record_schedule && (options.engines == 0 || options.nodes != 1)) {
    return InvalidArgument("a schedule is recorded for the engine model on one node");
  }
  for (double bw : options.read_bytes_per_s) {
    if (!(bw > 0)) return InvalidArgument("read bandwidths must be above 0");
  }
  if (options.peer && options.nodes < 2)
    return InvalidArgument("the peer tier reads other nodes: give 2 nodes or more");
  if (options.peer && !(options.peer_bytes_per_s > 0)) return InvalidArgument("the peer bandwidth must be above 0");
  for (double bw : options.write_bytes_per_s) {
    if (!(bw >= 0)) return InvalidArgument("write bandwidths must be 0 (no limit) or above");
  }
  std::vector<std::unique_ptr<AdmissionPolicy>> admissions;
  for (uint32_t k = 0; k < options.nodes; ++k) {
    auto made = MakeAdmission(trace, options);
    if (!made.ok()) return made.status();
    admissions.push_back(std::move(made).value());
  }
  if (options.remote_admission != "all" && !options.remote) {
    return InvalidArgument("remote admission '" + options.remote_admission +
                           "' decides for a remote tier: there is none");
  }
  std::vector<std::unique_ptr<AdmissionPolicy>> remote_admissions;
  for (uint32_t k = 0; options.remote && k < options.nodes; ++k) {
    auto made = MakeRemoteAdmission(trace, options);
    if (!made.ok()) return made.status();
    remote_admissions.push_back(std::move(made).value());
  }
  auto log = NvmeLogOptions(trace, options);
  if (!log.ok()) return log.status();
  Simulator sim(trace, options, std::move(admissions), std::move(remote_admissions), *log);
  return sim.Run();
}

}  // namespace kvtier::tools
