// Operator holds (`kvtier pin` / `kvtier unpin`): an admin request names
// the namespace by fingerprint, as Drop does, not by a Hello index, and
// the engine keeps the blocks in the host tier until the TTL passes
// (Engine::Hold, daemon/engine/holder.h). Neither request waits for I/O: a
// block being read into the host tier is answered pending.
#include "daemon/server/request_handler.h"
#include "daemon/server/response_status.h"
#include "proto/wire.h"

namespace kvtier {

Result<RequestHandler::HoldTarget> RequestHandler::HoldTargetOf(bool has_fingerprint, const v1::Key& fingerprint,
                                                                const google::protobuf::RepeatedField<uint64_t>& words,
                                                                std::string_view verb) const {
  if (!has_fingerprint) return InvalidArgument("name the namespace to " + std::string(verb) + " (fingerprint)");
  const NamespaceFingerprint ns = wire::FromProto(fingerprint);
  Engine* engine = EngineFor(ns);
  if (engine == nullptr) return NotFound("namespace " + ns.ToHex() + " is no tenant's");
  auto keys = wire::KeysFromProto(words);
  if (!keys.ok()) return keys.status();
  if (keys->empty()) return InvalidArgument("name at least one key to " + std::string(verb));
  return HoldTarget{engine, ns, std::move(*keys)};
}

void RequestHandler::HandleHold(const v1::HoldRequest& r, v1::Response& response) {
  auto target = HoldTargetOf(r.has_fingerprint(), r.fingerprint(), r.keys(), "hold");
  if (!target.ok()) return SetStatus(response, target.status());
  if (r.ttl_ms() == 0 || r.ttl_ms() > Engine::kMaxHoldTtlUs / 1000) {
    return SetStatus(
        response, InvalidArgument("a hold's TTL must be 1 ms to 30 days, got " + std::to_string(r.ttl_ms()) + " ms"));
  }
  auto* body = response.mutable_hold();
  for (const Engine::HoldResult& h : target->engine->Hold(target->ns, target->keys, r.ttl_ms() * 1000)) {
    wire::ToProto(h.status, body->add_statuses());
    body->add_pending(h.pending);
  }
  SetStatus(response, Status::Ok());
}

void RequestHandler::HandleUnhold(const v1::UnholdRequest& r, v1::Response& response) {
  auto target = HoldTargetOf(r.has_fingerprint(), r.fingerprint(), r.keys(), "unhold");
  if (!target.ok()) return SetStatus(response, target.status());
  auto* body = response.mutable_unhold();
  for (const Status& s : target->engine->Unhold(target->ns, target->keys)) wire::ToProto(s, body->add_statuses());
  SetStatus(response, Status::Ok());
}

}  // namespace kvtier
