// The put path of RequestHandler (request_handler.h): Reserve within the
// connection's reserved-bytes and client-memory limits, Commit and Abort,
// and the reservations that time out.
#include "daemon/server/request_handler.h"
#include "daemon/server/response_status.h"
#include "proto/wire.h"

namespace kvtier {

void RequestHandler::HandleReserve(const v1::ReserveRequest& r, v1::Response& response) {
  auto ns = Namespace(r.ns());
  if (!ns.ok()) return SetStatus(response, ns.status());
  if (r.keys_size() != 2 * r.sizes_size()) {
    return SetStatus(response, InvalidArgument("Reserve has " + std::to_string(r.keys_size() / 2) + " keys but " +
                                               std::to_string(r.sizes_size()) + " sizes"));
  }
  auto keys = wire::KeysFromProto(r.keys());
  if (!keys.ok()) return SetStatus(response, keys.status());
  std::vector<uint64_t> sizes(r.sizes().begin(), r.sizes().end());
  ReserveChain links;
  links.chain = r.chain();
  if (r.parent_size() == 2 && r.chain()) {
    links.parent = BlockKey{r.parent(0), r.parent(1)};
  } else if (r.parent_size() != 0) {
    return SetStatus(response, InvalidArgument("Reserve's parent must be one key (two words) with chain set, got " +
                                               std::to_string(r.parent_size()) + " words"));
  }
  // The longest run of keys within the connection's reserved-bytes limit
  // goes to the engine; the rest are refused (a chain's tail, typically).
  // One block is always let through while the connection holds none, so a
  // limit below the block size cannot lock a client out; sizes the engine
  // refuses as invalid (0, past the arena) hold nothing and do not count.
  const uint64_t arena = context_.engine->host_tier().capacity_bytes();
  size_t fits = 0;
  for (uint64_t pending = 0; fits < sizes.size(); ++fits) {
    const uint64_t size = sizes[fits];
    if (size == 0 || size > arena) continue;
    const bool holds_none = pending == 0 && usage_.reserved_bytes() == 0;
    if (!holds_none && !usage_.ReserveFits(pending + size)) break;
    pending += size;
  }
  // Each reservation's record is client state, charged before the engine
  // makes it; what the engine refuses gives its room back.
  const size_t bytes_fit = fits;
  fits = usage_.TakeReservationRoom(fits);
  auto grants =
      context_.engine->Reserve(connection_, *ns, std::span(*keys).first(fits), std::span(sizes).first(fits), links);
  const auto now = ConnectionUsage::Clock::now();
  uint64_t refused_by_engine = 0;
  for (size_t i = 0; i < grants.size(); ++i) {
    if (grants[i].status.ok()) {
      usage_.Reserved((*keys)[i], grants[i].length, now);
    } else {
      ++refused_by_engine;
    }
  }
  usage_.GiveBackReservationRoom(refused_by_engine + (fits - grants.size()));
  const std::string memory_refusal = fits < bytes_fit ? usage_.MemoryRefusal("more reservations") : std::string();
  for (size_t i = fits; i < keys->size(); ++i) {
    grants.push_back(SlotGrant{i < bytes_fit
                                   ? Busy(memory_refusal)
                                   : Busy("this connection holds " + std::to_string(usage_.reserved_bytes()) +
                                          " reserved bytes; server.max_reserved_bytes_per_connection is " +
                                          std::to_string(usage_.max_reserved_bytes()) + ": commit or abort first")});
  }
  auto* body = response.mutable_reserve();
  for (const SlotGrant& g : grants) {
    auto* slot = body->add_slots();
    wire::ToProto(g.status, slot->mutable_status());
    slot->set_offset(g.offset);
    slot->set_length(g.length);
  }
  SetStatus(response, Status::Ok());
}

void RequestHandler::HandleCommit(const v1::CommitRequest& r, v1::Response& response) {
  auto ns = Namespace(r.ns());
  if (!ns.ok()) return SetStatus(response, ns.status());
  if (r.keys_size() != 2 * r.sizes_size()) {
    return SetStatus(response, InvalidArgument("Commit has " + std::to_string(r.keys_size() / 2) + " keys but " +
                                               std::to_string(r.sizes_size()) + " sizes"));
  }
  if (r.checksums_size() != 0 && r.checksums_size() != r.sizes_size()) {
    return SetStatus(response,
                     InvalidArgument("Commit has " + std::to_string(r.sizes_size()) + " keys but " +
                                     std::to_string(r.checksums_size()) + " checksums (send none or one per key)"));
  }
  auto keys = wire::KeysFromProto(r.keys());
  if (!keys.ok()) return SetStatus(response, keys.status());
  std::vector<uint64_t> sizes(r.sizes().begin(), r.sizes().end());
  // Empty: the engine hashes every block itself (clients before checksums).
  std::span<const uint64_t> checksums(r.checksums().data(), static_cast<size_t>(r.checksums_size()));
  std::span<const uint64_t> layer_checksums(r.layer_checksums().data(), static_cast<size_t>(r.layer_checksums_size()));
  auto statuses = context_.engine->Commit(connection_, *ns, *keys, sizes, checksums, layer_checksums);
  // Committed or dropped (size or checksum mismatch): not reserved now. A
  // FailedPrecondition leaves a reservation of the key where it was (in
  // another namespace, say): it stays counted, and expires as it would.
  for (size_t i = 0; i < keys->size() && i < statuses.size(); ++i) {
    if (statuses[i].code() != StatusCode::kFailedPrecondition) usage_.Ended((*keys)[i]);
  }
  auto* body = response.mutable_commit();
  for (const Status& s : statuses) wire::ToProto(s, body->add_statuses());
  SetStatus(response, Status::Ok());
}

void RequestHandler::HandleAbort(const v1::AbortRequest& r, v1::Response& response) {
  auto ns = Namespace(r.ns());
  if (!ns.ok()) return SetStatus(response, ns.status());
  auto keys = wire::KeysFromProto(r.keys());
  if (!keys.ok()) return SetStatus(response, keys.status());
  size_t aborted = context_.engine->Abort(connection_, *keys);
  for (const BlockKey& key : *keys) usage_.Ended(key);
  response.mutable_abort()->set_aborted(static_cast<uint32_t>(aborted));
  SetStatus(response, Status::Ok());
}

void RequestHandler::HandlePublishLayers(const v1::PublishLayersRequest& r, v1::Response& response) {
  response.mutable_publish_layers();
  auto ns = Namespace(r.ns());
  if (!ns.ok()) return SetStatus(response, ns.status());
  auto keys = wire::KeysFromProto(r.keys());
  if (!keys.ok()) return SetStatus(response, keys.status());
  const std::vector<uint64_t> sums(r.layer_checksums().begin(), r.layer_checksums().end());
  std::vector<Status> published = context_.engine->published_layers().Publish(connection_, *ns, *keys, r.first_layer(),
                                                                              r.end_layer(), sums, r.free_when_taken());
  for (const Status& s : published) {
    if (!s.ok()) return SetStatus(response, s);  // the first refusal; the others were published
  }
  SetStatus(response, Status::Ok());
}

size_t RequestHandler::AbortExpiredReservations(ConnectionUsage::Clock::time_point now) {
  std::vector<BlockKey> expired = usage_.TakeExpired(now);
  if (expired.empty() || context_.engine == nullptr) return 0;
  return context_.engine->Abort(connection_, expired);
}

}  // namespace kvtier
