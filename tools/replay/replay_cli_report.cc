// The reports of `kvtier replay`'s simulated runs (replay_cli_parts.h):
// the printed table, the JSON runs, the CSV rows, and the lookup ceiling
// the table is judged against.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <unordered_map>

#include "tools/replay/replay_cli_parts.h"

namespace kvtier::tools::replay_cli {
namespace {

// The hit rates split into local (the serving node's host and NVMe tiers)
// and shared (the remote tier): block and token rates, as text for the
// reports.
struct HitSplit {
  std::string local_blocks, shared_blocks, local_tokens, shared_tokens;
};
HitSplit SplitOf(const ReplayResult& r) {
  return {Number(r.local_block_hit_rate()), Number(r.shared_block_hit_rate()), Number(r.local_token_hit_rate()),
          Number(r.shared_token_hit_rate())};
}

// A run's node fields (given --nodes): the node count, the router, the
// split hit rates, and per node its measured requests and token hit rates.
std::string NodesJson(const ReplayResult& r) {
  const HitSplit split = SplitOf(r);
  std::ostringstream j;
  j << ", \"nodes\": " << r.options.nodes << ", \"router\": \"" << RouterName(r.options.router)
    << "\", \"affinity_blocks\": " << r.options.affinity_blocks << ", \"local_block_hit_rate\": " << split.local_blocks
    << ", \"shared_block_hit_rate\": " << split.shared_blocks << ", \"local_token_hit_rate\": " << split.local_tokens
    << ", \"shared_token_hit_rate\": " << split.shared_tokens << ", \"node_requests\": [";
  for (size_t k = 0; k < r.nodes.size(); ++k) j << (k > 0 ? ", " : "") << r.nodes[k].requests;
  j << "], \"node_token_hit_rates\": [";
  for (size_t k = 0; k < r.nodes.size(); ++k) {
    const NodeResult& n = r.nodes[k];
    const double tokens = n.tokens == 0 ? 1 : double(n.tokens);
    j << (k > 0 ? ", " : "") << "{\"local\": " << Number(double(n.local_hit_tokens) / tokens)
      << ", \"shared\": " << Number(double(n.shared_hit_tokens) / tokens) << "}";
  }
  j << "]";
  return j.str();
}

// Requests per node, "a/b/c" (the text report) or "a;b;c" (a CSV field).
std::string NodeRequests(const ReplayResult& r, char sep) {
  std::string text;
  for (size_t k = 0; k < r.nodes.size(); ++k) {
    if (k > 0) text += sep;
    text += std::to_string(r.nodes[k].requests);
  }
  return text;
}

// A run's remote admission fields (given --remote-admission or
// --remote-write-rate): the policy, its rate (null unless rate), the
// blocks it refused.
std::string RemoteAdmissionJson(const ReplayResult& r) {
  const ReplayOptions& o = r.options;
  std::ostringstream j;
  j << ", \"remote_admission\": \"" << o.remote_admission
    << "\", \"remote_write_rate\": " << (o.remote_admission == "rate" ? std::to_string(o.remote_write_rate) : "null")
    << ", \"remote_admission_refused\": " << r.remote_admission_refused;
  return j.str();
}

// Whether a run carries the kv_aware fields: its router is kv_aware or
// its fetch model was chosen.
bool WithKv(const ReplayOptions& o) { return o.router == Router::kKvAware || o.fetch.has_value(); }
bool WithKv(const std::vector<ReplayResult>& runs) {
  return std::any_of(runs.begin(), runs.end(), [](const ReplayResult& r) { return WithKv(r.options); });
}

// A run's kv_aware fields: the fetch model and, for kv_aware, its events'
// delay, loss, seed and counts (null for another router).
std::string KvJson(const ReplayResult& r) {
  const ReplayOptions& o = r.options;
  const bool kv = o.router == Router::kKvAware;
  std::ostringstream j;
  j << ", \"kv_fetch\": \"" << FetchModelName(FetchModelOf(o))
    << "\", \"event_delay_ms\": " << (kv ? Number(double(o.event_delay_us) / 1000.0) : "null")
    << ", \"event_loss\": " << (kv ? Number(o.event_loss) : "null")
    << ", \"event_seed\": " << (kv ? std::to_string(o.event_seed) : "null")
    << ", \"events_published\": " << r.events_published << ", \"events_lost\": " << r.events_lost;
  return j.str();
}

// Whether a run carries the peer tier's fields (ReplayOptions::peer).
bool WithPeer(const std::vector<ReplayResult>& runs) {
  return std::any_of(runs.begin(), runs.end(), [](const ReplayResult& r) { return r.options.peer; });
}

// A run's peer tier fields: its bandwidth and round trip, its hits (blocks,
// tokens, rates, share of the hit blocks), the hit bytes it served and
// the bytes its pulls moved between nodes, the requests that pulled, per
// node its peer hit tokens and the bytes it served to the others; and
// every tier's hit tokens side by side.
std::string PeerJson(const ReplayResult& r) {
  const ReplayOptions& o = r.options;
  std::ostringstream j;
  j << ", \"peer\": {\"bytes_per_s\": " << Number(o.peer_bytes_per_s) << ", \"rtt_us\": " << o.peer_rtt_us
    << ", \"hits\": " << r.peer.hits
    << ", \"hit_share\": " << Number(r.hit_blocks == 0 ? 0 : double(r.peer.hits) / double(r.hit_blocks))
    << ", \"hit_tokens\": " << r.peer.hit_tokens << ", \"block_hit_rate\": " << Number(r.peer_block_hit_rate())
    << ", \"token_hit_rate\": " << Number(r.peer_token_hit_rate()) << ", \"bytes_read\": " << r.peer.bytes_read
    << ", \"pulled_bytes\": " << r.peer_pulled_bytes << ", \"pulls\": " << r.peer_pulls << ", \"node_hit_tokens\": [";
  for (size_t k = 0; k < r.nodes.size(); ++k) j << (k > 0 ? ", " : "") << r.nodes[k].peer_hit_tokens;
  j << "], \"node_bytes_served\": [";
  for (size_t k = 0; k < r.nodes.size(); ++k) j << (k > 0 ? ", " : "") << r.nodes[k].peer_bytes_served;
  j << "]}, \"hit_tokens_by_tier\": {\"host\": " << r.tiers[kHostTier].hit_tokens
    << ", \"nvme\": " << r.tiers[kNvmeTier].hit_tokens << ", \"peer\": " << r.peer.hit_tokens
    << ", \"remote\": " << r.tiers[kRemoteTier].hit_tokens << "}";
  return j.str();
}

}  // namespace

std::string Number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string RunJson(const ReplayResult& r, bool with_nodes, bool with_remote_admission) {
  const ReplayOptions& o = r.options;
  std::ostringstream j;
  j << "{\"capacities\": {\"host\": \"" << CapacityText(o.host) << "\"";
  if (o.nvme) j << ", \"nvme\": \"" << CapacityText(*o.nvme) << "\"";
  if (o.remote) j << ", \"remote\": \"" << CapacityText(*o.remote) << "\"";
  j << "}, \"policy\": \"" << o.policy << "\", \"admission\": \"" << o.admission << "\", \"requests\": " << r.requests
    << ", \"blocks\": " << r.blocks << ", \"tokens\": " << r.tokens
    << ", \"block_hit_rate\": " << Number(r.block_hit_rate()) << ", \"token_hit_rate\": " << Number(r.token_hit_rate())
    << ", \"gap_closed\": " << (r.gap_closed ? Number(*r.gap_closed) : "null")
    << ", \"mean_queue\": " << (o.engines > 0 ? Number(r.mean_queue) : "null") << ", \"tiers\": {";
  bool first = true;
  for (int t = 0; t < kSimTiers; ++t) {
    if (t == kNvmeTier && !o.nvme) continue;
    if (t == kRemoteTier && !o.remote) continue;
    const TierResult& x = r.tiers[t];
    j << (first ? "" : ", ") << "\"" << SimTierName(t) << "\": {\"hits\": " << x.hits
      << ", \"hit_share\": " << Number(r.hit_share(t)) << ", \"bytes_read\": " << x.bytes_read
      << ", \"bytes_written\": " << x.bytes_written << ", \"evictions\": " << x.evictions
      << ", \"dropped_busy\": " << x.dropped_busy << "}";
    first = false;
  }
  j << "}, \"ssd_bytes_written\": " << r.nvme_device_bytes << ", \"ssd_budget_bytes\": " << r.ssd_budget_bytes
    << ", \"admission_refused\": " << r.admission_refused;
  if (with_remote_admission) j << RemoteAdmissionJson(r);
  j << ", \"not_kept\": " << r.not_kept;
  if (o.nvme) {
    j << ", \"nvme_eviction\": \"" << NvmeEvictionOf(o) << "\", \"nvme_reinserted\": " << r.nvme_reinserted;
  }
  j << ", \"forced_demotions\": " << r.forced_demotions << ", \"prefetches\": " << r.prefetches
    << ", \"prefetch_bytes\": " << r.prefetch_bytes << ", \"prefetch_used\": " << r.prefetch_used << ", \"ttft_ms\": ";
  if (r.ttft_ms.empty()) {
    j << "null";
  } else {
    j << "{\"p50\": " << Number(*r.ttft_percentile(50)) << ", \"p90\": " << Number(*r.ttft_percentile(90))
      << ", \"p99\": " << Number(*r.ttft_percentile(99)) << "}";
  }
  if (with_nodes) j << NodesJson(r);
  if (WithKv(o)) j << KvJson(r);
  if (o.peer) j << PeerJson(r);
  j << ", \"wall_seconds\": " << Number(r.wall_seconds) << "}";
  return j.str();
}

double LookupCeiling(const Trace& trace) {
  double ceiling = 0;
  for (int pass = 0; pass < 5; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    std::unordered_map<BlockKey, uint32_t> ids;
    uint64_t lookups = 0, sum = 0;
    for (const TraceRequest& r : trace.requests) {
      for (const BlockKey& k : r.blocks) sum += ids.try_emplace(k, uint32_t(ids.size())).first->second;
      lookups += r.blocks.size();
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    volatile uint64_t keep = sum;  // the lookups are not optimized away
    (void)keep;
    if (seconds > 0) ceiling = std::max(ceiling, double(lookups) / seconds);
  }
  return ceiling;
}

void PrintTable(const std::vector<ReplayResult>& runs, const ReplayCliOptions& o, double ceiling) {
  std::printf("ceiling: %.0f block lookups/s (the trace's keys alone in a hash map)\n\n", ceiling);
  if (o.nodes_given) {
    char affinity[48] = "";
    if (o.router == "prefix_affinity") std::snprintf(affinity, sizeof affinity, " over %u blocks", o.affinity_blocks);
    std::printf("nodes: %u, router: %s%s (host and NVMe capacities per node; the remote tier shared)\n\n", o.nodes,
                o.router.c_str(), affinity);
  }
  if (o.remote_admission_given) {
    const std::string rate = o.remote_admission == "rate" && !runs.empty()
                                 ? ", " + std::to_string(runs.front().options.remote_write_rate) + " bytes/s per node"
                                 : "";
    std::printf("remote admission: %s%s\n\n", o.remote_admission.c_str(), rate.c_str());
  }
  const bool kv = WithKv(runs);
  if (kv && !runs.empty()) {
    const ReplayOptions& first = runs.front().options;
    std::printf("kv fetch: %s", std::string(FetchModelName(FetchModelOf(first))).c_str());
    if (first.router == Router::kKvAware) {
      std::printf(", kv_aware events %s ms late, %s lost (seed %llu)", Number(o.event_delay_ms).c_str(),
                  Number(o.event_loss).c_str(), static_cast<unsigned long long>(o.event_seed));
    }
    std::printf("\n\n");
  }
  // The peer tier's columns: its token hit rate, the hit bytes it moved
  // between nodes, the bytes written to the remote tier (the pool), and
  // TTFT when the kv columns do not show it.
  const bool peer = o.peer;
  const bool peer_ttft = peer && o.engines > 0 && !kv;
  if (peer && !runs.empty()) {
    std::printf("peer tier: %s bytes/s from the other nodes, %llu us a request's round trip\n\n",
                Number(runs.front().options.peer_bytes_per_s).c_str(), static_cast<unsigned long long>(o.peer_rtt_us));
  }
  std::printf("%-12s %-14s %10s %10s %10s %10s %10s %8s %12s %9s%s%s%s%s%s\n", "policy", "host", "requests", "blocks",
              "block_hit", "token_hit", "gap_closed", "seconds", "lookups/s", "/ceiling",
              o.engines > 0 ? " mean_queue" : "", kv ? " ttft_p50_ms ttft_p99_ms" : "",
              o.nodes_given ? "  local_tok shared_tok  node_requests" : "",
              o.remote_admission_given ? "  remote_written remote_refused" : "",
              peer ? (peer_ttft ? "   peer_tok     peer_bytes remote_written ttft_p50_ms ttft_p99_ms"
                                : "   peer_tok     peer_bytes remote_written")
                   : "");
  for (const ReplayResult& r : runs) {
    // Block lookups: every prompt block of every request, warm-up included.
    const double lookups = double(r.lookups);
    const double rate = r.wall_seconds > 0 ? lookups / r.wall_seconds : 0;
    char gap[32] = "-";
    if (r.gap_closed) std::snprintf(gap, sizeof gap, "%.3f", *r.gap_closed);
    char queue[32] = "";
    if (o.engines > 0) std::snprintf(queue, sizeof queue, " %10.1f", r.mean_queue);
    std::string nodes;
    if (o.nodes_given) {
      char split[64];
      std::snprintf(split, sizeof split, "  %9.4f %10.4f  ", r.local_token_hit_rate(), r.shared_token_hit_rate());
      nodes = split + NodeRequests(r, '/');
    }
    char remote[64] = "";
    if (o.remote_admission_given) {
      std::snprintf(remote, sizeof remote, "  %14llu %14llu",
                    static_cast<unsigned long long>(r.tiers[kRemoteTier].bytes_written),
                    static_cast<unsigned long long>(r.remote_admission_refused));
    }
    char ttft[40] = "";
    if (kv) {
      std::snprintf(ttft, sizeof ttft, " %11.1f %11.1f", r.ttft_percentile(50).value_or(0),
                    r.ttft_percentile(99).value_or(0));
    }
    char peers[96] = "";
    if (peer) {
      const int at = std::snprintf(peers, sizeof peers, "  %9.4f %14llu %14llu", r.peer_token_hit_rate(),
                                   static_cast<unsigned long long>(r.peer.bytes_read),
                                   static_cast<unsigned long long>(r.tiers[kRemoteTier].bytes_written));
      if (peer_ttft && at > 0) {
        std::snprintf(peers + at, sizeof peers - size_t(at), " %11.1f %11.1f", r.ttft_percentile(50).value_or(0),
                      r.ttft_percentile(99).value_or(0));
      }
    }
    std::printf("%-12s %-14s %10llu %10llu %10.4f %10.4f %10s %8.3f %12.0f %8.2fx%s%s%s%s%s\n",
                r.options.policy.c_str(), CapacityText(r.options.host).c_str(),
                static_cast<unsigned long long>(r.requests), static_cast<unsigned long long>(r.blocks),
                r.block_hit_rate(), r.token_hit_rate(), gap, r.wall_seconds, rate, ceiling > 0 ? rate / ceiling : 0,
                queue, ttft, nodes.c_str(), remote, peers);
  }
}

void WriteCsv(std::ostream& out, const std::vector<ReplayResult>& runs, bool with_nodes, bool with_remote_admission) {
  out << "policy,host,nvme,remote,admission,requests,blocks,tokens,block_hit_rate,token_hit_rate,gap_closed,mean_queue,"
         "host_hits,nvme_hits,"
         "remote_hits,ssd_bytes_written,ssd_budget_bytes,nvme_eviction,nvme_reinserted,prefetches,prefetch_used,ttft_"
         "p50_ms,ttft_p90_ms,ttft_p99_ms,wall_seconds"
      << (with_nodes ? ",nodes,router,affinity_blocks,local_block_hit_rate,shared_block_hit_rate,local_token_hit_rate,"
                       "shared_token_hit_rate,node_requests"
                     : "")
      << (with_remote_admission ? ",remote_admission,remote_write_rate,remote_admission_refused,remote_bytes_written"
                                : "")
      << (WithKv(runs) ? ",kv_fetch,event_delay_ms,event_loss,events_published,events_lost" : "")
      << (WithPeer(runs) ? ",peer_bytes_per_s,peer_rtt_us,peer_hits,peer_hit_tokens,peer_block_hit_rate,peer_token_hit_"
                           "rate,peer_bytes_read,peer_pulled_bytes,peer_pulls,remote_hit_tokens,remote_bytes_read,"
                           "remote_bytes_written"
                         : "")
      << "\n";
  for (const ReplayResult& x : runs) {
    const ReplayOptions& p = x.options;
    out << p.policy << "," << CapacityText(p.host) << "," << (p.nvme ? CapacityText(*p.nvme) : "") << ","
        << (p.remote ? CapacityText(*p.remote) : "") << "," << p.admission << "," << x.requests << "," << x.blocks
        << "," << x.tokens << "," << Number(x.block_hit_rate()) << "," << Number(x.token_hit_rate()) << ","
        << (x.gap_closed ? Number(*x.gap_closed) : "") << "," << (p.engines > 0 ? Number(x.mean_queue) : "") << ","
        << x.tiers[kHostTier].hits << "," << x.tiers[kNvmeTier].hits << "," << x.tiers[kRemoteTier].hits << ","
        << x.nvme_device_bytes << "," << x.ssd_budget_bytes << "," << (p.nvme ? NvmeEvictionOf(p) : "") << ","
        << x.nvme_reinserted << "," << x.prefetches << "," << x.prefetch_used << ",";
    for (double q : {50.0, 90.0, 99.0}) {
      auto v = x.ttft_percentile(q);
      out << (v ? Number(*v) : "") << ",";
    }
    out << Number(x.wall_seconds);
    if (with_nodes) {
      const HitSplit split = SplitOf(x);
      out << "," << p.nodes << "," << RouterName(p.router) << "," << p.affinity_blocks << "," << split.local_blocks
          << "," << split.shared_blocks << "," << split.local_tokens << "," << split.shared_tokens << ","
          << NodeRequests(x, ';');
    }
    if (with_remote_admission) {
      out << "," << p.remote_admission << ","
          << (p.remote_admission == "rate" ? std::to_string(p.remote_write_rate) : "") << ","
          << x.remote_admission_refused << "," << x.tiers[kRemoteTier].bytes_written;
    }
    if (WithKv(runs)) {
      const bool kv = p.router == Router::kKvAware;
      out << "," << FetchModelName(FetchModelOf(p)) << "," << (kv ? Number(double(p.event_delay_us) / 1000.0) : "")
          << "," << (kv ? Number(p.event_loss) : "") << "," << x.events_published << "," << x.events_lost;
    }
    if (WithPeer(runs)) {
      const TierResult& remote = x.tiers[kRemoteTier];
      out << "," << (p.peer ? Number(p.peer_bytes_per_s) : "") << "," << (p.peer ? std::to_string(p.peer_rtt_us) : "")
          << "," << x.peer.hits << "," << x.peer.hit_tokens << "," << Number(x.peer_block_hit_rate()) << ","
          << Number(x.peer_token_hit_rate()) << "," << x.peer.bytes_read << "," << x.peer_pulled_bytes << ","
          << x.peer_pulls << "," << remote.hit_tokens << "," << remote.bytes_read << "," << remote.bytes_written;
    }
    out << "\n";
  }
}

}  // namespace kvtier::tools::replay_cli
