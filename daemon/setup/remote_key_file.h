// The cluster secret of the remote tier: kClusterSecretBytes in a file
// (remote.key_file) that every kvtierd sharing a Redis Cluster holds the
// same copy of. It keys the MAC every remote value carries
// (tiers/remote/value_mac.h); whoever can read it can forge values, so it
// must be readable by kvtierd's user alone.
#pragma once

#include <string>

#include "kvtier/result.h"

namespace kvtier {

// The secret in `path`, loaded or created as LoadOrCreateSecret
// (secret_file.h) does; a new one is logged with a warning, since the other
// nodes need a copy of it. Its errors, each naming the file.
Result<std::string> LoadRemoteKey(const std::string& path);

}  // namespace kvtier
