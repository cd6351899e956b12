// kvtier: the command-line tool.
//   kvtier stats|ls|drop|pin|unpin|config get|health   operations on a running kvtierd (admin_cli.h)
//   kvtier bench host [options]           host-tier benchmark (bench_host.cc)
//   kvtier bench nvme [options]           NVMe-tier benchmark vs fio (bench_nvme.cc)
//   kvtier bench remote [options]         remote tier vs redis-benchmark (bench_remote.cc)
//   kvtier bench layers [options]         layer-wise load and save (bench_layers.cc)
//   kvtier bench policy [options]         policy operations per second (bench_policy.cc)
//   kvtier bench neighbour [options]      a lookup's latency beside huge lookups (bench_neighbour.cc)
//   kvtier replay --trace FILE ...        hit-rate replay of a block trace (replay_cli.cc)
//   kvtier trace gen multi-round-qa ...   a synthetic multi-round QA block trace (trace_gen.cc)
//   kvtier stress --socket PATH|--spawn   checked mixed load, and kill -9 loops (stress.cc)
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>

#include "kvtier/client.h"
#include "tools/admin_cli.h"
#include "tools/bench_host.h"
#include "tools/bench_layers.h"
#include "tools/bench_neighbour.h"
#include "tools/bench_nvme.h"
#include "tools/bench_policy.h"
#include "tools/bench_remote.h"
#include "tools/replay_cli.h"
#include "tools/stress.h"
#include "tools/trace_gen.h"


int main(int argc, char** argv) {
  CLI::App app{"kvtier: tools for the kvtier KV-cache daemon"};
  app.require_subcommand(1);

  kvtier::tools::AdminOptions admin_options;
  const kvtier::tools::AdminCommands admin = kvtier::tools::AddAdminCommands(app, admin_options);

  auto* bench = app.add_subcommand("bench", "Benchmarks (each figure beside its ceiling)");
  bench->require_subcommand(1);
  kvtier::tools::HostBenchOptions host_options;
  auto* host = bench->add_subcommand("host", "Put/get GB/s vs memcpy; Lookup ops/s vs redis-benchmark");
  kvtier::tools::AddHostBenchOptions(*host, host_options);
  kvtier::tools::NvmeBenchOptions nvme_options;
  auto* nvme = bench->add_subcommand("nvme", "NVMe tier write/read GB/s and random-read IOPS vs fio");
  kvtier::tools::AddNvmeBenchOptions(*nvme, nvme_options);
  kvtier::tools::RemoteBenchOptions remote_options;
  auto* remote = bench->add_subcommand("remote", "Remote tier put/get GB/s vs redis-benchmark SET/GET, same cluster");
  kvtier::tools::AddRemoteBenchOptions(*remote, remote_options);
  kvtier::tools::LayersBenchOptions layers_options;
  auto* layers = bench->add_subcommand(
      "layers", "Layer-wise load (first layer vs whole, load hidden behind compute) and save vs memcpy");
  kvtier::tools::AddLayersBenchOptions(*layers, layers_options);
  kvtier::tools::PolicyBenchOptions policy_options;
  auto* policy = bench->add_subcommand("policy", "Policy operations per second on one core (Google Benchmark)");
  kvtier::tools::AddPolicyBenchOptions(*policy, policy_options);
  kvtier::tools::NeighbourBenchOptions neighbour_options;
  auto* neighbour = bench->add_subcommand(
      "neighbour", "A small Lookup's latency alone and beside connections sending huge Lookups");
  kvtier::tools::AddNeighbourBenchOptions(*neighbour, neighbour_options);

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

  kvtier::tools::StressOptions stress_options;
  auto* stress = app.add_subcommand(
      "stress", "Mixed load from N clients, every read checked (a miss or byte-exact); --crash-loop: kill -9 cycles");
  kvtier::tools::AddStressOptions(*stress, stress_options);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    // replay's, trace's and the admin commands' contract: bad input exits 2 (help stays 0).
    const bool exits_2 = argc > 1 && (std::strcmp(argv[1], "replay") == 0 || std::strcmp(argv[1], "trace") == 0 ||
                                      std::strcmp(argv[1], "ls") == 0 || std::strcmp(argv[1], "drop") == 0 ||
                                      std::strcmp(argv[1], "pin") == 0 || std::strcmp(argv[1], "unpin") == 0 ||
                                      std::strcmp(argv[1], "config") == 0 || std::strcmp(argv[1], "health") == 0 ||
                                      std::strcmp(argv[1], "stats") == 0 || std::strcmp(argv[1], "stress") == 0);
    return exits_2 && code != 0 ? 2 : code;
  }
  if (replay->parsed()) return kvtier::tools::RunReplay(replay_options);
  if (stress->parsed()) return kvtier::tools::RunStress(stress_options);
  if (multi_round_qa->parsed()) return kvtier::tools::RunMultiRoundQa(multi_round_qa_options);
  if (admin.stats->parsed()) return kvtier::tools::RunStats(admin_options);
  if (admin.ls->parsed()) return kvtier::tools::RunLs(admin_options);
  if (admin.drop->parsed()) return kvtier::tools::RunDrop(admin_options);
  if (admin.pin->parsed()) return kvtier::tools::RunPin(admin_options);
  if (admin.unpin->parsed()) return kvtier::tools::RunUnpin(admin_options);
  if (admin.config_get->parsed()) return kvtier::tools::RunConfigGet(admin_options);
  if (admin.health->parsed()) return kvtier::tools::RunHealth(admin_options);
  if (host->parsed()) return kvtier::tools::RunHostBench(host_options);
  if (nvme->parsed()) return kvtier::tools::RunNvmeBench(nvme_options);
  if (remote->parsed()) return kvtier::tools::RunRemoteBench(remote_options);
  if (layers->parsed()) return kvtier::tools::RunLayersBench(layers_options);
  if (policy->parsed()) return kvtier::tools::RunPolicyBench(policy_options);
  if (neighbour->parsed()) return kvtier::tools::RunNeighbourBench(neighbour_options);
  return 2;
}
