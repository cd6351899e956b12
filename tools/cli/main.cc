// kvtier: the command-line tool.
//   kvtier stats|ls|drop|pin|unpin|config get|health   operations on a running kvtierd (admin_cli.h)
//   kvtier events [--json] [--rebuild] ...   KV events: tail them, or rebuild the index (events_cli.h)
//   kvtier bench host|nvme|remote|layers|policy|neighbour [options]   benchmarks (tools/bench)
//   kvtier replay --trace FILE ...        hit-rate replay of a block trace (tools/replay)
//   kvtier trace gen multi-round-qa ...   a synthetic multi-round QA block trace (tools/trace)
//   kvtier stress --socket PATH|--spawn   checked mixed load, and kill -9 loops (tools/stress/stress)
//   kvtier supervise -- kvtierd ...       restarts kvtierd with its kept host tier (tools/supervise)
// The admin commands run here; bench, replay, trace and stress run their own
// executable (kvtier-bench, ...; sibling.h) with the arguments after the
// command, so this binary links only the client library (and libzmq, for
// `kvtier events`).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>

#include "tools/cli/admin_cli.h"
#include "tools/cli/events_cli.h"
#include "tools/cli/sibling.h"

int main(int argc, char** argv) {
  if (argc > 1 && kvtier::tools::IsSiblingCommand(argv[1])) return kvtier::tools::ExecSibling(argc, argv);

  CLI::App app{"kvtier: tools for the kvtier KV-cache daemon"};
  app.require_subcommand(1);

  kvtier::tools::AdminOptions admin_options;
  const kvtier::tools::AdminCommands admin = kvtier::tools::AddAdminCommands(app, admin_options);
  kvtier::tools::EventsOptions events_options;
  CLI::App* events = kvtier::tools::AddEventsCommand(app, events_options);
  // Listed for --help only: these never reach the parser (ExecSibling above).
  app.add_subcommand("bench", "Benchmarks (each figure beside its ceiling): kvtier bench --help");
  app.add_subcommand("replay", "Replay a block trace through kvtier's policies (hit rates)");
  app.add_subcommand("trace", "Block traces for replay");
  app.add_subcommand("supervise",
                     "Run kvtierd and start it again with its kept host tier after a crash, where there is no "
                     "systemd: kvtier supervise -- kvtierd --config FILE");
  app.add_subcommand("stress",
                     "Mixed load from N clients, every read checked (a miss or byte-exact); --crash-loop: kill -9 "
                     "cycles");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    // The admin commands' contract: bad input exits 2 (help stays 0).
    const bool exits_2 = argc > 1 && (std::strcmp(argv[1], "ls") == 0 || std::strcmp(argv[1], "drop") == 0 ||
                                      std::strcmp(argv[1], "pin") == 0 || std::strcmp(argv[1], "unpin") == 0 ||
                                      std::strcmp(argv[1], "config") == 0 || std::strcmp(argv[1], "health") == 0 ||
                                      std::strcmp(argv[1], "stats") == 0 || std::strcmp(argv[1], "events") == 0);
    return exits_2 && code != 0 ? 2 : code;
  }
  if (admin.stats->parsed()) return kvtier::tools::RunStats(admin_options);
  if (admin.ls->parsed()) return kvtier::tools::RunLs(admin_options);
  if (admin.drop->parsed()) return kvtier::tools::RunDrop(admin_options);
  if (admin.pin->parsed()) return kvtier::tools::RunPin(admin_options);
  if (admin.unpin->parsed()) return kvtier::tools::RunUnpin(admin_options);
  if (admin.config_get->parsed()) return kvtier::tools::RunConfigGet(admin_options);
  if (admin.health->parsed()) return kvtier::tools::RunHealth(admin_options);
  if (events->parsed()) return kvtier::tools::RunEvents(events_options);
  return 2;
}
