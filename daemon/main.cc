// kvtierd: the node-local KV-cache daemon.
//   kvtierd [--config FILE] [--socket PATH] [--log-format text|json] [--takeover]
//           [--print-default-config]
// --takeover: take the socket and the host tier over from the kvtierd
// running at the socket (daemon/server/takeover.h), which drains its
// requests, hands them over and exits once this one serves.
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
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <ctime>
#include <iostream>
#include <memory>
#include <optional>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/logging.h"
#include "daemon/setup/auto_size.h"
#include "daemon/config/config.h"
#include "daemon/setup/directory_trust.h"
#include "daemon/engine/engine.h"
#include "daemon/setup/hbm_setup.h"
#include "daemon/setup/host_keep.h"
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
#include "daemon/server/takeover.h"
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
  if (auto_host) {
    std::string kept = KeepKeptArenaSize(command_line.kept_arena_bytes, command_line.machine, config);
    if (!kept.empty()) lines.push_back(std::move(kept));
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

// Resolves `config` as it will run: the command line's overrides, auto
// sizes (the kept arena among `passed` counted as available), tenants'
// shares and the memory limit. 0, or the exit code of a start that fails
// (*why says why); *chosen: what auto chose, for the log.
int ResolveConfig(CommandLine& command_line, const std::optional<CgroupMemory>& cgroup,
                  const std::vector<PassedFd>& passed, DaemonConfig& config, std::string* why,
                  std::vector<std::string>* chosen) {
  // Either auto size needs the machine's memory (client memory: its total).
  if (config.host_capacity_bytes == 0 || config.client_memory_bytes == 0) {
    auto machine = ReadMachineMemory(MeminfoPath());
    if (!machine.ok()) {
      *why = machine.status().ToString();
      return 1;
    }
    command_line.machine = cgroup ? UnderLimit(*machine, *cgroup) : *machine;
  }
  if (config.host_capacity_bytes == 0) {
    // The kept arenas this configuration claims (tenants' too) are memory
    // this daemon takes back: available to the sizing.
    std::vector<std::string> tenants;
    for (const TenantConfig& t : config.tenants) tenants.push_back(t.name);
    if (tenants.empty()) tenants.push_back("");
    command_line.kept_arena_bytes = HostKeeper::KeptArenaBytes(passed, {""});
    command_line.machine.available_bytes += HostKeeper::KeptArenaBytes(passed, tenants);
  }
  *chosen = ApplyOverrides(command_line, config);
  Status shares = ResolveShares(config);
  if (shares.ok() && cgroup) shares = CheckFitsUnderLimit(config, *cgroup);
  if (!shares.ok()) *why = shares.ToString();
  return shares.ok() ? 0 : 2;
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
// Returns the takeover connection when a takeover request ended it (SIGUSR1
// from `takeovers`, which may be null), else -1.
int WaitForSignals(const sigset_t& signals, const CommandLine& command_line, DaemonConfig& config,
                   RunningConfigText& shown, Server& server, TakeoverListener* takeovers) {
  const SystemdNotifier notifier = SystemdNotifier::FromEnvironment();
  Status ready = notifier.Notify("READY=1\nSTATUS=serving on " + server.socket_path());
  if (!ready.ok()) spdlog::warn("systemd notification: {}", ready.ToString());
  WatchdogPinger watchdog(notifier, [&server] { return server.IoThreadsAnswered(); });
  if (notifier.watchdog_usec() > 0) {
    spdlog::info("systemd watchdog: pinging every {} ms while the io threads answer", notifier.watchdog_usec() / 2000);
  }
  int takeover = -1;
  for (;;) {
    int signal_number = 0;
    sigwait(&signals, &signal_number);
    if (signal_number == SIGHUP) {
      Reload(command_line, config, shown, notifier);
      continue;
    }
    if (signal_number == SIGUSR1) {
      takeover = takeovers != nullptr ? takeovers->TakeRequest() : -1;
      if (takeover < 0) {
        spdlog::info("SIGUSR1 without a takeover request; ignored");
        continue;
      }
      break;
    }
    spdlog::info("received {}, draining", signal_number == SIGTERM ? "SIGTERM" : "SIGINT");
    notifier.Notify("STOPPING=1\nSTATUS=draining").IgnoreError();  // best effort
    break;
  }
  watchdog.Stop();  // no probes into io threads that are stopping
  return takeover;
}

// How Serve ended.
struct ServeEnd {
  int exit_code = 0;
  int takeover = -1;             // a takeover's connection; -1: a plain stop (or a failed start)
  std::vector<PassedFd> handed;  // for the takeover: the listening socket and each kept host pair
  // For the takeover: the engines, stopped but not freed (freeing them
  // would delay the hand-over by seconds at millions of blocks).
  std::unique_ptr<RetiredEngines> retired;
};

// The passed fd named `name`, removed from `passed`; -1 when none.
int TakePassed(std::vector<PassedFd>& passed, const std::string& name) {
  for (auto it = passed.begin(); it != passed.end(); ++it) {
    if (it->name != name) continue;
    const int fd = it->fd;
    passed.erase(it);
    return fd;
  }
  return -1;
}

// Keeps the listening socket in systemd's file descriptor store, so that a
// restart (or a crash) refuses no connection: they queue on it until the
// next kvtierd serves.
void StoreListener(const SystemdNotifier& notifier, Server& server) {
  if (!notifier.enabled()) return;
  const int fd = server.DupListener();
  Status stored = fd >= 0 ? notifier.Notify(std::string("FDSTOREREMOVE=1\nFDNAME=") + kListenerName)
                          : IoError(std::string("dup: ") + std::strerror(errno));
  if (stored.ok()) {
    stored = notifier.NotifyWithFds(std::string("FDSTORE=1\nFDPOLL=0\nFDNAME=") + kListenerName, {&fd, 1});
  }
  if (fd >= 0) ::close(fd);
  if (stored.ok()) server.KeepSocketFile(true);  // the store's socket: the next kvtierd serves it
  if (!stored.ok())
    spdlog::warn("could not keep the listening socket in the file descriptor store: {}", stored.ToString());
}

// What a takeover hands over: the listening socket, and each host tier's
// arena and journal (duplicates, the caller's). IoError (nothing held) when
// a dup fails: a takeover without all of it would cost the host tier.
Result<std::vector<PassedFd>> HandedFds(Server& server, const DaemonEngines& engines) {
  std::vector<PassedFd> handed;
  handed.push_back({server.DupListener(), kListenerName});
  for (const DaemonEngines::Tenant& t : engines.tenants()) {
    if (t.host->journal() == nullptr) continue;  // host.keep_across_restarts = false
    handed.push_back({::fcntl(t.host->journal()->fd(), F_DUPFD_CLOEXEC, 0), HostKeeper::JournalName(t.config.name)});
    handed.push_back({::fcntl(t.host->memfd(), F_DUPFD_CLOEXEC, 0), HostKeeper::ArenaName(t.config.name)});
  }
  const int error = errno;
  if (std::all_of(handed.begin(), handed.end(), [](const PassedFd& p) { return p.fd >= 0; })) return handed;
  for (const PassedFd& p : handed) {
    if (p.fd >= 0) ::close(p.fd);
  }
  return IoError(std::string("dup: ") + std::strerror(error));
}

// Waits for signals until a stop, or a takeover this daemon can hand over
// (its requester still there, every fd duplicated); refuses the others.
ServeEnd WaitForStopOrTakeover(const sigset_t& signals, const CommandLine& command_line, DaemonConfig& config,
                               RunningConfigText& shown, Server& server, const DaemonEngines& engines,
                               TakeoverListener* takeovers) {
  ServeEnd end;
  for (;;) {
    end.takeover = WaitForSignals(signals, command_line, config, shown, server, takeovers);
    if (end.takeover < 0) return end;
    if (HungUp(end.takeover)) {
      spdlog::warn("takeover: the requester went away before the hand-over; serving on");
    } else if (auto handed = HandedFds(server, engines); !handed.ok()) {
      spdlog::error("takeover refused: {}", handed.status().ToString());
      const std::string refused = "refused " + handed.status().message();
      [[maybe_unused]] ssize_t sent = ::send(end.takeover, refused.data(), refused.size(), MSG_NOSIGNAL);
    } else {
      end.handed = std::move(*handed);
      server.KeepSocketFile(true);  // the next daemon's now
      return end;
    }
    ::close(end.takeover);
    takeovers->Reopen();  // takes requests again
  }
}

// Serves until a stop signal or a takeover. `passed`: what systemd's fd
// store, a takeover or a failed takeover handed over. `asked`: this
// daemon's own takeover request (null: none), told once it serves.
ServeEnd Serve(const CommandLine& command_line, DaemonConfig& config, std::vector<PassedFd> passed,
               TakeoverRequest* asked) {
  const auto running_config = std::make_shared<RunningConfigText>(config);
  // Block the signals in every thread; WaitForSignals takes them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  sigaddset(&signals, SIGUSR1);  // a takeover request (TakeoverListener)
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  SystemClock clock;
  RaiseOpenFileLimit(config.max_connections);
  Status directories = CheckStateDirectories(config, ::geteuid());
  if (!directories.ok()) return {StartFailure(config, directories.ToString())};
  // Destroyed after the engines: closing the NVMe tier closes its RocksDB index.
  auto stack = OpenTierStack(config, clock);
  if (!stack.ok()) return {StartFailure(config, stack.status().ToString())};
  const SystemdNotifier notifier = SystemdNotifier::FromEnvironment();
  const int listener = TakePassed(passed, kListenerName);
  std::function<void(const std::string&)> release;  // a kept pair this daemon will not adopt
  if (asked != nullptr) {
    release = [asked](const std::string& name) {
      if (Status s = asked->Release(name); !s.ok()) spdlog::warn("takeover: release of {}: {}", name, s.ToString());
    };
  }
  HostKeeper keeper(notifier, std::move(passed), config.host_keep_across_restarts, std::move(release));
  auto engines = DaemonEngines::Open(config, *stack, clock, &keeper);
  if (!engines.ok()) return {StartFailure(config, engines.status().ToString())};
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
  server_options.listen_fd = listener;
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
  if (!peers.ok()) return {StartFailure(config, peers.status().ToString())};
  if (*peers != nullptr) {
    server_options.visit_daemon_counters = [&service = **peers](CounterVisitor& v) {
      service.server->VisitCounters(v);
    };
  }
  auto server = Server::Start(server_options, (*engines)->Served(config), TenantTable(config.tenants, ::geteuid()));
  if (!server.ok()) return {StartFailure(config, server.status().ToString())};
  if (Status events = (*engines)->StartEvents(config); !events.ok()) return {StartFailure(config, events.ToString())};
  // Declared after the server and the engines: it stops serving before they go.
  std::unique_ptr<MetricsServer> metrics;
  if (config.metrics_enabled) {
    auto metrics_options = MetricsOptionsOf(config, (*engines)->has_tenants());
    if (!metrics_options.ok()) return {StartFailure(config, metrics_options.status().ToString())};
    auto started = MetricsServer::Start(*metrics_options, [&server = **server, &engines = **engines](MetricsView view) {
      PrometheusWriter writer;
      DaemonWideVisitor daemon_wide(writer);
      CounterVisitor& out = view == MetricsView::kAll ? static_cast<CounterVisitor&>(writer) : daemon_wide;
      out.VisitGauge("build_info{version=\"" KVTIER_VERSION "\"}", 1);
      server.VisitCounters(out);
      engines.VisitCounters(out);
      return writer.Text();
    });
    if (!started.ok()) return {StartFailure(config, started.status().ToString())};
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

  StoreListener(notifier, **server);
  // A listener passed back after a failed takeover is this daemon's alone.
  if (!notifier.enabled() && asked == nullptr) (*server)->KeepSocketFile(false);
  // Under a service manager a takeover would leave the new daemon outside
  // it: the manager's restart keeps the host tier and the socket instead.
  auto takeovers = TakeoverListener::Start(
      config.socket_path,
      notifier.enabled() ? "kvtierd runs under a service manager ($NOTIFY_SOCKET): restart it there "
                           "(systemctl restart kvtierd keeps the host tier and the socket)"
                         : "",
      [] { ::kill(::getpid(), SIGUSR1); });
  if (!takeovers.ok()) spdlog::warn("takeovers are off: {}", takeovers.status().ToString());
  if (asked != nullptr) {
    Status told = asked->Serving();
    if (told.ok()) {
      spdlog::info("takeover: serving; the previous kvtierd exits");
      (*server)->KeepSocketFile(notifier.enabled());  // the socket is this daemon's for good
    } else {
      spdlog::warn("takeover: could not tell the previous kvtierd that this one serves: {}", told.ToString());
    }
  }

  ServeEnd end = WaitForStopOrTakeover(signals, command_line, config, *running_config, **server, **engines,
                                       takeovers.ok() ? takeovers->get() : nullptr);
  if (takeovers.ok()) (*takeovers)->Close();  // its path is the next daemon's
  (*server)->Shutdown();
  (*server)->Wait();
  if (end.takeover >= 0) {
    // Once nothing calls the engines (in the order a return would take),
    // they stop without freeing their index: the tiers then close at
    // once, the NVMe index's lock among them, and the hand-over follows.
    metrics.reset();
    (*server).reset();
    (*peers).reset();
    end.retired = (*engines)->Retire();
  }
  return end;  // then the server, the engine and the tiers close, in that order
}

// The old daemon's part of a takeover, once it stopped: hands `end`'s fds
// over and waits for the new daemon to serve. Unless it serves, what of
// end.handed it did not release is still the caller's.
TakeoverOutcome HandOverTo(ServeEnd& end) {
  Status handed = HandOver(end.takeover, end.handed);
  if (!handed.ok()) {
    spdlog::error("takeover: handing over failed: {}", handed.ToString());
    ::shutdown(end.takeover, SHUT_WR);  // the new daemon sees the end and gives up
  }
  // A released arena's pages go only once no process maps it: this one's
  // retired host tier lets go of it too.
  const TakeoverOutcome outcome =
      AwaitServing(end.takeover, end.handed, kServingTimeout, [&end](const std::string& name) {
        if (end.retired != nullptr) end.retired->Release(name);
      });
  ::close(end.takeover);
  return outcome;
}

}  // namespace

int main(int argc, char** argv) {
  // What systemd's file descriptor store (or kvtier supervise) passed: a
  // kept host arena and its journal (host_keep.h), the listening socket.
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
  bool takeover = false;
  app.add_flag("--takeover", takeover,
               "Take the socket and the host tier over from the kvtierd running at the socket, which exits once "
               "this one serves");
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
  std::string why;
  std::vector<std::string> chosen;
  std::unique_ptr<kvtier::TakeoverRequest> asked;
  if (takeover) {
    if (!passed.empty() || kvtier::SystemdNotifier::FromEnvironment().enabled()) {
      return StartFailure(*config,
                          "--takeover is for a kvtierd without a service manager; under one, restart the service "
                          "(it keeps the host tier and the socket)",
                          2);
    }
    // Everything that can fail this start without the predecessor's fds
    // fails it before the predecessor drains.
    kvtier::DaemonConfig trial = *config;
    CommandLine trial_line = command_line;
    if (int code = ResolveConfig(trial_line, cgroup, {}, trial, &why, &chosen); code != 0) {
      return StartFailure(trial, why, code);
    }
    if (Status directories = kvtier::CheckStateDirectories(trial, ::geteuid()); !directories.ok()) {
      return StartFailure(trial, directories.ToString());
    }
    auto request = kvtier::TakeoverRequest::Ask(
        trial.socket_path, kvtier::kHandOverTimeout + std::chrono::milliseconds(trial.drain_timeout_ms));
    if (!request.ok()) return StartFailure(trial, request.status().ToString());
    for (kvtier::PassedFd& fd : request->TakeFds()) passed.push_back(std::move(fd));
    asked = std::make_unique<kvtier::TakeoverRequest>(std::move(*request));
  }
  if (int code = ResolveConfig(command_line, cgroup, passed, *config, &why, &chosen); code != 0) {
    return StartFailure(*config, why, code);
  }
  ApplyLogOptions(*config);
  if (cgroup) {
    spdlog::info("memory limit {} bytes ({}); the configuration holds {} bytes of it", cgroup->limit_bytes,
                 cgroup->limit_file, kvtier::ConfiguredMemoryBytes(*config));
  }
  for (const std::string& line : chosen) spdlog::info("{}", line);
  for (;;) {
    ServeEnd end = Serve(command_line, *config, std::move(passed), asked.get());
    asked.reset();  // a start that failed before it served: the previous kvtierd resumes
    if (end.takeover < 0) {
      if (end.exit_code == 0) spdlog::info("kvtierd stopped");
      return end.exit_code;
    }
    const kvtier::TakeoverOutcome outcome = HandOverTo(end);
    if (outcome != kvtier::TakeoverOutcome::kFailed) {
      for (const kvtier::PassedFd& fd : end.handed) ::close(fd.fd);
      if (outcome == kvtier::TakeoverOutcome::kUnknown) return 1;
      spdlog::info("takeover: the new kvtierd serves; exiting");
      return 0;
    }
    spdlog::warn("takeover failed; serving again on the socket and the host tier it was to hand over");
    if (end.retired != nullptr) end.retired->Free();
    passed = std::move(end.handed);
  }
}
