// Who a caller is: the peer credentials of a connection (SO_PEERCRED and
// SO_PEERGROUPS, taken by the kernel at connect time, so a client cannot
// claim another identity) and the tenant they map to.
//
// Resolution, with [[tenant]] tables configured:
//   1. a tenant listing the caller's uid;
//   2. else a tenant listing the caller's primary gid;
//   3. else the one tenant listing any of its supplementary groups (two
//      tenants that way: refused as ambiguous);
//   4. else: an operator (uid 0, or the daemon's own uid) may run admin
//      commands over every tenant but register no namespace; anyone else
//      is refused (PermissionDenied, naming the uid and gid).
// Without tenants every caller the socket admits is the one tenant.
//
// Immutable after construction; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <sys/types.h>
#include <vector>

#include "daemon/config/config.h"
#include "kvtier/result.h"

namespace kvtier {

struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups (may be empty)
};

// The credentials the kernel recorded for the peer of the connected Unix
// socket `fd`. IoError when the kernel gives none.
Result<PeerCredentials> ReadPeerCredentials(int fd);

// What a caller is to the daemon.
struct Caller {
  static constexpr size_t kNoTenant = ~size_t{0};
  size_t tenant = kNoTenant;  // index into the configured tenants; kNoTenant: operator only
  bool operator_ = false;     // may run admin commands over every tenant
};

class TenantTable {
 public:
  // `daemon_uid`: the uid the daemon runs as (an operator).
  TenantTable(std::vector<TenantConfig> tenants, uid_t daemon_uid);

  bool empty() const { return tenants_.empty(); }
  const std::vector<TenantConfig>& tenants() const { return tenants_; }

  // The caller `peer` is, per the rules above; PermissionDenied for a
  // stranger or an ambiguous caller. Without tenants: tenant 0, and an
  // operator when uid 0 or the daemon's uid.
  Result<Caller> Resolve(const PeerCredentials& peer) const;

 private:
  std::vector<TenantConfig> tenants_;
  uid_t daemon_uid_;
};

}  // namespace kvtier
