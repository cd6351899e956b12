#include "tools/bench/bench_policy.h"

#include <benchmark/benchmark.h>
#include <malloc.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "policy/admission_policy.h"
#include "policy/eviction_policy.h"
#include "policy/policy_registry.h"
#include "policy/queue_aware_policy.h"

namespace kvtier::tools {
namespace {

using PolicyFactory = EvictionPolicyId;  // built with MakeEvictionPolicy

// A policy tracking handles [0, n), inserted at times 0..n-1.
std::unique_ptr<EvictionPolicy> Filled(PolicyFactory make, uint64_t n) {
  auto p = MakeEvictionPolicy(make);
  for (uint64_t h = 0; h < n; ++h) p->OnInsert(h, h);
  return p;
}

// Insert: keeps the tracked count at n by removing the oldest handle each time.
void Insert(benchmark::State& state, PolicyFactory make, uint64_t n) {
  auto p = Filled(make, n);
  uint64_t next = n, now = n;
  for (auto _ : state) {
    p->OnInsert(next, ++now);
    p->OnRemove(next - n);
    ++next;
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["tracked"] = double(p->size());
}

// Uses of uniformly random handles among [0, n), all tracked by `p`.
void AccessRandom(benchmark::State& state, EvictionPolicy& p, uint64_t n) {
  std::mt19937_64 rng(7);
  std::vector<uint64_t> handles(1 << 16);
  for (auto& h : handles) h = rng() % n;
  uint64_t i = 0, now = n;
  for (auto _ : state) p.OnAccess(handles[i++ & 0xffff], ++now);
  state.SetItemsProcessed(state.iterations());
}

void Access(benchmark::State& state, PolicyFactory make, uint64_t n) { AccessRandom(state, *Filled(make, n), n); }

// Victim selection as the engine does it: name the victim, remove it, and
// insert a new block so the size stays at n.
void Victim(benchmark::State& state, PolicyFactory make, uint64_t n) {
  auto p = Filled(make, n);
  uint64_t next = n, now = n;
  for (auto _ : state) {
    auto v = p->Victim();
    benchmark::DoNotOptimize(v);
    p->OnRemove(v->handle);
    p->OnInsert(next++, ++now);
  }
  state.SetItemsProcessed(state.iterations());
}

BlockKey ChainKey(uint64_t i) { return BlockKey{0xc4a1, i}; }

// A queue-aware policy tracking n keyed blocks (chains of 64: depth i % 64)
// with `queued` requests of 64 blocks each waiting over them.
std::unique_ptr<QueueAwarePolicy> QueueAwareFilled(uint64_t n, uint64_t queued) {
  auto p = MakeQueueAwarePolicy();
  for (uint64_t h = 0; h < n; ++h) p->OnInsertKeyed(h, ChainKey(h), static_cast<uint32_t>(h % 64), h / 640 + 1, h);
  std::vector<BlockKey> chain(64);
  for (uint64_t r = 0; r < queued; ++r) {
    const uint64_t first = (r * 64 * 7919) % (n - 64);
    for (uint64_t i = 0; i < 64; ++i) chain[i] = ChainKey(first + i);
    p->Enqueue(r, chain, n + r * 1000);
  }
  return p;
}

void QueueAwareInsert(benchmark::State& state, uint64_t n) {
  auto p = QueueAwareFilled(n, 1000);
  uint64_t next = n, now = n;
  for (auto _ : state) {
    p->OnInsertKeyed(next, ChainKey(next), static_cast<uint32_t>(next % 64), 1, ++now);
    p->OnRemove(next - n);
    ++next;
  }
  state.SetItemsProcessed(state.iterations());
}

void QueueAwareAccess(benchmark::State& state, uint64_t n) { AccessRandom(state, *QueueAwareFilled(n, 1000), n); }

void QueueAwareVictim(benchmark::State& state, uint64_t n) {
  auto p = QueueAwareFilled(n, 1000);
  uint64_t next = n, now = n;
  for (auto _ : state) {
    auto v = p->Victim();
    benchmark::DoNotOptimize(v);
    p->OnRemove(v->handle);
    p->OnInsertKeyed(next, ChainKey(next), static_cast<uint32_t>(next % 64), 1, ++now);
    ++next;
  }
  state.SetItemsProcessed(state.iterations());
}

// Enqueue of a 64-block chain of cached blocks, with 1000 requests already
// queued; the oldest request finishes at each step so the queue holds its
// size (one op = one Enqueue + one Finished).
void QueueAwareEnqueue(benchmark::State& state, uint64_t n) {
  auto p = QueueAwareFilled(n, 1000);
  std::vector<BlockKey> chain(64);
  uint64_t request = 1000, start = n + 1'000'000;
  for (auto _ : state) {
    const uint64_t first = (request * 64 * 7919) % (n - 64);
    for (uint64_t i = 0; i < 64; ++i) chain[i] = ChainKey(first + i);
    p->Enqueue(request, chain, ++start);
    p->Finished(request - 1000);
    ++request;
  }
  state.SetItemsProcessed(state.iterations());
}

// The floor under any per-key queue index: the 128 hash lookups an
// enqueue64 op makes (64 keys in, 64 out) in a 1M-key map like the
// policy's, with no other work. Same key pattern as QueueAwareEnqueue.
void KeyLookups128(benchmark::State& state, uint64_t n) {
  std::unordered_map<BlockKey, uint64_t> keys;
  keys.reserve(n);
  for (uint64_t h = 0; h < n; ++h) keys.emplace(ChainKey(h), h);
  uint64_t request = 1000, sum = 0;
  for (auto _ : state) {
    for (uint64_t r : {request, request - 1000}) {
      const uint64_t first = (r * 64 * 7919) % (n - 64);
      for (uint64_t i = 0; i < 64; ++i) sum += keys.find(ChainKey(first + i))->second;
    }
    ++request;
  }
  benchmark::DoNotOptimize(sum);
  state.SetItemsProcessed(state.iterations());
}

// One admission decision over a mix of classes (one in five a first
// sighting, one in ten with its parent missing); dwpd with a budget large
// enough that the bucket rarely runs dry.
void Admission(benchmark::State& state, const std::string& name) {
  AdmissionParams params;
  params.dwpd.drive_capacity_bytes = 4'000'000'000'000;
  std::unique_ptr<AdmissionPolicy> p =
      std::move(MakeAdmissionPolicy(*ParseAdmissionPolicy(name, kAdmissionForNvme), params, 0).value());
  std::vector<AdmissionCandidate> mix(1000);
  for (size_t i = 0; i < mix.size(); ++i) {
    mix[i].bytes = 64 << 10;
    mix[i].cls = i % 5 == 0 ? AdmissionClass::kFirstSighting : static_cast<AdmissionClass>(i % 3);
    mix[i].parent_cached = i % 10 != 3;
  }
  uint64_t i = 0, now = 0;
  for (auto _ : state) {
    now += 1000;  // 1 ms of fake time per decision
    benchmark::DoNotOptimize(p->Decide(mix[i++ % mix.size()], now));
  }
  state.SetItemsProcessed(state.iterations());
}

// Prints each case's ops/s beside the goal as the run goes.
class GoalReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      const double seconds = r.GetAdjustedRealTime() * 1e-9;  // ns per op (time unit ns)
      const double ops = seconds > 0 ? 1.0 / seconds : 0;
      std::printf("  %-28s %12.0f ops/s  %5.1fx the 1M/s goal  %s\n", r.run_name.function_name.c_str(), ops, ops / 1e6,
                  ops >= 1e6 ? "met" : "NOT MET");
    }
  }
  bool ReportContext(const Context&) override { return true; }
};

// Heap bytes in use (glibc's mallinfo2: small blocks and mmapped ones).
size_t HeapInUse() {
  const struct mallinfo2 m = ::mallinfo2();
  return m.uordblks + m.hblkhd;
}

// Heap bytes per tracked block of a `make` policy holding n keyed blocks:
// once filled, and after n more insertions that each evict the victim
// first (a full cache's steady state: ghost lists and use histories of the
// evicted keys included).
std::pair<double, double> BytesPerBlock(PolicyFactory make, uint64_t n) {
  const size_t before = HeapInUse();
  auto p = MakeEvictionPolicy(make);
  for (uint64_t h = 0; h < n; ++h) p->OnInsertKeyed(h, BlockKey{0x5eed, h}, h);
  const double filled = double(HeapInUse() - before) / double(n);
  for (uint64_t h = n; h < 2 * n; ++h) {
    if (std::optional<EvictionCandidate> v = p->Victim()) p->OnRemove(v->handle);
    p->OnInsertKeyed(h, BlockKey{0x5eed, h}, h);
  }
  return {filled, double(HeapInUse() - before) / double(n)};
}

}  // namespace

void AddPolicyBenchOptions(CLI::App& app, PolicyBenchOptions& o) {
  app.add_option("--blocks", o.blocks, "Blocks each eviction policy tracks")->capture_default_str();
  app.add_option("--min-seconds", o.min_seconds, "Minimum time per case")->capture_default_str();
  app.add_option("--json", o.json_path, "Also write Google Benchmark's JSON to this file");
}

int RunPolicyBench(const PolicyBenchOptions& o) {
  const uint64_t n = o.blocks;
  for (const EvictionPolicyEntry& row : kEvictionPolicies) {
    if (row.id == EvictionPolicyId::kQueueAware) continue;  // its own cases below, with queued requests
    const std::string name(row.name);
    const PolicyFactory make = row.id;
    benchmark::RegisterBenchmark(("eviction/" + name + "/insert").c_str(), Insert, make, n)->MinTime(o.min_seconds);
    benchmark::RegisterBenchmark(("eviction/" + name + "/access").c_str(), Access, make, n)->MinTime(o.min_seconds);
    benchmark::RegisterBenchmark(("eviction/" + name + "/victim").c_str(), Victim, make, n)->MinTime(o.min_seconds);
  }
  benchmark::RegisterBenchmark("eviction/queue_aware/insert", QueueAwareInsert, n)->MinTime(o.min_seconds);
  benchmark::RegisterBenchmark("eviction/queue_aware/access", QueueAwareAccess, n)->MinTime(o.min_seconds);
  benchmark::RegisterBenchmark("eviction/queue_aware/victim", QueueAwareVictim, n)->MinTime(o.min_seconds);
  benchmark::RegisterBenchmark("eviction/queue_aware/enqueue64", QueueAwareEnqueue, n)->MinTime(o.min_seconds);
  benchmark::RegisterBenchmark("floor/key_lookups128", KeyLookups128, n)->MinTime(o.min_seconds);
  for (const AdmissionPolicyEntry& row : kAdmissionPolicies) {
    if ((row.uses & kAdmissionForNvme) == 0) continue;
    const std::string name(row.name);
    benchmark::RegisterBenchmark(("admission/" + name + "/decide").c_str(), Admission, name)->MinTime(o.min_seconds);
  }
  std::vector<std::string> args = {"kvtier-bench-policy"};
  if (!o.json_path.empty()) {
    args.push_back("--benchmark_out=" + o.json_path);
    args.push_back("--benchmark_out_format=json");
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  int argc = static_cast<int>(argv.size());
  benchmark::Initialize(&argc, argv.data());
  std::printf("Policy operations on one core (%llu blocks tracked by each eviction policy), goal >= 1M ops/s each:\n\n",
              static_cast<unsigned long long>(n));
  GoalReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  std::printf(
      "\n  insert = OnInsert + OnRemove of the oldest (size held); victim = Victim + OnRemove + OnInsert;\n"
      "  access = OnAccess of a random tracked block; decide = one admission decision over a class mix.\n"
      "  queue_aware: 1000 requests of 64 blocks queued; enqueue64 = Enqueue of a 64-block chain of\n"
      "  cached blocks + Finished of the oldest request (the queue keeps its size): 128 keys moved.\n"
      "  floor/key_lookups128 = the 128 hash lookups of those keys alone in a 1M-key map: the\n"
      "  ceiling of any per-key queue index (not a policy; its goal column does not apply).\n");
  std::printf("\nHeap bytes per tracked block (%llu keyed blocks; mallinfo2 before and after):\n",
              static_cast<unsigned long long>(n));
  std::printf("  %-12s %8s %9s\n", "policy", "filled", "churned");
  for (const EvictionPolicyEntry& row : kEvictionPolicies) {
    const auto [filled, churned] = BytesPerBlock(row.id, n);
    std::printf("  %-12s %8.0f %9.0f\n", std::string(row.name).c_str(), filled, churned);
  }
  std::printf(
      "  filled: after n insertions; churned: after n more, each evicting the victim first (ghosts and\n"
      "  histories of evicted keys included). The host tier keeps one instance per shard; the engine's own\n"
      "  index entry (BlockEntry) comes on top (kvtier bench restart measures the daemon's whole).\n");
  return 0;
}

}  // namespace kvtier::tools
