#include "tools/bench/bench_fio.h"

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <unistd.h>
#include <vector>

#include "support/process.h"

namespace kvtier::tools {

FioResult RunFio(const NvmeBenchOptions& o, const std::string& rw, uint64_t block_bytes) {
  FioResult r;
  if (o.skip_fio) {
    r.why = "skipped (--skip-fio)";
    return r;
  }
  const std::string file = o.dir + "/kvtier-bench-fio-" + std::to_string(::getpid()) + ".dat";
  std::vector<std::string> argv = {o.fio,
                                   "--name=kvtier-ceiling",
                                   "--filename=" + file,
                                   "--ioengine=io_uring",
                                   "--direct=1",
                                   "--rw=" + rw,
                                   "--bs=" + std::to_string(block_bytes),
                                   "--iodepth=" + std::to_string(o.queue_depth),
                                   "--size=" + std::to_string(o.file_bytes),
                                   "--runtime=" + std::to_string(static_cast<int>(o.seconds + 0.999)),
                                   "--time_based",
                                   "--output-format=terse",
                                   "--terse-version=3"};
  auto run = support::RunCommand(argv);
  if (!run.ok() || run->exit_code != 0) {
    r.why = run.ok() ? "fio exited " + std::to_string(run->exit_code) + ": " + run->output.substr(0, 200)
                     : run.status().ToString();
    return r;
  }
  // Terse v3: field 7 read KiB/s, 8 read IOPS, 48 write KiB/s, 49 write IOPS (1-based).
  std::vector<std::string> fields;
  std::stringstream line(run->output.substr(run->output.rfind("3;fio-")));
  for (std::string f; std::getline(line, f, ';');) fields.push_back(f);
  if (fields.size() < 49) {
    r.why = "unexpected fio output";
    return r;
  }
  const bool write = rw == "write";
  r.gbps = std::atof(fields[write ? 47 : 6].c_str()) * 1024 / 1e9;
  r.iops = std::atof(fields[write ? 48 : 7].c_str());
  r.ran = true;
  std::filesystem::remove(file);
  return r;
}

}  // namespace kvtier::tools
