// `kvtier ls --blocks` (proto ListBlocksRequest): one page of every block
// every tier holds, in the order (tenant view, tier, namespace, key).
//
// Each page walks the engines' tiers (Engine::ForEachHeldBlock, O(blocks))
// and keeps only the `limit` smallest entries after the cursor in a
// bounded max-heap, so a daemon with millions of blocks answers in
// O(blocks log limit) time and O(limit) memory, and no response grows past
// a page. Pages are not one atomic snapshot (the proto's contract).
#include <algorithm>
#include <optional>
#include <queue>
#include <tuple>
#include <vector>

#include "daemon/server/request_handler.h"
#include "daemon/server/response_status.h"
#include "proto/wire.h"

namespace kvtier {
namespace {

// One listed block, ordered as the listing is.
struct Entry {
  uint32_t view = 0;
  Tier tier = Tier::kNone;
  NamespaceFingerprint ns;
  BlockKey key;
  auto Rank() const { return std::tie(view, tier, ns, key); }
  bool operator<(const Entry& other) const { return Rank() < other.Rank(); }
  bool operator==(const Entry& other) const { return Rank() == other.Rank(); }
};

// The request's cursor as an Entry, or why it cannot be one.
Result<Entry> CursorOf(const v1::BlockCursor& c, size_t views) {
  if (c.view() >= views) {
    return InvalidArgument("list_blocks cursor: tenant index " + std::to_string(c.view()) + " is not below " +
                           std::to_string(views));
  }
  if (c.tier() == static_cast<uint32_t>(Tier::kNone) || c.tier() > static_cast<uint32_t>(Tier::kRemote)) {
    return InvalidArgument("list_blocks cursor: tier " + std::to_string(c.tier()) + " is no tier");
  }
  if (!c.has_ns() || !c.has_key()) return InvalidArgument("list_blocks cursor: give both its namespace and key");
  return Entry{c.view(), static_cast<Tier>(c.tier()), wire::FromProto(c.ns()), wire::FromProto(c.key())};
}

void ToProto(const Entry& e, v1::BlockCursor* out) {
  out->set_view(e.view);
  out->set_tier(static_cast<uint32_t>(e.tier));
  wire::ToProto(e.ns, out->mutable_ns());
  wire::ToProto(e.key, out->mutable_key());
}

}  // namespace

void RequestHandler::HandleListBlocks(const v1::ListBlocksRequest& r, v1::Response& response) {
  if (r.limit() > kMaxListPageBlocks) {
    return SetStatus(response, InvalidArgument("list_blocks limit " + std::to_string(r.limit()) +
                                               " is over the limit of " + std::to_string(kMaxListPageBlocks)));
  }
  const size_t limit = r.limit() == 0 ? kMaxListPageBlocks : r.limit();
  const std::vector<TenantView> views = AdminEngines();
  std::optional<Entry> after;
  if (r.has_after()) {
    auto cursor = CursorOf(r.after(), views.size());
    if (!cursor.ok()) return SetStatus(response, cursor.status());
    after = *cursor;
  }
  // The `limit` smallest entries after the cursor (the heap's top is the
  // largest kept), and whether any larger one was left out.
  std::priority_queue<Entry> kept;
  bool more = false;
  for (uint32_t v = after ? after->view : 0; v < views.size() && !more; ++v) {
    views[v].engine->ForEachHeldBlock([&](Tier tier, const BlockKey& key, const BlockTier::BlockInfo& info) {
      const Entry e{v, tier, info.ns, key};
      if (after && !(*after < e)) return;
      if (kept.size() < limit) {
        kept.push(e);
      } else if (e < kept.top()) {
        kept.pop();
        kept.push(e);
        more = true;
      } else if (!(e == kept.top())) {
        more = true;
      }
    });
    // A full page from this view: later views come after everything kept.
    if (kept.size() == limit && v + 1 < views.size()) more = true;
  }
  std::vector<Entry> page;
  page.reserve(kept.size());
  for (; !kept.empty(); kept.pop()) page.push_back(kept.top());
  std::reverse(page.begin(), page.end());
  page.erase(std::unique(page.begin(), page.end()), page.end());  // one medium at two levels: listed once
  auto* body = response.mutable_list_blocks();
  for (const Entry& e : page) {
    auto* out = body->add_blocks();
    out->set_tier(static_cast<uint32_t>(e.tier));
    wire::ToProto(e.ns, out->mutable_ns());
    wire::ToProto(e.key, out->mutable_key());
    out->set_tenant(views[e.view].name);
  }
  if (more && !page.empty()) ToProto(page.back(), body->mutable_next());
  SetStatus(response, Status::Ok());
}

}  // namespace kvtier
