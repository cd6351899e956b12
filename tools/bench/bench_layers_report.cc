// Tables and JSON of `kvtier bench layers` (bench_layers_report.h).
#include "tools/bench/bench_layers_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "support/format.h"

namespace kvtier::tools {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double PredictedHidden(const OverlapRow& r, uint32_t layers) {
  if (!r.planned || r.t_read_us <= 0) return 0;
  return std::clamp(1.0 - Median(r.stall_us) / (double(layers) * r.t_read_us), 0.0, 1.0);
}

double FormulaHidden(const OverlapRow& r, uint32_t layers) {
  if (r.t_read_us <= 0) return 0;
  double n_pre = 1;
  if (r.t_read_us > r.t_comp_us) {
    n_pre = std::clamp(std::ceil(layers - (layers - 1) * r.t_comp_us / r.t_read_us - 1e-9), 1.0, double(layers));
  }
  return 1.0 - n_pre / layers;
}

bool GoalApplies(const OverlapRow& r) { return r.t_read_us > 0 && r.t_comp_us >= r.t_read_us * (1 - 1e-9); }

namespace {

constexpr double kGoalHidden = kLayersGoalHidden;

void PrintLoads(const Report& r) {
  std::printf(
      "\n1. Time to the first layer vs time to the whole prefix (BeginLoad, zero-copy), medians of %u\n"
      "   trials, microseconds from the BeginLoad call; ideal first/whole = 1/%u = %.3f:\n\n",
      r.trials, r.layers, 1.0 / r.layers);
  std::printf("  %-5s %9s %15s %9s %12s %10s %7s %13s %11s\n", "tier", "begin us", "first layer us", "whole us",
              "first/whole", "t_read us", "GB/s", "pin whole us", "kvtierd CPU");
  auto whole_number = [](const std::vector<double>& v) {
    return v.empty() ? std::string("-") : std::to_string(static_cast<long long>(Median(v)));
  };
  for (const LoadRow& l : r.loads) {
    const double whole = Median(l.whole_us);
    std::printf("  %-5s %9.0f %15.0f %9.0f %12.3f %10.1f %7.2f %13s %11s\n", std::string(TierName(l.tier)).c_str(),
                Median(l.begin_us), Median(l.first_us), whole, whole > 0 ? Median(l.first_us) / whole : 0,
                whole / r.layers, whole > 0 ? double(r.prefix_bytes) / (whole * 1e-6) / 1e9 : 0,
                whole_number(l.pin_us).c_str(), whole_number(l.daemon_cpu_us).c_str());
  }
  for (const LoadRow& l : r.loads) {
    if (l.tier != Tier::kNvme || l.device_reads.empty()) continue;
    std::printf(
        "\n  NVMe device reads per load: layer-wise %.0f (%s) for %u layer reads of %u blocks;\n"
        "  whole-block Pin %.0f (%s), kvtierd CPU %s us\n",
        Median(l.device_reads), support::Mib(static_cast<uint64_t>(Median(l.device_read_bytes))).c_str(),
        r.blocks * r.layers, r.blocks, Median(l.pin_device_reads),
        support::Mib(static_cast<uint64_t>(Median(l.pin_device_read_bytes))).c_str(),
        whole_number(l.pin_daemon_cpu_us).c_str());
  }
  std::printf(
      "\n  begin: BeginLoad returned (one round trip; blocks pinned or claimed, reads started)\n"
      "  first layer: WaitLayer(0) returned; whole: WaitAll returned; t_read = whole / %u\n"
      "  GB/s: prefix bytes / whole; pin whole: reference, Client::Pin of the same blocks (whole-block\n"
      "  promotion, not layer-wise), measured after section 2; kvtierd CPU: the private daemon's CPU\n"
      "  time (us, all threads, /proc schedstat) from BeginLoad to WaitAll\n",
      r.layers);
}

void PrintOverlaps(const Report& r) {
  std::printf(
      "\n2. Load time hidden behind a per-layer compute (busy loop, %.0f iterations/us): layer-wise\n"
      "   T_lw = BeginLoad .. {WaitLayer(l); compute} vs load-then-compute T_ltc = BeginLoad .. WaitAll\n"
      "   (T_load) .. compute x %u; hidden = (T_ltc - T_lw) / T_load, median of %u paired trials, beside\n"
      "   what the formula predicts: with the plan (1 - plan.stall_us / (%u t_read), clipped to [0, 1])\n"
      "   and with the measured t_read (1 - n_pre / %u). Goal: >= %.0f%% where t_read <= t_comp.\n\n",
      r.iterations_per_us, r.layers, r.trials, r.layers, r.layers, kGoalHidden * 100);
  std::printf("  %-5s %6s %10s %9s %11s %11s %12s  %s\n", "tier", "t_comp", "t_comp us", "hidden", "plan says",
              "t_read says", "vs t_read's", "goal");
  for (const OverlapRow& o : r.overlaps) {
    const double hidden = Median(o.hidden);
    const double formula = FormulaHidden(o, r.layers);
    const char* goal = !GoalApplies(o) ? "n/a" : hidden >= kGoalHidden ? "met" : "NOT MET";
    char ratio[16] = "-";
    if (formula > 0) std::snprintf(ratio, sizeof(ratio), "%.2fx", hidden / formula);
    std::printf("  %-5s %5.1fx %10.1f %8.1f%% %10.1f%% %10.1f%% %12s  %s\n", std::string(TierName(o.tier)).c_str(),
                o.factor, o.t_comp_us, hidden * 100, PredictedHidden(o, r.layers) * 100, formula * 100, ratio, goal);
  }
  std::printf(
      "\n  Where the time went (medians, us): layer-wise waits (BeginLoad and WaitLayer) and computes,\n"
      "  load-then-compute's load and computes; not waited = 1 - lw wait / T_load; lw kvtd: the private\n"
      "  kvtierd's CPU time during the layer-wise run; the plan's n_pre, t_read and stall; the warm-up\n"
      "  trial's BeginLoad:\n\n");
  std::printf("  %-5s %6s %8s %8s %8s %8s %8s %8s %8s %8s %5s %9s %8s %8s\n", "tier", "t_comp", "T_load", "T_lw",
              "T_ltc", "lw wait", "lw comp", "ltc comp", "not wtd", "lw kvtd", "n_pre", "plan t_rd", "stall",
              "warm-up");
  for (const OverlapRow& o : r.overlaps) {
    const double load = Median(o.load_us);
    std::printf("  %-5s %5.1fx %8.0f %8.0f %8.0f %8.0f %8.0f %8.0f %7.1f%% %8s %5.0f %9.1f %8.0f %8.0f\n",
                std::string(TierName(o.tier)).c_str(), o.factor, load, Median(o.lw_us), Median(o.ltc_us),
                Median(o.lw_wait_us), Median(o.lw_compute_us), Median(o.compute_us),
                load > 0 ? (1 - Median(o.lw_wait_us) / load) * 100 : 0,
                o.lw_daemon_cpu_us.empty() ? "-" : std::to_string((long long)Median(o.lw_daemon_cpu_us)).c_str(),
                Median(o.n_pre), Median(o.plan_read_us), Median(o.stall_us), o.warmup_begin_us);
  }
  std::printf(
      "\n  hidden = not waited - (lw comp - ltc comp) / T_load: a compute slowed down while the daemon\n"
      "  reads (both on this machine's CPUs) counts against the layer-wise run.\n");
  for (const OverlapRow& o : r.overlaps) {
    const double nominal = o.t_comp_us * r.layers;
    const double ltc = Median(o.compute_us) / nominal, lw = Median(o.lw_compute_us) / nominal;
    if (nominal < 1000 || (std::abs(ltc - 1) <= 0.1 && std::abs(lw - 1) <= 0.1)) continue;
    std::printf(
        "  WARNING: %s %.1fx: the computes took %.2fx (layer-wise) and %.2fx (load-then-compute) their\n"
        "  calibrated time: the CPUs are contended and the hidden share is skewed by it.\n",
        std::string(TierName(o.tier)).c_str(), o.factor, lw, ltc);
  }
}

void PrintSaves(const Report& r) {
  std::printf("\n3. Saving the prefix (%s), GB/s = 1e9 bytes/s, beside memcpy of the same bytes (%llu copies)\n\n",
              support::Mib(r.prefix_bytes).c_str(), (unsigned long long)r.memcpy_ops);
  std::printf("  %-24s %6s %9s %12s %10s\n", "op", "ops", "GB/s", "memcpy GB/s", "vs memcpy");
  for (const SaveRow& s : r.saves) {
    std::printf("  %-24s %6llu %9.2f %12.2f %9.2fx\n", s.op.c_str(), (unsigned long long)s.ops, s.gbps, s.memcpy_gbps,
                s.ratio());
  }
  std::printf(
      "\n  layer-wise save: BeginSave (one Reserve), SaveLayer(l) for each of %u layers (a copy per block),\n"
      "  FinishSave (one Commit; the daemon hashes each block). PutBatch: one Reserve, copies hashing on\n"
      "  the way, one Commit with the checksums. Erasing the keys between ops is not timed.\n",
      r.layers);
}

void PrintGoals(const Report& r) {
  std::printf("\nGoal: >= %.0f%% of the load hidden whenever the formula says t_read <= t_comp (measured t_read)\n",
              kGoalHidden * 100);
  bool any = false;
  for (const OverlapRow& o : r.overlaps) {
    if (!GoalApplies(o)) continue;
    any = true;
    std::printf("  %-5s t_comp = %.1fx t_read: %.1f%% hidden: %s\n", std::string(TierName(o.tier)).c_str(), o.factor,
                Median(o.hidden) * 100, Median(o.hidden) >= kGoalHidden ? "met" : "NOT MET");
  }
  if (!any) std::printf("  n/a: t_read > t_comp in every case\n");
  if (!r.nvme_note.empty()) std::printf("  NVMe part: %s\n", r.nvme_note.c_str());
  if (r.nvme_plan_bps_before_pins > 0) {
    std::printf("  NVMe plan bandwidth: %.2f GB/s before the whole-block pins, %.2f GB/s after\n",
                r.nvme_plan_bps_before_pins / 1e9, r.nvme_plan_bps_after_pins / 1e9);
  }
  if (r.setup_retries > 0) {
    std::printf("  %llu prefix(es) lost a block on the way to NVMe and were put again\n",
                (unsigned long long)r.setup_retries);
  }
}

// `, "name": [v...]`
void JsonList(std::ostream& out, const char* name, const std::vector<double>& v) {
  out << ", \"" << name << "\": [";
  for (size_t i = 0; i < v.size(); ++i) out << (i ? ", " : "") << v[i];
  out << "]";
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out + "\"";
}

void WriteJsonLoads(std::ostream& out, const Report& r) {
  out << "  \"loads\": [\n";
  for (size_t i = 0; i < r.loads.size(); ++i) {
    const LoadRow& l = r.loads[i];
    out << "    {\"tier\": \"" << TierName(l.tier) << "\", \"first_us\": " << Median(l.first_us)
        << ", \"whole_us\": " << Median(l.whole_us) << ", \"begin_us\": " << Median(l.begin_us)
        << ", \"t_read_us\": " << Median(l.whole_us) / r.layers;
    JsonList(out, "first_us_trials", l.first_us);
    JsonList(out, "whole_us_trials", l.whole_us);
    JsonList(out, "pin_whole_us_trials", l.pin_us);
    JsonList(out, "kvtierd_cpu_us_trials", l.daemon_cpu_us);
    JsonList(out, "device_reads_trials", l.device_reads);
    JsonList(out, "device_read_bytes_trials", l.device_read_bytes);
    JsonList(out, "pin_device_reads_trials", l.pin_device_reads);
    JsonList(out, "pin_device_read_bytes_trials", l.pin_device_read_bytes);
    JsonList(out, "pin_kvtierd_cpu_us_trials", l.pin_daemon_cpu_us);
    out << "}" << (i + 1 < r.loads.size() ? "," : "") << "\n";
  }
  out << "  ],\n";
}

void WriteJsonOverlaps(std::ostream& out, const Report& r) {
  out << "  \"overlaps\": [\n";
  for (size_t i = 0; i < r.overlaps.size(); ++i) {
    const OverlapRow& o = r.overlaps[i];
    out << "    {\"tier\": \"" << TierName(o.tier) << "\", \"factor\": " << o.factor
        << ", \"t_read_us\": " << o.t_read_us << ", \"t_comp_us\": " << o.t_comp_us
        << ", \"hidden\": " << Median(o.hidden) << ", \"predicted_hidden_plan\": " << PredictedHidden(o, r.layers)
        << ", \"predicted_hidden_t_read\": " << FormulaHidden(o, r.layers)
        << ", \"goal_applies\": " << (GoalApplies(o) ? "true" : "false")
        << ", \"warmup_begin_us\": " << o.warmup_begin_us;
    JsonList(out, "hidden_trials", o.hidden);
    JsonList(out, "lw_us", o.lw_us);
    JsonList(out, "ltc_us", o.ltc_us);
    JsonList(out, "load_us", o.load_us);
    JsonList(out, "compute_us", o.compute_us);
    JsonList(out, "lw_wait_us", o.lw_wait_us);
    JsonList(out, "lw_compute_us", o.lw_compute_us);
    JsonList(out, "lw_kvtierd_cpu_us", o.lw_daemon_cpu_us);
    JsonList(out, "ltc_kvtierd_cpu_us", o.ltc_daemon_cpu_us);
    JsonList(out, "plan_stall_us", o.stall_us);
    JsonList(out, "plan_read_us_per_layer", o.plan_read_us);
    JsonList(out, "plan_layers_to_preload", o.n_pre);
    out << "}" << (i + 1 < r.overlaps.size() ? "," : "") << "\n";
  }
  out << "  ],\n";
}

}  // namespace

void PrintLayersReport(const Report& r) {
  std::printf(
      "kvtier bench layers: kvtierd %s, arena %s; prefix %u blocks x %u layers, %s a block layer,\n"
      "%s a block, %s the prefix, %s a layer across the blocks; checksum verification %s\n",
      r.daemon.c_str(), support::Mib(r.arena_bytes).c_str(), r.blocks, r.layers, support::Mib(r.layer_bytes).c_str(),
      support::Mib(r.block_bytes).c_str(), support::Mib(r.prefix_bytes).c_str(),
      support::Mib(r.prefix_bytes / r.layers).c_str(), r.verify_checksums ? "on" : "off");
  PrintLoads(r);
  PrintOverlaps(r);
  PrintSaves(r);
  PrintGoals(r);
}

Status WriteLayersJson(const std::string& path, const Report& r) {
  std::ofstream out(path);
  out.precision(6);
  out << "{\n  \"bench\": \"layers\",\n  \"daemon\": " << JsonString(r.daemon) << ",\n  \"blocks\": " << r.blocks
      << ", \"layers\": " << r.layers << ", \"layer_bytes\": " << r.layer_bytes
      << ", \"block_bytes\": " << r.block_bytes << ", \"prefix_bytes\": " << r.prefix_bytes
      << ", \"arena_bytes\": " << r.arena_bytes << ", \"trials\": " << r.trials
      << ",\n  \"compute_iterations_per_us\": " << r.iterations_per_us << ", \"setup_retries\": " << r.setup_retries
      << ", \"nvme_note\": " << JsonString(r.nvme_note)
      << ",\n  \"nvme_plan_bytes_per_s_before_pins\": " << r.nvme_plan_bps_before_pins
      << ", \"nvme_plan_bytes_per_s_after_pins\": " << r.nvme_plan_bps_after_pins << ",\n";
  WriteJsonLoads(out, r);
  WriteJsonOverlaps(out, r);
  out << "  \"saves\": [\n";
  for (size_t i = 0; i < r.saves.size(); ++i) {
    const SaveRow& s = r.saves[i];
    out << "    {\"op\": " << JsonString(s.op) << ", \"ops\": " << s.ops << ", \"seconds\": " << s.seconds
        << ", \"gbps\": " << s.gbps << ", \"memcpy_gbps\": " << s.memcpy_gbps << ", \"ratio\": " << s.ratio() << "}"
        << (i + 1 < r.saves.size() ? "," : "") << "\n";
  }
  out << "  ]\n}\n";
  out.close();
  if (!out) return IoError("cannot write " + path);
  return Status::Ok();
}

}  // namespace kvtier::tools
