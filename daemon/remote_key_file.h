// The cluster secret of the remote tier: kClusterSecretBytes in a file
// (remote.key_file) that every kvtierd sharing a Redis Cluster holds the
// same copy of. It keys the MAC every remote value carries
// (tiers/remote/value_mac.h); whoever can read it can forge values, so it
// must be readable by kvtierd's user alone.
#pragma once

#include <string>

#include "kvtier/result.h"

namespace kvtier {

// The secret in `path`. When `path` does not exist it is created: 32 bytes
// from getrandom, mode 0600, opened O_CREAT|O_EXCL|O_NOFOLLOW (never
// through a link, never over a file another process made meanwhile),
// fsynced; logged, since the other nodes need a copy of it. Errors, each
// naming the file:
//   InvalidArgument   a link, not a regular file, group or other
//                     permission bits set (0600 or 0400 expected), a size
//                     other than 32 bytes;
//   IoError           cannot be opened, read, created or written.
Result<std::string> LoadRemoteKey(const std::string& path);

}  // namespace kvtier
