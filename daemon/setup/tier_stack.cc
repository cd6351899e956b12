#include "daemon/setup/tier_stack.h"

#include "common/logging.h"
#include "daemon/setup/nvme_setup.h"
#include "daemon/setup/peer_setup.h"
#include "daemon/setup/remote_setup.h"

namespace kvtier {
namespace {

// One tier kvtierd can put below the host tier.
struct TierRegistration {
  const char* name;
  // How clients hear of a block found there (LowerTier::reported).
  Tier reported;
  // The tier the configuration asks for; null when it is off.
  Result<std::unique_ptr<BlockTier>> (*open)(const DaemonConfig& config, Clock& clock);
  // Its admission (policy name and budget) from the configuration.
  Result<LowerTier> (*admission)(const DaemonConfig& config, BlockTier& tier);
};

Result<std::unique_ptr<BlockTier>> OpenNvme(const DaemonConfig& config, Clock& clock) {
  auto tier = OpenNvmeTier(config, clock);
  if (!tier.ok()) return tier.status();
  return std::unique_ptr<BlockTier>(std::move(*tier));
}

Result<std::unique_ptr<BlockTier>> OpenRemote(const DaemonConfig& config, Clock& clock) {
  auto tier = OpenRemoteTier(config, clock);
  if (!tier.ok()) return tier.status();
  return std::unique_ptr<BlockTier>(std::move(*tier));
}

Result<std::unique_ptr<BlockTier>> OpenPeer(const DaemonConfig& config, Clock& clock) {
  auto tier = OpenPeerTier(config, clock);
  if (!tier.ok()) return tier.status();
  return std::unique_ptr<BlockTier>(std::move(*tier));
}

// The registration table, in stack order. The peer tier (other nodes'
// memory, read one-sided) is asked before the remote tier (a copy through
// Redis); clients hear of a peer hit as a remote one (off this node).
constexpr TierRegistration kTiers[] = {
    {"nvme", Tier::kNvme, OpenNvme, NvmeAdmissionFromConfig},
    {"peer", Tier::kRemote, OpenPeer, PeerAdmissionFromConfig},
    {"remote", Tier::kRemote, OpenRemote, RemoteAdmissionFromConfig},
};

}  // namespace

Result<TierStack> OpenTierStack(const DaemonConfig& config, Clock& clock) {
  TierStack stack;
  for (const TierRegistration& r : kTiers) {
    auto tier = r.open(config, clock);
    if (!tier.ok()) return Status(tier.status().code(), std::string(r.name) + " tier: " + tier.status().message());
    if (*tier == nullptr) continue;
    auto lower = r.admission(config, **tier);
    if (!lower.ok()) {
      return Status(lower.status().code(), std::string(r.name) + " admission: " + lower.status().message());
    }
    lower->reported = r.reported;
    stack.lower.push_back(*lower);
    stack.tiers.push_back(std::move(*tier));
  }
  return stack;
}

}  // namespace kvtier
