#include "daemon/tenants/tenants.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sys/socket.h>

namespace kvtier {

Result<PeerCredentials> ReadPeerCredentials(int fd) {
  ucred cred{};
  socklen_t length = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &length) != 0) {
    return IoError(std::string("SO_PEERCRED: ") + std::strerror(errno));
  }
  PeerCredentials peer{cred.pid, cred.uid, cred.gid, {}};
  // SO_PEERGROUPS (Linux 4.13): ERANGE tells the size needed.
  std::vector<gid_t> groups(64);
  for (int attempt = 0; attempt < 3; ++attempt) {
    socklen_t bytes = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &bytes) == 0) {
      groups.resize(bytes / sizeof(gid_t));
      peer.groups = std::move(groups);
      return peer;
    }
    if (errno != ERANGE) break;  // an old kernel: primary ids only
    groups.resize(bytes / sizeof(gid_t) + 1);
  }
  return peer;
}

TenantTable::TenantTable(std::vector<TenantConfig> tenants, uid_t daemon_uid)
    : tenants_(std::move(tenants)), daemon_uid_(daemon_uid) {}

Result<Caller> TenantTable::Resolve(const PeerCredentials& peer) const {
  const bool is_operator = peer.uid == 0 || peer.uid == daemon_uid_;
  if (tenants_.empty()) return Caller{0, is_operator};
  const auto lists = [](const std::vector<uint32_t>& ids, uint32_t id) {
    return std::find(ids.begin(), ids.end(), id) != ids.end();
  };
  for (size_t i = 0; i < tenants_.size(); ++i) {
    if (lists(tenants_[i].uids, peer.uid)) return Caller{i, is_operator};
  }
  for (size_t i = 0; i < tenants_.size(); ++i) {
    if (lists(tenants_[i].gids, peer.gid)) return Caller{i, is_operator};
  }
  size_t found = Caller::kNoTenant;
  for (size_t i = 0; i < tenants_.size(); ++i) {
    const bool member =
        std::any_of(peer.groups.begin(), peer.groups.end(), [&](gid_t g) { return lists(tenants_[i].gids, g); });
    if (!member) continue;
    if (found != Caller::kNoTenant) {
      return PermissionDenied("uid " + std::to_string(peer.uid) + " is in groups of two tenants (" +
                              tenants_[found].name + ", " + tenants_[i].name + "); list its uid in one of them");
    }
    found = i;
  }
  if (found != Caller::kNoTenant) return Caller{found, is_operator};
  if (is_operator) return Caller{Caller::kNoTenant, true};
  return PermissionDenied("uid " + std::to_string(peer.uid) + " gid " + std::to_string(peer.gid) +
                          " is no tenant of this kvtierd (see [[tenant]] in its configuration)");
}

}  // namespace kvtier
