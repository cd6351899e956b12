#include "daemon/setup/memory_limit.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <vector>

#include "common/block_directory.h"
#include "tiers/host/host_directory.h"

namespace kvtier {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
// cgroup v1 writes "no limit" as the largest page-aligned counter
// (9223372036854771712); anything this large is no limit.
constexpr uint64_t kNoLimit = uint64_t{1} << 60;

std::string MiB(uint64_t bytes) { return std::to_string(bytes / kMiB) + " MiB"; }

bool Exists(const std::string& path) { return std::ifstream(path).good(); }

// The number in `path`: nullopt if unreadable, kNoLimit for "max".
std::optional<uint64_t> ReadNumber(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word)) return std::nullopt;
  if (word == "max") return kNoLimit;
  try {
    return static_cast<uint64_t>(std::stoull(word));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// The hierarchy's mount, and the process's path in it: from the /proc
// cgroup line "0::/path" (v2) or "N:a,memory,b:/path" (v1).
struct Placement {
  std::string mount;
  std::string path;
  const char* limit_name;
  const char* usage_name;
};

std::optional<Placement> FindPlacement(const std::string& proc_cgroup, const std::string& root) {
  std::ifstream in(proc_cgroup);
  std::string line;
  std::optional<Placement> v1, v2;
  while (std::getline(in, line)) {
    const size_t first = line.find(':');
    const size_t second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    if (line.compare(0, first, "0") == 0 && controllers.empty()) {
      // Unified hierarchy: at the root (pure v2) or under unified/ (hybrid).
      for (const std::string& mount : {root, root + "/unified"}) {
        std::ifstream list(mount + "/cgroup.controllers");
        std::string names((std::istreambuf_iterator<char>(list)), std::istreambuf_iterator<char>());
        std::istringstream words(names);
        std::string word;
        bool memory = false;
        while (words >> word) memory = memory || word == "memory";
        if (memory) {
          v2 = Placement{mount, path, "memory.max", "memory.current"};
          break;
        }
      }
      continue;
    }
    std::istringstream names(controllers);
    std::string name;
    while (std::getline(names, name, ',')) {
      if (name == "memory") v1 = Placement{root + "/memory", path, "memory.limit_in_bytes", "memory.usage_in_bytes"};
    }
  }
  if (v2) return v2;  // the memory controller is in one hierarchy only
  return v1;
}

}  // namespace

std::optional<CgroupMemory> ReadCgroupMemory(const std::string& proc_cgroup, const std::string& cgroup_root) {
  const auto placement = FindPlacement(proc_cgroup, cgroup_root);
  if (!placement) return std::nullopt;
  std::string path = placement->path;
  // In a cgroup namespace the path may name a cgroup above the mount: then
  // the mount's root is the process's cgroup.
  if (!Exists(placement->mount + path + "/" + placement->limit_name)) path = "/";
  CgroupMemory found;
  found.limit_bytes = kNoLimit;
  bool own = true;
  while (true) {
    const std::string dir = placement->mount + (path == "/" ? "" : path);
    if (auto limit = ReadNumber(dir + "/" + placement->limit_name); limit && *limit < found.limit_bytes) {
      found.limit_bytes = *limit;
      found.limit_file = dir + "/" + placement->limit_name;
    }
    if (own) {
      found.usage_bytes = ReadNumber(dir + "/" + placement->usage_name).value_or(0);
      own = false;
    }
    if (path == "/" || path.empty()) break;
    const size_t slash = path.rfind('/');
    path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  }
  if (found.limit_bytes >= kNoLimit) return std::nullopt;
  return found;
}

MachineMemory UnderLimit(MachineMemory machine, const CgroupMemory& cgroup) {
  machine.total_bytes = std::min(machine.total_bytes, cgroup.limit_bytes);
  const uint64_t left = cgroup.limit_bytes > cgroup.usage_bytes ? cgroup.limit_bytes - cgroup.usage_bytes : 0;
  machine.available_bytes = std::min(machine.available_bytes, left);
  return machine;
}

uint64_t ConfiguredMemoryBytes(const DaemonConfig& config) {
  uint64_t bytes = kDaemonBaseBytes + static_cast<uint64_t>(config.host_capacity_bytes);
  if (config.host_directory) {
    const uint32_t slots = config.host_directory_slots > 0
                               ? static_cast<uint32_t>(config.host_directory_slots)
                               : HostDirectory::DefaultSlots(static_cast<uint64_t>(config.host_capacity_bytes));
    bytes += DirectoryBytes(slots);
  }
  if (!config.nvme_path.empty()) bytes += static_cast<uint64_t>(config.nvme_staging_bytes);
  if (!config.remote_nodes.empty()) bytes += static_cast<uint64_t>(config.remote_staging_bytes);
  if (config.hbm_enabled == HbmEnabled::kOn) bytes += static_cast<uint64_t>(config.hbm_staging_bytes);
  if (!config.peer_members.empty() || config.peer_discover) {
    bytes += static_cast<uint64_t>(config.peer_events_max_blocks) * kPeerEventsBytesPerBlock;
  }
  bytes += static_cast<uint64_t>(config.client_memory_bytes);  // what connections may make it hold
  return bytes;
}

Status CheckFitsUnderLimit(const DaemonConfig& config, const CgroupMemory& cgroup) {
  const uint64_t needed = ConfiguredMemoryBytes(config);
  if (needed <= cgroup.limit_bytes) return Status::Ok();
  return InvalidArgument(
      "the configured sizes need " + MiB(needed) + " of memory (host.capacity_bytes " +
      MiB(static_cast<uint64_t>(config.host_capacity_bytes)) +
      " with its block directory, the staging buffers of "
      "the tiers below, the peer tier's events directory, server.client_memory_bytes " +
      MiB(static_cast<uint64_t>(config.client_memory_bytes)) + " and " + MiB(kDaemonBaseBytes) +
      " for the daemon itself), more than the memory limit of "
      "kvtierd's cgroup: " +
      MiB(cgroup.limit_bytes) + " (" + cgroup.limit_file +
      "); it would be OOM-killed: lower host.capacity_bytes (0 sizes it to the limit) or raise the limit");
}

}  // namespace kvtier
