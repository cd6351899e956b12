// TierName (include/kvtier/client.h), in kvtier_common so that the daemon,
// which does not link the client library, names tiers the same way.
#include "kvtier/client.h"

namespace kvtier {

std::string_view TierName(Tier tier) {
  switch (tier) {
    case Tier::kNone:
      return "none";
    case Tier::kHbm:
      return "hbm";
    case Tier::kHost:
      return "host";
    case Tier::kNvme:
      return "nvme";
    case Tier::kRemote:
      return "remote";
  }
  return "unknown";
}

}  // namespace kvtier
