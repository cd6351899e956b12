// `kvtier replay --live` (replay_cli_parts.h): the trace through the
// client library against a running kvtierd, reported beside memcpy's
// speed measured in the same run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include "tools/replay/replay_cli_parts.h"
#include "tools/replay/replay_live.h"

namespace kvtier::tools::replay_cli {

int RunLive(const ReplayCliOptions& o, const Trace& trace) {
  if (o.socket_path.empty()) return Fail("--live needs --socket PATH");
  if (!o.sweep.empty() || o.engines > 0 || !o.plot_path.empty()) {
    return Fail("--live takes no --sweep, --engines or --plot: the daemon has one configuration");
  }
  auto r = ReplayLive(trace, LiveOptions{o.socket_path, o.bytes_per_token, o.warmup, nullptr});
  if (!r.ok()) {
    std::fprintf(stderr, "kvtier replay: %s\n", r.status().ToString().c_str());
    return r.status().code() == StatusCode::kInvalidArgument ? kBadInput : 1;
  }
  const double rps = r->seconds > 0 ? double(trace.requests.size()) / r->seconds : 0;
  const double put_gbps = r->seconds > 0 ? double(r->put_bytes) / r->seconds / 1e9 : 0;
  // The ceiling of the put figure, measured now: memcpy of blocks of the
  // trace's average size from one 256 MiB buffer to another (out of cache,
  // like payloads into the arena), the better of two passes.
  double memcpy_gbps = 0;
  if (r->put_blocks > 0) {
    const size_t block = std::max<size_t>(4096, r->put_bytes / r->put_blocks);
    const size_t total = (size_t{256} << 20) / block * block;
    std::vector<std::byte> from(total, std::byte{1}), to(total, std::byte{0});
    for (int pass = 0; pass < 2; ++pass) {
      const auto t0 = std::chrono::steady_clock::now();
      for (size_t at = 0; at + block <= total; at += block) std::memcpy(to.data() + at, from.data() + at, block);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      volatile std::byte keep = to[total / 2];
      (void)keep;
      if (s > 0) memcpy_gbps = std::max(memcpy_gbps, double(total) / s / 1e9);
    }
  }
  std::printf("live %s: %llu requests measured, block hit rate %.4f, token hit rate %.4f\n", o.socket_path.c_str(),
              static_cast<unsigned long long>(r->requests), r->block_hit_rate(), r->token_hit_rate());
  std::printf("  %.0f requests/s; put %.3f GB/s (%llu blocks), %.3fx memcpy's %.2f GB/s in this run\n", rps, put_gbps,
              static_cast<unsigned long long>(r->put_blocks), memcpy_gbps > 0 ? put_gbps / memcpy_gbps : 0,
              memcpy_gbps);
  std::printf("  lookup p50 %.0f us, p99 %.0f us; whole request p50 %.0f us, p99 %.0f us\n",
              Percentile(r->lookup_us, 50), Percentile(r->lookup_us, 99), Percentile(r->request_us, 50),
              Percentile(r->request_us, 99));
  if (!o.json_path.empty()) {
    std::ofstream out(o.json_path);
    out << "{\"trace\": \"" << trace.path << "\", \"runs\": [\n  {\"mode\": \"live\", \"socket\": \"" << o.socket_path
        << "\", \"requests\": " << r->requests << ", \"blocks\": " << r->blocks << ", \"tokens\": " << r->tokens
        << ", \"block_hit_rate\": " << Number(r->block_hit_rate())
        << ", \"token_hit_rate\": " << Number(r->token_hit_rate())
        << ", \"hits_by_tier\": {\"host\": " << r->tier_hits[kHostTier] << ", \"nvme\": " << r->tier_hits[kNvmeTier]
        << ", \"remote\": " << r->tier_hits[kRemoteTier] << "}, \"put_blocks\": " << r->put_blocks
        << ", \"put_bytes\": " << r->put_bytes << ", \"put_gbps\": " << Number(put_gbps)
        << ", \"memcpy_gbps\": " << Number(memcpy_gbps) << ", \"not_kept\": " << r->not_kept
        << ", \"requests_per_s\": " << Number(rps)
        << ", \"lookup_us\": {\"p50\": " << Number(Percentile(r->lookup_us, 50))
        << ", \"p99\": " << Number(Percentile(r->lookup_us, 99))
        << "}, \"request_us\": {\"p50\": " << Number(Percentile(r->request_us, 50))
        << ", \"p99\": " << Number(Percentile(r->request_us, 99)) << "}, \"wall_seconds\": " << Number(r->seconds)
        << "}\n]}\n";
    if (!out) {
      std::fprintf(stderr, "kvtier replay: cannot write %s\n", o.json_path.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace kvtier::tools::replay_cli
