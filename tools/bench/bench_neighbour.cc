#include "tools/bench/bench_neighbour.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <optional>
#include <thread>
#include <vector>

#include "kvtier/client.h"
#include "support/process.h"
#include "support/servers.h"
#include "support/temp_dir.h"

namespace kvtier::tools {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kVictimKeys = 64;

NamespaceDescriptor NeighbourNamespace() {
  NamespaceDescriptor ns;
  ns.model_id = "kvtier-bench/neighbour";
  ns.model_revision = "run-" + std::to_string(::getpid());
  ns.kv_dtype = "bf16";
  ns.block_tokens = 16;
  ns.layer_count = 4;
  ns.kv_layout = "layer_major_kv";
  ns.bytes_per_token_per_layer = 64;  // 4 KiB blocks
  return ns;
}

Result<std::unique_ptr<Client>> Connect(const std::string& socket) {
  ClientOptions options;
  options.socket_path = socket;
  options.client_name = "kvtier-bench-neighbour";
  options.namespaces = {NeighbourNamespace()};
  options.use_directory = false;  // every lookup goes to the daemon
  return Client::Connect(options);
}

std::vector<BlockKey> ChainKeys(size_t blocks, uint32_t first_token) {
  std::vector<uint32_t> tokens(blocks * 16);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = first_token + static_cast<uint32_t>(i);
  return ChainHasher::Create(NeighbourNamespace()).value().Keys(tokens);
}

struct Latencies {
  double p50_us = 0, p99_us = 0, max_us = 0;
  size_t count = 0;
};

Latencies Summarize(std::vector<double>& us) {
  Latencies l;
  l.count = us.size();
  if (us.empty()) return l;
  std::sort(us.begin(), us.end());
  l.p50_us = us[us.size() / 2];
  l.p99_us = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  l.max_us = us.back();
  return l;
}

// The victims' lookups for `seconds`, taking turns; per victim. Internal
// if one misses part of the chain.
Result<std::vector<Latencies>> Victims(std::vector<std::unique_ptr<Client>>& clients, const std::vector<BlockKey>& keys,
                                       double seconds) {
  std::vector<std::vector<double>> us(clients.size());
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  for (size_t turn = 0; Clock::now() < end; ++turn) {
    const size_t v = turn % clients.size();
    const auto start = Clock::now();
    auto hit = clients[v]->Lookup(0, keys);
    us[v].push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    if (!hit.ok()) return hit.status();
    if (hit->prefix_blocks != keys.size()) return Internal("a victim's chain is not all cached");
  }
  std::vector<Latencies> out;
  for (auto& samples : us) out.push_back(Summarize(samples));
  return out;
}

void PrintRows(const char* phase, const std::vector<Latencies>& rows, const std::string& hog_rate) {
  for (size_t v = 0; v < rows.size(); ++v) {
    std::printf("| %s | %zu | %zu | %.1f | %.1f | %.1f | %s |\n", phase, v, rows[v].count, rows[v].p50_us,
                rows[v].p99_us, rows[v].max_us, hog_rate.c_str());
  }
}

Status Measure(const NeighbourBenchOptions& o, const std::string& socket) {
  auto setup = Connect(socket);
  if (!setup.ok()) return setup.status();
  const std::vector<BlockKey> huge = ChainKeys(o.huge_keys, 0);
  const std::vector<BlockKey> small = ChainKeys(kVictimKeys, 1u << 30);
  const std::vector<std::byte> block(NeighbourNamespace().BlockBytes(), std::byte{0x5a});
  std::fprintf(stderr, "kvtier bench neighbour: putting %zu + %zu blocks...\n", huge.size(), small.size());
  for (const auto* keys : {&huge, &small}) {
    for (const BlockKey& key : *keys) {
      if (Status s = (*setup)->Put(0, key, block); !s.ok()) return s;
    }
  }
  auto whole = (*setup)->Lookup(0, huge);
  if (!whole.ok()) return whole.status();
  if (whole->prefix_blocks != huge.size()) {
    return Internal("only " + std::to_string(whole->prefix_blocks) +
                    " of the huge chain stayed cached; use a "
                    "larger arena or fewer --huge-keys");
  }
  // Consecutive connections: the daemon spreads them round robin over its
  // io threads, so with `victims` >= io threads one shares each hog's.
  std::vector<std::unique_ptr<Client>> victims;
  for (int i = 0; i < o.victims; ++i) {
    auto victim = Connect(socket);
    if (!victim.ok()) return victim.status();
    victims.push_back(std::move(*victim));
  }
  auto alone = Victims(victims, small, o.seconds);
  if (!alone.ok()) return alone.status();

  std::vector<std::unique_ptr<Client>> hogs;
  for (int i = 0; i < o.hogs; ++i) {
    auto hog = Connect(socket);
    if (!hog.ok()) return hog.status();
    hogs.push_back(std::move(*hog));
  }
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> hog_lookups{0};
  std::vector<Status> hog_status(hogs.size(), Status::Ok());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < hogs.size(); ++i) {
    threads.emplace_back([&, i] {
      while (!stop.load()) {
        auto hit = hogs[i]->Lookup(0, huge);
        if (!hit.ok()) {
          hog_status[i] = hit.status();
          return;
        }
        hog_lookups.fetch_add(1);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the hogs are sending
  const auto hogged_start = Clock::now();
  auto hogged = Victims(victims, small, o.seconds);
  const double hogged_s = std::chrono::duration<double>(Clock::now() - hogged_start).count();
  const uint64_t hog_count = hog_lookups.load();
  stop = true;
  for (auto& t : threads) t.join();
  if (!hogged.ok()) return hogged.status();
  for (const Status& s : hog_status) {
    if (!s.ok()) return s;
  }
  std::printf(
      "kvtier bench neighbour: %d victim connection(s) taking turns at a Lookup of %zu cached keys; %d hog "
      "connection(s) each looking up %zu cached keys in one request\n",
      o.victims, kVictimKeys, o.hogs, huge.size());
  std::printf(
      "| phase | victim | lookups | p50 us | p99 us | max us | hog lookups/s |\n"
      "|---|---|---|---|---|---|---|\n");
  PrintRows("alone", *alone, "-");
  char rate[32];
  std::snprintf(rate, sizeof rate, "%.1f", static_cast<double>(hog_count) / hogged_s);
  PrintRows("beside the hogs", *hogged, rate);
  return Status::Ok();
}

}  // namespace

void AddNeighbourBenchOptions(CLI::App& app, NeighbourBenchOptions& o) {
  app.add_option("--socket", o.socket_path, "Use the kvtierd listening here instead of starting one");
  app.add_option("--kvtierd", o.kvtierd_path,
                 "kvtierd binary to start (default: the kvtierd of this build or install)");
  app.add_option("--huge-keys", o.huge_keys, "Keys per hog Lookup (all cached; one request each)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--hogs", o.hogs, "Hog connections")->check(CLI::Range(0, 64))->capture_default_str();
  app.add_option("--victims", o.victims, "Victim connections (consecutive: one per io thread at least)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--seconds", o.seconds, "Seconds per phase")->check(CLI::PositiveNumber)->capture_default_str();
}

int RunNeighbourBench(const NeighbourBenchOptions& o) {
  auto dir = support::MakeTempDir("kvtier-bench-");
  if (!dir.ok()) {
    std::fprintf(stderr, "kvtier bench neighbour: %s\n", dir.status().ToString().c_str());
    return 1;
  }
  std::optional<support::StartedServer> daemon;
  std::string socket = o.socket_path;
  if (socket.empty()) {
    const std::string path = o.kvtierd_path.empty() ? support::DefaultKvtierdPath() : o.kvtierd_path;
    const uint64_t arena = std::max<uint64_t>(256ull << 20, (o.huge_keys + 1024) * 4096 * 2);
    auto started = support::StartKvtierd(path, *dir, arena);
    if (!started.ok()) {
      std::fprintf(stderr, "kvtier bench neighbour: cannot start kvtierd: %s\n", started.status().ToString().c_str());
      support::RemoveTree(*dir);
      return 1;
    }
    daemon = std::move(*started);
    socket = daemon->socket_path;
  }
  Status s = Measure(o, socket);
  if (daemon) daemon->process.Stop();
  if (!s.ok()) {
    std::fprintf(stderr, "kvtier bench neighbour: %s\n", s.ToString().c_str());
    if (daemon) std::fprintf(stderr, "kvtierd log:\n%s\n", support::FileTail(daemon->log_path).c_str());
  }
  support::RemoveTree(*dir);
  return s.ok() ? 0 : 1;
}

}  // namespace kvtier::tools
