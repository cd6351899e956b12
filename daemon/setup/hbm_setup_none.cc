// hbm_setup.h without CUDA: there is never an HBM tier.
#include "daemon/setup/hbm_setup.h"

namespace kvtier::internal {

Result<HbmSetup> OpenDeviceTier(const DaemonConfig&) {
  return Unavailable(
      "this kvtierd is built without CUDA (KVTIER_CUDA=OFF, or no toolkit was found); "
      "running without the HBM tier");
}

}  // namespace kvtier::internal
