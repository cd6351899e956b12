// The operations calls of Client (include/kvtier/client.h): what the
// `kvtier` admin commands ask the daemon. Each is one round trip.
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
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace

Result<std::vector<NamespaceInfo>> Client::ListNamespaces() {
  auto r = Current()->CallSync(wire::MakeListNamespaces());
  if (!r.ok()) return r.status();
  return FromProto(r->list_namespaces().namespaces());
}

Result<std::vector<NamespaceInfo>> Client::DropNamespaces(std::span<const NamespaceFingerprint> fingerprints,
                                                          std::string_view model_id, std::string_view model_revision) {
  if (fingerprints.empty() && model_id.empty()) return InvalidArgument("name a namespace or a model to drop");
  auto r = Current()->CallSync(wire::MakeDrop(fingerprints, model_id, model_revision));
  if (!r.ok()) return r.status();
  return FromProto(r->drop().dropped());
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
