// Opens the remote tier a DaemonConfig describes (the [remote] section:
// tiers/remote/remote_tier.h over a Redis Cluster) and its admission.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "daemon/config/config.h"
#include "daemon/engine/engine.h"
#include "tiers/remote/remote_tier.h"

namespace kvtier {

// A comma-separated option's items, trimmed, empty ones dropped:
// "a, b,,c " -> {"a", "b", "c"} (remote.nodes, peer.members, ...).
std::vector<std::string> SplitList(std::string_view list);

// The options [remote] gives (remote.nodes and remote.cluster_networks
// split at commas), the password read from remote.password_file. IoError
// naming the option when that file cannot be read; InvalidArgument naming
// remote.cluster_networks when it holds something that is no network.
Result<RemoteTierOptions> RemoteOptionsFromConfig(const DaemonConfig& config);

// The cluster secret from remote.key_file (created when missing) into
// `options.cluster_secret`: LoadRemoteKey's errors, naming the option.
Status LoadClusterSecret(const DaemonConfig& config, RemoteTierOptions& options);

// Null when remote.nodes is empty (no remote tier). InvalidArgument naming
// a bad node address, IoError for an unreadable password file,
// PermissionDenied when a node refuses the password (or wants one),
// LoadClusterSecret's errors for remote.key_file. A
// cluster that does not answer yet is not an error: the tier starts
// unavailable, logged, and keeps trying. `clock` is borrowed and must
// outlive the tier.
Result<std::unique_ptr<RemoteTier>> OpenRemoteTier(const DaemonConfig& config, const Clock& clock);

// `tier` with remote.admission (and remote.write_rate for "rate").
Result<LowerTier> RemoteAdmissionFromConfig(const DaemonConfig& config, BlockTier& tier);

}  // namespace kvtier
