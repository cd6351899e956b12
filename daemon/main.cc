// kvtierd: the node-local KV-cache daemon.
//   kvtierd [--config FILE] [--socket PATH] [--print-default-config]
// SIGTERM / SIGINT drain in-flight requests and exit 0.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <bit>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <pthread.h>

#include "common/logging.h"
#include "daemon/config.h"
#include "daemon/engine.h"
#include "daemon/hbm_setup.h"
#include "daemon/tier_stack.h"
#include "daemon/server.h"

namespace {

using namespace kvtier;

HostArenaOptions::LockMode ParseLockMode(const std::string& mode) {
  if (mode == "required") return HostArenaOptions::LockMode::kRequired;
  if (mode == "off") return HostArenaOptions::LockMode::kOff;
  return HostArenaOptions::LockMode::kBestEffort;
}

// Slots of the host tier's block directory; 0 when it is off.
uint32_t DirectorySlots(const DaemonConfig& config) {
  if (config.host_directory == 0) return 0;
  if (config.host_directory_slots == 0) return HostDirectory::DefaultSlots(static_cast<uint64_t>(config.host_capacity_bytes));
  return std::bit_ceil(static_cast<uint32_t>(std::max<int64_t>(config.host_directory_slots, 2)));
}

int Serve(const DaemonConfig& config) {
  // Block the stop signals in every thread; main waits for them below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  HostArenaOptions arena;
  arena.capacity_bytes = static_cast<uint64_t>(config.host_capacity_bytes);
  arena.lock = ParseLockMode(config.host_lock_memory);
  auto host = HostTier::Open(arena, DirectorySlots(config));
  if (!host.ok()) {
    spdlog::critical("host tier: {}", host.status().ToString());
    return 1;
  }
  SystemClock clock;
  auto stack = OpenTierStack(config, clock);
  if (!stack.ok()) {
    spdlog::critical("{}", stack.status().ToString());
    return 1;
  }
  auto hbm = OpenHbmTier(config);
  if (!hbm.ok()) {
    spdlog::critical("{}", hbm.status().ToString());
    return 1;
  }
  if (!hbm->why_not.empty()) spdlog::warn("{}", hbm->why_not);
  EngineOptions engine_options{static_cast<uint32_t>(config.engine_shards), config.engine_eviction};
  engine_options.lookahead_us = static_cast<uint64_t>(config.engine_lookahead_ms) * 1000;
  engine_options.prefetch_share = static_cast<double>(config.engine_prefetch_percent) / 100.0;
  engine_options.demotion_buffer_bytes = static_cast<uint64_t>(config.engine_demotion_buffer_bytes);
  engine_options.prefetch_min_blocks = static_cast<uint32_t>(config.engine_prefetch_min_blocks);
  engine_options.verify_commits = config.host_verify_commits != 0;
  auto engine = Engine::Create(engine_options, **host, clock, stack->lower, hbm->tier.get());
  if (!engine.ok()) {
    spdlog::critical("engine: {}", engine.status().ToString());
    return 1;
  }
  ServerOptions server_options{config.socket_path, static_cast<uint32_t>(config.io_threads),
                               static_cast<uint32_t>(config.max_frame_bytes),
                               static_cast<uint32_t>(config.drain_timeout_ms),
                               static_cast<uint32_t>(config.spin_wait_us), hbm->offer};
  auto server = Server::Start(server_options, **engine, **host);
  if (!server.ok()) {
    spdlog::critical("server: {}", server.status().ToString());
    return 1;
  }
  spdlog::info("kvtierd {} listening on {}", KVTIER_VERSION, (*server)->socket_path());
  spdlog::info("tier host: {} bytes shared-memory arena ({}), eviction {}, block directory {}",
               config.host_capacity_bytes, (*host)->locked() ? "locked in memory" : "NOT locked",
               config.engine_eviction,
               (*host)->directory() != nullptr
                   ? std::to_string((*host)->directory()->bytes()) + " bytes"
                   : std::string("off"));
  if (hbm->tier != nullptr) spdlog::info("tier hbm: {}", hbm->description);
  std::string tiers = hbm->tier != nullptr ? "hbm host" : "host";
  for (const auto& tier : stack->tiers) tiers += " " + std::string(tier->name());
  std::printf("socket: %s\ntiers: %s\n", (*server)->socket_path().c_str(), tiers.c_str());
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  spdlog::info("received {}, draining", signal_number == SIGTERM ? "SIGTERM" : "SIGINT");
  (*server)->Shutdown();
  (*server)->Wait();
  spdlog::info("kvtierd stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvtierd: hierarchical KV-cache daemon for LLM inference"};
  app.footer(kvtier::OptionsHelp());
  std::string config_path;
  std::string socket_override;
  bool print_default = false;
  app.add_option("--config", config_path, "TOML configuration file (defaults are embedded)");
  app.add_option("--socket", socket_override, "Override server.socket_path");
  app.add_flag("--print-default-config", print_default, "Print the embedded default config and exit");
  CLI11_PARSE(app, argc, argv);

  if (print_default) {
    std::cout << kvtier::DefaultConfigToml();
    return 0;
  }
  auto config = config_path.empty() ? kvtier::ParseConfig("", "<embedded defaults>")
                                    : kvtier::LoadConfigFile(config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "kvtierd: %s\n", config.status().ToString().c_str());
    return 2;
  }
  if (!socket_override.empty()) config->socket_path = socket_override;
  kvtier::SetLogLevel(config->log_level);
  return Serve(*config);
}
