// `kvtier events`: tails a kvtierd's KV events (docs/OPERATIONS.md, "KV
// events"), or rebuilds the index a router would from them.
//   kvtier events [--socket PATH | --endpoint EP --replay-endpoint EP]
//                 [--tenant NAME] [--json] [--count N] [--seconds S] [--rebuild]
// The endpoints default to the daemon's own defaults beside its socket
// (ipc://DIR/kvtierd-events.sock, ipc://DIR/kvtierd-events-replay.sock;
// with --tenant, kvtierd-events-NAME.sock, ...); --endpoint and
// --replay-endpoint override them.
//   tail (default)  one line per event: "SEQ TS KIND MEDIUM ns=HEX
//                   parent=HEX|- keys=N HEX,..." or with --json one object
//                   {"seq","ts","kind","medium","tier","namespace","keys",
//                   "parent"} (kind "cleared" has seq and ts only); lost
//                   batches and a restarted daemon are said on stderr;
//   --rebuild       subscribes, takes a snapshot, applies the stream after
//                   it (replaying gaps), and at the end prints the index in
//                   `kvtier ls --blocks`' form (block_listing.h), to diff.
// Stops after --count events (tail: printed; rebuild: applied from the
// stream), after --seconds, or at SIGINT/SIGTERM (a rebuild still prints).
// Exit codes: 0 done; 1 a gap the replay buffer no longer covers, or a
// batch that does not decode (rebuild); 2 bad usage; 3 no answer from the
// sockets.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace kvtier::tools {

struct EventsOptions {
  std::string socket_path;
  std::string endpoint, replay_endpoint, tenant;
  bool json = false;
  bool rebuild = false;
  uint64_t count = 0;  // 0: no limit
  double seconds = 0;  // 0: no limit
};

CLI::App* AddEventsCommand(CLI::App& app, EventsOptions& options);
int RunEvents(const EventsOptions& options);

}  // namespace kvtier::tools
