// kvtier-bench: the benchmarks, each figure beside its ceiling. Run as
// `kvtier bench ...` (tools/cli runs this binary with the arguments after
// "bench"), or directly.
//   kvtier bench host [options]           host-tier benchmark (bench_host.cc)
//   kvtier bench nvme [options]           NVMe-tier benchmark vs fio (bench_nvme.cc)
//   kvtier bench remote [options]         remote tier vs redis-benchmark (bench_remote.cc)
//   kvtier bench peer [options]           peer tier pulls vs ucx_perftest (bench_peer.cc)
//   kvtier bench layers [options]         layer-wise load and save (bench_layers.cc)
//   kvtier bench policy [options]         policy operations per second (bench_policy.cc)
//   kvtier bench neighbour [options]      a lookup's latency beside huge lookups (bench_neighbour.cc)
//   kvtier bench startup [options]        time to serve and to warm the arena (bench_startup.cc)
//   kvtier bench restart [options]        a kill -9 and restart at N blocks (bench_restart.cc)
#include <CLI/CLI.hpp>

#include "tools/bench/bench_host.h"
#include "tools/bench/bench_layers.h"
#include "tools/bench/bench_neighbour.h"
#include "tools/bench/bench_nvme.h"
#include "tools/bench/bench_peer.h"
#include "tools/bench/bench_policy.h"
#include "tools/bench/bench_remote.h"
#include "tools/bench/bench_restart.h"
#include "tools/bench/bench_startup.h"

int main(int argc, char** argv) {
  CLI::App bench{"Benchmarks (each figure beside its ceiling)", "kvtier bench"};
  bench.require_subcommand(1);
  kvtier::tools::HostBenchOptions host_options;
  auto* host = bench.add_subcommand("host", "Put/get GB/s vs memcpy; Lookup ops/s vs redis-benchmark");
  kvtier::tools::AddHostBenchOptions(*host, host_options);
  kvtier::tools::NvmeBenchOptions nvme_options;
  auto* nvme = bench.add_subcommand("nvme", "NVMe tier write/read GB/s and random-read IOPS vs fio");
  kvtier::tools::AddNvmeBenchOptions(*nvme, nvme_options);
  kvtier::tools::RemoteBenchOptions remote_options;
  auto* remote = bench.add_subcommand("remote", "Remote tier put/get GB/s vs redis-benchmark SET/GET, same cluster");
  kvtier::tools::AddRemoteBenchOptions(*remote, remote_options);
  kvtier::tools::PeerBenchOptions peer_options;
  auto* peer = bench.add_subcommand("peer", "Peer tier pulls GB/s (blocks, a layer-wise prefix) vs ucx_perftest");
  kvtier::tools::AddPeerBenchOptions(*peer, peer_options);
  kvtier::tools::LayersBenchOptions layers_options;
  auto* layers = bench.add_subcommand(
      "layers", "Layer-wise load (first layer vs whole, load hidden behind compute) and save vs memcpy");
  kvtier::tools::AddLayersBenchOptions(*layers, layers_options);
  kvtier::tools::PolicyBenchOptions policy_options;
  auto* policy = bench.add_subcommand("policy", "Policy operations per second on one core (Google Benchmark)");
  kvtier::tools::AddPolicyBenchOptions(*policy, policy_options);
  kvtier::tools::NeighbourBenchOptions neighbour_options;
  auto* neighbour =
      bench.add_subcommand("neighbour", "A small Lookup's latency alone and beside connections sending huge Lookups");
  kvtier::tools::AddNeighbourBenchOptions(*neighbour, neighbour_options);
  kvtier::tools::StartupBenchOptions startup_options;
  auto* startup = bench.add_subcommand(
      "startup", "Seconds until a fresh kvtierd serves and until its arena is faulted in, vs doing that at once");
  kvtier::tools::AddStartupBenchOptions(*startup, startup_options);
  kvtier::tools::RestartBenchOptions restart_options;
  auto* restart = bench.add_subcommand(
      "restart", "A kill -9 and restart at N host blocks (kept arena) and N NVMe records: time to serve, memory");
  kvtier::tools::AddRestartBenchOptions(*restart, restart_options);

  // Bad input exits with CLI11's code, as it always has for `kvtier bench`.
  CLI11_PARSE(bench, argc, argv);
  if (host->parsed()) return kvtier::tools::RunHostBench(host_options);
  if (nvme->parsed()) return kvtier::tools::RunNvmeBench(nvme_options);
  if (remote->parsed()) return kvtier::tools::RunRemoteBench(remote_options);
  if (peer->parsed()) return kvtier::tools::RunPeerBench(peer_options);
  if (layers->parsed()) return kvtier::tools::RunLayersBench(layers_options);
  if (policy->parsed()) return kvtier::tools::RunPolicyBench(policy_options);
  if (neighbour->parsed()) return kvtier::tools::RunNeighbourBench(neighbour_options);
  if (startup->parsed()) return kvtier::tools::RunStartupBench(startup_options);
  if (restart->parsed()) return kvtier::tools::RunRestartBench(restart_options);
  return 2;
}
