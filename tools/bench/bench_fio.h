// fio, the NVMe benchmark's ceiling (`kvtier bench nvme`): one run on a
// file of its own in the options' directory (removed after), with the
// block size it is given and the options' queue depth, file size and
// seconds, through io_uring with O_DIRECT, as the tier reads and writes.
#pragma once

#include <cstdint>
#include <string>

#include "tools/bench/bench_nvme.h"

namespace kvtier::tools {

struct FioResult {
  bool ran = false;
  std::string why;  // when it did not run
  double gbps = 0, iops = 0;
};

// rw = write | read | randread. Not run (`why` says why) with --skip-fio,
// or when fio fails or prints what terse v3 does not.
FioResult RunFio(const NvmeBenchOptions& o, const std::string& rw, uint64_t block_bytes);

}  // namespace kvtier::tools
