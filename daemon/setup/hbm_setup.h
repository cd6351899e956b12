// Opens the HBM tier a DaemonConfig describes ([hbm]): the tier stacked
// above the host tier (Engine::Create's `above`), over a device pool
// allocated once at start, and the offer of that pool a Hello carries
// (its CUDA IPC handle, exported once).
//
// hbm.enabled:
//   off   no tier; no CUDA call is made.
//   auto  the tier when this build has CUDA (KVTIER_HAVE_CUDA), a device
//         answers and the pool fits; otherwise no tier, and `why_not` says
//         which (the daemon logs it and serves without the tier).
//   on    as auto, but each of those is an error: start-up fails.
// No CUDA header; built in every configuration (hbm_setup_cuda.cc with
// CUDA, hbm_setup_none.cc without).
#pragma once

#include <memory>
#include <string>

#include "daemon/config/config.h"
#include "daemon/server/request_handler.h"
#include "kvtier/result.h"
#include "tiers/tier.h"

namespace kvtier {

struct HbmSetup {
  std::unique_ptr<BlockTier> tier;  // null: running without the tier
  DevicePoolOffer offer;            // what Hello offers (empty handle with no tier)
  std::string why_not;              // no tier: the reason (empty for hbm.enabled = off)
  std::string description;          // with a tier: the line to log (device, sizes)
};

// Errors (hbm.enabled = on only): Unavailable (no CUDA build, no device,
// IPC unsupported), NoSpace (the pool does not fit the device), and the
// device's errors; each message names the option at fault.
Result<HbmSetup> OpenHbmTier(const DaemonConfig& config);

namespace internal {
// The build's part (hbm_setup_cuda.cc / hbm_setup_none.cc): the tier and
// its offer, or why not (Unavailable without CUDA or a device).
Result<HbmSetup> OpenDeviceTier(const DaemonConfig& config);
}  // namespace internal

}  // namespace kvtier
