// kvtier: the command-line tool.
//   kvtier stats [--socket PATH]          every counter of a running kvtierd
//   kvtier bench host [options]           host-tier benchmark (bench_host.cc)
//   kvtier bench nvme [options]           NVMe-tier benchmark vs fio (bench_nvme.cc)
//   kvtier bench layers [options]         layer-wise load and save (bench_layers.cc)
//   kvtier bench policy [options]         policy operations per second (bench_policy.cc)
//   kvtier replay --trace FILE ...        hit-rate replay of a block trace (replay_cli.cc)
//   kvtier trace gen multi-round-qa ...   a synthetic multi-round QA block trace (trace_gen.cc)
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>

#include "kvtier/client.h"
#include "tools/bench_host.h"
#include "tools/bench_layers.h"
#include "tools/bench_nvme.h"
#include "tools/bench_policy.h"
#include "tools/replay_cli.h"
#include "tools/trace_gen.h"

namespace {

int Stats(const std::string& socket_path) {
  kvtier::ClientOptions options;
  options.socket_path = socket_path;
  options.client_name = "kvtier-stats";
  auto client = kvtier::Client::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "kvtier stats: %s\n", client.status().ToString().c_str());
    return 1;
  }
  auto counters = (*client)->Stats();
  if (!counters.ok()) {
    std::fprintf(stderr, "kvtier stats: %s\n", counters.status().ToString().c_str());
    return 1;
  }
  for (const auto& c : *counters) std::printf("%-40s %lld\n", c.name.c_str(), static_cast<long long>(c.value));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvtier: tools for the kvtier KV-cache daemon"};
  app.require_subcommand(1);
  std::string socket_path = kvtier::ClientOptions().socket_path;

  auto* stats = app.add_subcommand("stats", "Print every counter of a running kvtierd");
  stats->add_option("--socket", socket_path, "kvtierd socket")->capture_default_str();

  auto* bench = app.add_subcommand("bench", "Benchmarks (each figure beside its ceiling)");
  bench->require_subcommand(1);
  kvtier::tools::HostBenchOptions host_options;
  auto* host = bench->add_subcommand("host", "Put/get GB/s vs memcpy; Lookup ops/s vs redis-benchmark");
  kvtier::tools::AddHostBenchOptions(*host, host_options);
  kvtier::tools::NvmeBenchOptions nvme_options;
  auto* nvme = bench->add_subcommand("nvme", "NVMe tier write/read GB/s and random-read IOPS vs fio");
  kvtier::tools::AddNvmeBenchOptions(*nvme, nvme_options);
  kvtier::tools::LayersBenchOptions layers_options;
  auto* layers = bench->add_subcommand(
      "layers", "Layer-wise load (first layer vs whole, load hidden behind compute) and save vs memcpy");
  kvtier::tools::AddLayersBenchOptions(*layers, layers_options);
  kvtier::tools::PolicyBenchOptions policy_options;
  auto* policy = bench->add_subcommand("policy", "Policy operations per second on one core (Google Benchmark)");
  kvtier::tools::AddPolicyBenchOptions(*policy, policy_options);

  kvtier::tools::ReplayCliOptions replay_options;
  auto* replay = app.add_subcommand("replay", "Replay a block trace through kvtier's policies (hit rates)");
  kvtier::tools::AddReplayOptions(*replay, replay_options);

  auto* trace = app.add_subcommand("trace", "Block traces for replay");
  trace->require_subcommand(1);
  auto* trace_gen = trace->add_subcommand("gen", "Generate a synthetic block trace");
  trace_gen->require_subcommand(1);
  kvtier::tools::MultiRoundQaOptions multi_round_qa_options;
  auto* multi_round_qa = trace_gen->add_subcommand(
      "multi-round-qa", "Users asking questions over rounds, each prompt its whole history (LMCache's benchmark)");
  kvtier::tools::AddMultiRoundQaOptions(*multi_round_qa, multi_round_qa_options);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    // replay's and trace's contract: bad input exits 2 (help stays 0).
    const bool exits_2 = argc > 1 && (std::strcmp(argv[1], "replay") == 0 || std::strcmp(argv[1], "trace") == 0);
    return exits_2 && code != 0 ? 2 : code;
  }
  if (replay->parsed()) return kvtier::tools::RunReplay(replay_options);
  if (multi_round_qa->parsed()) return kvtier::tools::RunMultiRoundQa(multi_round_qa_options);
  if (stats->parsed()) return Stats(socket_path);
  if (host->parsed()) return kvtier::tools::RunHostBench(host_options);
  if (nvme->parsed()) return kvtier::tools::RunNvmeBench(nvme_options);
  if (layers->parsed()) return kvtier::tools::RunLayersBench(layers_options);
  if (policy->parsed()) return kvtier::tools::RunPolicyBench(policy_options);
  return 2;
}
