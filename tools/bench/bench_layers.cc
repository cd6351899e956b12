#include "tools/bench/bench_layers.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <unistd.h>

#include "kvtier/client.h"
#include "support/format.h"
#include "support/process.h"
#include "support/servers.h"
#include "support/temp_dir.h"
#include "tools/bench/bench_layers_report.h"
#include "tools/bench/bench_layers_trials.h"

namespace kvtier::tools {
namespace {

using layers_bench::Clock;
using layers_bench::LayersBench;

NamespaceDescriptor BenchNamespace(const LayersBenchOptions& o, uint64_t salt) {
  NamespaceDescriptor ns;
  ns.model_id = "kvtier-bench/layers";
  ns.model_revision = "run-" + std::to_string(salt);
  ns.kv_dtype = "bf16";
  ns.block_tokens = o.block_tokens;
  ns.layer_count = o.layers;
  ns.kv_layout = "layer_major_kv";
  ns.bytes_per_token_per_layer = o.bytes_per_token_per_layer;
  return ns;
}

// The private daemon's [nvme] and [engine] tables.
std::string NvmeToml(const LayersBenchOptions& o, const std::string& nvme_path) {
  return "[nvme]\npath = " + support::TomlString(nvme_path) + "\ncapacity_bytes = " + std::to_string(o.nvme_bytes) +
         "\ndirect_io = true\nadmission = \"all\"\nreinsert_percent = 0\n"
         "[engine]\neviction = \"lru\"\nprefetch_percent = 0\n";
}

Status CheckOptions(const LayersBenchOptions& o) {
  if (o.blocks == 0 || o.layers == 0 || o.block_tokens == 0 || o.bytes_per_token_per_layer == 0) {
    return InvalidArgument("--blocks, --layers, --block-tokens and --bytes-per-token-per-layer must be positive");
  }
  if (o.trials == 0) return InvalidArgument("--trials must be positive");
  if (!(o.seconds > 0)) return InvalidArgument("--seconds must be positive");
  for (double f : o.compute_factors) {
    if (!(f > 0) || f > 1000) return InvalidArgument("--compute-factors must be in (0, 1000]");
  }
  return Status::Ok();
}

// Whether the daemon has an NVMe tier (its counters name one).
Result<bool> HasNvme(Client& client) {
  auto stats = client.Stats();
  if (!stats.ok()) return stats.status();
  return std::any_of(stats->begin(), stats->end(), [](const Counter& c) { return c.name == "nvme.capacity_bytes"; });
}

Status RunTierSections(LayersBench& bench, const LayersBenchOptions& o, Tier tier, Report& r) {
  std::fprintf(stderr, "kvtier bench layers: %s loads (%u trials)...\n", std::string(TierName(tier)).c_str(), o.trials);
  auto loads = bench.MeasureLoads(tier);
  if (!loads.ok()) return loads.status();
  r.loads.push_back(*loads);
  const double t_read_us = Median(loads->whole_us) / o.layers;
  for (double factor : o.compute_factors) {
    std::fprintf(stderr, "kvtier bench layers: %s overlap, t_comp = %.1fx t_read...\n",
                 std::string(TierName(tier)).c_str(), factor);
    auto overlap = bench.MeasureOverlap(tier, t_read_us, factor);
    if (!overlap.ok()) return overlap.status();
    r.overlaps.push_back(*overlap);
  }
  return Status::Ok();
}

Status Measure(Client& client, const LayersBenchOptions& o, uint64_t salt, bool nvme, pid_t daemon_pid, Report& r) {
  LayersBench bench(client, o, salt, daemon_pid, r);
  std::fprintf(stderr, "kvtier bench layers: calibrating the compute loop...\n");
  bench.compute().Calibrate();
  r.iterations_per_us = bench.compute().iterations_per_us();
  if (Status s = RunTierSections(bench, o, Tier::kHost, r); !s.ok()) return s;
  if (nvme) {
    Status s = RunTierSections(bench, o, Tier::kNvme, r);
    if (!s.ok() && (daemon_pid > 0 || s.code() != StatusCode::kNotFound)) return s;
    if (!s.ok()) {
      // A running daemon whose admission dropped the evicted prefix: no
      // NVMe figures from it, the rest still holds.
      r.nvme_note = "skipped: " + s.ToString() + " (the running daemon's nvme.admission?)";
      std::erase_if(r.loads, [](const LoadRow& l) { return l.tier == Tier::kNvme; });
      std::erase_if(r.overlaps, [](const OverlapRow& l) { return l.tier == Tier::kNvme; });
    }
  }
  std::fprintf(stderr, "kvtier bench layers: whole-block pins (reference)...\n");
  for (LoadRow& row : r.loads) {
    const bool below = row.tier == Tier::kNvme;
    const double t_comp = Median(row.whole_us) / o.layers;
    if (below) {
      auto plan = client.PlanPreload(Tier::kNvme, r.prefix_bytes / o.layers, t_comp, o.layers);
      if (plan.ok()) r.nvme_plan_bps_before_pins = plan->read_bytes_per_s;
    }
    if (Status s = bench.MeasureWholePins(row); !s.ok()) return s;
    if (below) {
      auto plan = client.PlanPreload(Tier::kNvme, r.prefix_bytes / o.layers, t_comp, o.layers);
      if (plan.ok()) r.nvme_plan_bps_after_pins = plan->read_bytes_per_s;
    }
  }
  std::fprintf(stderr, "kvtier bench layers: saves (%.1f s per op)...\n", o.seconds);
  return bench.MeasureSaves();
}

// `daemon_pid`: the private kvtierd's, 0 for a running one.
Status MeasureOn(const LayersBenchOptions& o, const std::string& socket_path, pid_t daemon_pid, Report& r) {
  const uint64_t salt =
      static_cast<uint64_t>(Clock::now().time_since_epoch().count()) ^ (static_cast<uint64_t>(::getpid()) << 40);
  ClientOptions options;
  options.socket_path = socket_path;
  options.client_name = "kvtier-bench-layers";
  options.namespaces = {BenchNamespace(o, salt)};
  options.verify_checksums = o.verify_checksums;
  auto client = Client::Connect(options);
  if (!client.ok()) return client.status();
  r.arena_bytes = (*client)->arena().size();
  if (r.prefix_bytes * 2 > r.arena_bytes) {
    return InvalidArgument("the host tier (" + support::Mib(r.arena_bytes) + ") must hold two prefixes of " +
                           support::Mib(r.prefix_bytes));
  }
  bool nvme = false;
  if (o.skip_nvme) {
    r.nvme_note = "skipped (--skip-nvme)";
  } else {
    auto has = HasNvme(**client);
    if (!has.ok()) return has.status();
    nvme = *has;
    if (!nvme) r.nvme_note = daemon_pid > 0 ? "the daemon has no NVMe tier" : "the running daemon has no NVMe tier";
  }
  return Measure(**client, o, salt, nvme, daemon_pid, r);
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "kvtier bench layers: %s\n", what.c_str());
  return 1;
}

int RunInDir(const LayersBenchOptions& o, const std::string& dir, Report& report) {
  std::optional<support::StartedServer> daemon;
  std::string socket_path = o.socket_path;
  const std::string nvme_path = o.dir + "/kvtier-bench-layers-" + std::to_string(::getpid()) + ".dat";
  if (socket_path.empty()) {
    const std::string path = o.kvtierd_path.empty() ? support::DefaultKvtierdPath() : o.kvtierd_path;
    std::fprintf(stderr, "kvtier bench layers: starting %s (arena %s, NVMe %s)...\n", path.c_str(),
                 support::Mib(o.arena_bytes).c_str(), o.skip_nvme ? "none" : nvme_path.c_str());
    auto started = support::StartKvtierd(path, dir, o.arena_bytes, std::chrono::seconds(60),
                                         o.skip_nvme ? std::string() : NvmeToml(o, nvme_path));
    if (!started.ok()) {
      std::filesystem::remove(nvme_path);
      support::RemoveTree(nvme_path + ".index");
      return Fail("cannot start kvtierd: " + started.status().ToString() + "\n(use --kvtierd PATH or --socket PATH)");
    }
    daemon = std::move(*started);
    socket_path = daemon->socket_path;
    report.daemon = "private " + path + (o.skip_nvme ? "" : ", NVMe file " + nvme_path);
  } else {
    report.daemon = "running at " + o.socket_path;
  }
  Status s = MeasureOn(o, socket_path, daemon ? daemon->process.pid() : 0, report);
  if (daemon) {
    const std::string how = daemon->process.Stop();
    if (how != "exit status 0") std::fprintf(stderr, "kvtier bench layers: kvtierd ended with %s\n", how.c_str());
    if (!s.ok()) std::fprintf(stderr, "kvtierd log:\n%s\n", support::FileTail(daemon->log_path).c_str());
    std::error_code ec;
    std::filesystem::remove(nvme_path, ec);  // best effort, as support::RemoveTree
    support::RemoveTree(nvme_path + ".index");
  }
  if (!s.ok()) return Fail(s.ToString());
  PrintLayersReport(report);
  if (!o.json_path.empty()) {
    if (Status j = WriteLayersJson(o.json_path, report); !j.ok()) return Fail(j.ToString());
  }
  return 0;
}

}  // namespace

void AddLayersBenchOptions(CLI::App& app, LayersBenchOptions& o) {
  app.add_option("--socket", o.socket_path, "Use the kvtierd listening here instead of starting one");
  app.add_option("--kvtierd", o.kvtierd_path,
                 "kvtierd binary to start (default: the kvtierd of this build or install)");
  app.add_option("--dir", o.dir, "Directory of the private kvtierd's NVMe file (removed after)")->capture_default_str();
  app.add_option("--arena-bytes", o.arena_bytes, "Host tier of the private kvtierd")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--nvme-bytes", o.nvme_bytes, "NVMe file of the private kvtierd")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--blocks", o.blocks, "Blocks in the prefix")->capture_default_str();
  app.add_option("--block-tokens", o.block_tokens, "Tokens per block (namespace)")->capture_default_str();
  app.add_option("--layers", o.layers, "Layers per block (namespace layer_count)")->capture_default_str();
  app.add_option("--bytes-per-token-per-layer", o.bytes_per_token_per_layer, "KV bytes per token per layer")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--trials", o.trials, "Trials per load case (medians are reported)")->capture_default_str();
  app.add_option("--seconds", o.seconds,
                 "Timed seconds per save op on average (memcpy, layer-wise save, PutBatch run in rounds)")
      ->capture_default_str();
  app.add_option("--compute-factors", o.compute_factors, "t_comp as multiples of the measured t_read")
      ->delimiter(',')
      ->capture_default_str();
  app.add_flag("--skip-nvme", o.skip_nvme, "No NVMe tier (host tier only)");
  app.add_flag("--verify-checksums", o.verify_checksums,
               "Loads check every layer against its checksum (ClientOptions::verify_checksums)");
  app.add_option("--json", o.json_path, "Also write the results to this file as JSON");
}

int RunLayersBench(const LayersBenchOptions& o) {
  if (Status s = CheckOptions(o); !s.ok()) return Fail(s.ToString());
  Report report;
  report.blocks = o.blocks;
  report.layers = o.layers;
  report.layer_bytes = uint64_t{o.block_tokens} * o.bytes_per_token_per_layer;
  report.block_bytes = report.layer_bytes * o.layers;
  report.prefix_bytes = report.block_bytes * o.blocks;
  report.trials = o.trials;
  report.verify_checksums = o.verify_checksums;
  auto dir = support::MakeTempDir("kvtier-bench-");
  if (!dir.ok()) return Fail(dir.status().ToString());
  const int rc = RunInDir(o, *dir, report);
  support::RemoveTree(*dir);
  return rc;
}

}  // namespace kvtier::tools
