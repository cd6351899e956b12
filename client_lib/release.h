// Waited release of one lease (Client::Release, BlockView::Release).
// Releases nobody waits for go through Connection::ReleaseLater. Internal.
#pragma once

#include <cstdint>
#include <span>

#include "client_lib/connection.h"

namespace kvtier::internal {

// Releases one lease and waits: Ok, NotFound (unknown or already released),
// PermissionDenied (another connection's), Unavailable (connection gone).
Status ReleaseAndWait(Connection& conn, uint64_t lease);

}  // namespace kvtier::internal
