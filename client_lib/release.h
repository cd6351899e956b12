// Unpinning leases: the one place Client, BlockView and the copying Get
// release through. Internal.
#pragma once

#include <cstdint>
#include <span>

#include "client_lib/connection.h"

namespace kvtier::internal {

// Releases one lease and waits: Ok, NotFound (unknown or already released),
// PermissionDenied (another connection's), Unavailable (connection gone).
Status ReleaseAndWait(Connection& conn, uint64_t lease);

// Releases `leases` without waiting (a destructor, or the tail of a copying
// get, must not block on the daemon); the answer is read by whoever reads
// next. A failure only means the connection is gone and the leases with it.
void ReleaseDetached(Connection& conn, std::span<const uint64_t> leases);

}  // namespace kvtier::internal
