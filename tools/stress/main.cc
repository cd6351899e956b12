// kvtier-stress: checked mixed load from N clients, and kill -9 loops
// (stress.h). Run as `kvtier stress --socket PATH|--spawn ...` (tools/cli
// runs this binary with the arguments after "stress"), or directly.
#include <CLI/CLI.hpp>

#include "tools/stress/stress.h"

int main(int argc, char** argv) {
  CLI::App stress{"Mixed load from N clients, every read checked (a miss or byte-exact); --crash-loop: kill -9 cycles",
                  "kvtier stress"};
  kvtier::tools::StressOptions options;
  kvtier::tools::AddStressOptions(stress, options);
  try {
    stress.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = stress.exit(e);
    return code != 0 ? 2 : 0;  // bad input exits 2; help exits 0
  }
  return kvtier::tools::RunStress(options);
}
