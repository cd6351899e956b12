// Operator holds (`kvtier pin` / `kvtier unpin`): an admin request names
// the namespace by fingerprint, as Drop does, not by a Hello index, and
// the engine keeps the blocks in the host tier until the TTL passes
// (Engine::Hold, daemon/engine_holds.cc). Neither request waits for I/O: a
// block being read into the host tier is answered pending.
#include "daemon/request_handler.h"
#include "proto/wire.h"

namespace kvtier {
namespace {

void SetStatus(v1::Response& response, const Status& s) { wire::ToProto(s, response.mutable_status()); }

}  // namespace

// The engine a hold of `fingerprint` goes to: the connection's own, or
// for an operator's the tenant's whose namespace it is.
Result<Engine*> RequestHandler::HoldEngine(const v1::Key& fingerprint) const {
  Engine* engine = EngineFor(wire::FromProto(fingerprint));
  if (engine == nullptr) return NotFound("namespace " + wire::FromProto(fingerprint).ToHex() + " is no tenant's");
  return engine;
}

void RequestHandler::HandleHold(const v1::HoldRequest& r, v1::Response& response) {
  if (!r.has_fingerprint()) return SetStatus(response, InvalidArgument("name the namespace to hold (fingerprint)"));
  auto engine = HoldEngine(r.fingerprint());
  if (!engine.ok()) return SetStatus(response, engine.status());
  auto keys = wire::KeysFromProto(r.keys());
  if (!keys.ok()) return SetStatus(response, keys.status());
  if (keys->empty()) return SetStatus(response, InvalidArgument("name at least one key to hold"));
  if (r.ttl_ms() == 0 || r.ttl_ms() > Engine::kMaxHoldTtlUs / 1000) {
    return SetStatus(response, InvalidArgument("a hold's TTL must be 1 ms to 30 days, got " +
                                               std::to_string(r.ttl_ms()) + " ms"));
  }
  const std::vector<Engine::HoldResult> held =
      (*engine)->Hold(wire::FromProto(r.fingerprint()), *keys, r.ttl_ms() * 1000);
  auto* body = response.mutable_hold();
  for (const Engine::HoldResult& h : held) {
    wire::ToProto(h.status, body->add_statuses());
    body->add_pending(h.pending);
  }
  SetStatus(response, Status::Ok());
}

void RequestHandler::HandleUnhold(const v1::UnholdRequest& r, v1::Response& response) {
  if (!r.has_fingerprint()) return SetStatus(response, InvalidArgument("name the namespace to unhold (fingerprint)"));
  auto engine = HoldEngine(r.fingerprint());
  if (!engine.ok()) return SetStatus(response, engine.status());
  auto keys = wire::KeysFromProto(r.keys());
  if (!keys.ok()) return SetStatus(response, keys.status());
  if (keys->empty()) return SetStatus(response, InvalidArgument("name at least one key to unhold"));
  auto* body = response.mutable_unhold();
  for (const Status& s : (*engine)->Unhold(wire::FromProto(r.fingerprint()), *keys)) {
    wire::ToProto(s, body->add_statuses());
  }
  SetStatus(response, Status::Ok());
}

}  // namespace kvtier
