#include "tools/bench/bench_layers.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>
#include <unistd.h>

#include "kvtier/client.h"
#include "support/format.h"
#include "support/process.h"
#include "support/servers.h"
#include "support/temp_dir.h"
#include "tools/bench/bench_layers_report.h"

namespace kvtier::tools {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kFillerBatch = 4;  // filler blocks per PutBatch while pushing a prefix out
constexpr auto kSettleTimeout = std::chrono::seconds(60);

double UsBetween(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::micro>(to - from).count();
}

// CPU time the process `pid` has used so far (every thread's
// /proc/PID/task/TID/schedstat run time), in microseconds; -1 if unknown.
double ProcessCpuUs(pid_t pid) {
  if (pid <= 0) return -1;
  std::error_code ec;
  uint64_t ns = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream in(task.path() / "schedstat");
    uint64_t run_ns = 0;
    if (in >> run_ns) ns += run_ns;
  }
  return ec ? -1 : double(ns) / 1e3;
}

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

Status FirstError(const std::vector<Status>& statuses, const char* what) {
  for (size_t i = 0; i < statuses.size(); ++i) {
    if (!statuses[i].ok()) {
      return Status(statuses[i].code(), std::string(what) + " block " + std::to_string(i) + ": " +
                                            statuses[i].ToString());
    }
  }
  return Status::Ok();
}

Status LayersBench::PutPrefix(const std::vector<BlockKey>& keys) {
  std::vector<std::span<const std::byte>> data;
  for (size_t i = 0; i < keys.size(); ++i) data.push_back(Block(i));
  return FirstError(client_.PutBatch(0, keys, data, ChainLinks{true, std::nullopt}), "PutBatch of the prefix:");
}

Status LayersBench::Erase(const std::vector<BlockKey>& keys) {
  if (keys.empty()) return Status::Ok();
  auto erased = client_.Erase(0, keys);
  return erased.ok() ? Status::Ok() : erased.status();
}

// Until no block is being promoted or demoted (an NVMe write of an evicted
// block would share the disk with the reads being timed).
Status LayersBench::WaitQuiet() {
  const auto deadline = Clock::now() + kSettleTimeout;
  for (;;) {
    auto stats = client_.Stats();
    if (!stats.ok()) return stats.status();
    int64_t moving = 0;
    for (const Counter& c : *stats) {
      if (c.name == "engine.demoting_blocks" || c.name == "engine.promoting_blocks") moving += c.value;
    }
    if (moving == 0) return Status::Ok();
    if (Clock::now() >= deadline) return TimedOut("blocks were still moving between tiers after 60 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// The NVMe device's read counters (0 without an NVMe tier).
Result<LayersBench::DeviceReads> LayersBench::ReadCounters() {
  auto stats = client_.Stats();
  if (!stats.ok()) return stats.status();
  DeviceReads out;
  for (const Counter& c : *stats) {
    if (c.name == "nvme.device.reads") out.reads = double(c.value);
    if (c.name == "nvme.device.read_bytes") out.bytes = double(c.value);
  }
  return out;
}

// Until Lookup places every prefix block in the NVMe tier (a block being
// demoted already counts; WaitQuiet waits for its write).
Status LayersBench::WaitInNvme(const std::vector<BlockKey>& prefix) {
  const auto deadline = Clock::now() + kSettleTimeout;
  for (;;) {
    auto look = client_.Lookup(0, prefix);
    if (!look.ok()) return look.status();
    if (look->prefix_blocks < prefix.size()) {
      return NotFound("prefix block " + std::to_string(look->prefix_blocks) +
                      " was evicted without reaching the NVMe tier (dropped)");
    }
    if (std::all_of(look->tiers.begin(), look->tiers.end(), [](Tier t) { return t == Tier::kNvme; })) {
      return Status::Ok();
    }
    if (Clock::now() >= deadline) return TimedOut("the prefix did not reach the NVMe tier within 60 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Puts filler blocks (fresh keys) until no prefix block is left in the host
// tier, waits for the prefix's NVMe writes, then erases the filler.
Status LayersBench::PushToNvme(const std::vector<BlockKey>& prefix) {
  const uint64_t cap = 3 * (report_.arena_bytes / report_.block_bytes) + prefix.size();
  std::vector<BlockKey> filler;
  Status s = Status::Ok();
  for (;;) {
    auto look = client_.Lookup(0, prefix);
    if (!look.ok()) {
      s = look.status();
      break;
    }
    if (std::none_of(look->tiers.begin(), look->tiers.end(), [](Tier t) { return t == Tier::kHost; })) break;
    if (filler.size() >= cap) {
      s = Unavailable("after " + std::to_string(filler.size()) + " filler blocks part of the prefix is still in " +
                      "the host tier");
      break;
    }
    std::vector<BlockKey> batch = NewKeys(kFillerBatch);
    std::vector<std::span<const std::byte>> data(batch.size(), std::span<const std::byte>(filler_));
    filler.insert(filler.end(), batch.begin(), batch.end());
    s = FirstError(client_.PutBatch(0, batch, data), "PutBatch of filler:");
    if (!s.ok()) break;
  }
  if (s.ok()) s = WaitInNvme(prefix);
  Status erased = Erase(filler);
  if (s.ok()) s = erased;
  if (s.ok()) s = WaitQuiet();
  return s;
}

// Fresh keys holding the prefix in `tier` alone, nothing moving. A prefix
// block dropped on its way to NVMe (the demotion buffer overflowed) costs
// a retry with new keys, at most twice.
Result<std::vector<BlockKey>> LayersBench::PreparePrefix(Tier tier) {
  for (int attempt = 0;; ++attempt) {
    std::vector<BlockKey> keys = NewKeys(o_.blocks);
    Status s = PutPrefix(keys);
    if (s.ok()) s = tier == Tier::kNvme ? PushToNvme(keys) : WaitQuiet();
    if (s.ok()) return keys;
    Erase(keys).IgnoreError();  // the error below is the one to report
    if (tier != Tier::kNvme || s.code() != StatusCode::kNotFound || attempt == 2) return s;
    ++report_.setup_retries;
  }
}

// Every block loaded, from the expected tier; with `verify`, every layer
// byte-exact (untimed).
Status LayersBench::CheckLoad(const LayerLoad& load, Tier tier, bool verify) const {
  if (load.usable_prefix() != load.size()) {
    return load.status(load.usable_prefix()).ok() ? Internal("usable_prefix disagrees with status")
                                                    : load.status(load.usable_prefix());
  }
  if (load.source() != tier) {
    return Internal("the load's source tier is " + std::string(TierName(load.source())) + ", expected " +
                    std::string(TierName(tier)));
  }
  if (!verify) return Status::Ok();
  for (size_t b = 0; b < load.size(); ++b) {
    for (uint32_t l = 0; l < load.layer_count(); ++l) {
      std::span<const std::byte> got = load.LayerSpan(b, l);
      std::span<const std::byte> want = Layer(b, l);
      if (got.size() != want.size() || std::memcmp(got.data(), want.data(), want.size()) != 0) {
        return Corruption("block " + std::to_string(b) + " layer " + std::to_string(l) +
                          " differs from what was put");
      }
    }
  }
  return Status::Ok();
}

// One section-1 trial: BeginLoad (zero-copy), WaitLayer(0), WaitAll.
Status LayersBench::TimeLoad(Tier tier, bool verify, LoadRow& row) {
  auto keys = PreparePrefix(tier);
  if (!keys.ok()) return keys.status();
  auto reads0 = ReadCounters();
  if (!reads0.ok()) return reads0.status();
  const double cpu0 = ProcessCpuUs(daemon_pid_);
  const auto t0 = Clock::now();
  auto load = client_.BeginLoad(0, *keys);
  const auto t1 = Clock::now();
  if (!load.ok()) {
    Erase(*keys).IgnoreError();  // the load's error is the one to report
    return load.status();
  }
  Status s = load->WaitLayer(0);
  const auto t2 = Clock::now();
  if (s.ok()) s = load->WaitAll();
  const auto t3 = Clock::now();
  const double cpu1 = ProcessCpuUs(daemon_pid_);
  if (s.ok()) s = CheckLoad(*load, tier, verify);
  Status ended = load->End();
  if (s.ok()) s = ended;
  auto reads1 = ReadCounters();
  if (s.ok() && !reads1.ok()) s = reads1.status();
  Status erased = Erase(*keys);
  if (s.ok()) s = erased;
  if (!s.ok()) return s;
  row.device_reads.push_back(reads1->reads - reads0->reads);
  row.device_read_bytes.push_back(reads1->bytes - reads0->bytes);
  row.begin_us.push_back(UsBetween(t0, t1));
  row.first_us.push_back(UsBetween(t0, t2));
  row.whole_us.push_back(UsBetween(t0, t3));
  if (cpu0 >= 0 && cpu1 >= 0) row.daemon_cpu_us.push_back(cpu1 - cpu0);
  return Status::Ok();
}

Result<LoadRow> LayersBench::MeasureLoads(Tier tier) {
  LoadRow row;
  row.tier = tier;
  LoadRow warmup;  // faults the arena into this process, seeds the daemon's bandwidth estimate
  if (Status s = TimeLoad(tier, true, warmup); !s.ok()) return s;
  for (uint32_t t = 0; t < o_.trials; ++t) {
    if (Status s = TimeLoad(tier, true, row); !s.ok()) return s;
  }
  return row;
}

// One section-2 trial. Layer-wise: BeginLoad .. for each layer WaitLayer,
// compute. Load-then-compute: BeginLoad .. WaitAll, then every layer's
// compute. Both ask for the plan (compute_us_per_layer). The time spent in
// WaitLayer and in the compute are summed apart.
Result<LayersBench::OverlapTrial> LayersBench::TimeOverlap(Tier tier, double t_comp_us, bool layer_wise) {
  auto keys = PreparePrefix(tier);
  if (!keys.ok()) return keys.status();
  LoadOptions options;
  options.compute_us_per_layer = t_comp_us;
  OverlapTrial trial;
  const double cpu0 = ProcessCpuUs(daemon_pid_);
  const auto t0 = Clock::now();
  auto load = client_.BeginLoad(0, *keys, options);
  const auto begun = Clock::now();
  if (!load.ok()) {
    Erase(*keys).IgnoreError();  // the load's error is the one to report
    return load.status();
  }
  Status s = Status::Ok();
  Clock::time_point at = t0;
  for (uint32_t l = 0; s.ok() && l < load->layer_count(); ++l) {
    if (layer_wise || l == 0) s = load->WaitLayer(layer_wise ? l : load->layer_count() - 1);
    const auto waited = Clock::now();
    if (l == 0) trial.load_us = UsBetween(t0, waited);  // load-then-compute: the whole load
    trial.wait_us += UsBetween(at, waited);
    if (s.ok()) compute_.Run(t_comp_us);
    at = Clock::now();
    trial.compute_us += UsBetween(waited, at);
  }
  const double cpu1 = ProcessCpuUs(daemon_pid_);
  if (cpu0 >= 0 && cpu1 >= 0) trial.daemon_cpu_us = cpu1 - cpu0;
  if (s.ok()) s = CheckLoad(*load, tier, false);
  trial.plan = load->plan();
  Status ended = load->End();
  if (s.ok()) s = ended;
  Status erased = Erase(*keys);
  if (s.ok()) s = erased;
  if (!s.ok()) return s;
  trial.total_us = UsBetween(t0, at);
  trial.begin_us = UsBetween(t0, begun);
  return trial;
}

Result<OverlapRow> LayersBench::MeasureOverlap(Tier tier, double t_read_us, double factor) {
  OverlapRow row;
  row.tier = tier;
  row.factor = factor;
  row.t_read_us = t_read_us;
  row.t_comp_us = factor * t_read_us;
  row.planned = true;
  // Trial 0 is an untimed warm-up of both (the daemon's first plan of a
  // tier may cost it a measurement); then alternate which goes first, so
  // that drift hits both alike.
  for (uint32_t t = 0; t <= o_.trials; ++t) {
    std::optional<OverlapTrial> lw, ltc;
    for (int k = 0; k < 2; ++k) {
      const bool layer_wise = (k == 0) == (t % 2 == 0);
      auto trial = TimeOverlap(tier, row.t_comp_us, layer_wise);
      if (!trial.ok()) return trial.status();
      (layer_wise ? lw : ltc) = *trial;
    }
    if (t == 0) {
      row.warmup_begin_us = lw->begin_us;
      continue;
    }
    row.lw_us.push_back(lw->total_us);
    row.lw_wait_us.push_back(lw->wait_us);
    row.lw_compute_us.push_back(lw->compute_us);
    if (lw->daemon_cpu_us >= 0) row.lw_daemon_cpu_us.push_back(lw->daemon_cpu_us);
    if (ltc->daemon_cpu_us >= 0) row.ltc_daemon_cpu_us.push_back(ltc->daemon_cpu_us);
    row.ltc_us.push_back(ltc->total_us);
    row.load_us.push_back(ltc->load_us);
    row.compute_us.push_back(ltc->compute_us);
    row.hidden.push_back(ltc->load_us > 0 ? (ltc->total_us - lw->total_us) / ltc->load_us : 0);
    if (!lw->plan) {
      row.planned = false;
      continue;
    }
    row.stall_us.push_back(lw->plan->stall_us);
    row.plan_read_us.push_back(lw->plan->read_us_per_layer);
    row.n_pre.push_back(lw->plan->layers_to_preload);
  }
  return row;
}

// Reference, after section 2 (whole-block promotions feed the NVMe tier's
// bandwidth estimate with per-read rates): Pin of the whole blocks.
Status LayersBench::MeasureWholePins(LoadRow& row) {
  for (uint32_t t = 0; t < o_.trials; ++t) {
    auto keys = PreparePrefix(row.tier);
    if (!keys.ok()) return keys.status();
    auto reads0 = ReadCounters();
    if (!reads0.ok()) return reads0.status();
    const double cpu0 = ProcessCpuUs(daemon_pid_);
    const auto t0 = Clock::now();
    std::vector<Result<BlockView>> views = client_.Pin(0, *keys);
    const auto t1 = Clock::now();
    const double cpu1 = ProcessCpuUs(daemon_pid_);
    Status s = Status::Ok();
    for (auto& v : views) {
      if (s.ok() && !v.ok()) s = v.status();
      if (v.ok()) v->Release().IgnoreError();  // a failed release ends with the erase below
    }
    auto reads1 = ReadCounters();
    if (s.ok() && !reads1.ok()) s = reads1.status();
    Status erased = Erase(*keys);
    if (s.ok()) s = erased;
    if (!s.ok()) return s;
    row.pin_us.push_back(UsBetween(t0, t1));
    row.pin_device_reads.push_back(reads1->reads - reads0->reads);
    row.pin_device_read_bytes.push_back(reads1->bytes - reads0->bytes);
    if (cpu0 >= 0 && cpu1 >= 0) row.pin_daemon_cpu_us.push_back(cpu1 - cpu0);
  }
  return Status::Ok();
}

// BeginSave, SaveLayer per layer from the caller's buffers, FinishSave.
Result<double> LayersBench::TimeLayerSave() {
  std::vector<BlockKey> keys = NewKeys(o_.blocks);
  std::vector<std::span<const std::byte>> src(keys.size());
  const auto t0 = Clock::now();
  auto save = client_.BeginSave(0, keys, ChainLinks{true, std::nullopt});
  if (!save.ok()) return save.status();
  Status s = Status::Ok();
  for (uint32_t l = 0; s.ok() && l < save->layer_count(); ++l) {
    for (size_t b = 0; b < keys.size(); ++b) src[b] = Layer(b, l);
    s = save->SaveLayer(l, src);
  }
  Result<std::vector<Status>> committed = s.ok() ? save->FinishSave() : Result<std::vector<Status>>(s);
  const auto t1 = Clock::now();
  if (s.ok()) s = committed.ok() ? FirstError(*committed, "FinishSave:") : committed.status();
  for (size_t b = 0; s.ok() && b < keys.size(); ++b) s = save->status(b);
  Status erased = Erase(keys);
  if (s.ok()) s = erased;
  if (!s.ok()) return s;
  return UsBetween(t0, t1);
}

Result<double> LayersBench::TimePutBatch() {
  std::vector<BlockKey> keys = NewKeys(o_.blocks);
  const auto t0 = Clock::now();
  Status s = PutPrefix(keys);
  const auto t1 = Clock::now();
  Status erased = Erase(keys);
  if (s.ok()) s = erased;
  if (!s.ok()) return s;
  return UsBetween(t0, t1);
}

// memcpy of the same bytes, block by block, into `scratch`.
double LayersBench::TimeMemcpy(std::vector<std::byte>& scratch) const {
  const auto t0 = Clock::now();
  for (uint32_t b = 0; b < o_.blocks; ++b) {
    std::memcpy(scratch.data() + uint64_t{b} * report_.block_bytes, Block(b).data(), report_.block_bytes);
  }
  const auto t1 = Clock::now();
  volatile std::byte keep = scratch[scratch.size() / 2];
  (void)keep;
  return UsBetween(t0, t1);
}

// The three ops in rounds (order rotating) until they have 3 x `seconds`
// of timed work together and at least `trials` ops each; one untimed round
// first.
Status LayersBench::MeasureSaves() {
  std::vector<std::byte> scratch(source_.size(), std::byte{1});
  std::vector<double> us[3];
  double total[3] = {0, 0, 0};
  for (uint32_t round = 0;; ++round) {
    for (int k = 0; k < 3; ++k) {
      const int op = (k + static_cast<int>(round)) % 3;
      Result<double> t = op == 0 ? Result<double>(TimeMemcpy(scratch)) : op == 1 ? TimeLayerSave() : TimePutBatch();
      if (!t.ok()) return t.status();
      if (round == 0) continue;  // warm-up
      us[op].push_back(*t);
      total[op] += *t;
    }
    if (round > o_.trials && total[0] + total[1] + total[2] >= 3 * o_.seconds * 1e6) break;
  }
  auto gbps = [this](double total_us, size_t ops) {
    return total_us > 0 ? double(report_.prefix_bytes) * double(ops) / (total_us * 1e-6) / 1e9 : 0;
  };
  report_.memcpy_ops = us[0].size();
  report_.memcpy_gbps = gbps(total[0], us[0].size());
  const char* names[] = {"", "layer-wise save", "PutBatch (whole prefix)"};
  for (int op = 1; op < 3; ++op) {
    report_.saves.push_back(SaveRow{names[op], us[op].size(), total[op] * 1e-6, gbps(total[op], us[op].size()),
                                    report_.memcpy_gbps});
  }
  return Status::Ok();
}

// ---- setup ----

NamespaceDescriptor BenchNamespace(const LayersBenchOptions& o, uint64_t salt) {
  NamespaceDescriptor ns;
  ns.model_id = "kvtier-bench/layers";
  ns.model_revision = "run-" + std::to_string(salt);
  ns.kv_dtype = "bf16";
  ns.block_tokens = o.block_tokens;
  ns.layer_count = o.layers;
  ns.kv_layout = "layer_major_kv";
  ns.bytes_per_token_per_layer = o.bytes_per_token_per_layer;
  return ns;
}

// The private daemon's [nvme] and [engine] tables.
std::string NvmeToml(const LayersBenchOptions& o, const std::string& nvme_path) {
  return "[nvme]\npath = " + support::TomlString(nvme_path) + "\ncapacity_bytes = " + std::to_string(o.nvme_bytes) +
         "\ndirect_io = true\nadmission = \"all\"\nreinsert_percent = 0\n"
         "[engine]\neviction = \"lru\"\nprefetch_percent = 0\n";
}

Status CheckOptions(const LayersBenchOptions& o) {
  if (o.blocks == 0 || o.layers == 0 || o.block_tokens == 0 || o.bytes_per_token_per_layer == 0) {
    return InvalidArgument("--blocks, --layers, --block-tokens and --bytes-per-token-per-layer must be positive");
  }
  if (o.trials == 0) return InvalidArgument("--trials must be positive");
  if (!(o.seconds > 0)) return InvalidArgument("--seconds must be positive");
  for (double f : o.compute_factors) {
    if (!(f > 0) || f > 1000) return InvalidArgument("--compute-factors must be in (0, 1000]");
  }
  return Status::Ok();
}

// Whether the daemon has an NVMe tier (its counters name one).
Result<bool> HasNvme(Client& client) {
  auto stats = client.Stats();
  if (!stats.ok()) return stats.status();
  return std::any_of(stats->begin(), stats->end(), [](const Counter& c) { return c.name == "nvme.capacity_bytes"; });
}

Status RunTierSections(LayersBench& bench, const LayersBenchOptions& o, Tier tier, Report& r) {
  std::fprintf(stderr, "kvtier bench layers: %s loads (%u trials)...\n", std::string(TierName(tier)).c_str(),
               o.trials);
  auto loads = bench.MeasureLoads(tier);
  if (!loads.ok()) return loads.status();
  r.loads.push_back(*loads);
  const double t_read_us = Median(loads->whole_us) / o.layers;
  for (double factor : o.compute_factors) {
    std::fprintf(stderr, "kvtier bench layers: %s overlap, t_comp = %.1fx t_read...\n",
                 std::string(TierName(tier)).c_str(), factor);
    auto overlap = bench.MeasureOverlap(tier, t_read_us, factor);
    if (!overlap.ok()) return overlap.status();
    r.overlaps.push_back(*overlap);
  }
  return Status::Ok();
}

Status Measure(Client& client, const LayersBenchOptions& o, uint64_t salt, bool nvme, pid_t daemon_pid,
               Report& r) {
  LayersBench bench(client, o, salt, daemon_pid, r);
  std::fprintf(stderr, "kvtier bench layers: calibrating the compute loop...\n");
  bench.compute().Calibrate();
  r.iterations_per_us = bench.compute().iterations_per_us();
  if (Status s = RunTierSections(bench, o, Tier::kHost, r); !s.ok()) return s;
  if (nvme) {
    Status s = RunTierSections(bench, o, Tier::kNvme, r);
    if (!s.ok() && (daemon_pid > 0 || s.code() != StatusCode::kNotFound)) return s;
    if (!s.ok()) {
      // A running daemon whose admission dropped the evicted prefix: no
      // NVMe figures from it, the rest still holds.
      r.nvme_note = "skipped: " + s.ToString() + " (the running daemon's nvme.admission?)";
      std::erase_if(r.loads, [](const LoadRow& l) { return l.tier == Tier::kNvme; });
      std::erase_if(r.overlaps, [](const OverlapRow& l) { return l.tier == Tier::kNvme; });
    }
  }
  std::fprintf(stderr, "kvtier bench layers: whole-block pins (reference)...\n");
  for (LoadRow& row : r.loads) {
    const bool below = row.tier == Tier::kNvme;
    const double t_comp = Median(row.whole_us) / o.layers;
    if (below) {
      auto plan = client.PlanPreload(Tier::kNvme, r.prefix_bytes / o.layers, t_comp, o.layers);
      if (plan.ok()) r.nvme_plan_bps_before_pins = plan->read_bytes_per_s;
    }
    if (Status s = bench.MeasureWholePins(row); !s.ok()) return s;
    if (below) {
      auto plan = client.PlanPreload(Tier::kNvme, r.prefix_bytes / o.layers, t_comp, o.layers);
      if (plan.ok()) r.nvme_plan_bps_after_pins = plan->read_bytes_per_s;
    }
  }
  std::fprintf(stderr, "kvtier bench layers: saves (%.1f s per op)...\n", o.seconds);
  return bench.MeasureSaves();
}

// `daemon_pid`: the private kvtierd's, 0 for a running one.
Status MeasureOn(const LayersBenchOptions& o, const std::string& socket_path, pid_t daemon_pid, Report& r) {
  const uint64_t salt = static_cast<uint64_t>(Clock::now().time_since_epoch().count()) ^
                        (static_cast<uint64_t>(::getpid()) << 40);
  ClientOptions options;
  options.socket_path = socket_path;
  options.client_name = "kvtier-bench-layers";
  options.namespaces = {BenchNamespace(o, salt)};
  options.verify_checksums = o.verify_checksums;
  auto client = Client::Connect(options);
  if (!client.ok()) return client.status();
  r.arena_bytes = (*client)->arena().size();
  if (r.prefix_bytes * 2 > r.arena_bytes) {
    return InvalidArgument("the host tier (" + support::Mib(r.arena_bytes) + ") must hold two prefixes of " +
                           support::Mib(r.prefix_bytes));
  }
  bool nvme = false;
  if (o.skip_nvme) {
    r.nvme_note = "skipped (--skip-nvme)";
  } else {
    auto has = HasNvme(**client);
    if (!has.ok()) return has.status();
    nvme = *has;
    if (!nvme) r.nvme_note = daemon_pid > 0 ? "the daemon has no NVMe tier" : "the running daemon has no NVMe tier";
  }
  return Measure(**client, o, salt, nvme, daemon_pid, r);
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "kvtier bench layers: %s\n", what.c_str());
  return 1;
}


int RunInDir(const LayersBenchOptions& o, const std::string& dir, Report& report) {
  std::optional<support::StartedServer> daemon;
  std::string socket_path = o.socket_path;
  const std::string nvme_path = o.dir + "/kvtier-bench-layers-" + std::to_string(::getpid()) + ".dat";
  if (socket_path.empty()) {
    const std::string path = o.kvtierd_path.empty() ? support::DefaultKvtierdPath() : o.kvtierd_path;
    std::fprintf(stderr, "kvtier bench layers: starting %s (arena %s, NVMe %s)...\n", path.c_str(),
                 support::Mib(o.arena_bytes).c_str(), o.skip_nvme ? "none" : nvme_path.c_str());
    auto started = support::StartKvtierd(path, dir, o.arena_bytes, std::chrono::seconds(60),
                                o.skip_nvme ? std::string() : NvmeToml(o, nvme_path));
    if (!started.ok()) {
      std::filesystem::remove(nvme_path);
      support::RemoveTree(nvme_path + ".index");
      return Fail("cannot start kvtierd: " + started.status().ToString() + "\n(use --kvtierd PATH or --socket PATH)");
    }
    daemon = std::move(*started);
    socket_path = daemon->socket_path;
    report.daemon = "private " + path + (o.skip_nvme ? "" : ", NVMe file " + nvme_path);
  } else {
    report.daemon = "running at " + o.socket_path;
  }
  Status s = MeasureOn(o, socket_path, daemon ? daemon->process.pid() : 0, report);
  if (daemon) {
    const std::string how = daemon->process.Stop();
    if (how != "exit status 0") std::fprintf(stderr, "kvtier bench layers: kvtierd ended with %s\n", how.c_str());
    if (!s.ok()) std::fprintf(stderr, "kvtierd log:\n%s\n", support::FileTail(daemon->log_path).c_str());
    std::error_code ec;
    std::filesystem::remove(nvme_path, ec);  // best effort, as support::RemoveTree
    support::RemoveTree(nvme_path + ".index");
  }
  if (!s.ok()) return Fail(s.ToString());
  PrintLayersReport(report);
  if (!o.json_path.empty()) {
    if (Status j = WriteLayersJson(o.json_path, report); !j.ok()) return Fail(j.ToString());
  }
  return 0;
}

}  // namespace

void AddLayersBenchOptions(CLI::App& app, LayersBenchOptions& o) {
  app.add_option("--socket", o.socket_path, "Use the kvtierd listening here instead of starting one");
  app.add_option("--kvtierd", o.kvtierd_path, "kvtierd binary to start (default: the kvtierd of this build or install)");
  app.add_option("--dir", o.dir, "Directory of the private kvtierd's NVMe file (removed after)")
      ->capture_default_str();
  app.add_option("--arena-bytes", o.arena_bytes, "Host tier of the private kvtierd")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--nvme-bytes", o.nvme_bytes, "NVMe file of the private kvtierd")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--blocks", o.blocks, "Blocks in the prefix")->capture_default_str();
  app.add_option("--block-tokens", o.block_tokens, "Tokens per block (namespace)")->capture_default_str();
  app.add_option("--layers", o.layers, "Layers per block (namespace layer_count)")->capture_default_str();
  app.add_option("--bytes-per-token-per-layer", o.bytes_per_token_per_layer, "KV bytes per token per layer")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  app.add_option("--trials", o.trials, "Trials per load case (medians are reported)")->capture_default_str();
  app.add_option("--seconds", o.seconds, "Timed seconds per save op on average (memcpy, layer-wise save, PutBatch run in rounds)")
      ->capture_default_str();
  app.add_option("--compute-factors", o.compute_factors, "t_comp as multiples of the measured t_read")
      ->delimiter(',')
      ->capture_default_str();
  app.add_flag("--skip-nvme", o.skip_nvme, "No NVMe tier (host tier only)");
  app.add_flag("--verify-checksums", o.verify_checksums,
               "Loads check every layer against its checksum (ClientOptions::verify_checksums)");
  app.add_option("--json", o.json_path, "Also write the results to this file as JSON");
}

int RunLayersBench(const LayersBenchOptions& o) {
  if (Status s = CheckOptions(o); !s.ok()) return Fail(s.ToString());
  Report report;
  report.blocks = o.blocks;
  report.layers = o.layers;
  report.layer_bytes = uint64_t{o.block_tokens} * o.bytes_per_token_per_layer;
  report.block_bytes = report.layer_bytes * o.layers;
  report.prefix_bytes = report.block_bytes * o.blocks;
  report.trials = o.trials;
  report.verify_checksums = o.verify_checksums;
  auto dir = support::MakeTempDir("kvtier-bench-");
  if (!dir.ok()) return Fail(dir.status().ToString());
  const int rc = RunInDir(o, *dir, report);
  support::RemoveTree(*dir);
  return rc;
}

}  // namespace kvtier::tools
