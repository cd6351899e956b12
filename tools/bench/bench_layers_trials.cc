// LayersBench's measurements (bench_layers_trials.h): timed loads (first
// layer and whole prefix), layer-wise loads against load-then-compute
// behind a busy-loop compute, whole-block pins, and saves beside memcpy.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "tools/bench/bench_layers_trials.h"

namespace kvtier::tools::layers_bench {

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
        return Corruption("block " + std::to_string(b) + " layer " + std::to_string(l) + " differs from what was put");
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
    report_.saves.push_back(
        SaveRow{names[op], us[op].size(), total[op] * 1e-6, gbps(total[op], us[op].size()), report_.memcpy_gbps});
  }
  return Status::Ok();
}

}  // namespace kvtier::tools::layers_bench
