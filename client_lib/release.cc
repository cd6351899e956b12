#include "client_lib/release.h"

#include "proto/wire.h"

namespace kvtier::internal {

Status ReleaseAndWait(Connection& conn, uint64_t lease) {
  auto r = conn.CallSync(wire::MakeRelease(std::span<const uint64_t>(&lease, 1)));
  if (!r.ok()) return r.status();
  if (r->release().statuses_size() != 1) return ProtocolError("Release response has no status");
  return wire::FromProto(r->release().statuses(0));
}

}  // namespace kvtier::internal
