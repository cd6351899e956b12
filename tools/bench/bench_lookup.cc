#include "tools/bench/bench_lookup.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <latch>
#include <sstream>
#include <thread>

#include "support/process.h"

namespace kvtier::tools {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kRedisCalibrationRequests = 20000;
constexpr uint64_t kRedisMaxRequests = 20'000'000;

std::vector<BlockKey> ChainKeys(const NamespaceDescriptor& ns, size_t blocks, Status& status) {
  auto hasher = ChainHasher::Create(ns);
  if (!hasher.ok()) {
    status = hasher.status();
    return {};
  }
  std::vector<uint32_t> tokens(blocks * ns.block_tokens);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>((i * 7919 + 17) % 128256);
  return hasher->Keys(tokens);
}

Status PutChain(Client& client, NamespaceId ns, const std::vector<BlockKey>& keys, uint64_t block_bytes) {
  std::vector<std::byte> bytes(block_bytes, std::byte{0x5a});
  for (const BlockKey& key : keys) {
    Status s = client.Put(ns, key, bytes);
    if (!s.ok()) return Status(s.code(), "Put of a lookup-chain block: " + s.message());
  }
  auto hit = client.Lookup(ns, keys);
  if (!hit.ok()) return hit.status();
  if (hit->prefix_blocks != keys.size()) {
    return Internal("after putting " + std::to_string(keys.size()) + " chain blocks, Lookup finds " +
                    std::to_string(hit->prefix_blocks));
  }
  return Status::Ok();
}

double Percentile(std::vector<uint64_t>& samples, double q) {
  if (samples.empty()) return 0;
  const size_t at = std::min(samples.size() - 1, static_cast<size_t>(q * static_cast<double>(samples.size())));
  std::nth_element(samples.begin(), samples.begin() + static_cast<std::ptrdiff_t>(at), samples.end());
  return static_cast<double>(samples[at]);
}

// What one lookup thread measured.
struct ThreadResult {
  Status status;
  std::vector<uint64_t> latencies_ns;
  Clock::time_point end;
};

void LookupLoop(Client& client, NamespaceId ns, const std::vector<BlockKey>& keys, std::latch& start,
                const Clock::time_point& deadline, ThreadResult& out) {
  out.latencies_ns.reserve(1 << 18);
  start.wait();
  for (Clock::time_point now = Clock::now(); now < deadline;) {
    auto hit = client.Lookup(ns, keys);
    const Clock::time_point done = Clock::now();
    if (!hit.ok() || hit->prefix_blocks != keys.size()) {
      out.status = hit.ok() ? Internal("Lookup found " + std::to_string(hit->prefix_blocks) + " of " +
                                       std::to_string(keys.size()) + " chain blocks")
                            : hit.status();
      break;
    }
    out.latencies_ns.push_back(static_cast<uint64_t>(std::chrono::nanoseconds(done - now).count()));
    now = done;
  }
  out.end = Clock::now();
}

Status MeasureLookups(const LookupBenchConfig& config, const std::vector<BlockKey>& keys, int clients, LookupRow& row) {
  ClientOptions options;
  options.socket_path = config.kvtier_socket;
  options.client_name = "kvtier-bench-lookup";
  options.namespaces = {config.ns};
  options.use_directory = config.use_directory;
  std::vector<std::unique_ptr<Client>> connections;
  for (int i = 0; i < clients; ++i) {
    auto c = Client::Connect(options);
    if (!c.ok()) return c.status();
    connections.push_back(std::move(*c));
  }
  std::vector<ThreadResult> results(static_cast<size_t>(clients));
  std::latch start(1);  // opened by the main thread once `deadline` is set
  Clock::time_point deadline;
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back(LookupLoop, std::ref(*connections[static_cast<size_t>(i)]), NamespaceId{0}, std::cref(keys),
                         std::ref(start), std::cref(deadline), std::ref(results[static_cast<size_t>(i)]));
  }
  const Clock::time_point begin = Clock::now();
  deadline =
      begin + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(config.seconds_per_case));
  start.count_down();  // publishes `deadline` to the threads
  for (auto& t : threads) t.join();
  std::vector<uint64_t> all;
  Clock::time_point end = begin;
  for (auto& r : results) {
    if (!r.status.ok()) return r.status;
    all.insert(all.end(), r.latencies_ns.begin(), r.latencies_ns.end());
    end = std::max(end, r.end);
  }
  row.clients = clients;
  row.ops = all.size();
  row.seconds = std::chrono::duration<double>(end - begin).count();
  row.ops_per_s = row.seconds > 0 ? static_cast<double>(row.ops) / row.seconds : 0;
  row.p50_us = Percentile(all, 0.50) / 1e3;
  row.p99_us = Percentile(all, 0.99) / 1e3;
  return Status::Ok();
}

Result<support::CommandOutput> RedisBenchmark(const LookupBenchConfig& config, const std::string& test, int clients,
                                              uint64_t requests) {
  auto out = support::RunCommand({config.redis_benchmark, "-s", config.redis_socket, "-t", test, "-c",
                                  std::to_string(clients), "-n", std::to_string(requests), "--csv"});
  if (!out.ok()) return out.status();
  if (out->exit_code != 0) {
    return Unavailable("redis-benchmark exited with " + std::to_string(out->exit_code) + ": " + out->output);
  }
  return out;
}

// Calibrates the request count on a short run so the measured run lasts
// about seconds_per_case, then runs it. Failures only fill row.redis_note.
void MeasureRedis(const LookupBenchConfig& config, int clients, LookupRow& row) {
  auto calibration = RedisBenchmark(config, "get", clients, kRedisCalibrationRequests);
  LookupRow probe;
  Status s = calibration.ok() ? ParseRedisBenchmarkCsv(calibration->output, probe) : calibration.status();
  uint64_t requests = kRedisCalibrationRequests;
  if (s.ok()) {
    requests = std::clamp<uint64_t>(static_cast<uint64_t>(probe.redis_rps * config.seconds_per_case),
                                    kRedisCalibrationRequests, kRedisMaxRequests);
    auto measured = RedisBenchmark(config, "get", clients, requests);
    s = measured.ok() ? ParseRedisBenchmarkCsv(measured->output, row) : measured.status();
  }
  if (!s.ok()) {
    row.redis_note = "redis-benchmark failed: " + s.ToString();
    return;
  }
  row.redis_ran = true;
  row.redis_requests = requests;
}

std::vector<std::string> SplitCsv(const std::string& line) {
  std::vector<std::string> fields;
  std::stringstream in(line);
  std::string field;
  while (std::getline(in, field, ',')) {
    field.erase(std::remove(field.begin(), field.end(), '"'), field.end());
    field.erase(std::remove(field.begin(), field.end(), '\r'), field.end());
    fields.push_back(field);
  }
  return fields;
}

}  // namespace

Status ParseRedisBenchmarkCsv(const std::string& output, LookupRow& row) {
  std::stringstream in(output);
  std::string line;
  std::vector<std::string> header = {"test", "rps"};  // redis < 7 prints no header
  while (std::getline(in, line)) {
    auto fields = SplitCsv(line);
    if (fields.empty()) continue;
    if (fields[0] == "test") {
      header = fields;
      continue;
    }
    if (fields[0] != "GET") continue;
    for (size_t i = 1; i < fields.size() && i < header.size(); ++i) {
      const double value = std::strtod(fields[i].c_str(), nullptr);
      if (header[i] == "rps") row.redis_rps = value;
      if (header[i] == "p50_latency_ms") row.redis_p50_us = value * 1e3;
      if (header[i] == "p99_latency_ms") row.redis_p99_us = value * 1e3;
    }
    if (row.redis_rps > 0) return Status::Ok();
  }
  return InvalidArgument("no GET row with a request rate in redis-benchmark output: " + output);
}

Result<std::vector<LookupRow>> RunLookupBench(Client& setup, NamespaceId ns, const LookupBenchConfig& config) {
  Status status;
  const std::vector<BlockKey> keys = ChainKeys(config.ns, config.chain_blocks, status);
  if (!status.ok()) return status;
  if (Status s = PutChain(setup, ns, keys, config.ns.BlockBytes()); !s.ok()) return s;
  const bool redis = !config.redis_benchmark.empty() && !config.redis_socket.empty();
  std::string redis_setup_note;
  if (redis) {
    // GET reads the key SET writes ("key:__rand_int__" without -r): a hit.
    auto set = RedisBenchmark(config, "set", 1, 1000);
    if (!set.ok()) redis_setup_note = "redis-benchmark -t set failed: " + set.status().ToString();
  }
  std::vector<LookupRow> rows;
  for (int clients : config.client_counts) {
    LookupRow row;
    if (Status s = MeasureLookups(config, keys, clients, row); !s.ok()) return s;
    if (!redis) {
      row.redis_note = config.redis_missing_reason;
    } else if (!redis_setup_note.empty()) {
      row.redis_note = redis_setup_note;
    } else {
      MeasureRedis(config, clients, row);
    }
    rows.push_back(row);
  }
  auto erased = setup.Erase(ns, keys);
  if (!erased.ok()) return erased.status();
  return rows;
}

}  // namespace kvtier::tools
