#include "tools/stress/stress.h"

#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <optional>
#include <random>
#include <thread>

#include "kvtier/client.h"
#include "support/format.h"
#include "support/process.h"
#include "support/servers.h"
#include "support/temp_dir.h"
#include "tools/stress/stress_crash.h"
#include "tools/stress/stress_report.h"
#include "tools/stress/stress_values.h"
#include "tools/stress/stress_workload.h"

namespace kvtier::tools {
namespace {

using Clock = std::chrono::steady_clock;

// Counters worth a line at the end: that the tiers below were used, and
// anything that says bytes went bad.
constexpr const char* kNotableCounters[] = {
    "engine.evictions",
    "engine.demotions",
    "engine.promotions",
    "engine.demotion_busy_drops",
    "engine.demotion_corrupt",
    "engine.load_failed_blocks",
    "engine.layer_reads",
    "nvme.writes",
    "nvme.reads",
    "nvme.corrupt_reads",
    "nvme.write_checksum_mismatches",
    "nvme.index_failures",
    "nvme.region_reclaims",
    "remote.writes",
    "remote.reads",
    "remote.corrupt",
};

int Fail(const std::string& what) {
  std::fprintf(stderr, "kvtier stress: %s\n", what.c_str());
  return 1;
}

Status CheckOptions(const StressOptions& o) {
  if (o.spawn == !o.socket_path.empty()) return InvalidArgument("give exactly one of --socket PATH and --spawn");
  if (o.crash_cycles > 0 && !o.spawn) return InvalidArgument("--crash-loop needs --spawn (it kills its own kvtierd)");
  if (o.crash_cycles > 0 && o.nvme_bytes == 0) return InvalidArgument("--crash-loop needs an NVMe tier");
  if (o.keep_host && o.crash_cycles == 0) return InvalidArgument("--keep-host goes with --crash-loop");
  if (o.clients == 0 || o.clients > 256) return InvalidArgument("--clients must be 1 to 256");
  if (!(o.seconds > 0) || o.seconds > 86400) return InvalidArgument("--seconds must be in (0, 86400]");
  if (!(o.cycle_seconds > 0) || o.cycle_seconds > 600) return InvalidArgument("--cycle-seconds must be in (0, 600]");
  if (o.crash_cycles > 100000) return InvalidArgument("--crash-loop: at most 100000 cycles");
  if (o.chains > 4096 || o.chain_blocks > 256) return InvalidArgument("at most 4096 chains of 256 blocks");
  return Status::Ok();
}

std::string KeySpaceLine(const KeySpace& space, const StressOptions& o) {
  return std::to_string(space.namespaces().size()) + " namespaces x " + std::to_string(o.chains) + " chains x " +
         std::to_string(o.chain_blocks) + " blocks (" + std::to_string(space.distinct_blocks()) + " distinct blocks, " +
         support::Mib(space.distinct_bytes()) + ")";
}

std::vector<Counter> NotableCounters(const std::vector<Counter>& all) {
  std::vector<Counter> out;
  for (const char* name : kNotableCounters) {
    for (const Counter& c : all) {
      if (c.name == name) out.push_back(c);
    }
  }
  return out;
}

// Reads the daemon's counters with a fresh client; an error means the
// daemon is gone.
Result<std::vector<Counter>> ReadCounters(const std::string& socket_path) {
  ClientOptions options;
  options.socket_path = socket_path;
  options.client_name = "kvtier-stress-stats";
  options.connect_timeout = std::chrono::seconds(10);
  auto client = Client::Connect(options);
  if (!client.ok()) return client.status();
  return (*client)->Stats();
}

// Runs the load for o.seconds, watching the private daemon (if any).
void RunLoad(const StressOptions& o, const KeySpace& space, const WorkloadMix& mix, const std::string& socket_path,
             support::ChildProcess* daemon, StressReport& report) {
  auto load = StressLoad::Connect(socket_path, space, o.clients, /*reconnect=*/true);
  if (!load.ok()) {
    report.daemon_died = true;
    report.daemon_problem = "cannot connect the clients: " + load.status().ToString();
    return;
  }
  const auto t0 = Clock::now();
  const auto deadline = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.seconds));
  (*load)->Start(mix, o.seed);
  while (Clock::now() < deadline) {
    std::this_thread::sleep_for(std::min<Clock::duration>(std::chrono::milliseconds(50), deadline - Clock::now()));
    std::string how;
    if (daemon != nullptr && daemon->Exited(&how)) {
      report.daemon_died = true;
      report.daemon_problem = "kvtierd exited during the load (" + how + ")";
      break;
    }
  }
  (*load)->Stop(report.tally);
  report.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
}

// A fresh directory kvtier-stress-XXXXXX in `parent`.
Result<std::string> MakeDirIn(const std::string& parent) {
  std::string pattern = parent + "/kvtier-stress-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) return IoError("mkdtemp " + pattern + ": " + std::strerror(errno));
  return pattern;
}

std::string DaemonToml(const StressOptions& o, const std::string& dir) {
  std::string toml;
  if (o.nvme_bytes > 0) {
    toml +=
        "[nvme]\npath = " + support::TomlString(dir + "/stress-nvme.dat") +
        "\ncapacity_bytes = " + std::to_string(o.nvme_bytes) + "\nregion_bytes = " + std::to_string(o.region_bytes) +
        "\nstaging_bytes = \"16MiB\"\nadmission = \"all\"\nsync_index = " + (o.sync_index ? "true" : "false") + "\n";
    if (o.reinsert_percent >= 0) toml += "reinsert_percent = " + std::to_string(o.reinsert_percent) + "\n";
  }
  if (!o.redis.empty()) toml += "[remote]\nnodes = " + support::TomlString(o.redis) + "\nadmission = \"all\"\n";
  return toml;
}

int RunSpawned(const StressOptions& o, const KeySpace& space, const WorkloadMix& mix, StressReport& report) {
  const std::string kvtierd = o.kvtierd_path.empty() ? support::DefaultKvtierdPath() : o.kvtierd_path;
  auto dir = o.dir.empty() ? support::MakeTempDir("kvtier-stress-") : MakeDirIn(o.dir);
  if (!dir.ok()) return Fail(dir.status().ToString());
  report.daemon = "private " + kvtierd + " (arena " + support::Mib(o.arena_bytes) +
                  (o.nvme_bytes > 0 ? ", NVMe " + support::Mib(o.nvme_bytes) + " in " + *dir : ", no NVMe") +
                  (o.redis.empty() ? "" : ", remote " + o.redis) + ")";
  int code;
  if (o.crash_cycles > 0) {
    code = RunCrashLoop(o, space, mix, kvtierd, *dir, DaemonToml(o, *dir), report);
  } else {
    auto daemon = support::StartKvtierd(kvtierd, *dir, o.arena_bytes, std::chrono::seconds(60), DaemonToml(o, *dir));
    if (!daemon.ok()) {
      support::RemoveTree(*dir);
      return Fail("cannot start kvtierd: " + daemon.status().ToString() + "\n(use --kvtierd PATH or --socket PATH)");
    }
    RunLoad(o, space, mix, daemon->socket_path, &daemon->process, report);
    if (!report.daemon_died) {
      auto counters = ReadCounters(daemon->socket_path);
      if (counters.ok()) report.daemon_counters = NotableCounters(*counters);
      const std::string how = daemon->process.Stop();
      if (how != "exit status 0") {
        report.daemon_died = true;
        report.daemon_problem = "kvtierd ended with " + how + " when stopped";
      }
    }
    if (report.daemon_died) std::fprintf(stderr, "kvtierd log:\n%s\n", support::FileTail(daemon->log_path).c_str());
    code = 0;
  }
  support::RemoveTree(*dir);
  return code;
}

}  // namespace

void AddStressOptions(CLI::App& app, StressOptions& o) {
  app.add_option("--socket", o.socket_path, "Stress the kvtierd listening here");
  app.add_flag("--spawn", o.spawn, "Start a private kvtierd (small arena, NVMe file in a temporary directory)");
  app.add_option("--kvtierd", o.kvtierd_path,
                 "kvtierd binary for --spawn (default: the kvtierd of this build or install)");
  app.add_option("--dir", o.dir, "Where --spawn makes its temporary directory (default: $TMPDIR or /tmp)");
  app.add_option("--arena-bytes", o.arena_bytes, "--spawn: host tier")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--nvme-bytes", o.nvme_bytes, "--spawn: NVMe file (0: no NVMe tier)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--region-bytes", o.region_bytes, "--spawn: nvme.region_bytes")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_flag("--sync-index", o.sync_index, "--spawn: nvme.sync_index (fsync the index on every update)");
  app.add_option("--reinsert-percent", o.reinsert_percent, "--spawn: nvme.reinsert_percent (default: the daemon's)")
      ->check(CLI::Range(0, 100));
  app.add_option("--redis", o.redis, "--spawn: host:port of a Redis (Cluster) for the remote tier");
  app.add_option("--clients", o.clients, "Client threads, each with its own connection")->capture_default_str();
  app.add_option("--seconds", o.seconds, "Seconds of load")->capture_default_str();
  app.add_option("--seed", o.seed, "Seed of the key space and the choices (0: draw one; printed)");
  app.add_option("--namespaces", o.namespaces, "Namespaces (1-4; 64-256 KiB blocks, 4-32 layers)")
      ->capture_default_str();
  app.add_option("--chains", o.chains, "Prefix chains per namespace")->capture_default_str();
  app.add_option("--chain-blocks", o.chain_blocks, "Blocks per chain")->capture_default_str();
  app.add_option("--mix", o.mix,
                 "Operation weights over the defaults, e.g. get=30,erase=0 (kinds: put reserve save "
                 "get pin lookup erase load layers hint)");
  app.add_option("--json", o.json_path, "Write the report as JSON to this file ('-': stdout, instead of the text)");
  app.add_option("--crash-loop", o.crash_cycles,
                 "With --spawn: this many cycles of start, verify, load, kill -9 at a random moment; then a last "
                 "start and verify");
  app.add_option("--cycle-seconds", o.cycle_seconds, "--crash-loop: scale of one cycle's load (0.1x-1x of it)")
      ->capture_default_str();
  app.add_flag("--keep-host", o.keep_host,
               "--crash-loop: run kvtierd under a descriptor store (as systemd's) so its host tier survives each "
               "kill, and check that it does");
}

int RunStress(const StressOptions& options) {
  StressOptions o = options;
  if (Status s = CheckOptions(o); !s.ok()) {
    std::fprintf(stderr, "kvtier stress: %s\n", s.ToString().c_str());
    return 2;
  }
  WorkloadMix mix;
  if (!o.mix.empty()) {
    auto parsed = ParseMix(o.mix);
    if (!parsed.ok()) {
      std::fprintf(stderr, "kvtier stress: %s\n", parsed.status().ToString().c_str());
      return 2;
    }
    mix = *parsed;
  }
  if (o.seed == 0) o.seed = std::random_device{}() | (uint64_t{std::random_device{}()} << 32) | 1;
  auto space = KeySpace::Build({o.seed, o.namespaces, o.chains, o.chain_blocks});
  if (!space.ok()) {
    std::fprintf(stderr, "kvtier stress: %s\n", space.status().ToString().c_str());
    return 2;
  }
  std::fprintf(stderr, "kvtier stress: seed %" PRIu64 "\n", o.seed);
  StressReport report;
  report.seed = o.seed;
  report.clients = o.clients;
  report.key_space = KeySpaceLine(*space, o);
  report.mix = MixToString(mix);
  report.crash_loop = o.crash_cycles > 0;
  if (o.spawn) {
    if (int failed = RunSpawned(o, *space, mix, report); failed != 0) return failed;
  } else {
    report.daemon = "running at " + o.socket_path;
    RunLoad(o, *space, mix, o.socket_path, nullptr, report);
    auto counters = ReadCounters(o.socket_path);
    if (counters.ok()) {
      report.daemon_counters = NotableCounters(*counters);
    } else if (!report.daemon_died) {
      report.daemon_died = true;
      report.daemon_problem = "kvtierd does not answer after the load: " + counters.status().ToString();
    }
  }
  if (o.json_path != "-") PrintStressReport(report);
  if (!o.json_path.empty()) {
    if (Status s = WriteStressJson(o.json_path, report); !s.ok()) return Fail(s.ToString());
  }
  return StressExitCode(report);
}

}  // namespace kvtier::tools
