// kvtier-replay: hit-rate replay of a block trace through kvtier's policies
// (replay_cli.h). Run as `kvtier replay --trace FILE ...` (tools/cli runs
// this binary with the arguments after "replay"), or directly.
#include <CLI/CLI.hpp>

#include "tools/replay/replay_cli.h"

int main(int argc, char** argv) {
  CLI::App replay{"Replay a block trace through kvtier's policies (hit rates)", "kvtier replay"};
  kvtier::tools::ReplayCliOptions options;
  kvtier::tools::AddReplayOptions(replay, options);
  try {
    replay.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = replay.exit(e);
    return code != 0 ? 2 : 0;  // bad input exits 2; help exits 0
  }
  return kvtier::tools::RunReplay(options);
}
