#include "tools/bench/bench_peer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <map>
#include <thread>

#include "common/checksum.h"
#include "common/mutex.h"
#include "support/format.h"
#include "support/ports.h"
#include "support/process.h"
#include "support/temp_dir.h"
#include "tiers/peer/peer_server.h"
#include "tiers/peer/peer_tier.h"

namespace kvtier::tools {
namespace {

using SteadyClock = std::chrono::steady_clock;
constexpr NamespaceFingerprint kBenchNs{0xbe4c, 0x9ee7};
constexpr const char* kSecretEnv = "KVTIER_BENCH_PEER_SECRET";
// The prefix's reads are all issued at once; ucx_perftest's gets of a layer's size, this many in flight.
constexpr uint32_t kPrefixPerftestOutstanding = 256;

double Since(SteadyClock::time_point t) { return std::chrono::duration<double>(SteadyClock::now() - t).count(); }

// A loopback port free a moment ago (0: none).
int FreePort() {
  const std::vector<int> ports = support::ReserveLoopbackPorts(1, 10000, 30000, 0);
  return ports.empty() ? 0 : ports.front();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// What the serving copy holds, derived from the options alone (both ends
// compute it): per whole-block case, enough blocks for --in-flight reads
// twice over and at least 128 MiB; then the prefix.
struct Shape {
  struct Case {
    uint64_t block_bytes = 0;
    uint32_t layers = 1;
    uint32_t blocks = 0;
    uint64_t first_offset = 0;
  };
  std::vector<Case> cases;  // the whole-block cases, then the prefix (last)
  uint64_t total_bytes = 0;
  static BlockKey Key(size_t c, uint32_t i) { return BlockKey{c + 1, i}; }
};

Shape ShapeOf(const PeerBenchOptions& o) {
  Shape s;
  for (uint64_t bytes : o.block_bytes) {
    const uint32_t blocks = static_cast<uint32_t>(std::max<uint64_t>(2 * o.in_flight, (128ull << 20) / bytes));
    s.cases.push_back({bytes, 1, blocks, s.total_bytes});
    s.total_bytes += bytes * blocks;
  }
  s.cases.push_back({o.layer_bytes * o.layers, o.layers, o.prefix_blocks, s.total_bytes});
  s.total_bytes += o.layer_bytes * o.layers * o.prefix_blocks;
  return s;
}

// Blocks in one region of memory, pinned without bounds (the bench's reader
// is the only one).
class BenchSource final : public PeerSource {
 public:
  explicit BenchSource(const Shape& shape) : shape_(shape), memory_(shape.total_bytes) {
    for (size_t c = 0; c < shape.cases.size(); ++c) {
      const Shape::Case& k = shape.cases[c];
      for (uint32_t i = 0; i < k.blocks; ++i) {
        const uint64_t offset = k.first_offset + i * k.block_bytes;
        std::fill_n(memory_.data() + offset, k.block_bytes, static_cast<std::byte>(c * 31 + i));
        Block b{offset, k.block_bytes, k.layers, {}};
        const uint64_t layer_bytes = k.block_bytes / k.layers;
        for (uint32_t l = 0; l < k.layers; ++l) {
          b.sums.push_back(BlockChecksum(std::span(memory_).subspan(offset + l * layer_bytes, layer_bytes)));
        }
        blocks_[Shape::Key(c, i)] = std::move(b);
      }
    }
  }
  std::vector<Region> Regions() const override { return {{0, const_cast<std::byte*>(memory_.data()), memory_.size()}}; }
  std::vector<PeerHeld> Find(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) override {
    std::vector<PeerHeld> out;
    for (const BlockKey& k : keys) {
      auto it = blocks_.find(k);
      out.push_back(ns != kBenchNs || it == blocks_.end()
                        ? PeerHeld{}
                        : PeerHeld{true, it->second.bytes, it->second.layers, it->second.layers, 0});
    }
    return out;
  }
  void Pin(uint64_t, const NamespaceFingerprint& ns, const BlockKey& key, PinDone done) override {
    PeerPinned p;
    auto it = blocks_.find(key);
    if (ns != kBenchNs || it == blocks_.end()) {
      p.code = StatusCode::kNotFound;
      return done(std::move(p));
    }
    p.lease = ++leases_;
    p.offset = it->second.offset;
    p.payload_bytes = it->second.bytes;
    p.layer_count = it->second.layers;
    p.layers_ready = it->second.layers;
    p.layer_checksums = it->second.sums;
    done(std::move(p));
  }
  void Release(uint64_t, std::span<const uint64_t>) override {}
  void EndReader(uint64_t) override {}

 private:
  struct Block {
    uint64_t offset = 0;
    uint64_t bytes = 0;
    uint32_t layers = 1;
    std::vector<uint64_t> sums;
  };
  const Shape shape_;
  std::vector<std::byte> memory_;
  std::map<BlockKey, Block> blocks_;  // immutable after construction
  std::atomic<uint64_t> leases_{0};   // the server's thread only; atomic for the analysis' sake
};

// The serving copy: a PeerServer until SIGTERM.
int Serve(const PeerBenchOptions& o) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  const char* secret = std::getenv(kSecretEnv);
  if (secret == nullptr) return 1;
  BenchSource source(ShapeOf(o));
  PeerServerOptions options;
  options.listen = "127.0.0.1:" + std::to_string(o.serve_port);
  options.secret = secret;
  auto server = PeerServer::Start(options, source);
  if (!server.ok()) {
    std::fprintf(stderr, "kvtier bench peer --serve: %s\n", server.status().ToString().c_str());
    return 1;
  }
  int signal = 0;
  sigwait(&signals, &signal);
  return 0;
}

// ucx_perftest's ucp_get bandwidth (bytes/s) at `bytes`, `outstanding` gets in flight (as the bench's
// reads are), over the bench's transport; 0 when it cannot run.
double PerftestGet(const PeerBenchOptions& o, uint64_t bytes, uint32_t outstanding, const std::string& log_dir) {
  const int port = FreePort();
  if (port <= 0) return 0;
  auto server = support::ChildProcess::Spawn({o.ucx_perftest, "-p", std::to_string(port)}, log_dir + "/perftest.log");
  if (!server.ok()) return 0;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const uint64_t iterations = std::max<uint64_t>(20, (512ull << 20) / bytes);
  auto r = support::RunCommand({o.ucx_perftest, "127.0.0.1", "-p", std::to_string(port), "-t", "ucp_get", "-s",
                                std::to_string(bytes), "-n", std::to_string(iterations), "-w", "5", "-O",
                                std::to_string(outstanding)});
  server->Stop(std::chrono::seconds(2));
  if (!r.ok() || r->exit_code != 0) return 0;
  // "Final: iters p50 avg overall bw_avg bw_overall msg_avg msg_overall" (MB = 2^20 bytes).
  const size_t at = r->output.rfind("Final:");
  if (at == std::string::npos) return 0;
  double fields[8] = {};
  if (std::sscanf(r->output.c_str() + at, "Final: %lf %lf %lf %lf %lf %lf %lf %lf", &fields[0], &fields[1], &fields[2],
                  &fields[3], &fields[4], &fields[5], &fields[6], &fields[7]) != 8) {
    return 0;
  }
  return fields[5] * 1048576.0;
}

// Whole-block reads of case `c`, --in-flight at once, for --seconds: bytes/s (0 on a failed read).
double PullBlocks(PeerTier& tier, const Shape& shape, size_t c, const PeerBenchOptions& o) {
  const Shape::Case& k = shape.cases[c];
  std::vector<std::vector<std::byte>> buffers(o.in_flight, std::vector<std::byte>(k.block_bytes));
  Mutex mu;
  CondVar cv;
  uint32_t running = 0;
  uint64_t done_bytes = 0;
  bool failed = false;
  uint32_t next = 0;
  const auto start = SteadyClock::now();
  std::function<void(uint32_t)> issue = [&](uint32_t slot) {
    const BlockKey key = Shape::Key(c, next++ % k.blocks);
    Status s = tier.Read(key, 0, 0, buffers[slot], [&, slot](Result<size_t> r) {
      MutexLock lock(mu);
      if (!r.ok() && !failed) std::fprintf(stderr, "kvtier bench peer: %s\n", r.status().ToString().c_str());
      if (!r.ok()) failed = true;
      done_bytes += r.ok() ? *r : 0;
      if (!failed && Since(start) < o.seconds) return issue(slot);
      --running;
      cv.NotifyAll();
    });
    if (!s.ok()) {
      std::fprintf(stderr, "kvtier bench peer: %s\n", s.ToString().c_str());
      failed = true;
      --running;
      cv.NotifyAll();
    }
  };
  {
    MutexLock lock(mu);
    for (uint32_t slot = 0; slot < o.in_flight; ++slot) {
      ++running;
      issue(slot);
    }
    while (running > 0) cv.Wait(mu);
  }
  const double seconds = Since(start);
  return failed ? 0 : static_cast<double>(done_bytes) / seconds;
}

// The prefix, layer by layer: seconds to layer 0 of every block, and to the whole.
struct PrefixTimes {
  double first_layer_s = 0;
  double whole_s = 0;
  bool ok = false;
};
PrefixTimes PullPrefix(PeerTier& tier, const Shape& shape, const PeerBenchOptions& o) {
  const size_t c = shape.cases.size() - 1;
  const Shape::Case& k = shape.cases[c];
  std::vector<std::byte> dst(k.block_bytes * k.blocks);
  Mutex mu;
  CondVar cv;
  uint64_t left = uint64_t{k.blocks} * k.layers;
  uint32_t first_left = k.blocks;
  bool failed = false;
  PrefixTimes t;
  const auto start = SteadyClock::now();
  for (uint32_t layer = 0; layer < k.layers; ++layer) {
    for (uint32_t b = 0; b < k.blocks; ++b) {
      std::span<std::byte> out = std::span(dst).subspan(b * k.block_bytes + layer * o.layer_bytes, o.layer_bytes);
      Status s = tier.Read(Shape::Key(c, b), layer, layer + 1, out, [&, layer](Result<size_t> r) {
        MutexLock lock(mu);
        if (!r.ok()) failed = true;
        if (layer == 0 && --first_left == 0) t.first_layer_s = Since(start);
        if (--left == 0) {
          t.whole_s = Since(start);
          cv.NotifyAll();
        }
      });
      if (!s.ok()) return t;
    }
  }
  MutexLock lock(mu);
  while (left > 0) cv.Wait(mu);
  t.ok = !failed;
  return t;
}

// The hand-off as a decode node sees it: a probe for the prefix, then
// every block read whole, all at once: seconds until the last is in.
double HandOff(PeerTier& tier, const Shape& shape, const std::function<void()>& probe) {
  const size_t c = shape.cases.size() - 1;
  const Shape::Case& k = shape.cases[c];
  std::vector<std::byte> dst(k.block_bytes * k.blocks);
  Mutex mu;
  CondVar cv;
  uint32_t left = k.blocks;
  bool failed = false;
  const auto start = SteadyClock::now();
  probe();
  for (uint32_t b = 0; b < k.blocks; ++b) {
    Status s = tier.Read(Shape::Key(c, b), 0, 0, std::span(dst).subspan(b * k.block_bytes, k.block_bytes),
                         [&](Result<size_t> r) {
                           MutexLock lock(mu);
                           if (!r.ok()) failed = true;
                           if (--left == 0) cv.NotifyAll();
                         });
    if (!s.ok()) return 0;
  }
  MutexLock lock(mu);
  while (left > 0) cv.Wait(mu);
  return failed ? 0 : Since(start);
}

std::string Gbps(double bytes_per_s) {
  char out[32];
  std::snprintf(out, sizeof out, "%.2f", bytes_per_s / 1e9);
  return out;
}
std::string Ratio(double ours, double ceiling) {
  if (ceiling <= 0) return "n/a";
  char out[16];
  std::snprintf(out, sizeof out, "%.2fx", ours / ceiling);
  return out;
}

}  // namespace

void AddPeerBenchOptions(CLI::App& app, PeerBenchOptions& o) {
  app.add_option("--transport", o.transport, "UCX_TLS for both ends and ucx_perftest (tcp; shm,tcp)")
      ->capture_default_str();
  app.add_option("--block-bytes", o.block_bytes, "Whole-block sizes")->capture_default_str();
  app.add_option("--in-flight", o.in_flight, "Whole-block reads in flight")->capture_default_str();
  app.add_option("--seconds", o.seconds, "Seconds per whole-block case and round")->capture_default_str();
  app.add_option("--layers", o.layers, "Layers per block of the prefix")->capture_default_str();
  app.add_option("--layer-bytes", o.layer_bytes, "Bytes per layer of a prefix block")->capture_default_str();
  app.add_option("--prefix-blocks", o.prefix_blocks, "Blocks of the prefix")->capture_default_str();
  app.add_option("--rounds", o.rounds, "Rounds (medians)")->capture_default_str();
  app.add_flag("--skip-perftest", o.skip_perftest, "Do not run ucx_perftest (ratios print as n/a)");
  app.add_option("--ucx-perftest", o.ucx_perftest, "ucx_perftest binary")->capture_default_str();
  app.add_option("--json", o.json_path, "Also write the results to this file as JSON");
  app.add_option("--serve-port", o.serve_port, "(internal) serve as the bench's other node on this port")->group("");
}

int RunPeerBench(const PeerBenchOptions& o) {
  if (o.in_flight == 0 || o.rounds == 0 || o.layers == 0 || o.layer_bytes == 0 || o.prefix_blocks == 0 ||
      o.block_bytes.empty()) {
    std::fprintf(stderr, "kvtier bench peer: sizes, counts and rounds must be positive\n");
    return 1;
  }
  ::setenv("UCX_TLS", o.transport.c_str(), 1);
  if (o.serve_port > 0) return Serve(o);
  auto dir = support::MakeTempDir("kvtier-bench-peer");
  if (!dir.ok()) return 1;
  const int port = FreePort();
  auto secret = FreshNonce();
  if (port <= 0 || !secret.ok()) return 1;
  std::string secret_text;
  for (std::byte b : *secret) secret_text += static_cast<char>('a' + (static_cast<unsigned>(b) % 26));
  ::setenv(kSecretEnv, secret_text.c_str(), 1);
  std::vector<std::string> argv = {"/proc/self/exe",  "peer",
                                   "--serve-port",    std::to_string(port),
                                   "--transport",     o.transport,
                                   "--in-flight",     std::to_string(o.in_flight),
                                   "--layers",        std::to_string(o.layers),
                                   "--layer-bytes",   std::to_string(o.layer_bytes),
                                   "--prefix-blocks", std::to_string(o.prefix_blocks),
                                   "--block-bytes"};
  for (uint64_t b : o.block_bytes) argv.push_back(std::to_string(b));
  char self[4096] = {};
  if (::readlink("/proc/self/exe", self, sizeof(self) - 1) <= 0) return 1;
  argv[0] = self;
  auto server = support::ChildProcess::Spawn(argv, *dir + "/server.log", {.search_path = false});
  if (!server.ok()) {
    std::fprintf(stderr, "kvtier bench peer: starting the serving copy: %s\n", server.status().ToString().c_str());
    return 1;
  }
  const Shape shape = ShapeOf(o);
  PeerTierOptions to;
  to.members = {"127.0.0.1:" + std::to_string(port)};
  to.secret = secret_text;
  to.probe_timeout = std::chrono::seconds(5);
  to.timeout = std::chrono::seconds(30);
  to.retry = std::chrono::milliseconds(100);
  auto tier = PeerTier::Open(to);
  if (!tier.ok()) {
    std::fprintf(stderr, "kvtier bench peer: %s\n", tier.status().ToString().c_str());
    return 1;
  }
  const auto deadline = SteadyClock::now() + std::chrono::seconds(30);
  while ((*tier)->connected() == 0 && SteadyClock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if ((*tier)->connected() == 0) {
    std::fprintf(stderr, "kvtier bench peer: the serving copy never answered (%s)\n", (*dir + "/server.log").c_str());
    return 1;
  }
  // What a probe learns counts for PeerTierOptions::known_for: each round probes its case first, as a lookup would.
  auto probe = [&](size_t c) {
    std::vector<BlockKey> keys;
    for (uint32_t i = 0; i < shape.cases[c].blocks; ++i) keys.push_back(Shape::Key(c, i));
    for (size_t at = 0; at < keys.size(); at += kMaxPeerQueryKeys) {
      (*tier)->Probe(kBenchNs, std::span(keys).subspan(at, std::min<size_t>(kMaxPeerQueryKeys, keys.size() - at)));
    }
  };
  const bool perftest = !o.skip_perftest && !support::FindProgram(o.ucx_perftest).empty();
  std::printf("kvtier bench peer: two processes on this machine, UCX_TLS=%s, %u rounds (medians)\n",
              o.transport.c_str(), o.rounds);
  std::printf("%-26s %12s %18s %8s\n", "case", "kvtier GB/s", "ucx_perftest GB/s", "ratio");
  std::string json = "{\"transport\": \"" + o.transport + "\", \"cases\": [";
  double first_case_rate = 0;  // the first whole-block case's median, the hand-off formula's B
  for (size_t c = 0; c + 1 < shape.cases.size(); ++c) {
    std::vector<double> ours, ceiling;
    for (uint32_t r = 0; r < o.rounds; ++r) {
      probe(c);
      const double got = PullBlocks(**tier, shape, c, o);
      if (got <= 0) {
        std::fprintf(stderr, "kvtier bench peer: a read failed\n");
        return 1;
      }
      ours.push_back(got);
      if (perftest) ceiling.push_back(PerftestGet(o, shape.cases[c].block_bytes, o.in_flight, *dir));
    }
    if (c == 0) first_case_rate = Median(ours);
    const std::string name = support::Mib(shape.cases[c].block_bytes) + " blocks";
    std::printf("%-26s %12s %18s %8s\n", name.c_str(), Gbps(Median(ours)).c_str(),
                perftest ? Gbps(Median(ceiling)).c_str() : "n/a", Ratio(Median(ours), Median(ceiling)).c_str());
    json += std::string(c == 0 ? "" : ", ") + "{\"block_bytes\": " + std::to_string(shape.cases[c].block_bytes) +
            ", \"gbps\": " + Gbps(Median(ours)) + ", \"perftest_gbps\": " + Gbps(Median(ceiling)) + "}";
  }
  std::vector<double> first, whole, ceiling;
  for (uint32_t r = 0; r < o.rounds; ++r) {
    probe(shape.cases.size() - 1);
    PrefixTimes t = PullPrefix(**tier, shape, o);
    if (!t.ok) {
      std::fprintf(stderr, "kvtier bench peer: a layer read failed\n");
      return 1;
    }
    first.push_back(t.first_layer_s);
    whole.push_back(t.whole_s);
    if (perftest) ceiling.push_back(PerftestGet(o, o.layer_bytes, kPrefixPerftestOutstanding, *dir));
  }
  const Shape::Case& p = shape.cases.back();
  const double prefix_bytes = static_cast<double>(p.block_bytes) * p.blocks;
  const double rate = prefix_bytes / Median(whole);
  const std::string name =
      "prefix " + std::to_string(p.blocks) + "x" + std::to_string(o.layers) + "x" + support::Mib(o.layer_bytes);
  std::printf("%-26s %12s %18s %8s\n", name.c_str(), Gbps(rate).c_str(),
              perftest ? Gbps(Median(ceiling)).c_str() : "n/a", Ratio(rate, Median(ceiling)).c_str());
  std::printf("  layer 0 of every block after %.1f ms; the whole %s prefix after %.1f ms\n", Median(first) * 1e3,
              support::Mib(static_cast<uint64_t>(prefix_bytes)).c_str(), Median(whole) * 1e3);
  // The hand-off against V/B + alpha: B the 2 MiB-block pull rate above (the first case), alpha one probe's round
  // trip (median of 21 probes of one key).
  std::vector<double> rtts, handoffs;
  for (int i = 0; i < 21; ++i) {
    const BlockKey one = Shape::Key(0, 0);
    const auto t0 = SteadyClock::now();
    (*tier)->Probe(kBenchNs, std::span(&one, 1));
    rtts.push_back(Since(t0));
  }
  for (uint32_t r = 0; r < o.rounds; ++r) {
    const double t = HandOff(**tier, shape, [&] { probe(shape.cases.size() - 1); });
    if (t <= 0) {
      std::fprintf(stderr, "kvtier bench peer: a hand-off read failed\n");
      return 1;
    }
    handoffs.push_back(t);
  }
  const double alpha = Median(rtts), formula = prefix_bytes / first_case_rate + alpha;
  std::printf(
      "  hand-off of the %s prefix (probe, then every block whole): %.1f ms; V/B + alpha = %.1f ms "
      "(B %.2f GB/s, alpha %.0f us): %.2fx\n",
      support::Mib(static_cast<uint64_t>(prefix_bytes)).c_str(), Median(handoffs) * 1e3, formula * 1e3,
      first_case_rate / 1e9, alpha * 1e6, Median(handoffs) / formula);
  if (!perftest) std::printf("\n(ucx_perftest not run: ratios n/a)\n");
  char tail[512];
  std::snprintf(tail, sizeof tail,
                "], \"prefix\": {\"blocks\": %u, \"layers\": %u, \"layer_bytes\": %llu, \"first_layer_ms\": %.3f, "
                "\"whole_ms\": %.3f, \"gbps\": %s, \"perftest_gbps\": %s, \"handoff_ms\": %.3f, "
                "\"handoff_formula_ms\": %.3f, \"alpha_us\": %.1f}}\n",
                p.blocks, o.layers, static_cast<unsigned long long>(o.layer_bytes), Median(first) * 1e3,
                Median(whole) * 1e3, Gbps(rate).c_str(), Gbps(Median(ceiling)).c_str(), Median(handoffs) * 1e3,
                formula * 1e3, alpha * 1e6);
  json += tail;
  if (!o.json_path.empty()) std::ofstream(o.json_path) << json;
  return 0;
}

}  // namespace kvtier::tools
