// Sizes for options left at 0 ("auto": OptionSpec::zero_is_auto), fitted
// to the machine kvtierd starts on, so that `make run` with the embedded
// defaults neither wastes a large node nor overcommits a small one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/machine_memory.h"
#include "daemon/config/config.h"
#include "kvtier/result.h"

namespace kvtier {

// The meminfo kvtierd sizes from: $KVTIER_MEMINFO when set (tests size a
// daemon for a machine other than the one they run on), else /proc/meminfo.
std::string MeminfoPath();

// The host arena for host.capacity_bytes = 0: a quarter of the memory and
// at most half of what is available now (the arena is pre-faulted and
// locked at start), within [64 MiB, 64 GiB], a multiple of 2 MiB.
uint64_t AutoHostCapacity(const MachineMemory& memory);

// server.client_memory_bytes = 0: a sixteenth of the memory, within
// [32 MiB, 4 GiB], a multiple of 1 MiB (what clients' state may take).
uint64_t AutoClientMemory(const MachineMemory& memory);

// Replaces every auto (0) size in `config` with its value for `memory`;
// one line per choice, saying what and why, for the log.
std::vector<std::string> ResolveAutoSizes(DaemonConfig& config, const MachineMemory& memory);

// An auto host size (config.host_capacity_bytes as ResolveAutoSizes
// resolved it) with a kept arena without tenants of `kept_bytes`
// (host_keep.h; 0: none) takes the kept arena's size, so that the start
// adopts it rather than start empty, whenever that is within a quarter of
// the memory (the total-memory part of AutoHostCapacity): its memory is
// held already, so what is available now (less, while a predecessor still
// frees its index) does not limit it. Not with tenants: no tenant adopts
// that arena, and their shares are not kept this way. The line for the
// log when it changed the size; empty otherwise.
std::string KeepKeptArenaSize(uint64_t kept_bytes, const MachineMemory& memory, DaemonConfig& config);

}  // namespace kvtier
