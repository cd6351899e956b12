// The figures of `kvtier bench layers` (bench_layers*.cc): what each
// section measured, the formula's predictions beside them, and their
// printed tables and JSON copy. Thread-compatible plain data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/client.h"
#include "kvtier/status.h"

namespace kvtier::tools {

// The goal: this share of the load hidden where t_read <= t_comp.
inline constexpr double kLayersGoalHidden = 0.9;

// The median of `v` (the mean of the middle two of an even count); 0 if empty.
double Median(std::vector<double> v);

// Section 1: one tier's loads.
struct LoadRow {
  Tier tier = Tier::kNone;
  std::vector<double> begin_us;                         // BeginLoad returned
  std::vector<double> first_us;                         // WaitLayer(0) returned
  std::vector<double> whole_us;                         // WaitAll returned
  std::vector<double> pin_us;                           // reference: Pin of the whole blocks (not layer-wise)
  std::vector<double> daemon_cpu_us;                    // the private kvtierd's CPU time from BeginLoad to WaitAll
  std::vector<double> device_reads, device_read_bytes;  // NVMe device reads a load made
  std::vector<double> pin_device_reads, pin_device_read_bytes;  // ... and a whole-block Pin
  std::vector<double> pin_daemon_cpu_us;                        // the private kvtierd's CPU time in that Pin
};

// Section 2: one tier at one t_comp.
struct OverlapRow {
  Tier tier = Tier::kNone;
  double factor = 0;     // t_comp / t_read
  double t_read_us = 0;  // section 1's whole / layers
  double t_comp_us = 0;
  std::vector<double> lw_us, ltc_us, load_us, compute_us, hidden;  // per trial (hidden paired)
  std::vector<double> lw_wait_us, lw_compute_us;                   // layer-wise: waiting, computing
  std::vector<double> lw_daemon_cpu_us;                            // the private kvtierd's, layer-wise
  std::vector<double> ltc_daemon_cpu_us;                           // the private kvtierd's, load-then-compute
  double warmup_begin_us = 0;                                      // the warm-up's BeginLoad
  std::vector<double> stall_us, plan_read_us, n_pre;               // the layer-wise loads' plans
  bool planned = false;                                            // every load carried a plan
};

// Section 3.
struct SaveRow {
  std::string op;
  uint64_t ops = 0;
  double seconds = 0;  // timed, all ops
  double gbps = 0;
  double memcpy_gbps = 0;
  double ratio() const { return memcpy_gbps > 0 ? gbps / memcpy_gbps : 0; }
};

struct Report {
  std::string daemon;
  std::string nvme_note;  // why there is no NVMe part, if there is none
  uint32_t blocks = 0, layers = 0;
  uint64_t layer_bytes = 0, block_bytes = 0, prefix_bytes = 0, arena_bytes = 0;
  uint32_t trials = 0;
  double iterations_per_us = 0;
  std::vector<LoadRow> loads;
  std::vector<OverlapRow> overlaps;
  std::vector<SaveRow> saves;
  uint64_t memcpy_ops = 0;
  double memcpy_gbps = 0;
  uint64_t setup_retries = 0;
  double nvme_plan_bps_before_pins = 0, nvme_plan_bps_after_pins = 0;
  bool verify_checksums = false;  // the bench client's ClientOptions::verify_checksums
};

// The formula's prediction with the plan's stall (the daemon's t_read: a
// low percentile of its measured bandwidth, plus a margin) against the
// measured load: 1 - stall / (L t_read), in [0, 1].
double PredictedHidden(const OverlapRow& r, uint32_t layers);
// The same formula (docs/POLICIES.md) with the measured t_read:
// n_pre = 1 if t_read <= t_comp, else ceil(L - (L - 1) t_comp / t_read);
// hidden = 1 - n_pre / L.
double FormulaHidden(const OverlapRow& r, uint32_t layers);
// The goal applies where the formula says t_read <= t_comp, with the
// t_read measured in section 1 (the plan's own t_read is deliberately
// pessimistic; its n_pre is printed beside).
bool GoalApplies(const OverlapRow& r);

// The tables, on stdout.
void PrintLayersReport(const Report& r);
// The JSON copy; IoError if `path` cannot be written.
Status WriteLayersJson(const std::string& path, const Report& r);

}  // namespace kvtier::tools
