// The operations requests (`kvtier stats`, `ls`, `drop`, `config get`,
// `health`): answered from the engine and the server's context, never
// touching a client's blocks except Drop.
#include <algorithm>
#include <map>
#include <optional>

#include "common/health_findings.h"
#include "daemon/server/request_handler.h"
#include "daemon/server/response_status.h"
#include "proto/wire.h"

namespace kvtier {
namespace {

void ToProto(const Engine::NamespaceUse& use, v1::NamespaceUse* out) {
  wire::ToProto(use.ns, out->mutable_fingerprint());
  if (use.descriptor) wire::ToProto(*use.descriptor, out->mutable_namespace_descriptor());
  for (const Engine::TierUse& t : use.tiers) {
    auto* tier = out->add_tiers();
    tier->set_tier(t.tier);
    tier->set_blocks(t.blocks);
    tier->set_bytes(t.bytes);
  }
}

// Where a listing page starts: after fingerprint `after` of tenant view
// `view` (no `after`: at the view's start).
struct ListPosition {
  size_t view = 0;
  std::optional<NamespaceFingerprint> after;
};

// "<view index>:<32 hex digits>" (HandleListNamespaces), or nullopt.
std::optional<ListPosition> ParsePageToken(std::string_view token) {
  const size_t colon = token.find(':');
  if (colon == 0 || colon > 6 || colon == std::string_view::npos) return std::nullopt;
  const std::string_view digits = token.substr(0, colon);
  if (digits.find_first_not_of("0123456789") != std::string_view::npos) return std::nullopt;
  auto fingerprint = BlockKey::FromHex(token.substr(colon + 1));
  if (!fingerprint.ok()) return std::nullopt;
  return ListPosition{std::stoul(std::string(digits)), *fingerprint};
}

}  // namespace

// The listing's order is (tenant view index, fingerprint); a page token
// is "<view index>:<32 hex digits of the last fingerprint listed>" and the
// next page starts after it.
void RequestHandler::HandleListNamespaces(const v1::ListNamespacesRequest& r, v1::Response& response) {
  if (r.page_size() > kMaxListPageNamespaces) {
    return SetStatus(response, InvalidArgument("page_size " + std::to_string(r.page_size()) + " is over the limit of " +
                                               std::to_string(kMaxListPageNamespaces)));
  }
  const size_t page_size = r.page_size() == 0 ? kMaxListPageNamespaces : r.page_size();
  ListPosition from;  // the first page: before everything
  if (!r.page_token().empty()) {
    std::optional<ListPosition> parsed = ParsePageToken(r.page_token());
    if (!parsed) return SetStatus(response, InvalidArgument("page_token does not come from a listing of this kvtierd"));
    from = *parsed;
  }
  auto* body = response.mutable_list_namespaces();
  const std::vector<TenantView> views = AdminEngines();
  ListPosition last;
  for (size_t v = from.view; v < views.size(); ++v) {
    const TenantView& view = views[v];
    view.engine->ForgetUnusedNamespaces();
    for (const Engine::NamespaceUse& use : view.engine->NamespaceUses()) {
      if (v == from.view && from.after && !(*from.after < use.ns)) continue;
      if (static_cast<size_t>(body->namespaces_size()) == page_size) {  // more to come: resume after `last`
        body->set_next_page_token(std::to_string(last.view) + ":" + last.after->ToHex());
        return SetStatus(response, Status::Ok());
      }
      auto* out = body->add_namespaces();
      ToProto(use, out);
      out->set_tenant(view.name);
      last = ListPosition{v, use.ns};
    }
  }
  SetStatus(response, Status::Ok());
}

// With tenants, an operator's Drop reaches every tenant's engine and a
// tenant's only its own: a namespace of another tenant is not in its
// engine's view (its tiers hold nothing of it, daemon/tenants/tenant_tier.h), so
// nothing of it is dropped and the answer lists it with no blocks.
void RequestHandler::HandleDrop(const v1::DropRequest& r, v1::Response& response) {
  if (r.model_id().empty() && !r.model_revision().empty()) {
    SetStatus(response, InvalidArgument("a model revision to drop needs its model id"));
    return;
  }
  if (r.fingerprints_size() == 0 && r.model_id().empty()) {
    SetStatus(response, InvalidArgument("name a namespace or a model to drop"));
    return;
  }
  const std::vector<NamespaceFingerprint> named = wire::FromProto(r.fingerprints());
  auto* body = response.mutable_drop();
  std::vector<NamespaceFingerprint> found;
  for (const TenantView& view : AdminEngines()) {
    std::map<NamespaceFingerprint, std::optional<NamespaceDescriptor>> descriptors;
    for (const auto& use : view.engine->NamespaceUses()) descriptors[use.ns] = use.descriptor;
    std::vector<NamespaceFingerprint> targets;
    for (const NamespaceFingerprint& ns : named) {
      if (descriptors.count(ns) != 0) targets.push_back(ns);
    }
    if (!r.model_id().empty()) {
      for (const auto& ns : view.engine->NamespacesOfModel(r.model_id(), r.model_revision())) targets.push_back(ns);
    }
    std::sort(targets.begin(), targets.end());
    targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
    for (const NamespaceFingerprint& ns : targets) {
      Engine::NamespaceUse dropped{ns, descriptors[ns], view.engine->DropNamespace(ns)};
      auto* out = body->add_dropped();
      ToProto(dropped, out);
      out->set_tenant(view.name);
      found.push_back(ns);
    }
  }
  for (const NamespaceFingerprint& ns : named) {  // named, but in no engine's view: nothing to drop
    if (std::find(found.begin(), found.end(), ns) == found.end())
      ToProto(Engine::NamespaceUse{ns, {}, {}}, body->add_dropped());
  }
  SetStatus(response, Status::Ok());
}

void RequestHandler::HandleConfig(v1::Response& response) {
  if (!context_.running_config) {
    SetStatus(response, Unimplemented("this kvtierd has no configuration to show (an embedded test daemon)"));
    return;
  }
  // A tenant's connection sees its own [[tenant]] table only; an
  // operator's (no tenant name) and a daemon without tenants see all.
  response.mutable_config()->set_toml(context_.running_config(context_.tenant));
  SetStatus(response, Status::Ok());
}

namespace {

// Healthy unless a tier is failing; the warnings are what an operator
// should look at before it becomes a problem. Each tier of `engine`'s
// stack and the engine itself say what is wrong (Engine::CheckHealth);
// each line goes to `out` prefixed with `whose`.
void CheckHealth(const Engine& engine, const std::string& whose, v1::HealthResponse& out) {
  HealthFindings report;
  engine.CheckHealth(report);
  for (const std::string& line : report.problems) out.add_problems(whose + line);
  for (const std::string& line : report.warnings) out.add_warnings(whose + line);
}

}  // namespace

void RequestHandler::HandleHealth(v1::Response& response) {
  auto* body = response.mutable_health();
  std::vector<std::string> tiers;
  for (const TenantView& view : AdminEngines()) {
    const std::string whose = view.name.empty() ? std::string() : "tenant " + view.name + ": ";
    CheckHealth(*view.engine, whose, *body);
    for (std::string& t : view.engine->TierNames()) {
      if (std::find(tiers.begin(), tiers.end(), t) == tiers.end()) tiers.push_back(std::move(t));
    }
  }
  body->set_healthy(body->problems_size() == 0);
  body->set_version(KVTIER_VERSION);
  body->set_uptime_s(static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - context_.started).count()));
  for (const auto& t : tiers) body->add_tiers(t);
  SetStatus(response, Status::Ok());
}

namespace {

class StatsWriter final : public CounterVisitor {
 public:
  explicit StatsWriter(v1::StatsResponse* out) : out_(out) {}
  void Visit(std::string_view name, int64_t value) override {
    auto* c = out_->add_counters();
    c->set_name(std::string(name));
    c->set_value(value);
  }

 private:
  v1::StatsResponse* out_;
};

}  // namespace

void RequestHandler::HandleStats(v1::Response& response) {
  StatsWriter writer(response.mutable_stats());
  if (context_.visit_server_counters) context_.visit_server_counters(writer);
  for (const TenantView& view : AdminEngines()) {
    if (view.name.empty()) {
      view.engine->VisitCounters(writer);
      continue;
    }
    const std::string label = "tenant=\"" + view.name + "\"";  // names are [A-Za-z0-9_.-]
    LabellingVisitor labelled(writer, label);
    view.engine->VisitCounters(labelled);
  }
  if (context_.engine == nullptr && context_.visit_shared_counters) context_.visit_shared_counters(writer);
  SetStatus(response, Status::Ok());
}

}  // namespace kvtier
