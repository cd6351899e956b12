// The parts of `kvtier replay` (replay_cli.h) and what they share: the
// exit code of bad input, the reports of simulated runs
// (replay_cli_report.cc) and live mode (replay_cli_live.cc); replay_cli.cc
// parses the options and runs the simulations. Private to tools/replay.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "tools/replay/replay_cli.h"
#include "tools/replay/replay_sim.h"
#include "tools/replay/replay_trace.h"

namespace kvtier::tools::replay_cli {

// The exit code of bad input (replay_cli.h).
inline constexpr int kBadInput = 2;

// Prints "kvtier replay: <message>" on stderr; returns kBadInput.
int Fail(const std::string& message);

// `v` as the reports print a number (%.6g).
std::string Number(double v);

// Live mode: the trace against a running daemon (its own capacity and
// policy), one JSON run with the measured figures. The exit code.
int RunLive(const ReplayCliOptions& o, const Trace& trace);

// The ceiling of the speed figure, measured here: the trace's block
// lookups alone in a hash map, as any simulator keyed by block makes; the
// best of 5 passes, each with a fresh map.
double LookupCeiling(const Trace& trace);

// The printed table, a row per run; given --nodes, a line naming the node
// count and router first, and per run its token hit rate split into local
// and shared and its requests per node; given --peer, a line naming the
// peer tier's bandwidth and round trip, and per run its peer token hit
// rate, the hit bytes it moved between nodes, the bytes written to the
// remote tier, and TTFT p50/p99 (engine model) when not shown already.
void PrintTable(const std::vector<ReplayResult>& runs, const ReplayCliOptions& o, double ceiling);

// One row per run; `with_nodes`: the node columns after the others;
// `with_remote_admission`: then the remote admission's; then, when a run
// is kv_aware or chose its fetch model, kv_fetch, event_delay_ms,
// event_loss, events_published and events_lost; then, when a run has the
// peer tier, its columns (peer_*, and the remote tier's hit tokens, bytes
// read and written beside them).
void WriteCsv(std::ostream& out, const std::vector<ReplayResult>& runs, bool with_nodes, bool with_remote_admission);

// One run as a JSON object. `with_nodes`: add the node fields (the node
// count, the router, the split hit rates, per node its requests and token
// hit rates); `with_remote_admission`: the remote admission's (the policy,
// its rate, the blocks it refused). A kv_aware run, or one that chose its
// fetch model, adds kv_fetch and the events' delay, loss, seed and counts.
// A run with the peer tier adds "peer" (its bandwidth, round trip, hits,
// hit tokens and rates, bytes read and pulled, pulls, per node its hit
// tokens and bytes served) and "hit_tokens_by_tier".
std::string RunJson(const ReplayResult& r, bool with_nodes, bool with_remote_admission);

}  // namespace kvtier::tools::replay_cli
