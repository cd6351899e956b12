// The read path of RequestHandler (request_handler.h): lookups (whole, or
// in steps for a long key list), pins within the connection's lease and
// memory limits and their releases, erases, and reports of corrupt blocks.
#include <algorithm>

#include "daemon/server/request_handler.h"
#include "daemon/server/response_status.h"
#include "proto/wire.h"

namespace kvtier {

void RequestHandler::HandleLookup(const v1::Request& request, v1::Response& response) {
  LookupSteps steps = BeginLookup(request);
  StepLookup(steps, steps.keys.size(), response);
}

bool RequestHandler::LookupTakesSteps(const v1::Request& request, size_t chunk_keys) const {
  return request.body_case() == v1::Request::kLookup && ServesPins() &&
         static_cast<size_t>(request.lookup().keys_size()) / 2 > chunk_keys;
}

RequestHandler::LookupSteps RequestHandler::BeginLookup(const v1::Request& request) const {
  LookupSteps steps;
  steps.id = request.id();
  auto ns = Namespace(request.lookup().ns());
  if (!ns.ok()) {
    steps.refused = ns.status();
    return steps;
  }
  steps.ns = *ns;
  auto keys = wire::KeysFromProto(request.lookup().keys());
  if (!keys.ok()) {
    steps.refused = keys.status();
    return steps;
  }
  steps.keys = std::move(*keys);
  return steps;
}

bool RequestHandler::StepLookup(LookupSteps& steps, size_t chunk_keys, v1::Response& response) {
  response.set_id(steps.id);
  if (!steps.refused.ok()) {
    SetStatus(response, steps.refused);
    return true;
  }
  context_.engine->LookupSome(steps.ns, steps.keys, steps.cursor, chunk_keys);
  if (!steps.cursor.done) return false;
  const LookupOutcome& out = steps.cursor.out;
  auto* body = response.mutable_lookup();
  body->set_prefix_blocks(static_cast<uint32_t>(out.prefix_blocks));
  body->mutable_tiers()->Reserve(static_cast<int>(out.tiers.size()));
  for (Tier t : out.tiers) body->add_tiers(static_cast<uint32_t>(t));
  SetStatus(response, Status::Ok());
  return true;
}

void RequestHandler::HandlePinAsync(const v1::Request& request, std::function<void(v1::Response)> done) {
  v1::Response response;
  response.set_id(request.id());
  if (!hello_done_) {
    SetStatus(response, FailedPrecondition("send Hello before any other request"));
    return done(std::move(response));
  }
  const v1::PinRequest& r = request.pin();
  auto ns = Namespace(r.ns());
  if (!ns.ok()) {
    SetStatus(response, ns.status());
    return done(std::move(response));
  }
  auto keys = wire::KeysFromProto(r.keys());
  if (!keys.ok()) {
    SetStatus(response, keys.status());
    return done(std::move(response));
  }
  const LayerSpan layers{r.first_layer(), r.last_layer()};
  if (!layers.whole() && layers.first >= layers.last) {
    SetStatus(response, InvalidArgument("Pin layer range [" + std::to_string(layers.first) + ", " +
                                        std::to_string(layers.last) + ") is empty"));
    return done(std::move(response));
  }
  // Keys past the connection's lease limit, or past the memory its leases
  // may take, are refused; the rest are pinned.
  const bool count_bound = keys->size() > usage_.LeaseRoom();
  const uint64_t room = usage_.TakeLeaseRoom(keys->size());
  const size_t refused = keys->size() - room;
  std::string why_refused;
  if (refused > 0) {
    why_refused = count_bound ? "this connection holds " + std::to_string(usage_.leases()) +
                                    " leases, server.max_leases_per_connection: release some first"
                              : usage_.MemoryRefusal("more leases");
  }
  keys->resize(room);
  context_.engine->PinAsync(
      connection_, *ns, std::move(*keys),
      [this, refused, room, why_refused = std::move(why_refused), response = std::move(response),
       done = std::move(done)](std::vector<PinGrant> grants) mutable {
        const uint64_t granted = static_cast<uint64_t>(
            std::count_if(grants.begin(), grants.end(), [](const PinGrant& g) { return g.status.ok(); }));
        usage_.Leased(granted, room);
        for (size_t i = 0; i < refused; ++i) grants.push_back(PinGrant{Busy(why_refused)});
        auto* body = response.mutable_pin();
        for (const PinGrant& g : grants) {
          auto* block = body->add_blocks();
          wire::ToProto(g.status, block->mutable_status());
          block->set_offset(g.offset);
          block->set_length(g.length);
          block->set_lease(g.lease);
          block->set_checksum(g.checksum);
          for (uint64_t c : g.layer_checksums) block->add_layer_checksums(c);
          block->set_block_offset(g.block_offset);
          block->set_block_length(g.block_length);
        }
        SetStatus(response, Status::Ok());
        done(std::move(response));
      },
      layers);
}

void RequestHandler::HandleRelease(const v1::ReleaseRequest& r, v1::Response& response) {
  std::vector<LeaseId> leases(r.leases().begin(), r.leases().end());
  auto statuses = context_.engine->Release(connection_, leases);
  usage_.Released(
      static_cast<uint64_t>(std::count_if(statuses.begin(), statuses.end(), [](const Status& s) { return s.ok(); })));
  auto* body = response.mutable_release();
  for (const Status& s : statuses) wire::ToProto(s, body->add_statuses());
  SetStatus(response, Status::Ok());
}

void RequestHandler::HandleLater(const v1::Request& request, std::function<void(v1::Response)> done) {
  if (request.has_erase()) return HandleCorruptReportAsync(request, std::move(done));
  HandlePinAsync(request, std::move(done));
}

void RequestHandler::HandleCorruptReportAsync(const v1::Request& request, std::function<void(v1::Response)> done) {
  v1::Response response;
  response.set_id(request.id());
  auto ns = Namespace(request.erase().ns());
  auto keys = ns.ok() ? wire::KeysFromProto(request.erase().keys()) : Result<std::vector<BlockKey>>(ns.status());
  if (!keys.ok()) {
    SetStatus(response, keys.status());
    return done(std::move(response));
  }
  // The tenant's own engine: a report reaches no other tenant's blocks.
  context_.engine->CheckReportedCorrupt(
      *ns, *keys, [response = std::move(response), done = std::move(done)](Result<size_t> dropped) mutable {
        if (dropped.ok()) response.mutable_erase()->set_erased(static_cast<uint32_t>(*dropped));
        SetStatus(response, dropped.status());
        done(std::move(response));
      });
}

void RequestHandler::HandleErase(const v1::EraseRequest& r, v1::Response& response) {
  auto ns = Namespace(r.ns());
  if (!ns.ok()) return SetStatus(response, ns.status());
  auto keys = wire::KeysFromProto(r.keys());
  if (!keys.ok()) return SetStatus(response, keys.status());
  response.mutable_erase()->set_erased(static_cast<uint32_t>(context_.engine->Erase(*ns, *keys)));
  SetStatus(response, Status::Ok());
}

}  // namespace kvtier
