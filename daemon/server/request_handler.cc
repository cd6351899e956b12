// RequestHandler (request_handler.h): the dispatch of each request, Hello
// and the namespaces it registers, which engine an admin request goes to,
// and usage reports. The put path is in request_handler_puts.cc, lookups,
// pins and erases in request_handler_gets.cc, loads and queue hints in
// request_handler_loads.cc, the operations requests in
// request_handler_ops.cc, request_handler_blocks.cc and
// request_handler_holds.cc.
#include "daemon/server/request_handler.h"

#include <algorithm>
#include <future>

#include "common/utf8.h"
#include "daemon/server/response_status.h"
#include "daemon/tenants/tenant_scope.h"
#include "proto/wire.h"

namespace kvtier {
namespace {

// A connection registers namespaces in its Hello only, so this bounds both
// one Hello and one connection (docs/RELIABILITY.md).
constexpr int kMaxNamespacesPerConnection = 64;
constexpr size_t kMaxClientNameBytes = 256;

// What registering `d` holds in kvtierd, charged to the connection: its
// record and the bytes of its strings (kept once per registration).
uint64_t RegistrationBytes(const NamespaceDescriptor& d) {
  return ClientStateCost::kNamespace + d.model_id.size() + d.model_revision.size() + d.adapter_id.size() +
         d.adapter_revision.size() + d.kv_dtype.size() + d.kv_layout.size() + d.object_kind.size();
}

}  // namespace

RequestHandler::Outcome RequestHandler::Handle(const v1::Request& request, v1::Response& response) {
  response.set_id(request.id());
  if (request.body_case() == v1::Request::kHello) return HandleHello(request.hello(), response);
  if (request.body_case() == v1::Request::BODY_NOT_SET) {
    SetStatus(response, Unimplemented("unknown or empty request type (is the client newer than kvtierd?)"));
    return {};
  }
  if (!hello_done_) {
    SetStatus(response, FailedPrecondition("send Hello before any other request"));
    return {};
  }
  if (context_.engine == nullptr && !AdminRequest(request)) {
    SetStatus(response, PermissionDenied("this caller is an operator of kvtierd but no tenant's: it may run admin "
                                         "requests (stats, ls, ls --blocks, drop, pin, unpin, config, health) only"));
    return {};
  }
  switch (request.body_case()) {
    case v1::Request::kLookup:
      HandleLookup(request, response);
      break;
    case v1::Request::kReserve:
      HandleReserve(request.reserve(), response);
      break;
    case v1::Request::kCommit:
      HandleCommit(request.commit(), response);
      break;
    case v1::Request::kAbort:
      HandleAbort(request.abort(), response);
      break;
    case v1::Request::kPublishLayers:
      HandlePublishLayers(request.publish_layers(), response);
      break;
    case v1::Request::kPin: {
      std::promise<v1::Response> answered;
      auto future = answered.get_future();
      HandlePinAsync(request, [&answered](v1::Response r) { answered.set_value(std::move(r)); });
      response = future.get();
      break;
    }
    case v1::Request::kRelease:
      HandleRelease(request.release(), response);
      return {.no_response = request.release().no_reply()};
    case v1::Request::kErase:
      if (request.erase().corrupt()) {
        std::promise<v1::Response> answered;
        auto future = answered.get_future();
        HandleCorruptReportAsync(request, [&answered](v1::Response r) { answered.set_value(std::move(r)); });
        response = future.get();
        break;
      }
      HandleErase(request.erase(), response);
      break;
    case v1::Request::kPreloadPlan:
      HandlePreloadPlan(request.preload_plan(), response);
      break;
    case v1::Request::kReadyEstimate:
      HandleReadyEstimate(request.ready_estimate(), response);
      break;
    case v1::Request::kBeginLoad:
      HandleBeginLoad(request.begin_load(), response);
      break;
    case v1::Request::kEndLoad: {
      Status ended = context_.engine->EndLoad(connection_, request.end_load().load_id());
      if (ended.ok()) usage_.LoadEnded(request.end_load().load_id());
      SetStatus(response, ended);
    }
      response.mutable_end_load();
      break;
    case v1::Request::kUsage:
      HandleUsageReport(request.usage());
      return {.no_response = true};
    case v1::Request::kStats:
      HandleStats(response);
      break;
    case v1::Request::kListNamespaces:
      HandleListNamespaces(request.list_namespaces(), response);
      break;
    case v1::Request::kListBlocks:
      HandleListBlocks(request.list_blocks(), response);
      break;
    case v1::Request::kDrop:
      HandleDrop(request.drop(), response);
      break;
    case v1::Request::kConfig:
      HandleConfig(response);
      break;
    case v1::Request::kHealth:
      HandleHealth(response);
      break;
    case v1::Request::kHold:
      HandleHold(request.hold(), response);
      break;
    case v1::Request::kUnhold:
      HandleUnhold(request.unhold(), response);
      break;
    case v1::Request::kQueue:
      HandleQueueHint(request.queue(), response);
      break;
    default:
      SetStatus(response, Unimplemented("request type " + std::to_string(request.body_case()) +
                                        " is not handled by this kvtierd"));
  }
  return {};
}

RequestHandler::Outcome RequestHandler::HandleHello(const v1::HelloRequest& hello, v1::Response& response) {
  if (hello_done_) {
    SetStatus(response, FailedPrecondition("Hello was already sent on this connection"));
    return {};
  }
  if (hello.protocol_version() != wire::kProtocolVersion) {
    SetStatus(response, VersionMismatch("client speaks protocol " + std::to_string(hello.protocol_version()) +
                                        ", kvtierd speaks " + std::to_string(wire::kProtocolVersion)));
    return {.close_after = true};
  }
  if (hello.namespaces_size() > kMaxNamespacesPerConnection) {
    SetStatus(response,
              InvalidArgument("at most " + std::to_string(kMaxNamespacesPerConnection) + " namespaces per connection"));
    return {.close_after = true};
  }
  if (hello.client_name().size() > kMaxClientNameBytes || !IsValidUtf8(hello.client_name())) {
    SetStatus(response,
              InvalidArgument("client_name must be valid UTF-8 of at most " + std::to_string(kMaxClientNameBytes) +
                              " bytes (it is " + std::to_string(hello.client_name().size()) + ")"));
    return {.close_after = true};
  }
  if (context_.engine == nullptr && hello.namespaces_size() > 0) {
    SetStatus(response, PermissionDenied("this caller is an operator of kvtierd but no tenant's: it can register "
                                         "no namespace (list its uid or group in a [[tenant]] table)"));
    return {.close_after = true};
  }
  std::vector<NamespaceFingerprint> fingerprints;
  std::vector<NamespaceDescriptor> descriptors;
  for (int i = 0; i < hello.namespaces_size(); ++i) {
    NamespaceDescriptor d = wire::FromProto(hello.namespaces(i));
    Status valid = d.Validate();
    if (!valid.ok()) {
      SetStatus(response, InvalidArgument("namespace " + std::to_string(i) + ": " + valid.message()));
      return {.close_after = true};
    }
    if (!context_.models.empty() &&
        std::find(context_.models.begin(), context_.models.end(), d.model_id) == context_.models.end()) {
      SetStatus(response, PermissionDenied("namespace " + std::to_string(i) + ": tenant " + context_.tenant +
                                           " may not cache model " + d.model_id));
      return {.close_after = true};
    }
    // A tenant's namespaces are its own: the same descriptor in another
    // tenant is another namespace (daemon/tenants/tenant_scope.h).
    const NamespaceFingerprint plain = FingerprintNamespace(d);
    fingerprints.push_back(context_.scope != nullptr ? context_.scope->ScopeNamespace(plain) : plain);
    descriptors.push_back(std::move(d));
  }
  // Every namespace passed; what registering them holds is charged to the
  // connection (a refusal leaves nothing behind).
  uint64_t registration_bytes = 0;
  for (const NamespaceDescriptor& d : descriptors) registration_bytes += RegistrationBytes(d);
  if (Status charged = usage_.ChargeNamespaces(registration_bytes); !charged.ok()) {
    SetStatus(response, charged);
    return {.close_after = true};
  }
  // They stay registered while this connection or a block uses them.
  if (!fingerprints.empty()) context_.engine->UseNamespaces(connection_, fingerprints, descriptors);
  namespaces_ = std::move(fingerprints);
  hello_done_ = true;
  auto* body = response.mutable_hello();
  body->set_protocol_version(wire::kProtocolVersion);
  wire::AddKeys(namespaces_, body->mutable_namespace_fingerprints());
  body->set_arena_bytes(context_.arena_bytes);
  if (context_.arena_bytes > 0 && context_.arena_allocated_bytes) {
    body->set_arena_allocated_bytes(std::min(context_.arena_bytes, context_.arena_allocated_bytes()));
  }
  body->set_max_frame_bytes(context_.max_frame_bytes);
  body->set_daemon_version(KVTIER_VERSION);
  body->set_directory_bytes(context_.directory_fd >= 0 ? context_.directory_bytes : 0);
  body->set_tenant(context_.tenant);
  body->set_events_endpoint(context_.events_endpoint);
  body->set_events_replay_endpoint(context_.events_replay_endpoint);
  if (!context_.device_pool.ipc_handle.empty()) {
    auto* pool = body->mutable_device_pool();
    pool->set_ipc_handle(context_.device_pool.ipc_handle);
    pool->set_bytes(context_.device_pool.bytes);
    pool->set_pci_bus_id(context_.device_pool.pci_bus_id);
  }
  SetStatus(response, Status::Ok());
  // An operator's connection has no arena (arena_bytes 0): no fd travels.
  return {.attach_arena_fd = context_.engine != nullptr};
}

bool RequestHandler::AdminRequest(const v1::Request& request) {
  switch (request.body_case()) {
    case v1::Request::kStats:
    case v1::Request::kListNamespaces:
    case v1::Request::kListBlocks:
    case v1::Request::kDrop:
    case v1::Request::kConfig:
    case v1::Request::kHealth:
    case v1::Request::kHold:
    case v1::Request::kUnhold:
      return true;
    default:
      return false;
  }
}

std::vector<TenantView> RequestHandler::AdminEngines() const {
  if (context_.engine != nullptr) return {TenantView{context_.tenant, context_.engine, context_.scope}};
  return context_.operator_view;
}

Engine* RequestHandler::EngineFor(const NamespaceFingerprint& ns) const {
  if (context_.engine != nullptr) return context_.engine;
  for (const TenantView& view : context_.operator_view) {
    if (view.scope == nullptr || view.scope->Owns(ns)) return view.engine;
  }
  return nullptr;
}

Result<NamespaceFingerprint> RequestHandler::Namespace(uint32_t ns) const {
  if (ns >= namespaces_.size()) {
    return InvalidArgument("namespace " + std::to_string(ns) + " is not registered on this connection (" +
                           std::to_string(namespaces_.size()) + " registered at Hello)");
  }
  return namespaces_[ns];
}

void RequestHandler::HandleUsageReport(const v1::UsageReport& r) {
  for (const auto& uses : r.uses()) {
    auto ns = Namespace(uses.ns());
    auto keys = wire::KeysFromProto(uses.keys());
    if (!ns.ok() || !keys.ok()) {
      context_.engine->RecordBadUsageReport();
      continue;
    }
    context_.engine->RecordUses(*ns, *keys);
  }
  context_.engine->RecordLocalLookups(static_cast<int64_t>(r.local_lookups()),
                                      static_cast<int64_t>(r.local_lookup_keys()),
                                      static_cast<int64_t>(r.local_lookup_hit_blocks()));
}

}  // namespace kvtier
