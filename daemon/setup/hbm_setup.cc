#include "daemon/setup/hbm_setup.h"

namespace kvtier {

Result<HbmSetup> OpenHbmTier(const DaemonConfig& config) {
  if (config.hbm_enabled == HbmEnabled::kOff) return HbmSetup{};
  Result<HbmSetup> opened = internal::OpenDeviceTier(config);
  if (opened.ok()) return opened;
  const std::string why =
      "hbm tier (hbm.enabled = " + std::string(ChoiceName(config.hbm_enabled)) + "): " + opened.status().message();
  if (config.hbm_enabled == HbmEnabled::kOn) return Status(opened.status().code(), why);
  HbmSetup none;
  none.why_not = why;
  return none;
}

}  // namespace kvtier
