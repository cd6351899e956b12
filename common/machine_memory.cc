#include "common/machine_memory.h"

#include <fstream>
#include <sstream>

namespace kvtier {

Result<MachineMemory> ReadMachineMemory(const std::string& path) {
  std::ifstream in(path);
  if (!in) return IoError("cannot read " + path + " to size the host tier (set host.capacity_bytes)");
  MachineMemory m;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    uint64_t kib = 0;
    if (!(fields >> key >> kib)) continue;
    if (key == "MemTotal:") m.total_bytes = kib * 1024;
    if (key == "MemAvailable:") m.available_bytes = kib * 1024;
  }
  if (m.total_bytes == 0) return ProtocolError(path + " has no MemTotal (set host.capacity_bytes)");
  if (m.available_bytes == 0) m.available_bytes = m.total_bytes;  // kernels before 3.14
  return m;
}

}  // namespace kvtier
