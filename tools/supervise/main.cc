// kvtier-supervise: restarts kvtierd with its kept host tier where there is
// no systemd (supervise.h). Run as `kvtier supervise -- kvtierd ...`
// (tools/cli runs this binary with the arguments after "supervise").
#include <CLI/CLI.hpp>

#include "tools/supervise/supervise.h"

int main(int argc, char** argv) {
  CLI::App app{"Run kvtierd, keep its host tier's descriptors, and start it again with them after a crash",
               "kvtier supervise"};
  kvtier::tools::SuperviseOptions options;
  app.add_option("--restart-delay-ms", options.restart_delay_ms,
                 "Wait before a restart (doubled after each child that lived under 10 s, up to 30 s)")
      ->capture_default_str();
  app.add_option("--notify-socket", options.notify_socket,
                 "Where the descriptor store listens (default: a new directory under $TMPDIR or /tmp)");
  app.add_option("command", options.command, "The command after --, e.g. -- kvtierd --config FILE")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code != 0 ? 2 : 0;  // bad input exits 2; help exits 0
  }
  return kvtier::tools::RunSupervise(options);
}
