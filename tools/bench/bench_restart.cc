#include "tools/bench/bench_restart.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "common/checksum.h"
#include "kvtier/client.h"
#include "support/fd_store.h"
#include "support/process.h"
#include "support/servers.h"
#include "support/temp_dir.h"

namespace kvtier::tools {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

constexpr size_t kPutBatch = 64;
constexpr int kLookups = 20'000;
constexpr uint32_t kFillThreads = 2;
constexpr uint64_t kNvmeRowArenaBytes = uint64_t{16} << 20;
constexpr uint64_t kNvmeFillChunk = 2048;  // half the NVMe row's host tier

NamespaceDescriptor BenchNamespace(uint64_t block_bytes) {
  NamespaceDescriptor ns;
  ns.model_id = "kvtier-bench/restart";
  ns.model_revision = "r1";
  ns.kv_dtype = "bf16";
  ns.block_tokens = 16;
  ns.layer_count = 1;
  ns.kv_layout = "layer_major_kv";
  ns.bytes_per_token_per_layer = block_bytes / 16;
  return ns;
}

BlockKey KeyOf(uint64_t i) { return BlockKey{0x7e57a27, i * 0x9e3779b97f4a7c15ULL + 1}; }

// /proc/<pid>/status's RssAnon in bytes; -1 if unreadable.
int64_t RssAnon(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("RssAnon:", 0) == 0) return std::stoll(line.substr(8)) * 1024;
  }
  return -1;
}

Result<std::unique_ptr<Client>> Connect(const std::string& socket_path, uint64_t block_bytes) {
  ClientOptions o;
  o.socket_path = socket_path;
  o.client_name = "kvtier-bench-restart";
  o.namespaces = {BenchNamespace(block_bytes)};
  o.use_directory = false;  // every lookup a round trip to the daemon
  o.prefault_arena = false;
  o.reconnect = false;
  return Client::Connect(o);
}

std::map<std::string, int64_t> Counters(Client& client) {
  std::map<std::string, int64_t> out;
  auto stats = client.Stats();
  if (stats.ok()) {
    for (const Counter& c : *stats) out[c.name] = c.value;
  }
  return out;
}

// Blocks [from, n) put from kFillThreads clients; false on the first failure.
bool Fill(const std::string& socket_path, uint64_t from, uint64_t n, uint64_t block_bytes) {
  std::vector<std::thread> threads;
  std::atomic<bool> ok{true};
  for (uint32_t t = 0; t < kFillThreads; ++t) {
    threads.emplace_back([&, t] {
      auto client = Connect(socket_path, block_bytes);
      if (!client.ok()) {
        ok = false;
        return;
      }
      std::vector<std::byte> bytes(block_bytes * kPutBatch);
      std::mt19937_64 rng(t + 1);
      for (auto& b : bytes) b = static_cast<std::byte>(rng());
      std::vector<std::span<const std::byte>> data;
      for (size_t j = 0; j < kPutBatch; ++j) data.push_back({bytes.data() + j * block_bytes, block_bytes});
      std::vector<BlockKey> keys;
      for (uint64_t first = from + t * kPutBatch; first < n && ok; first += kFillThreads * kPutBatch) {
        keys.clear();
        for (uint64_t i = first; i < std::min(n, first + kPutBatch); ++i) keys.push_back(KeyOf(i));
        for (const Status& s : (*client)->PutBatch(0, keys, std::span(data).first(keys.size()))) {
          if (!s.ok()) {
            std::fprintf(stderr, "kvtier bench restart: put: %s\n", s.ToString().c_str());
            ok = false;
            break;
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  return ok;
}

// Until every kept block is visible: the blocks put last (adopted last)
// are looked up, cheaply, and only then Stats is asked (its engine gauges
// walk every block under the shard locks: polled often, it would slow the
// adoption it measures). False when `limit_s` passed.
bool WaitVisible(Client& client, uint64_t n, Clock::time_point t0, double limit_s) {
  while (Since(t0) < limit_s) {
    bool last_there = true;
    for (uint64_t j = 0; j < std::min<uint64_t>(n, 64) && last_there; ++j) {
      const BlockKey key = KeyOf(n - 1 - j);
      auto found = client.Lookup(0, {&key, 1});
      last_there = found.ok() && found->prefix_blocks == 1;
    }
    if (last_there && Counters(client)["host.adopt.pending"] == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(last_there ? 100 : 10));
  }
  return false;
}

// Mean microseconds of a one-key Lookup of a random key among the first `n`.
double LookupUs(Client& client, uint64_t n) {
  std::mt19937_64 rng(7);
  const auto t0 = Clock::now();
  for (int i = 0; i < kLookups; ++i) {
    const BlockKey key = KeyOf(n == 0 ? i : rng() % n);
    static_cast<void>(client.Lookup(0, {&key, 1}));
  }
  return Since(t0) * 1e6 / kLookups;
}

struct Row {
  std::string tier;
  uint64_t blocks = 0;
  double fill_s = 0, empty_serve_s = 0, serve_s = 0, visible_s = 0, hash_s = 0;
  double empty_lookup_us = 0, lookup_us = 0;
  int64_t found = 0;  // adopted (host) or loaded (nvme)
  double anon_bytes_per_block = 0;
  double longest_wait_s = -1;  // takeover rows: a client's longest wait for an answer
  int64_t unavailable = 0;     // takeover rows: that client's calls answered Unavailable
  bool ok = false;
};

// Removes a row's directory (the daemons' files) however the row ends.
struct RemoveOnExit {
  std::string dir;
  ~RemoveOnExit() { support::RemoveTree(dir); }
};

// A fresh directory under `base`; empty (after a message) when it cannot be made.
std::string MakeDir(const std::string& base) {
  std::string path = base + "/kvtier-bench-restart-XXXXXX";
  if (::mkdtemp(path.data()) == nullptr) {
    std::fprintf(stderr, "kvtier bench restart: cannot make a directory under %s: %s\n", base.c_str(),
                 std::strerror(errno));
    return "";
  }
  return path;
}

// Starts a daemon in `dir` (under `store` when given), waits for it; the
// seconds it took, or a negative value.
double Start(const std::string& kvtierd, const std::string& dir, uint64_t arena, const std::string& toml,
             support::FdStore* store, std::unique_ptr<support::StartedServer>& out) {
  const auto t0 = Clock::now();
  auto started = support::StartKvtierd(kvtierd, dir, arena, std::chrono::seconds(300), toml, store);
  if (!started.ok()) {
    std::fprintf(stderr, "kvtier bench restart: cannot start kvtierd: %s\n", started.status().ToString().c_str());
    return -1;
  }
  out = std::make_unique<support::StartedServer>(std::move(*started));
  return Since(t0);
}

// Hashing `n` blocks of `block_bytes` in this process, one thread: what
// the adoption does for them.
double HashSeconds(uint64_t n, uint64_t block_bytes) {
  std::vector<std::byte> bytes(std::min<uint64_t>(n * block_bytes, uint64_t{256} << 20));
  std::mt19937_64 rng(3);
  for (auto& b : bytes) b = static_cast<std::byte>(rng());
  const auto t0 = Clock::now();
  uint64_t sink = 0;
  for (uint64_t done = 0; done < n;) {
    for (uint64_t off = 0; off + block_bytes <= bytes.size() && done < n; off += block_bytes, ++done) {
      sink ^= BlockChecksum({bytes.data() + off, block_bytes});
    }
  }
  const double s = Since(t0);
  if (sink == 42) std::printf(" ");
  return s;
}

Row HostRow(const std::string& kvtierd, const std::string& base, uint64_t n, uint64_t block_bytes) {
  Row row{"host", n};
  const std::string dir = MakeDir(base);
  if (dir.empty()) return row;
  const RemoveOnExit cleanup{dir};
  // Room for N blocks, and slack for the allocator's size classes.
  const uint64_t arena = ((n * block_bytes) / 100 * 105 + (uint64_t{64} << 20)) >> 20 << 20;
  const std::string toml = "[events]\nenabled = false\n";
  auto store = support::FdStore::Open(dir + "/notify.sock");
  std::unique_ptr<support::StartedServer> server;
  if (!store.ok() || (row.empty_serve_s = Start(kvtierd, dir, arena, toml, store->get(), server)) < 0) return row;
  const int64_t empty_anon = RssAnon(server->process.pid());
  {
    auto client = Connect(server->socket_path, block_bytes);
    if (!client.ok()) return row;
    row.empty_lookup_us = LookupUs(**client, 0);
  }
  const auto fill = Clock::now();
  if (!Fill(server->socket_path, 0, n, block_bytes)) return row;
  row.fill_s = Since(fill);
  row.anon_bytes_per_block = static_cast<double>(RssAnon(server->process.pid()) - empty_anon) / static_cast<double>(n);
  server->process.Kill();
  const auto restart = Clock::now();
  if ((row.serve_s = Start(kvtierd, dir, arena, toml, store->get(), server)) < 0) return row;
  auto client = Connect(server->socket_path, block_bytes);
  if (!client.ok()) return row;
  if (!WaitVisible(**client, n, restart, 1200)) return row;
  row.visible_s = Since(restart);
  const auto counters = Counters(**client);
  row.found = counters.count("host.adopt.blocks") ? counters.at("host.adopt.blocks") : -1;
  row.lookup_us = LookupUs(**client, n);
  row.hash_s = HashSeconds(n, block_bytes);
  client->reset();
  server->process.Stop();
  server.reset();
  store->reset();
  row.ok = row.found == static_cast<int64_t>(n);
  return row;
}

Row NvmeRow(const std::string& kvtierd, const std::string& base, uint64_t n, uint64_t block_bytes) {
  Row row{"nvme", n};
  const std::string dir = MakeDir(base);
  if (dir.empty()) return row;
  const RemoveOnExit cleanup{dir};
  const uint64_t arena = kNvmeRowArenaBytes;  // small: nearly every block goes below
  // A record is a 4 KiB header and the payload (tiers/nvme/block_record.h),
  // and regions need slack: room for N records with none reclaimed.
  const uint64_t nvme = ((n * (block_bytes + 4096)) / 100 * 125 + (uint64_t{512} << 20)) >> 20 << 20;
  const std::string toml = "[events]\nenabled = false\n[nvme]\npath = \"" + dir +
                           "/nvme.dat\"\ncapacity_bytes = " + std::to_string(nvme) + "\nadmission = \"all\"\n";
  std::unique_ptr<support::StartedServer> server;
  if ((row.empty_serve_s = Start(kvtierd, dir, arena, toml, nullptr, server)) < 0) return row;
  const int64_t empty_anon = RssAnon(server->process.pid());
  {
    auto client = Connect(server->socket_path, block_bytes);
    if (!client.ok()) return row;
    row.empty_lookup_us = LookupUs(**client, 0);
  }
  // In chunks, each until the demotions it caused are written: a fill
  // faster than the NVMe tier writes would see blocks dropped
  // (engine.demotion_busy_drops) rather than stored. With a 16 MiB host
  // tier, the engine gauges Stats walks stay small.
  const auto fill = Clock::now();
  auto client = Connect(server->socket_path, block_bytes);
  if (!client.ok()) return row;
  for (uint64_t first = 0; first < n; first += kNvmeFillChunk) {
    if (!Fill(server->socket_path, first, std::min(n, first + kNvmeFillChunk), block_bytes)) return row;
    for (int waited = 0; waited < 6000; ++waited) {
      auto c = Counters(**client);
      if (c["engine.demoting_blocks"] == 0 && c["engine.demoter.jobs_queued"] == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  client->reset();
  row.fill_s = Since(fill);
  server->process.Stop();  // a clean stop and a start: N records loaded, measured against the empty daemon
  if (Start(kvtierd, dir, arena, toml, nullptr, server) < 0) return row;
  row.anon_bytes_per_block = static_cast<double>(RssAnon(server->process.pid()) - empty_anon) / static_cast<double>(n);
  server->process.Kill();
  if ((row.serve_s = Start(kvtierd, dir, arena, toml, nullptr, server)) < 0) return row;
  client = Connect(server->socket_path, block_bytes);
  if (!client.ok()) return row;
  row.visible_s = row.serve_s;  // the index is open before the socket
  row.found = Counters(**client)["nvme.recovery_loaded"];
  row.lookup_us = LookupUs(**client, n);
  client->reset();
  server->process.Stop();
  server.reset();
  // Blocks the host tier could not hold went to NVMe (a busy demotion may
  // drop some: engine.demotion_busy_drops) and came back.
  const int64_t below = static_cast<int64_t>(n) - static_cast<int64_t>(arena / block_bytes);
  row.ok = below <= 0 || row.found > 0;
  return row;
}

// A client asking for one block over and over (reconnecting by itself)
// while the daemon changes under it: the longest it waited between two
// answers, and how many calls failed Unavailable (retried).
class Prober {
 public:
  Prober(const std::string& socket_path, uint64_t block_bytes) {
    ClientOptions o;
    o.socket_path = socket_path;
    o.client_name = "kvtier-bench-restart-prober";
    o.namespaces = {BenchNamespace(block_bytes)};
    o.use_directory = false;
    o.prefault_arena = false;
    o.reconnect_min_backoff = std::chrono::milliseconds(1);
    o.reconnect_max_backoff = std::chrono::milliseconds(20);
    auto client = Client::Connect(o);
    if (!client.ok()) return;
    client_ = std::move(*client);
    thread_ = std::thread([this] {
      const BlockKey key = KeyOf(0);
      auto last = Clock::now();
      while (!stop_) {
        auto found = client_->Lookup(0, {&key, 1});
        const auto now = Clock::now();
        if (found.ok()) {
          longest_ = std::max(longest_, std::chrono::duration<double>(now - last).count());
          last = now;
        } else if (found.status().code() == StatusCode::kUnavailable) {
          ++unavailable_;
        }
      }
    });
  }
  bool running() const { return client_ != nullptr; }
  // Stops it; the longest wait in seconds.
  double Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return longest_;
  }
  int64_t unavailable() const { return unavailable_; }

 private:
  std::unique_ptr<Client> client_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  double longest_ = 0;       // the thread's until Stop
  int64_t unavailable_ = 0;  // the thread's until Stop
};

// `kvtierd --takeover` of a daemon holding N host blocks: until the old one
// exits (the new one serves then), until every block is visible again, and
// the longest a client asking all along waited.
Row TakeoverRow(const std::string& kvtierd, const std::string& base, uint64_t n, uint64_t block_bytes) {
  Row row{"takeover", n};
  const std::string dir = MakeDir(base);
  if (dir.empty()) return row;
  const RemoveOnExit cleanup{dir};
  const uint64_t arena = ((n * block_bytes) / 100 * 105 + (uint64_t{64} << 20)) >> 20 << 20;
  const std::string toml = "[events]\nenabled = false\n";
  std::unique_ptr<support::StartedServer> server;
  if ((row.empty_serve_s = Start(kvtierd, dir, arena, toml, nullptr, server)) < 0) return row;
  {
    auto client = Connect(server->socket_path, block_bytes);
    if (!client.ok()) return row;
    row.empty_lookup_us = LookupUs(**client, 0);
  }
  const auto fill = Clock::now();
  if (!Fill(server->socket_path, 0, n, block_bytes)) return row;
  row.fill_s = Since(fill);
  Prober prober(server->socket_path, block_bytes);
  if (!prober.running()) return row;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto takeover = Clock::now();
  auto successor =
      support::ChildProcess::Spawn({kvtierd, "--config", dir + "/kvtierd.toml", "--takeover"}, dir + "/successor.log");
  if (!successor.ok()) {
    std::fprintf(stderr, "kvtier bench restart: cannot start kvtierd --takeover: %s\n",
                 successor.status().ToString().c_str());
    prober.Stop();
    return row;
  }
  std::string how;
  while (!server->process.Exited(&how) && Since(takeover) < 600)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  row.serve_s = Since(takeover);
  if (how != "exit status 0") {
    std::fprintf(stderr, "kvtier bench restart: the old kvtierd ended with %s:\n%s\n", how.c_str(),
                 support::FileTail(dir + "/successor.log").c_str());
    prober.Stop();
    return row;
  }
  auto client = Connect(server->socket_path, block_bytes);
  if (!client.ok() || !WaitVisible(**client, n, takeover, 1200)) {
    prober.Stop();
    return row;
  }
  row.visible_s = Since(takeover);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  row.longest_wait_s = prober.Stop();
  row.unavailable = prober.unavailable();
  const auto counters = Counters(**client);
  row.found = counters.count("host.adopt.blocks") ? counters.at("host.adopt.blocks") : -1;
  row.lookup_us = LookupUs(**client, n);
  row.ok = row.found == static_cast<int64_t>(n);
  return row;
}

}  // namespace

void AddRestartBenchOptions(CLI::App& app, RestartBenchOptions& o) {
  app.add_option("--kvtierd", o.kvtierd_path,
                 "kvtierd binary to start (default: the kvtierd of this build or install)");
  app.add_option("--blocks", o.blocks, "Block counts, one pair of daemons each (e.g. 100000,1000000)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--block-bytes", o.block_bytes, "Bytes per block")->capture_default_str();
  app.add_flag("--nvme", o.nvme, "Also the NVMe rows: N records in the NVMe tier's index");
  app.add_flag("--takeover", o.takeover, "Also the takeover rows: kvtierd --takeover of a daemon with N host blocks");
  app.add_option("--dir", o.dir, "Where the daemons' files go (default: $TMPDIR or /tmp)");
  app.add_option("--json", o.json_path, "Also write the figures as JSON here");
}

int RunRestartBench(const RestartBenchOptions& o) {
  const std::string kvtierd = o.kvtierd_path.empty() ? support::DefaultKvtierdPath() : o.kvtierd_path;
  const char* tmp = std::getenv("TMPDIR");
  const std::string base = !o.dir.empty() ? o.dir : (tmp != nullptr && *tmp != '\0' ? tmp : "/tmp");
  if (o.block_bytes < 256 || o.block_bytes % 16 != 0) {
    std::fprintf(stderr, "kvtier bench restart: --block-bytes must be a multiple of 16, at least 256\n");
    return 2;
  }
  std::vector<Row> rows;
  for (uint64_t n : o.blocks) {
    rows.push_back(HostRow(kvtierd, base, n, o.block_bytes));
    if (o.nvme) rows.push_back(NvmeRow(kvtierd, base, n, o.block_bytes));
    if (o.takeover) rows.push_back(TakeoverRow(kvtierd, base, n, o.block_bytes));
  }
  std::printf("kvtier bench restart: kvtierd %s, %llu-byte blocks, kill -9 then start\n", kvtierd.c_str(),
              static_cast<unsigned long long>(o.block_bytes));
  std::printf("  %8s %9s %8s %9s %10s %9s %9s %10s %10s %11s %9s %9s\n", "tier", "blocks", "fill s", "serve s",
              "empty srv", "visible s", "hash s", "found", "anon B/blk", "lookup us", "empty us", "wait ms");
  bool ok = true;
  for (const Row& r : rows) {
    const std::string wait = r.longest_wait_s < 0 ? "-"
                                                  : std::to_string(static_cast<int64_t>(r.longest_wait_s * 1000)) +
                                                        " (" + std::to_string(r.unavailable) + ")";
    std::printf("  %8s %9llu %8.2f %9.3f %10.3f %9.3f %9.3f %10lld %10.0f %11.1f %9.1f %9s%s\n", r.tier.c_str(),
                static_cast<unsigned long long>(r.blocks), r.fill_s, r.serve_s, r.empty_serve_s, r.visible_s, r.hash_s,
                static_cast<long long>(r.found), r.anon_bytes_per_block, r.lookup_us, r.empty_lookup_us, wait.c_str(),
                r.ok ? "" : "  (failed)");
    ok = ok && r.ok;
  }
  std::printf(
      "  serve: kill -9 to the first Hello of the next daemon; empty srv: the same for an empty daemon of that size;\n"
      "  visible: until every kept block is checked (host; nvme: the index opens before the socket);\n"
      "  hash: hashing the same bytes here on one thread (the adoption's work); found: blocks adopted / records\n"
      "  loaded; anon B/blk: the daemon's RssAnon, filled minus empty, per block; lookup: one-key Lookup round trip\n"
      "  after the restart, empty us: the same on the empty daemon.\n"
      "  takeover rows: serve is kvtierd --takeover's start to the old daemon's exit (the new one serves then),\n"
      "  visible counts from that start too; wait ms: the longest a client looking up all along waited between\n"
      "  two answers, and (in brackets) its calls answered Unavailable and retried.\n");
  if (!o.json_path.empty()) {
    std::ofstream json(o.json_path);
    json << "{\"bench\": \"restart\", \"block_bytes\": " << o.block_bytes << ", \"rows\": [";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      json << (i ? ", " : "") << "{\"tier\": \"" << r.tier << "\", \"blocks\": " << r.blocks
           << ", \"fill_s\": " << r.fill_s << ", \"serve_s\": " << r.serve_s
           << ", \"empty_serve_s\": " << r.empty_serve_s << ", \"visible_s\": " << r.visible_s
           << ", \"hash_s\": " << r.hash_s << ", \"found\": " << r.found
           << ", \"anon_bytes_per_block\": " << r.anon_bytes_per_block << ", \"lookup_us\": " << r.lookup_us
           << ", \"empty_lookup_us\": " << r.empty_lookup_us << ", \"longest_wait_s\": " << r.longest_wait_s
           << ", \"unavailable\": " << r.unavailable << ", \"ok\": " << (r.ok ? "true" : "false") << "}";
    }
    json << "]}\n";
  }
  return ok ? 0 : 1;
}

}  // namespace kvtier::tools
