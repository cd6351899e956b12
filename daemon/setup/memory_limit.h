// The memory limit kvtierd runs under when it is in a memory cgroup (a
// container, a systemd MemoryMax=, a Kubernetes limit). /proc/meminfo shows
// the whole machine there, and a host arena sized from it, or configured
// past the limit, would have kvtierd OOM-killed while it pre-faults the
// arena (or later, under load). So kvtierd sizes "auto" from the limit and
// refuses to start with sizes that cannot fit under it (main.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "daemon/setup/auto_size.h"
#include "daemon/config/config.h"
#include "kvtier/status.h"

namespace kvtier {

struct CgroupMemory {
  uint64_t limit_bytes = 0;  // the lowest limit on the way to the root
  uint64_t usage_bytes = 0;  // charged to kvtierd's own cgroup now
  std::string limit_file;    // where limit_bytes was read (for messages)
};

// What kvtierd holds besides the sizes of its configuration (code, threads'
// stacks, RocksDB's memtables and caches, protobuf and I/O buffers of a
// few connections): the headroom it asks for under a memory limit.
// Connections add about ConnectionLimits' per-connection cost each
// (docs/RELIABILITY.md), and partial frames up to server.partial_frame_bytes.
inline constexpr uint64_t kDaemonBaseBytes = uint64_t{96} << 20;
// An entry of the peer tier's events directory (subscriber/held_directory.h,
// about 64 bytes) and its share of a snapshot being applied (at most 64).
inline constexpr uint64_t kPeerEventsBytesPerBlock = 128;

// The memory cgroup of the process described by `proc_cgroup` (a
// /proc/<pid>/cgroup file) under the cgroup file systems at `cgroup_root`:
// cgroup v2's memory.max / memory.current when the unified hierarchy has the
// memory controller, else v1's memory.limit_in_bytes / memory.usage_in_bytes
// under <root>/memory. Walks from the process's cgroup up to the root and
// keeps the lowest limit (a parent's limit binds its children). A cgroup
// path that is not under the mount (a cgroup namespace) is read at the
// mount's root. nullopt when no limit applies or nothing is readable:
// kvtierd then goes by /proc/meminfo alone.
std::optional<CgroupMemory> ReadCgroupMemory(const std::string& proc_cgroup = "/proc/self/cgroup",
                                             const std::string& cgroup_root = "/sys/fs/cgroup");

// `machine` as seen from inside `cgroup`: total at most the limit, and
// available at most what the limit leaves above the current usage.
MachineMemory UnderLimit(MachineMemory machine, const CgroupMemory& cgroup);

// The bytes kvtierd's configuration holds in memory: the host arena (with
// its block directory), the staging buffers of the NVMe and remote tiers,
// with a peer tier the directory of its members' KV events
// (kPeerEventsBytesPerBlock per peer.events_max_blocks), plus
// kDaemonBaseBytes.
uint64_t ConfiguredMemoryBytes(const DaemonConfig& config);

// Ok when ConfiguredMemoryBytes(config) fits under cgroup.limit_bytes, else
// InvalidArgument naming the sizes, the limit and its file, and what to change.
Status CheckFitsUnderLimit(const DaemonConfig& config, const CgroupMemory& cgroup);

}  // namespace kvtier
