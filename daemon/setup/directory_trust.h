// Whether kvtierd may trust a directory with what it keeps there: its
// socket, the NVMe file and index, the tenant and cluster keys. Someone who
// can add, remove or rename entries in such a directory can swap the socket
// for a listener of their own (and read the KV bytes clients send it) or
// plant a symlink that makes kvtierd write over another file.
#pragma once

#include <string>
#include <string_view>
#include <sys/types.h>

#include "kvtier/status.h"

namespace kvtier {

struct DaemonConfig;

// Ok when `dir` is a directory (symlinks to one are followed) owned by root
// or `self` that neither its group nor others may write; a sticky directory
// such as /tmp does not qualify (others may still create names in it before
// kvtierd does). A `dir` that does not exist is judged by its nearest
// existing ancestor, where kvtierd would create it. Otherwise
// PermissionDenied naming `what`, the directory, its owner and mode, and
// server.trust_shared_directories; IoError when it cannot be examined.
Status CheckTrustedDirectory(const std::string& dir, std::string_view what, uid_t self);

// CheckTrustedDirectory on the directory of every path the configuration
// names: server.socket_path, nvme.path (unless a block device),
// nvme.index_path (or its default), server.tenant_key_file, remote.key_file
// (with a remote tier). Ok at once when
// config.trust_shared_directories is set.
Status CheckStateDirectories(const DaemonConfig& config, uid_t self);

}  // namespace kvtier
