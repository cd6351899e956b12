// kvtierd: the node-local KV-cache daemon.
//   kvtierd [--config FILE] [--socket PATH] [--log-format text|json] [--print-default-config]
// Signals: SIGTERM / SIGINT stop accepting, drain in-flight requests, close
// the tiers (the NVMe index included) and exit 0. SIGHUP re-reads --config
// and applies the options marked run-time changeable (the others are logged
// as needing a restart; a bad file is logged and the running config kept).
// Under systemd (Type=notify) it reports READY / RELOADING / STOPPING and
// pings the watchdog (daemon/server/systemd_notify.h).
// A daemon that cannot start says why in one line on stderr and exits 1
// (2 for a bad command line or config file).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <bit>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <memory>
#include <optional>
#include <pthread.h>
#include <sys/resource.h>

#include "common/logging.h"
#include "daemon/setup/auto_size.h"
#include "daemon/config/config.h"
#include "daemon/setup/directory_trust.h"
#include "daemon/engine/engine.h"
#include "daemon/setup/hbm_setup.h"
#include "daemon/setup/memory_limit.h"
#include "daemon/setup/peer_setup.h"
#include "daemon/server/metrics_format.h"
#include "daemon/server/metrics_server.h"
#include "daemon/config/secret_file.h"
#include "daemon/server/protobuf_logging.h"
#include "daemon/server/server.h"
#include "daemon/config/tenant_config.h"
#include "daemon/setup/tenant_engines.h"
#include "daemon/server/systemd_notify.h"
#include "daemon/setup/tier_stack.h"

namespace {

using namespace kvtier;

// What the command line sets over the config file, and the machine's
// memory as measured at start; kept across reloads (so auto sizes resolve
// to the same values on SIGHUP).
struct CommandLine {
  std::string config_path;                       // empty: embedded defaults, nothing to reload
  std::string socket_override;                   // empty: server.socket_path
  std::optional<LogFormat> log_format_override;  // none: log.format
  MachineMemory machine;
  uint64_t kept_arena_bytes = 0;  // the kept host arena's size (host_keep.h); 0: none
};

// The command line's overrides, then auto (0) sizes resolved; returns the
// log lines saying what auto chose.
std::vector<std::string> ApplyOverrides(const CommandLine& command_line, DaemonConfig& config) {
  if (!command_line.socket_override.empty()) config.socket_path = command_line.socket_override;
  if (command_line.log_format_override) config.log_format = *command_line.log_format_override;
  const bool auto_host = config.host_capacity_bytes == 0;
  std::vector<std::string> lines = ResolveAutoSizes(config, command_line.machine);
  // An auto size picks the kept arena's when that fits what auto allows, so
  // that a restart adopts it rather than start empty over a small drift in
  // the memory available.
  const auto kept = static_cast<int64_t>(command_line.kept_arena_bytes);
  if (auto_host && kept > 0 && kept <= config.host_capacity_bytes && kept != config.host_capacity_bytes) {
    lines.push_back("host.capacity_bytes = 0 (auto): " + std::to_string(kept) +
                    " bytes, the size of the kept host arena (auto would allow " +
                    std::to_string(config.host_capacity_bytes) + ")");
    config.host_capacity_bytes = kept;
  }
  return lines;
}

// Raises the soft open-file limit to the hard one: each client connection
// takes a descriptor, and the shell's default soft limit (1024) is below
// server.max_connections. Warns when even the hard limit is below it
// (accepts then fail with EMFILE and back off; see Server::BackOffAfter).
void RaiseOpenFileLimit(int64_t max_connections) {
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  if (limit.rlim_cur < limit.rlim_max) {
    const rlim_t before = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &limit) == 0) {
      spdlog::info("raised the open-file limit from {} to {}", before, limit.rlim_cur);
    } else {
      limit.rlim_cur = before;
    }
  }
  constexpr rlim_t kOwnDescriptors = 256;  // tiers, index, epoll, metrics, log
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < static_cast<rlim_t>(max_connections) + kOwnDescriptors) {
    spdlog::warn(
        "the open-file limit ({}) is below server.max_connections ({}) plus {} for the daemon itself: "
        "connections past it wait until others close (raise LimitNOFILE / ulimit -n)",
        limit.rlim_cur, max_connections, kOwnDescriptors);
  }
}

// Gives every tenant without a size its share of the host (and HBM) tier.
Status ResolveShares(DaemonConfig& config) {
  return ResolveTenantShares(config.host_capacity_bytes,
                             config.hbm_enabled == HbmEnabled::kOff ? 0 : config.hbm_capacity_bytes, config.tenants);
}

// The one line a daemon that cannot start writes to stderr (a JSON record
// in the json log format); returns `exit_code` for main to return.
int StartFailure(const DaemonConfig& config, const std::string& why, int exit_code = 1) {
  std::string line = why;
  std::replace(line.begin(), line.end(), '\n', ' ');  // one line, whatever the status said
  if (config.log_format == LogFormat::kJson) {
    std::fputs(
        JsonLogRecord(spdlog::level::critical, "kvtierd cannot start: " + line, std::chrono::system_clock::now(), 0)
            .c_str(),
        stderr);
  } else {
    std::fprintf(stderr, "kvtierd: cannot start: %s\n", line.c_str());
  }
  return exit_code;
}

// The metrics endpoint's options: where it listens, its bearer token (read,
// or created, from metrics.bearer_token_file) and what a scrape without a
// token sees: with tenants, daemon-wide series only unless
// metrics.tenant_series (docs/OPERATIONS.md, "Metrics").
Result<MetricsOptions> MetricsOptionsOf(const DaemonConfig& config, bool has_tenants) {
  MetricsOptions options{config.metrics_address, static_cast<uint16_t>(config.metrics_port)};
  if (!config.metrics_bearer_token_file.empty()) {
    bool created = false;
    auto token = LoadOrCreateToken(config.metrics_bearer_token_file, "the metrics bearer token", &created);
    if (!token.ok()) return Status(token.status().code(), "metrics.bearer_token_file: " + token.status().message());
    if (created) spdlog::info("metrics: created a bearer token in {}", config.metrics_bearer_token_file);
    options.bearer_token = std::move(*token);
  }
  options.open_view = has_tenants && !config.metrics_tenant_series ? MetricsView::kDaemonWide : MetricsView::kAll;
  return options;
}

// The value of `spec` in `config`, as it would be written in TOML.
std::string OptionToml(const OptionSpec& spec, const DaemonConfig& config) { return spec.field.toml(spec, config); }

void ApplyLogOptions(const DaemonConfig& config) {
  SetLogLevel(config.log_level);
  SetLogFormat(config.log_format);
}

// The running configuration as `kvtier config get` shows it: read by io
// threads, replaced after a SIGHUP reload.
class RunningConfigText {
 public:
  explicit RunningConfigText(const DaemonConfig& config) : config_(config) {}
  void Set(const DaemonConfig& config) EXCLUDES(mu_) {
    MutexLock lock(mu_);
    config_ = config;
  }
  // As TOML, all of it (`tenant` empty: the operator, or no tenants), or as
  // tenant `tenant` may see it (TenantConfigToml).
  std::string Get(const std::string& tenant) const EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return tenant.empty() ? ConfigToml(config_) : TenantConfigToml(config_, tenant);
  }

 private:
  mutable Mutex mu_;
  DaemonConfig config_ GUARDED_BY(mu_);
};

// SIGHUP: re-reads the config file into `running`, applying what may
// change at run time and logging the rest. A bad file changes nothing.
// Applying is ApplyLogOptions: an option newly marked runtime_changeable in
// kOptions needs its own apply step here (the engine's options are fixed
// at Engine::Create).
void Reload(const CommandLine& command_line, DaemonConfig& running, RunningConfigText& shown,
            const SystemdNotifier& notifier) {
  if (command_line.config_path.empty()) {
    spdlog::info("SIGHUP: kvtierd runs on its embedded defaults (no --config); nothing to reload");
    return;
  }
  const auto now_us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count();
  notifier.Notify("RELOADING=1\nMONOTONIC_USEC=" + std::to_string(now_us)).IgnoreError();  // best effort
  auto loaded = LoadConfigFile(command_line.config_path);
  if (!loaded.ok()) {
    spdlog::error("SIGHUP: reload failed, the running configuration stays: {}", loaded.status().ToString());
  } else {
    ApplyOverrides(command_line, *loaded);
    Status shares = ResolveShares(*loaded);
    if (!shares.ok() || loaded->tenants != running.tenants) {
      spdlog::warn("SIGHUP: the [[tenant]] tables changed in {}; they need a restart{}", command_line.config_path,
                   shares.ok() ? "" : " (and the new ones are wrong: " + shares.message() + ")");
    }
    int applied = 0;
    for (const OptionSpec* spec : ChangedOptions(running, *loaded)) {
      if (!spec->runtime_changeable) {
        spdlog::warn("SIGHUP: {} changed to {} in {}; it needs a restart (still {})", spec->name,
                     OptionToml(*spec, *loaded), command_line.config_path, OptionToml(*spec, running));
        continue;
      }
      spdlog::info("SIGHUP: {} = {} (was {})", spec->name, OptionToml(*spec, *loaded), OptionToml(*spec, running));
      spec->field.copy(*loaded, running);
      ++applied;
    }
    ApplyLogOptions(running);
    shown.Set(running);
    spdlog::info("SIGHUP: reloaded {}; {} option(s) applied", command_line.config_path, applied);
  }
  notifier.Notify("READY=1\nSTATUS=serving on " + running.socket_path).IgnoreError();  // best effort
}

// Serves until SIGTERM / SIGINT, reloading on SIGHUP; `server` is running.
void WaitForSignals(const sigset_t& signals, const CommandLine& command_line, DaemonConfig& config,
                    RunningConfigText& shown, Server& server) {
  const SystemdNotifier notifier = SystemdNotifier::FromEnvironment();
  Status ready = notifier.Notify("READY=1\nSTATUS=serving on " + server.socket_path());
  if (!ready.ok()) spdlog::warn("systemd notification: {}", ready.ToString());
  WatchdogPinger watchdog(notifier, [&server] { return server.IoThreadsAnswered(); });
  if (notifier.watchdog_usec() > 0) {
    spdlog::info("systemd watchdog: pinging every {} ms while the io threads answer", notifier.watchdog_usec() / 2000);
  }
  for (;;) {
    int signal_number = 0;
    sigwait(&signals, &signal_number);
    if (signal_number == SIGHUP) {
      Reload(command_line, config, shown, notifier);
      continue;
    }
    spdlog::info("received {}, draining", signal_number == SIGTERM ? "SIGTERM" : "SIGINT");
    notifier.Notify("STOPPING=1\nSTATUS=draining").IgnoreError();  // best effort
    break;
  }
  watchdog.Stop();  // no probes into io threads that are stopping
}

int Serve(const CommandLine& command_line, DaemonConfig& config, std::vector<PassedFd> passed) {
  const auto running_config = std::make_shared<RunningConfigText>(config);
  // Block the signals in every thread; WaitForSignals takes them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  SystemClock clock;
  RaiseOpenFileLimit(config.max_connections);
  Status directories = CheckStateDirectories(config, ::geteuid());
  if (!directories.ok()) return StartFailure(config, directories.ToString());
  // Destroyed after the engines: closing the NVMe tier closes its RocksDB index.
  auto stack = OpenTierStack(config, clock);
  if (!stack.ok()) return StartFailure(config, stack.status().ToString());
  const SystemdNotifier notifier = SystemdNotifier::FromEnvironment();
  HostKeeper keeper(notifier, std::move(passed), config.host_keep_across_restarts);
  auto engines = DaemonEngines::Open(config, *stack, clock, &keeper);
  if (!engines.ok()) return StartFailure(config, engines.status().ToString());
  keeper.DropUnclaimed();
  ServerOptions server_options{config.socket_path,
                               static_cast<uint32_t>(config.io_threads),
                               static_cast<uint32_t>(config.max_frame_bytes),
                               static_cast<uint32_t>(config.drain_timeout_ms),
                               static_cast<uint32_t>(config.spin_wait_us),
                               {}};
  server_options.limits = ConnectionLimits{
      .max_connections = static_cast<uint32_t>(config.max_connections),
      .reserved_connections_percent = static_cast<uint32_t>(config.reserved_connections_percent),
      .first_request_timeout = std::chrono::milliseconds(config.first_request_timeout_ms),
      .max_leases = static_cast<uint64_t>(config.max_leases_per_connection),
      .max_reserved_bytes = static_cast<uint64_t>(config.max_reserved_bytes_per_connection),
      .reservation_timeout = std::chrono::seconds(config.reservation_timeout_s),
      .idle_timeout = std::chrono::seconds(config.idle_timeout_s),
      .frame_timeout = std::chrono::milliseconds(config.frame_timeout_ms),
      .partial_frame_bytes = static_cast<uint64_t>(config.partial_frame_bytes),
      .client_memory_bytes = static_cast<uint64_t>(config.client_memory_bytes),
      .reserved_client_memory_percent = static_cast<uint32_t>(config.reserved_client_memory_percent),
      .max_client_memory_per_connection = static_cast<uint64_t>(config.max_client_memory_per_connection)};
  server_options.socket_mode = *ParseFileMode(config.socket_mode);  // checked by ParseConfig
  server_options.socket_group = config.socket_group;
  server_options.running_config = [running = running_config](const std::string& tenant) {
    return running->Get(tenant);
  };
  server_options.visit_shared_counters = [&engines = **engines](CounterVisitor& v) { engines.VisitSharedCounters(v); };
  // Declared after the engines: it stops serving peers before they go; before the server, whose Stats count it.
  std::vector<TenantsPeerSource::Part> peer_parts;
  for (const DaemonEngines::Tenant& t : (*engines)->tenants()) {
    peer_parts.push_back({t.engine.get(), t.host.get(), t.scope.get()});
  }
  auto peers = StartPeerService(config, peer_parts);
  if (!peers.ok()) return StartFailure(config, peers.status().ToString());
  if (*peers != nullptr) {
    server_options.visit_daemon_counters = [&service = **peers](CounterVisitor& v) {
      service.server->VisitCounters(v);
    };
  }
  auto server = Server::Start(server_options, (*engines)->Served(config), TenantTable(config.tenants, ::geteuid()));
  if (!server.ok()) return StartFailure(config, server.status().ToString());
  if (Status events = (*engines)->StartEvents(config); !events.ok()) return StartFailure(config, events.ToString());
  // Declared after the server and the engines: it stops serving before they go.
  std::unique_ptr<MetricsServer> metrics;
  if (config.metrics_enabled) {
    auto metrics_options = MetricsOptionsOf(config, (*engines)->has_tenants());
    if (!metrics_options.ok()) return StartFailure(config, metrics_options.status().ToString());
    auto started = MetricsServer::Start(*metrics_options, [&server = **server, &engines = **engines](MetricsView view) {
      PrometheusWriter writer;
      DaemonWideVisitor daemon_wide(writer);
      CounterVisitor& out = view == MetricsView::kAll ? static_cast<CounterVisitor&>(writer) : daemon_wide;
      out.VisitGauge("build_info{version=\"" KVTIER_VERSION "\"}", 1);
      server.VisitCounters(out);
      engines.VisitCounters(out);
      return writer.Text();
    });
    if (!started.ok()) return StartFailure(config, started.status().ToString());
    metrics = std::move(*started);
  }
  spdlog::info("kvtierd {} listening on {}", KVTIER_VERSION, (*server)->socket_path());
  const DaemonEngines::Tenant& first = (*engines)->tenants().front();
  spdlog::info("tier host: {} bytes shared-memory arena{} ({}), eviction {}, block directory {}",
               config.host_capacity_bytes, (*engines)->has_tenants() ? ", split among the tenants" : "",
               first.host->locked() ? "locked in memory" : "NOT locked", EvictionPolicyName(config.engine_eviction),
               first.host->directory() != nullptr ? std::to_string(first.host->directory()->bytes()) + " bytes"
                                                  : std::string("off"));
  if (first.hbm.tier != nullptr) spdlog::info("tier hbm: {}", first.hbm.description);
  if (!first.hbm.why_not.empty()) spdlog::warn("{}", first.hbm.why_not);
  if (metrics != nullptr) spdlog::info("metrics: {}", metrics->url());
  std::string tiers = first.hbm.tier != nullptr ? "hbm host" : "host";
  for (const auto& tier : stack->tiers) tiers += " " + std::string(tier->name());
  if (config.log_format == LogFormat::kJson) {
    spdlog::info("socket: {}; tiers: {}", (*server)->socket_path(), tiers);
  } else {
    std::printf("socket: %s\ntiers: %s\n", (*server)->socket_path().c_str(), tiers.c_str());
    if (metrics != nullptr) std::printf("metrics: %s\n", metrics->url().c_str());
    std::fflush(stdout);
  }

  WaitForSignals(signals, command_line, config, *running_config, **server);
  (*server)->Shutdown();
  (*server)->Wait();
  return 0;  // then the server, the engine and the tiers close, in that order
}

}  // namespace

int main(int argc, char** argv) {
  // What systemd's file descriptor store (or kvtier supervise) passed: a
  // kept host arena and its journal (host_keep.h).
  std::vector<kvtier::PassedFd> passed = kvtier::TakePassedFds();
  CLI::App app{"kvtierd: hierarchical KV-cache daemon for LLM inference"};
  app.footer(kvtier::OptionsHelp());
  CommandLine command_line;
  bool print_default = false;
  app.add_option("--config", command_line.config_path, "TOML configuration file (defaults are embedded)");
  app.add_option("--socket", command_line.socket_override, "Override server.socket_path");
  app.add_option_function<std::string>(
         "--log-format",
         [&command_line](const std::string& name) {
           command_line.log_format_override = kvtier::FindChoice<kvtier::LogFormat>(name);
         },
         "Override log.format: " + kvtier::ListChoices(kvtier::kChoiceNames<kvtier::LogFormat>))
      ->check([](const std::string& name) {
        return kvtier::FindChoice<kvtier::LogFormat>(name)
                   ? std::string()
                   : name + " is not one of " + std::string(kvtier::kChoiceNames<kvtier::LogFormat>);
      });
  app.add_flag("--print-default-config", print_default, "Print the embedded default config and exit");
  CLI11_PARSE(app, argc, argv);
  kvtier::RouteProtobufLogging();  // a peer's bad message must not fill stderr

  if (print_default) {
    std::cout << kvtier::DefaultConfigToml();
    return 0;
  }
  auto config = command_line.config_path.empty() ? kvtier::ParseConfig("", "<embedded defaults>")
                                                 : kvtier::LoadConfigFile(command_line.config_path);
  if (!config.ok()) {
    kvtier::DaemonConfig failed;
    failed.log_format = command_line.log_format_override.value_or(kvtier::LogFormat::kText);
    return StartFailure(failed, config.status().ToString(), 2);
  }
  // In a memory cgroup, /proc/meminfo is the machine's, not kvtierd's.
  const std::optional<kvtier::CgroupMemory> cgroup = kvtier::ReadCgroupMemory();
  if (config->host_capacity_bytes == 0) {
    auto machine = ReadMachineMemory(MeminfoPath());
    if (!machine.ok()) return StartFailure(*config, machine.status().ToString());
    command_line.machine = cgroup ? kvtier::UnderLimit(*machine, *cgroup) : *machine;
    // A kept arena is memory this daemon takes back: available to the sizing.
    command_line.kept_arena_bytes = kvtier::HostKeeper::KeptArenaBytes(passed);
    command_line.machine.available_bytes += command_line.kept_arena_bytes;
  }
  const std::vector<std::string> chosen = ApplyOverrides(command_line, *config);
  Status shares = ResolveShares(*config);
  if (!shares.ok()) return StartFailure(*config, shares.ToString(), 2);
  if (cgroup) {
    Status fits = kvtier::CheckFitsUnderLimit(*config, *cgroup);
    if (!fits.ok()) return StartFailure(*config, fits.ToString(), 2);
  }
  ApplyLogOptions(*config);
  if (cgroup) {
    spdlog::info("memory limit {} bytes ({}); the configuration holds {} bytes of it", cgroup->limit_bytes,
                 cgroup->limit_file, kvtier::ConfiguredMemoryBytes(*config));
  }
  for (const std::string& line : chosen) spdlog::info("{}", line);
  const int exit_code = Serve(command_line, *config, std::move(passed));
  if (exit_code == 0) spdlog::info("kvtierd stopped");
  return exit_code;
}
