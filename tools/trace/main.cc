// kvtier-trace: block traces for replay (trace_gen.h). Run as `kvtier trace
// gen multi-round-qa ...` (tools/cli runs this binary with the arguments
// after "trace"), or directly.
#include <CLI/CLI.hpp>

#include "tools/trace/trace_gen.h"

int main(int argc, char** argv) {
  CLI::App trace{"Block traces for replay", "kvtier trace"};
  trace.require_subcommand(1);
  auto* gen = trace.add_subcommand("gen", "Generate a synthetic block trace");
  gen->require_subcommand(1);
  kvtier::tools::MultiRoundQaOptions multi_round_qa_options;
  auto* multi_round_qa = gen->add_subcommand(
      "multi-round-qa", "Users asking questions over rounds, each prompt its whole history (LMCache's benchmark)");
  kvtier::tools::AddMultiRoundQaOptions(*multi_round_qa, multi_round_qa_options);
  try {
    trace.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = trace.exit(e);
    return code != 0 ? 2 : 0;  // bad input exits 2; help exits 0
  }
  if (multi_round_qa->parsed()) return kvtier::tools::RunMultiRoundQa(multi_round_qa_options);
  return 2;
}
