#include "tools/bench/bench_host.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <unistd.h>

#include "kvtier/client.h"
#include "support/process.h"
#include "support/servers.h"
#include "support/temp_dir.h"
#include "tools/bench/bench_copy.h"
#include "tools/bench/bench_lookup.h"

namespace kvtier::tools {
namespace {

constexpr uint64_t kGiB = 1ull << 30;
constexpr uint64_t kGoalMinBlockBytes = 2ull << 20;
constexpr double kGoalGetVsMemcpy = 0.8;
constexpr double kGoalPutVsMemcpy = 0.8;  // single-block put, blocks >= 2 MiB (issue 12)

std::string Bytes(uint64_t b) {
  char out[32];
  if (b >= kGiB)
    std::snprintf(out, sizeof(out), "%.2f GiB", double(b) / double(kGiB));
  else if (b >= (1u << 20) && b % (1u << 20) == 0)
    std::snprintf(out, sizeof(out), "%llu MiB", (unsigned long long)(b >> 20));
  else if (b >= 1024 && b % 1024 == 0)
    std::snprintf(out, sizeof(out), "%llu KiB", (unsigned long long)(b >> 10));
  else
    std::snprintf(out, sizeof(out), "%llu B", (unsigned long long)b);
  return out;
}

NamespaceDescriptor BenchNamespace(uint64_t salt) {
  NamespaceDescriptor ns;
  ns.model_id = "kvtier-bench/host";
  ns.model_revision = "run-" + std::to_string(salt);
  ns.kv_dtype = "bf16";
  ns.block_tokens = 16;
  ns.layer_count = 4;
  ns.kv_layout = "layer_major_kv";
  ns.bytes_per_token_per_layer = 64;  // 4 KiB blocks for the lookup chain
  return ns;
}

// Everything measured, plus what describes the setup.
struct Report {
  std::string daemon;  // "private <path>" or "running at <socket>"
  std::string events;  // the private daemon's --events; empty with --socket
  std::string socket_path;
  uint64_t arena_bytes = 0;
  uint64_t working_set_bytes = 0;
  double seconds_per_case = 0;
  size_t chain_blocks = 0;
  bool use_directory = true;
  bool verify_checksums = false;
  std::string redis;  // version line, or why there is none
  std::vector<CopyRow> copies;
  std::vector<LookupRow> lookups;
};

// Goals 1 and 3: `op` (the single-block get or put) >= `ratio` x memcpy for
// every block >= 2 MiB; nullopt if no such size was measured.
std::optional<bool> CopyGoalMet(const Report& r, const std::string& op, double ratio) {
  std::optional<bool> met;
  for (const auto& c : r.copies) {
    if (c.op != op || c.block_bytes < kGoalMinBlockBytes) continue;
    met = met.value_or(true) && c.ratio() >= ratio;
  }
  return met;
}
std::optional<bool> GetGoalMet(const Report& r) { return CopyGoalMet(r, "get", kGoalGetVsMemcpy); }
std::optional<bool> PutGoalMet(const Report& r) { return CopyGoalMet(r, "put", kGoalPutVsMemcpy); }

// Goal 2: Lookup ops/s >= redis GET rps at every client count; nullopt if
// redis did not run.
std::optional<bool> LookupGoalMet(const Report& r) {
  bool met = !r.lookups.empty();
  for (const auto& l : r.lookups) {
    if (!l.redis_ran) return std::nullopt;
    met = met && l.ratio() >= 1.0;
  }
  return met;
}

void PrintCopies(const Report& r) {
  std::printf(
      "\nCopies through the client (GB/s = 1e9 bytes/s), each beside single-thread memcpy\n"
      "of the same block size over the same footprint, measured in this run:\n\n");
  std::printf("  %-8s %8s %7s %9s %12s %10s\n", "op", "block", "blocks", "GB/s", "memcpy GB/s", "vs memcpy");
  for (const auto& c : r.copies) {
    std::printf("  %-8s %8s %7llu %9.2f %12.2f %9.2fx\n", c.op.c_str(), Bytes(c.block_bytes).c_str(),
                (unsigned long long)c.blocks, c.gbps, c.memcpy_gbps, c.ratio());
  }
  std::printf("\n  nt copy  memcpy's copy with non-temporal stores (how put writes the arena): put's own ceiling\n");
  std::printf(
      "  put      Client::Put: Reserve, copy caller -> arena hashing it on the way, Commit with the checksum\n"
      "  put x16  Client::PutBatch of 16 blocks: one Reserve, 16 copies, one Commit (a prefix store)\n"
      "  put zc   zero-copy: Client::Reserve, memcpy into the slot, Commit without checksum (daemon hashes)\n");
  if (r.use_directory) {
    std::printf(
        "  get      Client::Get: block directory lookup, memcpy arena -> caller buffer, seqlock check\n"
        "           (no round trip; the use is reported to the daemon later, batched)\n"
        "  get x16  Client::GetBatch of 16 blocks the same way (a prefix load)\n");
  } else {
    std::printf(
        "  get      Client::Get: Pin, memcpy arena -> caller buffer, Release (not waited for)\n"
        "  get x16  Client::GetBatch of 16 blocks: one Pin, 16 copies, one Release (a prefix load)\n");
  }
  std::printf(
      "  pin+sum  zero-copy: Pin, sum every 8-byte word of the view (reads, no copy), Release\n"
      "  memcpy   caller buffer i -> scratch buffer i, i cycling over %s\n",
      Bytes(r.working_set_bytes).c_str());
}

std::string Micros(double us) {
  char out[32];
  if (us < 0) return "-";
  std::snprintf(out, sizeof(out), "%.1f", us);
  return out;
}

void PrintLookups(const Report& r) {
  std::printf(
      "\nLookup of a %zu-key chain (all committed: every Lookup is a full hit), one Client\n"
      "connection per thread, %s, beside redis-benchmark -t get -c N (%s):\n\n",
      r.chain_blocks,
      r.use_directory ? "answered from the block directory (shared memory, no round trip)"
                      : "one socket round trip each (--no-directory)",
      r.redis.c_str());
  std::printf("  %7s %13s %8s %8s | %13s %8s %8s | %12s\n", "clients", "lookup ops/s", "p50 us", "p99 us",
              "redis GET/s", "p50 us", "p99 us", "lookup/redis");
  for (const auto& l : r.lookups) {
    std::string ratio = "n/a";
    if (l.redis_ran) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.2fx", l.ratio());
      ratio = buf;
    }
    std::printf("  %7d %13.0f %8s %8s | %13s %8s %8s | %12s\n", l.clients, l.ops_per_s, Micros(l.p50_us).c_str(),
                Micros(l.p99_us).c_str(), l.redis_ran ? std::to_string((long long)l.redis_rps).c_str() : "n/a",
                Micros(l.redis_ran ? l.redis_p50_us : -1).c_str(), Micros(l.redis_ran ? l.redis_p99_us : -1).c_str(),
                ratio.c_str());
  }
  std::string last_note;
  for (const auto& l : r.lookups) {
    if (l.redis_ran || l.redis_note.empty() || l.redis_note == last_note) continue;
    std::printf("  redis n/a: %s\n", l.redis_note.c_str());
    last_note = l.redis_note;
  }
}

void PrintGoals(const Report& r) {
  std::printf("\nGoals\n  get >= %.1fx memcpy at blocks >= 2 MiB:", kGoalGetVsMemcpy);
  for (const auto& c : r.copies) {
    if (c.op == "get" && c.block_bytes >= kGoalMinBlockBytes) {
      std::printf(" %s %.2fx;", Bytes(c.block_bytes).c_str(), c.ratio());
    }
  }
  auto get = GetGoalMet(r);
  std::printf(" %s\n", !get ? "n/a (no block >= 2 MiB measured)" : *get ? "MET" : "NOT MET");
  std::printf("  put >= %.1fx memcpy at blocks >= 2 MiB:", kGoalPutVsMemcpy);
  for (const auto& c : r.copies) {
    if (c.op == "put" && c.block_bytes >= kGoalMinBlockBytes) {
      std::printf(" %s %.2fx;", Bytes(c.block_bytes).c_str(), c.ratio());
    }
  }
  auto put = PutGoalMet(r);
  std::printf(" %s\n", !put ? "n/a (no block >= 2 MiB measured)" : *put ? "MET" : "NOT MET");
  auto lookup = LookupGoalMet(r);
  std::printf("  Lookup ops/s >= redis GET/s at every client count: %s\n", !lookup   ? "n/a (redis did not run)"
                                                                           : *lookup ? "MET"
                                                                                     : "NOT MET");
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
      continue;
    }
    out += c;
  }
  return out + "\"";
}

void WriteJsonCopies(std::ostream& out, const Report& r) {
  out << "  \"copies\": [\n";
  for (size_t i = 0; i < r.copies.size(); ++i) {
    const auto& c = r.copies[i];
    out << "    {\"op\": " << JsonString(c.op) << ", \"block_bytes\": " << c.block_bytes << ", \"blocks\": " << c.blocks
        << ", \"ops\": " << c.ops << ", \"seconds\": " << c.seconds << ", \"gbps\": " << c.gbps
        << ", \"memcpy_gbps\": " << c.memcpy_gbps << ", \"ratio\": " << c.ratio() << "}"
        << (i + 1 < r.copies.size() ? "," : "") << "\n";
  }
  out << "  ],\n";
}

void WriteJsonLookups(std::ostream& out, const Report& r) {
  out << "  \"lookups\": [\n";
  for (size_t i = 0; i < r.lookups.size(); ++i) {
    const auto& l = r.lookups[i];
    out << "    {\"clients\": " << l.clients << ", \"ops\": " << l.ops << ", \"seconds\": " << l.seconds
        << ", \"ops_per_s\": " << l.ops_per_s << ", \"p50_us\": " << l.p50_us << ", \"p99_us\": " << l.p99_us
        << ", \"redis_ran\": " << (l.redis_ran ? "true" : "false");
    if (l.redis_ran) {
      out << ", \"redis_requests\": " << l.redis_requests << ", \"redis_rps\": " << l.redis_rps;
      if (l.redis_p50_us >= 0) out << ", \"redis_p50_us\": " << l.redis_p50_us;
      if (l.redis_p99_us >= 0) out << ", \"redis_p99_us\": " << l.redis_p99_us;
      out << ", \"ratio\": " << l.ratio();
    } else {
      out << ", \"redis_note\": " << JsonString(l.redis_note) << ", \"ratio\": null";
    }
    out << "}" << (i + 1 < r.lookups.size() ? "," : "") << "\n";
  }
  out << "  ],\n";
}

Status WriteJson(const std::string& path, const Report& r) {
  std::ofstream out(path);
  out.precision(6);
  out << "{\n  \"bench\": \"host\",\n  \"events\": " << JsonString(r.events)
      << ",\n  \"daemon\": " << JsonString(r.daemon) << ",\n  \"arena_bytes\": " << r.arena_bytes
      << ",\n  \"working_set_bytes\": " << r.working_set_bytes << ",\n  \"seconds_per_case\": " << r.seconds_per_case
      << ",\n  \"lookup_chain_blocks\": " << r.chain_blocks
      << ",\n  \"use_directory\": " << (r.use_directory ? "true" : "false")
      << ",\n  \"verify_checksums\": " << (r.verify_checksums ? "true" : "false")
      << ",\n  \"redis\": " << JsonString(r.redis) << ",\n";
  WriteJsonCopies(out, r);
  WriteJsonLookups(out, r);
  auto lookup = LookupGoalMet(r);
  auto get = GetGoalMet(r);
  auto put = PutGoalMet(r);
  out << "  \"goals\": {\"get_vs_memcpy_at_2mib_and_up\": "
      << (!get   ? "null"
          : *get ? "true"
                 : "false")
      << ", \"put_vs_memcpy_at_2mib_and_up\": "
      << (!put   ? "null"
          : *put ? "true"
                 : "false")
      << ", \"lookup_vs_redis_get\": "
      << (!lookup   ? "null"
          : *lookup ? "true"
                    : "false")
      << "}\n}\n";
  out.close();
  if (!out) return IoError("cannot write " + path);
  return Status::Ok();
}

// Starts redis-server when redis-benchmark and redis-server exist. On any
// failure `why` says why there are no redis figures.
std::optional<support::StartedServer> MaybeStartRedis(const HostBenchOptions& o, const std::string& dir,
                                                      LookupBenchConfig& config, std::string& version) {
  if (o.skip_redis) {
    config.redis_missing_reason = version = "skipped (--skip-redis)";
    return std::nullopt;
  }
  config.redis_benchmark = support::FindProgram(o.redis_benchmark);
  const std::string server_path = support::FindProgram(o.redis_server);
  if (config.redis_benchmark.empty() || server_path.empty()) {
    config.redis_missing_reason = version =
        (config.redis_benchmark.empty() ? o.redis_benchmark : o.redis_server) + " not found; no redis figures";
    config.redis_benchmark.clear();
    return std::nullopt;
  }
  auto v = support::RunCommand({config.redis_benchmark, "--version"});
  version = v.ok() ? v->output.substr(0, v->output.find('\n')) : "redis-benchmark (version unknown)";
  auto redis = support::StartRedis(server_path, dir);
  if (!redis.ok()) {
    config.redis_missing_reason = version = "redis-server did not start: " + redis.status().ToString();
    config.redis_benchmark.clear();
    return std::nullopt;
  }
  config.redis_socket = redis->socket_path;
  version += ", private redis-server on " + redis->socket_path;
  return std::move(*redis);
}

// The measuring part, once a daemon listens at report.socket_path.
Status Measure(const HostBenchOptions& o, const std::string& dir, Report& report) {
  const uint64_t salt = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                        (static_cast<uint64_t>(::getpid()) << 40);
  ClientOptions client_options;
  client_options.socket_path = report.socket_path;
  client_options.client_name = "kvtier-bench-host";
  client_options.namespaces = {BenchNamespace(salt)};
  client_options.use_directory = o.use_directory;
  client_options.verify_checksums = o.verify_checksums;
  auto client = Client::Connect(client_options);
  if (!client.ok()) return client.status();
  report.arena_bytes = (*client)->arena().size();
  report.working_set_bytes = o.working_set_bytes != 0 ? o.working_set_bytes : std::min(report.arena_bytes / 2, kGiB);
  std::fprintf(stderr, "kvtier bench host: copies (%zu sizes x 4 ops x %.1f s)...\n", o.block_bytes.size(),
               o.seconds_per_case);
  auto copies = RunCopyBench(**client, 0, {o.block_bytes, report.working_set_bytes, o.seconds_per_case, salt});
  if (!copies.ok()) return copies.status();
  report.copies = std::move(*copies);

  LookupBenchConfig config{report.socket_path,
                           client_options.namespaces[0],
                           o.lookup_chain_blocks,
                           o.lookup_clients,
                           o.seconds_per_case,
                           o.use_directory,
                           "",
                           "",
                           ""};
  auto redis = MaybeStartRedis(o, dir, config, report.redis);
  std::fprintf(stderr, "kvtier bench host: lookups (%zu client counts)...\n", o.lookup_clients.size());
  auto lookups = RunLookupBench(**client, 0, config);
  if (redis) redis->process.Stop();
  if (!lookups.ok()) return lookups.status();
  report.lookups = std::move(*lookups);
  return Status::Ok();
}

Status CheckOptions(const HostBenchOptions& o) {
  if (o.seconds_per_case <= 0) return InvalidArgument("--seconds must be positive");
  if (o.block_bytes.empty()) return InvalidArgument("--block-bytes needs at least one size");
  if (o.lookup_chain_blocks == 0) return InvalidArgument("--chain-blocks must be positive");
  for (int c : o.lookup_clients) {
    if (c < 1 || c > 1024) return InvalidArgument("--lookup-clients must be in 1..1024");
  }
  return Status::Ok();
}

// The `kvtier` tool beside this one (kvtier-bench is its sibling).
std::string KvtierBeside() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("kvtier") : (self.parent_path() / "kvtier").string();
}

// Starts the private daemon (unless --socket) and measures; prints errors.
int RunInDir(const HostBenchOptions& o, const std::string& dir) {
  Report report;
  report.seconds_per_case = o.seconds_per_case;
  report.chain_blocks = o.lookup_chain_blocks;
  report.use_directory = o.use_directory;
  report.verify_checksums = o.verify_checksums;
  std::optional<support::StartedServer> daemon;
  if (o.socket_path.empty()) {
    const std::string path = o.kvtierd_path.empty() ? support::DefaultKvtierdPath() : o.kvtierd_path;
    std::fprintf(stderr, "kvtier bench host: starting %s (arena %s)...\n", path.c_str(), Bytes(o.arena_bytes).c_str());
    auto started = support::StartKvtierd(path, dir, o.arena_bytes, std::chrono::seconds(60),
                                         o.events == "off" ? "[events]\nenabled = false\n" : "");
    if (!started.ok()) {
      std::fprintf(stderr, "kvtier bench host: cannot start kvtierd: %s\n(use --kvtierd PATH or --socket PATH)\n",
                   started.status().ToString().c_str());
      return 1;
    }
    daemon = std::move(*started);
    report.daemon = "private " + path;
    report.socket_path = daemon->socket_path;
    report.events = o.events;
  } else {
    report.daemon = "running at " + o.socket_path;
    report.socket_path = o.socket_path;
  }
  std::optional<support::ChildProcess> subscriber;
  if (daemon && o.events == "subscribed") {
    // This tool's own `events` command, every event decoded and printed (to /dev/null).
    auto child = support::ChildProcess::Spawn({KvtierBeside(), "events", "--json", "--socket", daemon->socket_path},
                                              "/dev/null");
    if (!child.ok()) {
      std::fprintf(stderr, "kvtier bench host: cannot start the subscriber: %s\n", child.status().ToString().c_str());
      return 1;
    }
    subscriber = std::move(*child);
  }
  Status s = Measure(o, dir, report);
  if (subscriber) {
    const std::string how = subscriber->Stop();
    if (how != "exit status 0") std::fprintf(stderr, "kvtier bench host: the subscriber ended with %s\n", how.c_str());
  }
  if (daemon) {
    const std::string how = daemon->process.Stop();
    if (how != "exit status 0") std::fprintf(stderr, "kvtier bench host: kvtierd ended with %s\n", how.c_str());
  }
  if (!s.ok()) {
    std::fprintf(stderr, "kvtier bench host: %s\n", s.ToString().c_str());
    if (daemon) std::fprintf(stderr, "kvtierd log:\n%s\n", support::FileTail(daemon->log_path).c_str());
    return 1;
  }
  std::printf(
      "kvtier bench host: kvtierd %s, arena %s, working set %s per block size, %.1f s per case, "
      "checksum verification %s%s\n",
      report.daemon.c_str(), Bytes(report.arena_bytes).c_str(), Bytes(report.working_set_bytes).c_str(),
      report.seconds_per_case, report.verify_checksums ? "on" : "off",
      report.events.empty() ? "" : (", KV events " + report.events).c_str());
  PrintCopies(report);
  PrintLookups(report);
  PrintGoals(report);
  if (!o.json_path.empty()) {
    if (Status j = WriteJson(o.json_path, report); !j.ok()) {
      std::fprintf(stderr, "kvtier bench host: %s\n", j.ToString().c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace

void AddHostBenchOptions(CLI::App& app, HostBenchOptions& o) {
  app.add_option("--socket", o.socket_path, "Use the kvtierd listening here instead of starting one");
  app.add_option("--kvtierd", o.kvtierd_path,
                 "kvtierd binary to start (default: the kvtierd of this build or install)");
  app.add_option("--events", o.events,
                 "The private kvtierd's KV events: on (published, no subscriber), off, or subscribed (`kvtier "
                 "events --json` reads them meanwhile)")
      ->check(CLI::IsMember({"on", "off", "subscribed"}))
      ->capture_default_str();
  app.add_option("--arena-bytes", o.arena_bytes, "Arena of the private kvtierd (e.g. 2GiB)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--working-set-bytes", o.working_set_bytes,
                 "Bytes cycled over per block size (0: min(arena/2, 1 GiB))")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--block-bytes", o.block_bytes, "Block sizes of the copy cases (e.g. 256KiB,2MiB)")
      ->delimiter(',')
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--seconds", o.seconds_per_case, "Timed seconds per case")->capture_default_str();
  app.add_option("--lookup-clients", o.lookup_clients, "Client thread counts of the Lookup cases (e.g. 1,4,16)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--chain-blocks", o.lookup_chain_blocks, "Keys per Lookup (all committed)")->capture_default_str();
  app.add_flag("--skip-redis", o.skip_redis, "Do not run redis-benchmark (ratios print as n/a)");
  app.add_option("--redis-server", o.redis_server, "redis-server binary")->capture_default_str();
  app.add_option("--redis-benchmark", o.redis_benchmark, "redis-benchmark binary")->capture_default_str();
  app.add_option("--json", o.json_path, "Also write the results to this file as JSON");
  app.add_flag("--verify-checksums", o.verify_checksums,
               "Gets and pins check the bytes against their checksums (ClientOptions::verify_checksums)");
  app.add_flag("!--no-directory", o.use_directory,
               "Clients do not use the block directory: every get and lookup is a socket round trip");
}

int RunHostBench(const HostBenchOptions& options) {
  if (Status s = CheckOptions(options); !s.ok()) {
    std::fprintf(stderr, "kvtier bench host: %s\n", s.ToString().c_str());
    return 1;
  }
  auto dir = support::MakeTempDir("kvtier-bench-");
  if (!dir.ok()) {
    std::fprintf(stderr, "kvtier bench host: %s\n", dir.status().ToString().c_str());
    return 1;
  }
  const int rc = RunInDir(options, *dir);
  support::RemoveTree(*dir);
  return rc;
}

}  // namespace kvtier::tools
