// The machine's memory as /proc/meminfo says: what auto sizing fits the
// daemon to (daemon/setup/auto_size.h) and what a host arena checks it can
// still allocate (tiers/host/host_arena.h).
#pragma once

#include <cstdint>
#include <string>

#include "kvtier/result.h"

namespace kvtier {

struct MachineMemory {
  uint64_t total_bytes = 0;      // MemTotal
  uint64_t available_bytes = 0;  // MemAvailable: what can be taken without swapping
};

// From /proc/meminfo (or `path`). IoError when unreadable, ProtocolError
// without MemTotal; without MemAvailable (kernels before 3.14) all of
// MemTotal counts as available.
Result<MachineMemory> ReadMachineMemory(const std::string& path = "/proc/meminfo");

}  // namespace kvtier
