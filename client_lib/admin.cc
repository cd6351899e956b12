// The operations calls of Client (include/kvtier/client.h): what the
// `kvtier` admin commands ask the daemon. Each is one round trip.
#include <iterator>
#include <string>

#include "client_lib/connection.h"
#include "kvtier/client.h"
#include "proto/wire.h"

namespace kvtier {
namespace {

std::vector<NamespaceInfo> FromProto(const google::protobuf::RepeatedPtrField<v1::NamespaceUse>& uses) {
  std::vector<NamespaceInfo> out;
  out.reserve(uses.size());
  for (const v1::NamespaceUse& u : uses) {
    NamespaceInfo info;
    info.fingerprint = wire::FromProto(u.fingerprint());
    if (u.has_namespace_descriptor()) info.descriptor = wire::FromProto(u.namespace_descriptor());
    for (const v1::TierUse& t : u.tiers()) info.tiers.push_back({t.tier(), t.blocks(), t.bytes()});
    info.tenant = u.tenant();
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace

// Page by page (the daemon bounds each response), so any number of
// namespaces lists; stops with ProtocolError if the daemon's tokens never
// end.
Result<std::vector<NamespaceInfo>> Client::ListNamespaces() {
  constexpr size_t kMaxPages = size_t{1} << 20;
  std::vector<NamespaceInfo> out;
  std::string token;
  for (size_t page = 0; page < kMaxPages; ++page) {
    auto r = Current()->CallSync(wire::MakeListNamespaces(token));
    if (!r.ok()) return r.status();
    std::vector<NamespaceInfo> got = FromProto(r->list_namespaces().namespaces());
    out.insert(out.end(), std::make_move_iterator(got.begin()), std::make_move_iterator(got.end()));
    token = r->list_namespaces().next_page_token();
    if (token.empty()) return out;
  }
  return ProtocolError("the namespace listing did not end after " + std::to_string(kMaxPages) + " pages");
}

Result<HeldBlockPage> Client::ListBlocksPage(const std::optional<BlockListCursor>& after, uint32_t limit) {
  v1::Request request;
  auto* body = request.mutable_list_blocks();
  body->set_limit(limit);
  if (after) {
    auto* c = body->mutable_after();
    c->set_view(after->view);
    c->set_tier(static_cast<uint32_t>(after->tier));
    wire::ToProto(after->ns, c->mutable_ns());
    wire::ToProto(after->key, c->mutable_key());
  }
  auto r = Current()->CallSync(request);
  if (!r.ok()) return r.status();
  const v1::ListBlocksResponse& got = r->list_blocks();
  HeldBlockPage page;
  page.blocks.reserve(got.blocks_size());
  for (const v1::HeldBlock& b : got.blocks()) {
    page.blocks.push_back({static_cast<Tier>(b.tier()), wire::FromProto(b.ns()), wire::FromProto(b.key()), b.tenant()});
  }
  if (got.has_next()) {
    const v1::BlockCursor& n = got.next();
    page.next =
        BlockListCursor{n.view(), static_cast<Tier>(n.tier()), wire::FromProto(n.ns()), wire::FromProto(n.key())};
  }
  return page;
}

// Page by page; stops with ProtocolError if the daemon's cursors never end
// or go back.
Result<std::vector<HeldBlockInfo>> Client::ListBlocks(uint32_t page_limit) {
  constexpr size_t kMaxPages = size_t{1} << 24;
  std::vector<HeldBlockInfo> out;
  std::optional<BlockListCursor> cursor;
  for (size_t page = 0; page < kMaxPages; ++page) {
    auto got = ListBlocksPage(cursor, page_limit);
    if (!got.ok()) return got.status();
    out.insert(out.end(), std::make_move_iterator(got->blocks.begin()), std::make_move_iterator(got->blocks.end()));
    if (!got->next) return out;
    if (got->blocks.empty()) return ProtocolError("a block listing page was empty but said more follow");
    cursor = got->next;
  }
  return ProtocolError("the block listing did not end after " + std::to_string(kMaxPages) + " pages");
}

Result<std::vector<NamespaceInfo>> Client::DropNamespaces(std::span<const NamespaceFingerprint> fingerprints,
                                                          std::string_view model_id, std::string_view model_revision) {
  if (fingerprints.empty() && model_id.empty()) return InvalidArgument("name a namespace or a model to drop");
  auto r = Current()->CallSync(wire::MakeDrop(fingerprints, model_id, model_revision));
  if (!r.ok()) return r.status();
  return FromProto(r->drop().dropped());
}

Result<std::vector<HoldOutcome>> Client::Hold(const NamespaceFingerprint& fingerprint, std::span<const BlockKey> keys,
                                              std::chrono::milliseconds ttl) {
  if (keys.empty()) return InvalidArgument("name at least one key to hold");
  if (ttl.count() <= 0) return InvalidArgument("a hold's TTL must be positive");
  auto r = Current()->CallSync(wire::MakeHold(fingerprint, keys, static_cast<uint64_t>(ttl.count())));
  if (!r.ok()) return r.status();
  const v1::HoldResponse& h = r->hold();
  if (static_cast<size_t>(h.statuses_size()) != keys.size()) {
    return ProtocolError("a hold of " + std::to_string(keys.size()) + " keys was answered with " +
                         std::to_string(h.statuses_size()) + " outcomes");
  }
  std::vector<HoldOutcome> out(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    out[i].status = wire::FromProto(h.statuses(static_cast<int>(i)));
    out[i].pending = static_cast<int>(i) < h.pending_size() && h.pending(static_cast<int>(i));
  }
  return out;
}

Result<std::vector<Status>> Client::Unhold(const NamespaceFingerprint& fingerprint, std::span<const BlockKey> keys) {
  if (keys.empty()) return InvalidArgument("name at least one key to unhold");
  auto r = Current()->CallSync(wire::MakeUnhold(fingerprint, keys));
  if (!r.ok()) return r.status();
  const v1::UnholdResponse& u = r->unhold();
  if (static_cast<size_t>(u.statuses_size()) != keys.size()) {
    return ProtocolError("an unhold of " + std::to_string(keys.size()) + " keys was answered with " +
                         std::to_string(u.statuses_size()) + " outcomes");
  }
  std::vector<Status> out;
  out.reserve(keys.size());
  for (const v1::Status& s : u.statuses()) out.push_back(wire::FromProto(s));
  return out;
}

Result<std::string> Client::RunningConfig() {
  auto r = Current()->CallSync(wire::MakeConfig());
  if (!r.ok()) return r.status();
  return r->config().toml();
}

Result<HealthReport> Client::Health() {
  auto r = Current()->CallSync(wire::MakeHealth());
  if (!r.ok()) return r.status();
  const v1::HealthResponse& h = r->health();
  HealthReport out;
  out.healthy = h.healthy();
  out.problems.assign(h.problems().begin(), h.problems().end());
  out.warnings.assign(h.warnings().begin(), h.warnings().end());
  out.version = h.version();
  out.uptime_s = h.uptime_s();
  out.tiers.assign(h.tiers().begin(), h.tiers().end());
  return out;
}

}  // namespace kvtier
