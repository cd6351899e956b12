#include "tools/bench/bench_remote.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>

#include "common/checksum.h"
#include "support/process.h"
#include "support/redis_cluster.h"
#include "tiers/remote/remote_tier.h"
#include "tools/bench/bench_window.h"

namespace kvtier::tools {
namespace {

using SteadyClock = std::chrono::steady_clock;
constexpr NamespaceFingerprint kBenchNs{0xbe4c, 0x7e30};

double Since(SteadyClock::time_point t) { return std::chrono::duration<double>(SteadyClock::now() - t).count(); }

struct Figure {
  double gbps = 0;  // 1e9 bytes per second
  uint64_t ops = 0;
  uint64_t errors = 0;
};

// One case's rounds: the medians are reported.
struct Row {
  uint64_t block_bytes = 0;
  std::vector<double> tier_put, tier_get, redis_set, redis_get;
  uint64_t errors = 0;
};

// FLUSHALL on every node of a private cluster (best effort: a round on a
// node that kept keys only reads more of them).
void FlushAll(const support::RedisCluster& cluster) {
  for (int port : cluster.Ports()) cluster.Cli(port, {"FLUSHALL"}).status().IgnoreError();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string Ratio(double ours, const std::vector<double>& ceiling) {
  const double c = Median(ceiling);
  if (c <= 0) return "n/a";
  char out[16];
  std::snprintf(out, sizeof out, "%.2fx", ours / c);
  return out;
}

Result<std::unique_ptr<RemoteTier>> OpenBenchTier(const std::vector<std::string>& seeds, const RemoteBenchOptions& o,
                                                  uint64_t block_bytes, const Clock& clock) {
  RemoteTierOptions options;
  options.cluster.seeds = seeds;
  options.cluster_secret = std::string(kClusterSecretBytes, 'b');  // values are MACed as kvtierd's are
  options.threads = o.clients;
  options.staging_bytes = uint64_t{o.clients} * (block_bytes + 4096) * 2;
  options.timeout = std::chrono::seconds(30);
  options.probe_timeout = std::chrono::seconds(5);
  auto tier = RemoteTier::Open(options, clock);
  if (tier.ok() && !(*tier)->available()) return Unavailable("the cluster at " + seeds.front() + " does not answer");
  return tier;
}

// Writes `count` blocks under fresh keys (first_key...), `clients` in flight.
Figure Put(RemoteTier& tier, uint64_t block_bytes, uint32_t clients, uint64_t first_key, uint64_t count) {
  std::vector<std::byte> payload(block_bytes);
  for (uint64_t i = 0; i + 8 <= block_bytes; i += 8) std::memcpy(payload.data() + i, &i, 8);
  // The daemon demotes blocks whose xxh3 the host tier recorded at commit.
  const uint64_t checksum = BlockChecksum(payload);
  Window window(clients);
  std::mutex mu;
  Figure f;
  const auto start = SteadyClock::now();
  for (uint64_t n = 0; n < count; ++n) {
    window.Acquire();
    auto done = [&](Status s) {
      {
        std::lock_guard lock(mu);
        ++(s.ok() ? f.ops : f.errors);
      }
      window.Release();
    };
    Status accepted;
    while ((accepted = tier.Write(kBenchNs, BlockKey{0xbe4c, first_key + n}, 1, payload, done, checksum)).code() ==
           StatusCode::kBusy) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (!accepted.ok()) {
      std::lock_guard lock(mu);
      ++f.errors;
      window.Release();
    }
  }
  window.Drain();
  f.gbps = double(f.ops * block_bytes) / Since(start) / 1e9;
  return f;
}

// Reads every block written by Put (whole, verified), `clients` in flight.
Figure Get(RemoteTier& tier, uint64_t block_bytes, uint32_t clients, uint64_t first_key, uint64_t count) {
  std::vector<std::vector<std::byte>> buffers(clients, std::vector<std::byte>(block_bytes));
  std::vector<uint32_t> free_buffers;
  for (uint32_t i = 0; i < clients; ++i) free_buffers.push_back(i);
  std::mutex mu;
  std::condition_variable cv;
  Figure f;
  const auto start = SteadyClock::now();
  for (uint64_t n = 0; n < count; ++n) {
    uint32_t slot;
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return !free_buffers.empty(); });
      slot = free_buffers.back();
      free_buffers.pop_back();
    }
    auto done = [&, slot](Result<size_t> r) {
      std::lock_guard lock(mu);
      ++(r.ok() && *r == block_bytes ? f.ops : f.errors);
      free_buffers.push_back(slot);
      cv.notify_all();
    };
    Status accepted = tier.Read(BlockKey{0xbe4c, first_key + n}, 0, 1, buffers[slot], done);
    if (!accepted.ok()) done(accepted);
  }
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return free_buffers.size() == clients; });
  }
  f.gbps = double(f.ops * block_bytes) / Since(start) / 1e9;
  return f;
}

// redis-benchmark's requests per second for `test` ("set" / "get"), from
// its --csv output; < 0 when it fails.
double RedisBenchmark(const RemoteBenchOptions& o, const std::string& seed, const std::string& test,
                      uint64_t block_bytes, uint64_t requests, uint64_t keyspace, std::string* error) {
  const size_t colon = seed.rfind(':');
  auto r = support::RunCommand({o.redis_benchmark, "-h", seed.substr(0, colon), "-p", seed.substr(colon + 1),
                                "--cluster", "-t", test, "-d", std::to_string(block_bytes), "-n",
                                std::to_string(requests), "-c", std::to_string(o.clients), "--threads",
                                std::to_string(o.clients), "-r", std::to_string(keyspace), "--csv"});
  if (!r.ok() || r->exit_code != 0) {
    *error = r.ok() ? r->output : r.status().ToString();
    return -1;
  }
  std::string upper = test;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const std::string tag = "\"" + upper + "\",\"";
  const size_t at = r->output.find(tag);
  if (at == std::string::npos) {
    *error = "no " + upper + " row in redis-benchmark's output: " + r->output;
    return -1;
  }
  return std::strtod(r->output.c_str() + at + tag.size(), nullptr);
}

void WriteJson(const std::string& path, const RemoteBenchOptions& o, const std::string& where,
               const std::vector<Row>& rows) {
  std::ofstream out(path);
  out << "{\"cluster\": \"" << where << "\", \"clients\": " << o.clients << ", \"rounds\": " << o.rounds
      << ", \"cases\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    out << (i ? ", " : "") << "{\"block_bytes\": " << r.block_bytes << ", \"tier_put_gbps\": " << Median(r.tier_put)
        << ", \"redis_set_gbps\": " << Median(r.redis_set) << ", \"tier_get_gbps\": " << Median(r.tier_get)
        << ", \"redis_get_gbps\": " << Median(r.redis_get) << ", \"errors\": " << r.errors << "}";
  }
  out << "]}\n";
}

}  // namespace

void AddRemoteBenchOptions(CLI::App& app, RemoteBenchOptions& o) {
  app.add_option("--nodes", o.nodes, "An existing cluster (host:port,...); default: start a private one");
  app.add_option("--masters", o.masters, "Private cluster: masters")->capture_default_str();
  app.add_option("--node-memory", o.node_memory, "Private cluster: maxmemory of each node")->capture_default_str();
  app.add_option("--block-bytes", o.block_bytes, "Block sizes")->capture_default_str();
  app.add_option("--clients", o.clients, "Operations in flight (redis-benchmark -c)")->capture_default_str();
  app.add_option("--bytes-per-case", o.bytes_per_case, "Bytes put (and got) per case and round")->capture_default_str();
  app.add_option("--rounds", o.rounds, "Rounds per case (medians)")->capture_default_str();
  app.add_flag("--skip-redis", o.skip_redis, "Do not run redis-benchmark (ratios print as n/a)");
  app.add_option("--redis-benchmark", o.redis_benchmark, "redis-benchmark binary")->capture_default_str();
  app.add_option("--json", o.json_path, "Also write the results to this file as JSON");
}

int RunRemoteBench(const RemoteBenchOptions& o) {
  if (o.clients == 0 || o.rounds == 0) {
    std::fprintf(stderr, "kvtier bench remote: --clients and --rounds must be positive\n");
    return 1;
  }
  std::unique_ptr<support::RedisCluster> cluster;
  std::vector<std::string> seeds;
  std::string where = o.nodes;
  if (o.nodes.empty()) {
    support::RedisCluster::Options options;
    options.masters = o.masters;
    options.replicas_per_master = 0;
    options.maxmemory = o.node_memory;
    auto started = support::RedisCluster::Start(options);
    if (!started.ok()) {
      std::fprintf(stderr, "kvtier bench remote: %s\n", started.status().ToString().c_str());
      return 1;
    }
    cluster = std::move(*started);
    seeds = cluster->Seeds();
    where = "private, " + std::to_string(o.masters) + " masters on loopback, maxmemory " + o.node_memory + " each";
  } else {
    for (size_t at = 0; at <= o.nodes.size();) {
      const size_t comma = std::min(o.nodes.find(',', at), o.nodes.size());
      if (comma > at) seeds.push_back(o.nodes.substr(at, comma - at));
      at = comma + 1;
    }
  }
  const bool redis = !o.skip_redis && !support::FindProgram(o.redis_benchmark).empty();
  std::printf("kvtier bench remote: cluster %s; %u in flight; %u rounds, medians\n\n", where.c_str(), o.clients,
              o.rounds);
  std::printf("%-8s %12s %12s %7s %12s %12s %7s\n", "block", "put GB/s", "SET GB/s", "ratio", "get GB/s", "GET GB/s",
              "ratio");
  std::vector<Row> rows;
  SystemClock clock;  // outlives every tier opened below
  uint64_t next_key = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  for (uint64_t block : o.block_bytes) {
    Row row;
    row.block_bytes = block;
    const uint64_t count = std::max<uint64_t>(uint64_t{o.clients} * 2, o.bytes_per_case / block);
    // redis-benchmark picks keys at random in a space as large as the
    // tier's fresh keys: its SETs mostly create values too (a store that
    // grows pays page faults an overwrite does not).
    const uint64_t keyspace = count;
    for (uint32_t round = 0; round < o.rounds; ++round) {
      auto tier_side = [&]() -> bool {
        auto tier = OpenBenchTier(seeds, o, block, clock);
        if (!tier.ok()) {
          std::fprintf(stderr, "kvtier bench remote: %s\n", tier.status().ToString().c_str());
          return false;
        }
        const uint64_t first = next_key;
        next_key += count;
        const Figure put = Put(**tier, block, o.clients, first, count);
        const Figure got = Get(**tier, block, o.clients, first, count);
        row.tier_put.push_back(put.gbps);
        row.tier_get.push_back(got.gbps);
        row.errors += put.errors + got.errors;
        for (uint64_t n = 0; n < count; ++n) (*tier)->Erase(BlockKey{0xbe4c, first + n}).IgnoreError();
        return true;  // the tier's destructor waits for the erases
      };
      auto redis_side = [&]() -> bool {
        if (!redis) return true;
        std::string error;
        // A private cluster starts each round empty, as the tier's side does.
        if (cluster != nullptr) FlushAll(*cluster);
        // SET fills about 63% of the key space; GET then reads all of it,
        // and a key SET missed answers nil: GB/s counts the values returned,
        // the expected share of GETs that find one (uniform random keys).
        const double set = RedisBenchmark(o, seeds.front(), "set", block, count, keyspace, &error);
        const double get = set < 0 ? -1 : RedisBenchmark(o, seeds.front(), "get", block, count, keyspace, &error);
        if (set < 0 || get < 0) {
          std::fprintf(stderr, "kvtier bench remote: redis-benchmark failed: %s\n", error.c_str());
          return false;
        }
        row.redis_set.push_back(set * double(block) / 1e9);
        const double present = 1.0 - std::pow(1.0 - 1.0 / double(keyspace), double(count));
        row.redis_get.push_back(get * present * double(block) / 1e9);
        return true;
      };
      const bool tier_first = round % 2 == 0;
      if (!(tier_first ? tier_side() : redis_side())) return 1;
      if (!(tier_first ? redis_side() : tier_side())) return 1;
    }
    std::printf("%-8s %12.2f %12.2f %7s %12.2f %12.2f %7s\n", (std::to_string(block >> 20) + " MiB").c_str(),
                Median(row.tier_put), Median(row.redis_set), Ratio(Median(row.tier_put), row.redis_set).c_str(),
                Median(row.tier_get), Median(row.redis_get), Ratio(Median(row.tier_get), row.redis_get).c_str());
    if (row.errors != 0) {
      std::fprintf(stderr, "kvtier bench remote: %llu operations failed\n", (unsigned long long)row.errors);
      return 1;
    }
    rows.push_back(std::move(row));
  }
  if (!redis) std::printf("\n(redis-benchmark not run: ratios n/a)\n");
  if (!o.json_path.empty()) WriteJson(o.json_path, o, where, rows);
  return 0;
}

}  // namespace kvtier::tools
