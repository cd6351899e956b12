// Placeholder translation unit replaced by the host benchmark (in progress).
#include "tools/bench_host.h"
#include <cstdio>
namespace kvtier::tools {
void AddHostBenchOptions(CLI::App& app, HostBenchOptions& options) {}
int RunHostBench(const HostBenchOptions& options) {
  std::fprintf(stderr, "kvtier bench host: not built yet\n");
  return 1;
}
}  // namespace kvtier::tools
