// The trials of `kvtier bench layers` (bench_layers.h) against one daemon:
// LayersBench prepares prefixes in a tier (bench_layers_prefix.cc) and
// times loads, overlaps with a synthetic compute, whole-block pins and
// saves (bench_layers_trials.cc), filling in a Report
// (bench_layers_report.h). Private to tools/bench.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <sys/types.h>
#include <vector>

#include "kvtier/client.h"
#include "tools/bench/bench_layers.h"
#include "tools/bench/bench_layers_report.h"

namespace kvtier::tools::layers_bench {

using Clock = std::chrono::steady_clock;

inline double UsBetween(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::micro>(to - from).count();
}

// CPU time the process `pid` has used so far (every thread's
// /proc/PID/task/TID/schedstat run time), in microseconds; -1 if unknown.
double ProcessCpuUs(pid_t pid);

// The first failed status of `statuses` as "<what> block <i>: <status>",
// with that status's code; Ok when none failed.
Status FirstError(const std::vector<Status>& statuses, const char* what);

// The synthetic per-layer compute: a chain of dependent xorshift steps the
// compiler can neither vectorize nor drop, calibrated once to iterations
// per microsecond (the fastest of several runs: the core's own speed).
// Under CPU contention a step takes longer, as a real kernel would on a
// shared GPU; the benches time the compute they ran, not the nominal one.
// Thread-compatible.
class BusyCompute {
 public:
  void Calibrate() {
    constexpr uint64_t kIterations = 20'000'000;
    double best_us = 0;
    for (int run = 0; run < 5; ++run) {
      const auto t0 = Clock::now();
      Spin(kIterations);
      const double us = UsBetween(t0, Clock::now());
      if (us > 0 && (best_us == 0 || us < best_us)) best_us = us;
    }
    iterations_per_us_ = double(kIterations) / std::max(best_us, 1.0);
  }
  void Run(double us) const { Spin(static_cast<uint64_t>(us * iterations_per_us_ + 0.5)); }
  double iterations_per_us() const { return iterations_per_us_; }

 private:
  static void Spin(uint64_t n) {
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (uint64_t i = 0; i < n; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      asm volatile("" : "+r"(x));
    }
    sink_.store(x, std::memory_order_relaxed);
  }
  static inline std::atomic<uint64_t> sink_{0};
  double iterations_per_us_ = 1;
};

// Drives the trials against one daemon through one client (namespace 0),
// filling in `report`; every key it puts is erased again. Not thread-safe.
class LayersBench {
 public:
  // `daemon_pid`: the private kvtierd's (its CPU time is read), or 0.
  LayersBench(Client& client, const LayersBenchOptions& o, uint64_t salt, pid_t daemon_pid, Report& report)
      : client_(client), o_(o), salt_(salt), daemon_pid_(daemon_pid), report_(report) {
    const uint64_t block = report.block_bytes;
    source_.resize(uint64_t{o.blocks} * block);
    for (uint64_t i = 0; i < source_.size(); i += 8) {
      const uint64_t word = (i * 0x9e3779b97f4a7c15ull) ^ salt;
      std::memcpy(source_.data() + i, &word, 8);
    }
    filler_.assign(block, std::byte{0x5a});
  }

  Result<LoadRow> MeasureLoads(Tier tier);
  Result<OverlapRow> MeasureOverlap(Tier tier, double t_read_us, double factor);
  Status MeasureWholePins(LoadRow& row);
  Status MeasureSaves();

  BusyCompute& compute() { return compute_; }

 private:
  struct OverlapTrial {
    double total_us = 0;        // BeginLoad .. the last layer's compute
    double begin_us = 0;        // BeginLoad's round trip
    double load_us = 0;         // BeginLoad .. WaitLayer(0) (load-then-compute: WaitAll) returned
    double wait_us = 0;         // in BeginLoad and WaitLayer
    double compute_us = 0;      // in the compute
    double daemon_cpu_us = -1;  // the private kvtierd's CPU time over the trial
    std::optional<PreloadPlan> plan;
  };

  std::vector<BlockKey> NewKeys(size_t n) {
    std::vector<BlockKey> keys(n);
    for (auto& k : keys) k = BlockKey{salt_, ++next_key_};
    return keys;
  }
  std::span<const std::byte> Block(size_t i) const {
    return {source_.data() + i * report_.block_bytes, report_.block_bytes};
  }
  std::span<const std::byte> Layer(size_t block, uint32_t layer) const {
    return Block(block).subspan(uint64_t{layer} * report_.layer_bytes, report_.layer_bytes);
  }

  Status PutPrefix(const std::vector<BlockKey>& keys);
  Status PushToNvme(const std::vector<BlockKey>& prefix);
  Status WaitInNvme(const std::vector<BlockKey>& prefix);
  Status WaitQuiet();
  Status Erase(const std::vector<BlockKey>& keys);
  struct DeviceReads {
    double reads = 0, bytes = 0;
  };
  Result<DeviceReads> ReadCounters();
  Result<std::vector<BlockKey>> PreparePrefix(Tier tier);
  Status CheckLoad(const LayerLoad& load, Tier tier, bool verify) const;
  Status TimeLoad(Tier tier, bool verify, LoadRow& row);
  Result<OverlapTrial> TimeOverlap(Tier tier, double t_comp_us, bool layer_wise);
  Result<double> TimeLayerSave();
  Result<double> TimePutBatch();
  double TimeMemcpy(std::vector<std::byte>& scratch) const;

  Client& client_;
  const LayersBenchOptions& o_;
  const uint64_t salt_;
  const pid_t daemon_pid_;
  Report& report_;
  uint64_t next_key_ = 0;
  std::vector<std::byte> source_;  // the prefix: block i at i x block_bytes, layer-major
  std::vector<std::byte> filler_;  // one block, put under many keys
  BusyCompute compute_;
};

}  // namespace kvtier::tools::layers_bench
