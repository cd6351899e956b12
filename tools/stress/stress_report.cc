#include "tools/stress/stress_report.h"

#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

namespace kvtier::tools {
namespace {

double Us(uint64_t ns) { return static_cast<double>(ns) / 1000.0; }

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

void PrintCrashLoop(const CrashLoopReport& c) {
  std::printf("\ncrash loop: %zu kills in %.1f s\n", c.cycles.empty() ? size_t{0} : c.cycles.size() - 1, c.seconds);
  std::printf("%5s %8s %8s %8s %6s %8s %8s %8s %8s %6s %6s %8s %8s %7s %8s %6s\n", "cycle", "start_ms", "reclaims",
              "cp_nvme", "loaded", "stale", "corrupt", "on_nvme", "verified", "strict", "acked", "survived", "missing",
              "erased", "load_ms", "ops");
  for (const CrashCycle& y : c.cycles) {
    std::printf("%5u %8.0f %8" PRId64 " %8" PRId64 " %6" PRId64 " %8" PRId64 " %8" PRId64 " %8" PRIu64 " %8" PRIu64
                " %6s %6" PRIu64 " %8" PRIu64 " %8" PRIu64 " %7" PRIu64 " %8.0f %6" PRIu64 "\n",
                y.cycle, y.start_ms, y.reclaims_at_checkpoint, y.nvme_blocks_at_checkpoint, y.recovery_loaded,
                y.recovery_dropped_stale, y.recovery_dropped_corrupt, y.nvme_resident, y.verified,
                y.strict ? "yes" : "no", y.acked, y.acked_survived, y.acked_missing, y.acked_missing_erased, y.load_ms,
                y.ops);
  }
  std::printf(
      "(per row: the restart after the previous row's kill; cp_nvme = the NVMe tier's blocks at the "
      "checkpoint before that kill, reclaims = NVMe regions reclaimed by then)\n");
  std::printf("blocks verified after restarts %" PRIu64 "; acknowledged durable %" PRIu64 ", survived %" PRIu64
              ", lost but reported missing %" PRIu64 " (%" PRIu64 " of them erased by the load)\n",
              c.blocks_verified, c.acked, c.acked_survived, c.lost_but_reported, c.lost_erased_by_load);
  if (c.keep_host) {
    std::printf("host tier kept: in the host tier at checkpoints %" PRIu64 ", host hits after the restart %" PRIu64
                ", missing after load past the checkpoint %" PRIu64 ", lost after a strict checkpoint %" PRIu64
                ", kept blocks failing their check %" PRId64 "\n",
                c.host_acked, c.host_survived, c.host_lost_but_reported, c.host_violations, c.host_adopt_corrupt);
  }
  std::printf("durability violations %" PRIu64 ", recoveries that dropped entries %" PRIu64
              ", verification violations %" PRIu64 ", verification errors %" PRIu64 ", reads refused for room %" PRIu64
              "\n",
              c.durability_violations, c.repairs, c.verify_violations, c.verify_errors, c.verify_refused);
  for (const auto& p : c.problems) std::printf("  %s\n", p.c_str());
}

void WriteCrashJson(std::ostream& out, const CrashLoopReport& c) {
  out << ",\n  \"crash_loop\": {\"kills\": " << (c.cycles.empty() ? 0 : c.cycles.size() - 1)
      << ", \"seconds\": " << c.seconds << ", \"blocks_verified\": " << c.blocks_verified << ", \"acked\": " << c.acked
      << ", \"acked_survived\": " << c.acked_survived << ", \"lost_but_reported\": " << c.lost_but_reported
      << ", \"lost_erased_by_load\": " << c.lost_erased_by_load
      << ", \"durability_violations\": " << c.durability_violations << ", \"repairs\": " << c.repairs
      << ", \"verify_violations\": " << c.verify_violations << ", \"verify_errors\": " << c.verify_errors
      << ", \"verify_refused\": " << c.verify_refused << ", \"keep_host\": " << (c.keep_host ? "true" : "false")
      << ", \"host_acked\": " << c.host_acked << ", \"host_survived\": " << c.host_survived
      << ", \"host_lost_but_reported\": " << c.host_lost_but_reported << ", \"host_violations\": " << c.host_violations
      << ", \"host_adopt_corrupt\": " << c.host_adopt_corrupt << ",\n    \"problems\": [";
  for (size_t i = 0; i < c.problems.size(); ++i) out << (i ? ", " : "") << JsonString(c.problems[i]);
  out << "],\n    \"cycles\": [";
  for (size_t i = 0; i < c.cycles.size(); ++i) {
    const CrashCycle& y = c.cycles[i];
    out << (i ? ",\n      " : "\n      ") << "{\"cycle\": " << y.cycle << ", \"start_ms\": " << y.start_ms
        << ", \"recovery_loaded\": " << y.recovery_loaded
        << ", \"recovery_dropped_stale\": " << y.recovery_dropped_stale
        << ", \"recovery_dropped_corrupt\": " << y.recovery_dropped_corrupt
        << ", \"nvme_resident\": " << y.nvme_resident << ", \"verified\": " << y.verified
        << ", \"strict\": " << (y.strict ? "true" : "false") << ", \"acked\": " << y.acked
        << ", \"acked_survived\": " << y.acked_survived << ", \"acked_missing\": " << y.acked_missing
        << ", \"acked_missing_erased\": " << y.acked_missing_erased
        << ", \"nvme_blocks_at_checkpoint\": " << y.nvme_blocks_at_checkpoint
        << ", \"reclaims_at_checkpoint\": " << y.reclaims_at_checkpoint << ", \"load_ms\": " << y.load_ms
        << ", \"ops\": " << y.ops << ", \"violations\": " << y.violations << ", \"host_acked\": " << y.host_acked
        << ", \"host_survived\": " << y.host_survived << ", \"host_adopted\": " << y.host_adopted << "}";
  }
  out << "]}";
}

}  // namespace

int StressExitCode(const StressReport& r) {
  const CrashLoopReport& c = r.crash;
  if (r.tally.violations > 0 || r.daemon_died) return 1;
  if (r.crash_loop && (c.durability_violations > 0 || c.host_violations > 0 || c.repairs > 0 ||
                       c.verify_violations > 0 || !c.problems.empty())) {
    return 1;
  }
  if (r.tally.errors_total() > 0 || c.verify_errors > 0) return 3;
  return 0;
}

void PrintStressReport(const StressReport& r) {
  std::printf("kvtier stress: seed %" PRIu64 ", %u clients, %.1f s of load; %s\n", r.seed, r.clients, r.seconds,
              r.daemon.c_str());
  std::printf("key space: %s; mix %s\n\n", r.key_space.c_str(), r.mix.c_str());
  std::printf("%-8s %9s %9s %9s %8s %8s %7s %5s %9s %9s %9s %9s\n", "kind", "ops", "blocks", "ok", "misses", "refused",
              "errors", "viol", "p50_us", "p99_us", "p999_us", "max_us");
  for (size_t i = 0; i < kOpKinds; ++i) {
    const KindTally& k = r.tally.kinds[i];
    std::printf("%-8s %9" PRIu64 " %9" PRIu64 " %9" PRIu64 " %8" PRIu64 " %8" PRIu64 " %7" PRIu64 " %5" PRIu64
                " %9.1f %9.1f %9.1f %9.1f\n",
                std::string(OpKindName(static_cast<OpKind>(i))).c_str(), k.ops, k.blocks, k.ok, k.misses, k.refused,
                k.errors, k.violations, Us(k.latency.Percentile(0.5)), Us(k.latency.Percentile(0.99)),
                Us(k.latency.Percentile(0.999)), Us(k.latency.max()));
  }
  const auto& t = r.tally.lookup_tiers;
  std::printf("\nlookup hits by tier: hbm %" PRIu64 ", host %" PRIu64 ", nvme %" PRIu64 ", remote %" PRIu64 "\n", t[1],
              t[2], t[3], t[4]);
  if (!r.daemon_counters.empty()) {
    std::printf("daemon:");
    for (size_t i = 0; i < r.daemon_counters.size(); ++i) {
      std::printf("%s %s %" PRId64, i ? "," : "", r.daemon_counters[i].name.c_str(), r.daemon_counters[i].value);
    }
    std::printf("\n");
  }
  std::printf("errors: %" PRIu64 "%s\n", r.tally.errors_total(), r.tally.errors.empty() ? "" : ":");
  for (const auto& [name, e] : r.tally.errors) {
    std::printf("  %s x%" PRIu64 " (first: %s)\n", name.c_str(), e.count, e.first_message.c_str());
  }
  if (r.tally.after_kill > 0) std::printf("calls failed after a deliberate kill: %" PRIu64 "\n", r.tally.after_kill);
  std::printf("violations: %" PRIu64 "\n", r.tally.violations);
  for (const Violation& v : r.tally.samples) {
    std::printf("  %s %s key %s: %s\n", std::string(OpKindName(v.kind)).c_str(), v.ns.c_str(), v.key.ToHex().c_str(),
                v.what.c_str());
  }
  if (r.daemon_died || !r.daemon_problem.empty()) {
    std::printf("daemon: %s%s\n", r.daemon_died ? "DIED: " : "", r.daemon_problem.c_str());
  }
  if (r.crash_loop) PrintCrashLoop(r.crash);
  const int code = StressExitCode(r);
  std::printf("\nresult: %s (rerun with --seed %" PRIu64 ")\n",
              code == 0   ? "ok"
              : code == 3 ? "unexpected errors"
                          : "FAILED",
              r.seed);
  std::fflush(stdout);
}

Status WriteStressJson(const std::string& path, const StressReport& r) {
  std::ostringstream out;
  out << "{\"seed\": " << r.seed << ", \"clients\": " << r.clients << ", \"seconds\": " << r.seconds
      << ", \"daemon\": " << JsonString(r.daemon) << ", \"key_space\": " << JsonString(r.key_space)
      << ", \"mix\": " << JsonString(r.mix) << ",\n  \"kinds\": {";
  for (size_t i = 0; i < kOpKinds; ++i) {
    const KindTally& k = r.tally.kinds[i];
    out << (i ? ",\n    " : "\n    ") << JsonString(std::string(OpKindName(static_cast<OpKind>(i))))
        << ": {\"ops\": " << k.ops << ", \"blocks\": " << k.blocks << ", \"ok\": " << k.ok
        << ", \"misses\": " << k.misses << ", \"refused\": " << k.refused << ", \"errors\": " << k.errors
        << ", \"violations\": " << k.violations << ", \"latency_us\": {\"p50\": " << Us(k.latency.Percentile(0.5))
        << ", \"p99\": " << Us(k.latency.Percentile(0.99)) << ", \"p999\": " << Us(k.latency.Percentile(0.999))
        << ", \"max\": " << Us(k.latency.max()) << "}}";
  }
  const auto& t = r.tally.lookup_tiers;
  out << "},\n  \"lookup_hits\": {\"hbm\": " << t[1] << ", \"host\": " << t[2] << ", \"nvme\": " << t[3]
      << ", \"remote\": " << t[4] << "},\n  \"operations\": " << r.tally.ops_total()
      << ", \"violations\": " << r.tally.violations << ", \"errors\": " << r.tally.errors_total()
      << ", \"after_kill\": " << r.tally.after_kill << ", \"daemon_died\": " << (r.daemon_died ? "true" : "false")
      << ", \"daemon_problem\": " << JsonString(r.daemon_problem) << ",\n  \"error_counts\": {";
  bool first = true;
  for (const auto& [name, e] : r.tally.errors) {
    out << (first ? "" : ", ") << JsonString(name) << ": {\"count\": " << e.count
        << ", \"first\": " << JsonString(e.first_message) << "}";
    first = false;
  }
  out << "},\n  \"violation_samples\": [";
  for (size_t i = 0; i < r.tally.samples.size(); ++i) {
    const Violation& v = r.tally.samples[i];
    out << (i ? ", " : "") << "{\"kind\": " << JsonString(std::string(OpKindName(v.kind)))
        << ", \"namespace\": " << JsonString(v.ns) << ", \"key\": " << JsonString(v.key.ToHex())
        << ", \"what\": " << JsonString(v.what) << "}";
  }
  out << "],\n  \"daemon_counters\": {";
  for (size_t i = 0; i < r.daemon_counters.size(); ++i) {
    out << (i ? ", " : "") << JsonString(r.daemon_counters[i].name) << ": " << r.daemon_counters[i].value;
  }
  out << "}";
  if (r.crash_loop) WriteCrashJson(out, r.crash);
  out << ",\n  \"exit_code\": " << StressExitCode(r) << "}\n";
  if (path == "-") {
    std::cout << out.str();
    std::cout.flush();
    return Status::Ok();
  }
  std::ofstream file(path);
  file << out.str();
  if (!file) return IoError("cannot write " + path);
  return Status::Ok();
}

}  // namespace kvtier::tools
