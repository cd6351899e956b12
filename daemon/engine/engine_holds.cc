// Engine operator holds: forwarded to the Holder (holder.h), which owns them.
#include "daemon/engine/engine.h"

namespace kvtier {

std::vector<Engine::HoldResult> Engine::Hold(const NamespaceFingerprint& ns, std::span<const BlockKey> keys,
                                             uint64_t ttl_us) {
  return holder_->Hold(ns, keys, ttl_us);
}

std::vector<Status> Engine::Unhold(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  return holder_->Unhold(ns, keys);
}

size_t Engine::ReleaseExpiredHolds() { return holder_->ReleaseExpired(); }

}  // namespace kvtier
