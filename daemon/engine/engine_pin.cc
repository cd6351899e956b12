// Engine pins: forwarded to the Pinner (pinner.h), which owns them.
#include "daemon/engine/engine.h"

namespace kvtier {

void Engine::PinAsync(ConnectionId connection, const NamespaceFingerprint& ns, std::vector<BlockKey> keys, PinDone done,
                      LayerSpan layers) {
  pinner_->PinAsync(connection, ns, std::move(keys), std::move(done), layers);
}

std::vector<PinGrant> Engine::Pin(ConnectionId connection, const NamespaceFingerprint& ns,
                                  std::span<const BlockKey> keys, LayerSpan layers) {
  return pinner_->Pin(connection, ns, keys, layers);
}

std::vector<Status> Engine::Release(ConnectionId connection, std::span<const LeaseId> leases) {
  return pinner_->Release(connection, leases);
}

size_t Engine::RecordUses(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  return pinner_->RecordUses(ns, keys);
}

}  // namespace kvtier
