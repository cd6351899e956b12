#include "daemon/setup/remote_key_file.h"

#include <spdlog/spdlog.h>

#include "daemon/config/secret_file.h"
#include "tiers/remote/value_mac.h"

namespace kvtier {

Result<std::string> LoadRemoteKey(const std::string& path) {
  bool created = false;
  auto key = LoadOrCreateSecret(path, kClusterSecretBytes, "the remote key", &created);
  if (key.ok() && created) {
    spdlog::warn(
        "remote tier: created a new cluster key {}; every node of this cluster needs a copy of it "
        "(remote.key_file, mode 0600), else it misses the others' values",
        path);
  }
  return key;
}

}  // namespace kvtier
