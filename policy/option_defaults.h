// The defaults of the knobs that kvtierd's option table (daemon/config/
// config_options.cc) and a library's option struct both carry, each named
// once here: the table's default text is made from the constant
// (DefaultInt, DefaultBytes, DefaultBool, DefaultReal in
// daemon/config/option_field.h), and EngineOptions, DwpdOptions,
// BlockDeviceOptions, NvmeTierOptions, RemoteTierOptions and `kvtier
// replay`'s options initialize their members with it (and the one rule
// below that is no option, but which the daemon and the replay share);
// tests/unit/config_defaults_test.cc checks, for every option that maps
// onto any of these structs, that a daemon given no option builds the
// struct's default. Constants only: no code, no state.
#pragma once

#include <cstdint>

namespace kvtier::defaults {

// [engine] -> EngineOptions (daemon/engine/engine.h)
inline constexpr uint32_t kEngineShards = 8;
inline constexpr uint64_t kLookaheadMs = 2000;
inline constexpr uint32_t kPrefetchPercent = 25;  // EngineOptions::prefetch_share = this / 100
inline constexpr uint32_t kPrefetchMinBlocks = 2;
inline constexpr uint64_t kDemotionBufferBytes = uint64_t{256} << 20;
// Not an option: how long a demotion a busy tier below refused waits (in
// the demotion buffer) for room before it is dropped. The daemon's
// Demoter::kQueuedDemotionWaitUs and `kvtier replay`'s write channels
// (ReplayOptions::max_write_backlog_us) both give up after it.
inline constexpr uint64_t kQueuedDemotionWaitMs = 10'000;
// Not an option: a tier's read bandwidth until reads are measured. The
// daemon's read meters (TierLevel::read_meter) start at it, so it is the
// prefetch planner's estimate of a tier below until then, and what a
// replay sets its read bandwidths to (ReplayOptions::read_bytes_per_s) to
// plan as a daemon on a clock that does not move.
inline constexpr double kInitialReadBytesPerS = 1e9;
// [host] -> EngineOptions
inline constexpr bool kVerifyCommits = false;

// [nvme] -> BlockDeviceOptions (tiers/nvme/block_device.h) and
// NvmeTierOptions (tiers/nvme/nvme_tier.h), equal by test
inline constexpr bool kNvmeDirectIo = true;
inline constexpr bool kNvmePreallocate = true;
inline constexpr uint32_t kNvmeQueueDepth = 32;
inline constexpr uint32_t kNvmeIoThreads = 1;
inline constexpr uint64_t kNvmeRegionBytes = uint64_t{64} << 20;
inline constexpr uint64_t kNvmeStagingBytes = uint64_t{256} << 20;
inline constexpr uint32_t kNvmeReinsertPercent = 10;  // NvmeTierOptions::reinsert_share = this / 100

// [nvme] dwpd_* -> DwpdOptions (policy/dwpd_budget.h)
inline constexpr double kDwpd = 1.0;
inline constexpr double kDwpdWarrantyYears = 5.0;
inline constexpr double kDwpdPlannedYears = 5.0;
inline constexpr double kDwpdShare = 1.0;

// [remote] -> RemoteTierOptions (tiers/remote/remote_tier.h), equal by test
inline constexpr uint64_t kRemoteCapacityBytes = uint64_t{64} << 30;
inline constexpr int64_t kRemoteTimeoutMs = 2000;
inline constexpr int64_t kRemoteProbeTimeoutMs = 50;
inline constexpr int64_t kRemoteRetryMs = 1000;
inline constexpr uint32_t kRemoteThreads = 4;
inline constexpr uint64_t kRemoteStagingBytes = uint64_t{256} << 20;
inline constexpr uint32_t kRemoteTtlSeconds = 0;

}  // namespace kvtier::defaults
