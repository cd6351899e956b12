// Who may be this client's kvtierd: the check Connect makes on the
// listening peer before it sends anything (ClientOptions::
// trusted_daemon_uids). Internal.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvtier/client.h"
#include "kvtier/result.h"

namespace kvtier::internal {

// The uids `options` trusts: its trusted_daemon_uids; else those of
// KVTIER_TRUSTED_DAEMON_UIDS (`environment`, null when unset): uids or user
// names separated by commas (InvalidArgument for an unknown name, an empty
// list or garbage); else DefaultTrustedDaemonUids().
Result<std::vector<uint32_t>> TrustedDaemonUids(const ClientOptions& options, const char* environment);

// Root, geteuid() and the uid of the user "kvtier" when there is one.
std::vector<uint32_t> DefaultTrustedDaemonUids();

// Ok when the peer of the connected Unix socket `fd` runs as one of
// `trusted`; PermissionDenied naming the peer's uid and pid, the socket
// path and how to trust it otherwise; IoError when SO_PEERCRED fails.
Status CheckDaemonPeer(int fd, const std::string& socket_path, const std::vector<uint32_t>& trusted);

}  // namespace kvtier::internal
