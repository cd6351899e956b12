#include "daemon/setup/auto_size.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace kvtier {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

std::string MiB(uint64_t bytes) { return std::to_string(bytes / kMiB) + " MiB"; }

}  // namespace

std::string MeminfoPath() {
  const char* path = std::getenv("KVTIER_MEMINFO");
  return path != nullptr && *path != '\0' ? path : "/proc/meminfo";
}

uint64_t AutoHostCapacity(const MachineMemory& memory) {
  uint64_t bytes = std::min(memory.total_bytes / 4, memory.available_bytes / 2);
  bytes = std::clamp(bytes, 64 * kMiB, 64 * kGiB);
  return bytes / (2 * kMiB) * (2 * kMiB);
}

std::string KeepKeptArenaSize(uint64_t kept_bytes, const MachineMemory& memory, DaemonConfig& config) {
  const uint64_t cap = AutoHostCapacity(MachineMemory{memory.total_bytes, memory.total_bytes});
  const auto kept = static_cast<int64_t>(kept_bytes);
  int64_t* capacity_bytes = &config.host_capacity_bytes;
  if (!config.tenants.empty() || kept_bytes == 0 || kept_bytes > cap || kept == *capacity_bytes) return "";
  std::string line = "host.capacity_bytes = 0 (auto): " + std::to_string(kept_bytes) +
                     " bytes, the size of the kept host arena (auto would choose " + std::to_string(*capacity_bytes) +
                     " now; a kept arena may take up to " + std::to_string(cap) + ")";
  *capacity_bytes = kept;
  return line;
}

uint64_t AutoClientMemory(const MachineMemory& memory) {
  const uint64_t bytes = std::clamp(memory.total_bytes / 16, 32 * kMiB, 4096 * kMiB);
  return bytes / kMiB * kMiB;
}

std::vector<std::string> ResolveAutoSizes(DaemonConfig& config, const MachineMemory& memory) {
  std::vector<std::string> lines;
  if (config.host_capacity_bytes == 0) {
    const uint64_t bytes = AutoHostCapacity(memory);
    config.host_capacity_bytes = static_cast<int64_t>(bytes);
    lines.push_back("host.capacity_bytes = 0 (auto): " + MiB(bytes) + " of this machine's " + MiB(memory.total_bytes) +
                    " (" + MiB(memory.available_bytes) +
                    " available): a quarter of its memory, at most half of what is available, within "
                    "64 MiB..64 GiB; set host.capacity_bytes to choose");
  }
  if (config.client_memory_bytes == 0) {
    const uint64_t bytes = AutoClientMemory(memory);
    config.client_memory_bytes = static_cast<int64_t>(bytes);
    lines.push_back("server.client_memory_bytes = 0 (auto): " + MiB(bytes) + ", a sixteenth of " +
                    MiB(memory.total_bytes) + " within 32 MiB..4 GiB; set it to choose");
  }
  return lines;
}

}  // namespace kvtier
