// What RequestHandler (request_handler.h) tells the engine of the work
// ahead: layer-wise loads with their preload plans, plans alone, ready
// estimates, and the queue hints of the engine's scheduler (enqueued, started, finished,
// sessions).
#include "daemon/server/request_handler.h"
#include "daemon/server/response_status.h"
#include "proto/wire.h"

namespace kvtier {

void RequestHandler::HandleQueueHint(const v1::QueueHint& q, v1::Response& response) {
  Engine& engine = *context_.engine;
  switch (q.kind()) {
    case v1::QueueHint::ENQUEUE: {
      auto ns = Namespace(q.ns());
      if (!ns.ok()) return SetStatus(response, ns.status());
      auto keys = wire::KeysFromProto(q.keys());
      if (!keys.ok()) return SetStatus(response, keys.status());
      if (keys->empty()) return SetStatus(response, InvalidArgument("an enqueued request needs at least one key"));
      // Charged first; a request the engine refuses keeps what it held
      // (a replaced request stays as it was).
      const uint64_t before = usage_.queued_keys(q.request_id());
      if (Status charged = usage_.SetQueued(q.request_id(), keys->size()); !charged.ok()) {
        return SetStatus(response, charged);
      }
      Status queued = engine.Enqueue(connection_, *ns, q.request_id(), *keys, q.start_in_us(), q.session_id());
      if (!queued.ok()) (void)usage_.SetQueued(q.request_id(), before);  // back to what it held: never refused
      return SetStatus(response, queued);
    }
    case v1::QueueHint::STARTED:
    case v1::QueueHint::FINISHED: {
      Status dequeued = engine.Dequeue(connection_, q.request_id());
      if (dequeued.ok()) (void)usage_.SetQueued(q.request_id(), 0);
      return SetStatus(response, dequeued);
    }
    case v1::QueueHint::SESSION_OPEN:
    case v1::QueueHint::SESSION_CLOSE:
      if (q.session_id() == 0) return SetStatus(response, InvalidArgument("session 0 means none; hint a real one"));
      engine.ConversationHint(q.session_id(), q.kind() == v1::QueueHint::SESSION_OPEN);
      return SetStatus(response, Status::Ok());
    default:
      return SetStatus(response, InvalidArgument("unknown queue hint kind " + std::to_string(q.kind())));
  }
}

void RequestHandler::HandlePreloadPlan(const v1::PreloadPlanRequest& r, v1::Response& response) {
  if (r.source_tier() > static_cast<uint32_t>(Tier::kRemote)) {
    return SetStatus(response, InvalidArgument("unknown source tier " + std::to_string(r.source_tier())));
  }
  auto plan = context_.engine->PlanPreload(static_cast<Tier>(r.source_tier()), r.bytes_per_layer(),
                                           r.compute_us_per_layer(), r.layers(), r.recompute_us_per_layer());
  if (!plan.ok()) return SetStatus(response, plan.status());
  wire::ToProto(*plan, response.mutable_preload_plan());
  SetStatus(response, Status::Ok());
}

void RequestHandler::HandleReadyEstimate(const v1::ReadyEstimateRequest& r, v1::Response& response) {
  auto ns = Namespace(r.ns());
  if (!ns.ok()) return SetStatus(response, ns.status());
  auto keys = wire::KeysFromProto(r.keys());
  if (!keys.ok()) return SetStatus(response, keys.status());
  auto estimate = context_.engine->EstimateReady(*ns, *keys);
  if (!estimate.ok()) return SetStatus(response, estimate.status());
  wire::ToProto(*estimate, response.mutable_ready_estimate());
  SetStatus(response, Status::Ok());
}

void RequestHandler::HandleBeginLoad(const v1::BeginLoadRequest& r, v1::Response& response) {
  auto ns = Namespace(r.ns());
  if (!ns.ok()) return SetStatus(response, ns.status());
  auto keys = wire::KeysFromProto(r.keys());
  if (!keys.ok()) return SetStatus(response, keys.status());
  const double compute_us = r.compute_us_per_layer();
  if (!(compute_us >= 0) || compute_us > 1e12) {
    return SetStatus(response, InvalidArgument("compute_us_per_layer must be a time >= 0"));
  }
  if (Status room = usage_.TakeLoadRoom(keys->size()); !room.ok()) return SetStatus(response, room);
  LoadFlags flags;
  flags.in_place = r.device_pool();
  flags.verify = r.verify();
  flags.deadline_us = r.deadline_us();
  auto started = context_.engine->BeginLoad(connection_, *ns, *keys, flags);
  if (!started.ok()) {
    usage_.LoadRefused(keys->size());
    return SetStatus(response, started.status());
  }
  usage_.LoadBegun(started->load, keys->size());
  auto* body = response.mutable_begin_load();
  body->set_load_id(started->load);
  body->set_board_offset(started->board_offset);
  body->set_board_bytes(started->board_bytes);
  body->set_layers(started->layers);
  body->set_layer_bytes(started->layer_bytes);
  for (const Status& s : started->blocks) wire::ToProto(s, body->add_blocks());
  body->set_source_tier(static_cast<uint32_t>(started->source));
  for (const auto& sums : started->layer_checksums) {
    auto* block = body->add_layer_checksums();
    block->mutable_layers()->Add(sums.layers.begin(), sums.layers.end());
    block->set_block(sums.block);
    block->set_settled(sums.settled);
  }
  if (compute_us > 0) {
    // The host's bytes are in place already; below, what a layer reads.
    const uint64_t bytes =
        started->source == Tier::kHost ? started->layer_bytes * keys->size() : started->below_bytes_per_layer;
    auto plan = context_.engine->PlanPreload(started->source, bytes, compute_us, started->layers, 0);
    if (plan.ok()) wire::ToProto(*plan, body->mutable_plan());
  }
  SetStatus(response, Status::Ok());
}

}  // namespace kvtier
