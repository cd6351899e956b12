#include "tools/replay/replay_cli.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "policy/option_defaults.h"
#include "policy/policy_registry.h"
#include "tools/replay/replay_cli_parts.h"
#include "tools/replay/replay_plot.h"
#include "tools/replay/replay_sim.h"
#include "tools/replay/replay_trace.h"

namespace kvtier::tools {
namespace replay_cli {

int Fail(const std::string& message) {
  std::fprintf(stderr, "kvtier replay: %s\n", message.c_str());
  return kBadInput;
}

}  // namespace replay_cli

using replay_cli::Fail;
using replay_cli::LookupCeiling;
using replay_cli::PrintTable;
using replay_cli::RunJson;
using replay_cli::RunLive;
using replay_cli::WriteCsv;

namespace {

// A registry's choices ("a|b", policy/policy_registry.h) as help text
// ("a | b"), and as the list a flag accepts (plus `extra`, if any).
std::string ChoiceText(std::string_view choices) {
  std::string out;
  for (char c : choices) out += c == '|' ? std::string(" | ") : std::string(1, c);
  return out;
}

std::vector<std::string> ChoiceList(std::string_view choices, std::string_view extra = {}) {
  std::vector<std::string> out;
  while (!choices.empty()) {
    const size_t bar = choices.find('|');
    out.emplace_back(choices.substr(0, bar));
    choices.remove_prefix(bar == std::string_view::npos ? choices.size() : bar + 1);
  }
  if (!extra.empty()) out.emplace_back(extra);
  return out;
}

std::vector<std::string> Split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, sep)) parts.push_back(part);
  return parts;
}

// What a file holds, by its first non-blank byte: '{' a block trace (JSONL),
// '[' raw ShareGPT JSON (an array of conversations).
Result<bool> IsRawJsonArray(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound(path + ": cannot open the trace");
  char c = 0;
  while (in.get(c)) {
    if (c == '{') return false;
    if (c == '[') return true;
    if (!std::isspace(static_cast<unsigned char>(c))) break;
  }
  return InvalidArgument(path + ":1: neither a block trace (JSON objects, one per line) nor ShareGPT JSON (an array)");
}

// "host=20GB,nvme=5GB": bytes per second per tier into `out` (tiers not
// named keep their value); with `peer`, also "peer=BW" into it (the peer
// tier's). InvalidArgument naming the option otherwise.
Status ParseBandwidths(const std::string& option, const std::string& text, std::array<double, kSimTiers>& out,
                       double* peer = nullptr) {
  if (text.empty()) return Status::Ok();
  for (const std::string& part : Split(text, ',')) {
    const size_t eq = part.find('=');
    const std::string tier = eq == std::string::npos ? "" : part.substr(0, eq);
    const int index = tier == "host"                      ? kHostTier
                      : tier == "nvme"                    ? kNvmeTier
                      : tier == "remote"                  ? kRemoteTier
                      : tier == "peer" && peer != nullptr ? kSimTiers
                                                          : -1;
    auto bw = index < 0 ? Result<Capacity>(InvalidArgument("no tier")) : ParseCapacity(part.substr(eq + 1), 1);
    if (!bw.ok() || bw->infinite || bw->unit != Capacity::Unit::kTokens || bw->amount == 0) {
      return InvalidArgument(option + " '" + part + "': expected host|nvme|remote" + (peer != nullptr ? "|peer" : "") +
                             "=BYTES per second, e.g. nvme=5GB");
    }
    (index == kSimTiers ? *peer : out[index]) = double(bw->amount);
  }
  return Status::Ok();
}

// Reads every --trace file, concatenated in the order given.
Result<Trace> LoadTraces(const ReplayCliOptions& o) {
  Trace trace;
  trace.block_tokens = o.block_tokens;
  for (size_t i = 0; i < o.traces.size(); ++i) {
    auto raw = IsRawJsonArray(o.traces[i]);
    if (!raw.ok()) return raw.status();
    if (*raw) {
      return InvalidArgument(o.traces[i] +
                             ": raw ShareGPT JSON has no tokens: convert it first with "
                             "tools/trace/sharegpt_convert (node convert.mjs --in FILE --out FILE.jsonl "
                             "--block-tokens N; docs/REPLAY.md)");
    }
    // sharegpt: the converted form, every line naming its conversation.
    auto read = ReadMooncakeTrace(o.traces[i], o.block_tokens, i, o.format == "sharegpt");
    if (!read.ok()) return read.status();
    trace.path += (i > 0 ? "," : "") + o.traces[i];
    for (auto& r : read->requests) trace.requests.push_back(std::move(r));
  }
  return trace;
}

// --remote-admission and --remote-write-rate into `base` (whose tiers and
// bytes per token are set); InvalidArgument naming the option otherwise.
Status SetRemoteAdmission(const ReplayCliOptions& o, ReplayOptions& base) {
  const std::string& name = o.remote_admission;
  if (!ParseAdmissionPolicy(name, kAdmissionForRemote).ok()) {
    return InvalidArgument("--remote-admission '" + name + "': expected " + ListChoices(kRemoteAdmissionChoices));
  }
  if (name != "all" && !base.remote) {
    return InvalidArgument("--remote-admission " + name + " decides for a remote tier: give remote=CAP");
  }
  if (!o.remote_write_rate.empty() && name != "rate") {
    return InvalidArgument("--remote-write-rate is the rate admission's: give --remote-admission rate");
  }
  if (name == "rate" && o.bytes_per_token == 0) {
    return InvalidArgument("--remote-admission rate counts bytes: give --bytes-per-token");
  }
  if (!o.remote_write_rate.empty()) {
    auto rate = ParseCapacity(o.remote_write_rate, 1);  // bytes: one "token" per byte
    if (!rate.ok() || rate->infinite || rate->unit != Capacity::Unit::kTokens || rate->amount == 0) {
      return InvalidArgument("--remote-write-rate '" + o.remote_write_rate +
                             "': expected bytes per second above 0, e.g. 512MiB");
    }
    base.remote_write_rate = rate->amount;
  }
  base.remote_admission = name;
  return Status::Ok();
}

}  // namespace

void AddReplayOptions(CLI::App& app, ReplayCliOptions& o) {
  app.add_option("--trace", o.traces, "Trace file (repeat for several; ids are namespaced per file)")->required();
  app.add_option("--format", o.format,
                 "mooncake (JSONL) | sharegpt (converted JSONL, every line with \"session\") | auto (either)")
      ->check(CLI::IsMember({"mooncake", "sharegpt", "auto"}))
      ->capture_default_str();
  app.add_option("--block-tokens", o.block_tokens, "Tokens per trace block (Mooncake: 512)")
      ->check(CLI::Range(1u, 1u << 20))
      ->capture_default_str();
  app.add_option("--capacity", o.capacity,
                 "host=CAP[,nvme=CAP][,remote=CAP]; CAP: 1e6tok, 50000blk, 64GiB, inf (sim mode: required)");
  app.add_option("--bytes-per-token", o.bytes_per_token, "KV bytes per token (for byte capacities and byte counts)");
  app.add_option("--policy", o.policies,
                 "Eviction: " + ChoiceText(kEvictionPolicyChoices) +
                     " | belady (the offline optimum; comma-separated: one run each; lru and belady always run, for "
                     "the gap-closed column)")
      ->delimiter(',')
      ->check(CLI::IsMember(ChoiceList(kEvictionPolicyChoices, "belady")))
      ->capture_default_str();
  app.add_option("--admission", o.admission, "NVMe admission: " + ChoiceText(kNvmeAdmissionChoices))
      ->check(CLI::IsMember(ChoiceList(kNvmeAdmissionChoices)))
      ->capture_default_str();
  app.add_option(
         "--remote-admission", o.remote_admission,
         "Remote tier admission, each node's own (kvtierd's remote.admission): " + ChoiceText(kRemoteAdmissionChoices) +
             " "
             "(second_hit's rules within --remote-write-rate); the replay's default: all")
      ->each([&o](const std::string&) { o.remote_admission_given = true; })
      ->capture_default_str();
  app.add_option("--remote-write-rate", o.remote_write_rate,
                 "rate remote admission: bytes/s each node may write to the remote tier (remote.write_rate; "
                 "default 4GiB, kvtierd's)")
      ->each([&o](const std::string&) { o.remote_admission_given = true; });
  app.add_option("--nvme-eviction", o.nvme_eviction,
                 "NVMe log reclaim order: " + ChoiceText(kEvictionPolicyChoices) +
                     " (kvtierd's nvme.eviction); default: each run's --policy (belady: a tier that can evict any "
                     "block, the ideal)")
      ->check(CLI::IsMember(ChoiceList(kEvictionPolicyChoices)));
  app.add_option("--nvme-region", o.nvme_region,
                 "NVMe region size in bytes (nvme.region_bytes); default 64MiB, or a 16th of a smaller device");
  app.add_option("--reinsert-percent", o.reinsert_percent,
                 "Copies forward before a region's reclaim, as a % of bytes written (nvme.reinsert_percent)")
      ->check(CLI::Range(0, 100))
      ->capture_default_str();
  app.add_option("--prefetch-percent", o.prefetch_percent,
                 "Engine model: the share of the host tier a prefetch plan may fill (engine.prefetch_percent; 0: off)")
      ->check(CLI::Range(0, 100))
      ->capture_default_str();
  app.add_option("--prefetch-min-blocks", o.prefetch_min_blocks,
                 "Prefetch skips a prefix shorter than this (engine.prefetch_min_blocks)")
      ->check(CLI::Range(1u, 1u << 20))
      ->capture_default_str();
  app.add_option("--lookahead-ms", o.lookahead_ms,
                 "A host victim a queued request needs within this is forced into the first tier below "
                 "(engine.lookahead_ms)")
      ->capture_default_str();
  app.add_option("--drive-bytes", o.drive_bytes, "dwpd: the drive's capacity (e.g. 3.84TB); default: the nvme tier's");
  app.add_option("--dwpd", o.dwpd, "dwpd: rated drive writes per day")->capture_default_str();
  app.add_option("--dwpd-share", o.dwpd_share, "dwpd: the share of the drive's writes kvtier may use")
      ->capture_default_str();
  app.add_option("--warranty-years", o.warranty_years, "dwpd: the years the rating covers")->capture_default_str();
  app.add_option("--planned-years", o.planned_years, "dwpd: the years the drive should last")->capture_default_str();
  app.add_option("--warmup", o.warmup, "Fraction of requests run but not measured")
      ->check(CLI::Range(0.0, 0.999999))
      ->capture_default_str();
  app.add_option("--engines", o.engines, "Engine instances for TTFT (0: no engine model)")->capture_default_str();
  app.add_option("--prefill-tps", o.prefill_tps, "Prefill tokens/s per engine")->capture_default_str();
  app.add_option("--read-bandwidth", o.read_bandwidth,
                 "KV load bytes/s per tier: host=20GB,nvme=5GB,remote=1GB (the defaults); with --peer also "
                 "peer=BW (default 10GB: a node's link to the other nodes)");
  app.add_option("--write-bandwidth", o.write_bandwidth,
                 "Demotion bytes/s per tier: nvme=2GB,remote=1GB (the defaults); a demotion is dropped as the "
                 "daemon's demoter drops it: past " +
                     std::to_string(defaults::kQueuedDemotionWaitMs) +
                     " ms of waiting, or when the bytes queued ahead pass engine.demotion_buffer_bytes (" +
                     std::to_string(defaults::kDemotionBufferBytes >> 20) + " MiB)");
  app.add_option("--nodes", o.nodes,
                 "kvtier nodes (1 to 256), each with its own host and NVMe tiers of the --capacity given; the remote "
                 "tier is one, shared by all")
      ->each([&o](const std::string&) { o.nodes_given = true; })
      ->capture_default_str();
  app.add_option("--router", o.router,
                 "How requests spread over --nodes: prefix_affinity (by a hash of the first --affinity-blocks "
                 "blocks) | round_robin (request i to node i mod N) | kv_aware (at arrival, to the node where the "
                 "first token can start soonest, max(Q, R) + C, by delayed, lossy KV events; needs --engines)")
      ->capture_default_str();
  app.add_option("--affinity-blocks", o.affinity_blocks,
                 "prefix_affinity hashes a request's first K blocks (2 tells apart conversations that open with "
                 "one shared system-prompt block)")
      ->check(CLI::Range(1u, 1u << 20))
      ->capture_default_str();
  app.add_option("--event-delay-ms", o.event_delay_ms,
                 "kv_aware: a KV event reaches the router this many ms after the block changed tier")
      ->check(CLI::Range(0.0, 3.6e6))
      ->capture_default_str();
  app.add_option("--event-loss", o.event_loss,
                 "kv_aware: the share of KV events lost on the way (a lost store: the router does not know the "
                 "block is there; a lost removal: it wrongly thinks it is)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--event-seed", o.event_seed, "kv_aware: the seed of the event losses")->capture_default_str();
  app.add_option("--kv-fetch", o.kv_fetch,
                 "Engine model: serial (the KV load starts when an engine is free: wait + load + prefill) | "
                 "overlap (it starts at arrival, beside the wait: max(Q, R) + C); default: overlap for kv_aware, "
                 "serial otherwise")
      ->check(CLI::IsMember({"serial", "overlap"}));
  app.add_flag("--peer", o.peer,
               "Model kvtierd's peer tier (needs --nodes 2 or more): a node reads a block another node holds in "
               "its host or NVMe tier directly, asked after its own tiers and before the remote tier, pulled into "
               "its host tier (a use on the source); never written");
  app.add_option("--peer-rtt-us", o.peer_rtt_us,
                 "--peer: the round trip a request's pull from the peers pays once (its pins out, their grants "
                 "back) before its bytes at peer=BW")
      ->each([&o](const std::string&) { o.peer_rtt_given = true; })
      ->capture_default_str();
  app.add_option("--sweep", o.sweep, "Host capacities CAP,CAP,...: one run per value (and policy), in threads");
  app.add_option("--threads", o.threads, "Threads for a sweep; 0: one per core")->capture_default_str();
  app.add_option("--json", o.json_path, "Write {\"runs\": [...]} here");
  app.add_option("--csv", o.csv_path, "Write one row per run here");
  app.add_flag("--live", o.live, "Drive a running kvtierd through the client library instead of simulating");
  app.add_option("--socket", o.socket_path, "--live: the daemon's socket");
  app.add_option("--plot", o.plot_path, "Write an SVG here: hit rate vs host capacity per policy, hits by tier");
}

int RunReplay(const ReplayCliOptions& o) {
  if (o.live) {
    if (o.nodes != 1) return Fail("--live drives one daemon: --nodes is for sim mode");
    if (o.peer) return Fail("--live drives one daemon: --peer is for sim mode");
    auto trace = LoadTraces(o);
    if (!trace.ok()) return Fail(trace.status().message());
    return RunLive(o, *trace);
  }
  if (o.capacity.empty()) return Fail("--capacity host=CAP is required (sim mode)");
  ReplayOptions base;
  if (o.nodes < 1 || o.nodes > kMaxNodes) {
    return Fail("--nodes " + std::to_string(o.nodes) + ": expected 1 to " + std::to_string(kMaxNodes) + " nodes");
  }
  const std::optional<Router> router = ParseRouter(o.router);
  if (!router) return Fail("--router '" + o.router + "': expected round_robin, prefix_affinity or kv_aware");
  if (*router == Router::kKvAware && o.engines == 0) {
    return Fail("--router kv_aware routes by time: give the engine model (--engines N --prefill-tps X)");
  }
  if (!o.kv_fetch.empty() && o.engines == 0) return Fail("--kv-fetch is the engine model's: give --engines N");
  base.nodes = o.nodes;
  base.router = *router;
  base.affinity_blocks = o.affinity_blocks;
  base.event_delay_us = static_cast<uint64_t>(std::llround(o.event_delay_ms * 1000));
  base.event_loss = o.event_loss;
  base.event_seed = o.event_seed;
  if (!o.kv_fetch.empty()) base.fetch = o.kv_fetch == "serial" ? FetchModel::kSerial : FetchModel::kOverlap;
  // Capacities.
  bool have_host = false;
  for (const std::string& part : Split(o.capacity, ',')) {
    const size_t eq = part.find('=');
    if (eq == std::string::npos) return Fail("--capacity '" + part + "': expected TIER=CAP");
    const std::string tier = part.substr(0, eq);
    auto cap = ParseCapacity(part.substr(eq + 1), o.bytes_per_token);
    if (!cap.ok()) return Fail("--capacity: " + cap.status().message());
    if (tier == "host") {
      base.host = *cap;
      have_host = true;
    } else if (tier == "nvme") {
      base.nvme = *cap;
    } else if (tier == "remote") {
      base.remote = *cap;
    } else {
      return Fail("--capacity: unknown tier '" + tier + "' (host, nvme, remote)");
    }
  }
  if (!have_host) return Fail("--capacity needs host=CAP");
  std::vector<Capacity> hosts{base.host};
  if (!o.sweep.empty()) {
    hosts.clear();
    for (const std::string& text : Split(o.sweep, ',')) {
      auto cap = ParseCapacity(text, o.bytes_per_token);
      if (!cap.ok()) return Fail("--sweep: " + cap.status().message());
      hosts.push_back(*cap);
    }
  }
  base.engines = o.engines;
  base.prefill_tps = o.prefill_tps;
  if (o.engines > 0 && !(o.prefill_tps > 0)) return Fail("--engines needs --prefill-tps above 0");
  if (o.engines == 0 && o.prefill_tps > 0) return Fail("--prefill-tps needs --engines N");
  if (!o.peer && ("," + o.read_bandwidth).find(",peer=") != std::string::npos) {
    return Fail("--read-bandwidth peer=BW is the peer tier's: give --peer");
  }
  if (Status s = ParseBandwidths("--read-bandwidth", o.read_bandwidth, base.read_bytes_per_s,
                                 o.peer ? &base.peer_bytes_per_s : nullptr);
      !s.ok()) {
    return Fail(s.message());
  }
  if (o.peer && o.nodes < 2) return Fail("--peer reads the other nodes' tiers: give --nodes 2 or more");
  if (!o.peer && o.peer_rtt_given) return Fail("--peer-rtt-us is the peer tier's: give --peer");
  base.peer = o.peer;
  base.peer_rtt_us = o.peer_rtt_us;
  if (Status s = ParseBandwidths("--write-bandwidth", o.write_bandwidth, base.write_bytes_per_s); !s.ok()) {
    return Fail(s.message());
  }
  base.admission = o.admission;
  base.nvme_eviction = o.nvme_eviction;
  base.nvme_reinsert_share = o.reinsert_percent / 100.0;
  base.prefetch_share = o.prefetch_percent / 100.0;
  base.prefetch_min_blocks = o.prefetch_min_blocks;
  base.lookahead_us = o.lookahead_ms * 1000;
  if (!o.nvme_region.empty()) {
    auto region = ParseCapacity(o.nvme_region, 1);  // bytes: one "token" per byte
    if (!region.ok() || region->infinite || region->unit != Capacity::Unit::kTokens || region->amount == 0) {
      return Fail("--nvme-region '" + o.nvme_region + "': expected bytes, e.g. 64MiB");
    }
    base.nvme_region_bytes = region->amount;
  }
  base.bytes_per_token = o.bytes_per_token;
  base.warmup = o.warmup;
  if (o.admission != "all" && !base.nvme)
    return Fail("--admission " + o.admission + " decides for an nvme tier: give nvme=CAP");
  if (Status s = SetRemoteAdmission(o, base); !s.ok()) return Fail(s.message());
  if (o.admission == "dwpd") {
    base.dwpd.dwpd = o.dwpd;
    base.dwpd.share = o.dwpd_share;
    base.dwpd.warranty_years = o.warranty_years;
    base.dwpd.planned_years = o.planned_years;
    if (!o.drive_bytes.empty()) {
      auto drive = ParseCapacity(o.drive_bytes, 1);  // bytes: one "token" per byte
      if (!drive.ok() || drive->infinite || drive->unit != Capacity::Unit::kTokens) {
        return Fail("--drive-bytes '" + o.drive_bytes + "': expected bytes, e.g. 3.84TB or 512GiB");
      }
      base.dwpd.drive_capacity_bytes = drive->amount;
    } else if (base.nvme && !base.nvme->infinite && base.nvme->unit == Capacity::Unit::kTokens) {
      base.dwpd.drive_capacity_bytes = base.nvme->amount * o.bytes_per_token;
    } else {
      return Fail("--admission dwpd needs --drive-bytes (or an nvme capacity in tokens or bytes)");
    }
    if (Status s = ValidateDwpdOptions(base.dwpd); !s.ok()) return Fail(s.message());
  }
  auto loaded = LoadTraces(o);
  if (!loaded.ok()) return Fail(loaded.status().message());
  const Trace& trace = *loaded;
  // Runs: every policy at every host capacity, in parallel; results in order.
  struct Run {
    ReplayOptions options;
    ReplayResult result;
    Status status;
  };
  std::vector<Run> runs;
  // LRU and Belady run at every setting (after the policies asked for),
  // the two ends of the gap-closed column.
  std::vector<std::string> policies;
  for (const std::string& p : o.policies) {
    if (std::find(policies.begin(), policies.end(), p) == policies.end()) policies.push_back(p);
  }
  for (const char* reference : {"lru", "belady"}) {
    if (std::find(policies.begin(), policies.end(), reference) == policies.end()) policies.push_back(reference);
  }
  for (const std::string& policy : policies) {
    for (const Capacity& c : hosts) {
      ReplayOptions options = base;
      options.host = c;
      options.policy = policy;
      runs.push_back(Run{options, {}, Status::Ok()});
    }
  }
  const unsigned threads =
      std::max(1u, std::min<unsigned>(o.threads > 0 ? o.threads : std::thread::hardware_concurrency(),
                                      static_cast<unsigned>(runs.size())));
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (size_t i = next++; i < runs.size(); i = next++) {
        auto r = Replay(trace, runs[i].options);
        if (r.ok()) {
          runs[i].result = *r;
        } else {
          runs[i].status = r.status();
        }
      }
    });
  }
  for (auto& t : pool) t.join();
  for (const Run& r : runs) {
    if (!r.status.ok()) return Fail(r.status.message());
  }
  std::vector<ReplayResult> results;
  for (const Run& r : runs) results.push_back(r.result);
  SetGapClosed(results);
  PrintTable(results, o, LookupCeiling(trace));
  if (!o.json_path.empty()) {
    std::ofstream out(o.json_path);
    out << "{\"trace\": \"" << trace.path << "\", \"runs\": [";
    for (size_t i = 0; i < results.size(); ++i)
      out << (i > 0 ? ",\n  " : "\n  ") << RunJson(results[i], o.nodes_given, o.remote_admission_given);
    out << "\n]}\n";
    if (!out) {
      std::fprintf(stderr, "kvtier replay: cannot write %s\n", o.json_path.c_str());
      return 1;
    }
  }
  if (!o.plot_path.empty()) {
    std::ofstream out(o.plot_path);
    out << PlotSvg(results, "kvtier replay: " + trace.path);
    if (!out) {
      std::fprintf(stderr, "kvtier replay: cannot write %s\n", o.plot_path.c_str());
      return 1;
    }
  }
  if (!o.csv_path.empty()) {
    std::ofstream out(o.csv_path);
    WriteCsv(out, results, o.nodes_given, o.remote_admission_given);
    if (!out) {
      std::fprintf(stderr, "kvtier replay: cannot write %s\n", o.csv_path.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace kvtier::tools
