#include "daemon/server/request_handler.h"

#include <algorithm>
#include <future>

#include "common/utf8.h"
#include "daemon/tenants/tenant_scope.h"
#include "proto/wire.h"

namespace kvtier {
namespace {

// A connection registers namespaces in its Hello only, so this bounds both
// one Hello and one connection (docs/RELIABILITY.md).
constexpr int kMaxNamespacesPerConnection = 64;
constexpr size_t kMaxClientNameBytes = 256;

void SetStatus(v1::Response& response, const Status& s) { wire::ToProto(s, response.mutable_status()); }

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
                                         "requests (stats, ls, drop, pin, unpin, config, health) only"));
    return {};
  }
  switch (request.body_case()) {
    case v1::Request::kLookup: HandleLookup(request, response); break;
    case v1::Request::kReserve: HandleReserve(request.reserve(), response); break;
    case v1::Request::kCommit: HandleCommit(request.commit(), response); break;
    case v1::Request::kAbort: HandleAbort(request.abort(), response); break;
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
    case v1::Request::kPreloadPlan: HandlePreloadPlan(request.preload_plan(), response); break;
    case v1::Request::kBeginLoad: HandleBeginLoad(request.begin_load(), response); break;
    case v1::Request::kEndLoad:
    {
      Status ended = context_.engine->EndLoad(connection_, request.end_load().load_id());
      if (ended.ok()) usage_.LoadEnded(request.end_load().load_id());
      SetStatus(response, ended);
    }
      response.mutable_end_load();
      break;
    case v1::Request::kUsage:
      HandleUsageReport(request.usage());
      return {.no_response = true};
    case v1::Request::kStats: HandleStats(response); break;
    case v1::Request::kListNamespaces: HandleListNamespaces(request.list_namespaces(), response); break;
    case v1::Request::kDrop: HandleDrop(request.drop(), response); break;
    case v1::Request::kConfig: HandleConfig(response); break;
    case v1::Request::kHealth: HandleHealth(response); break;
    case v1::Request::kHold: HandleHold(request.hold(), response); break;
    case v1::Request::kUnhold: HandleUnhold(request.unhold(), response); break;
    case v1::Request::kQueue: HandleQueueHint(request.queue(), response); break;
    default:
      SetStatus(response, Unimplemented("request type " + std::to_string(request.body_case()) +
                                        " is not handled by this kvtierd"));
  }
  return {};
}

RequestHandler::Outcome RequestHandler::HandleHello(const v1::HelloRequest& hello,
                                                    v1::Response& response) {
  if (hello_done_) {
    SetStatus(response, FailedPrecondition("Hello was already sent on this connection"));
    return {};
  }
  if (hello.protocol_version() != wire::kProtocolVersion) {
    SetStatus(response, VersionMismatch("client speaks protocol " +
                                        std::to_string(hello.protocol_version()) +
                                        ", kvtierd speaks " + std::to_string(wire::kProtocolVersion)));
    return {.close_after = true};
  }
  if (hello.namespaces_size() > kMaxNamespacesPerConnection) {
    SetStatus(response, InvalidArgument("at most " + std::to_string(kMaxNamespacesPerConnection) +
                                        " namespaces per connection"));
    return {.close_after = true};
  }
  if (hello.client_name().size() > kMaxClientNameBytes || !IsValidUtf8(hello.client_name())) {
    SetStatus(response, InvalidArgument("client_name must be valid UTF-8 of at most " +
                                        std::to_string(kMaxClientNameBytes) + " bytes (it is " +
                                        std::to_string(hello.client_name().size()) + ")"));
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
  body->set_max_frame_bytes(context_.max_frame_bytes);
  body->set_daemon_version(KVTIER_VERSION);
  body->set_directory_bytes(context_.directory_fd >= 0 ? context_.directory_bytes : 0);
  body->set_tenant(context_.tenant);
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

void RequestHandler::HandleReserve(const v1::ReserveRequest& r, v1::Response& response) {
  auto ns = Namespace(r.ns());
  if (!ns.ok()) return SetStatus(response, ns.status());
  if (r.keys_size() != 2 * r.sizes_size()) {
    return SetStatus(response, InvalidArgument("Reserve has " + std::to_string(r.keys_size() / 2) +
                                               " keys but " + std::to_string(r.sizes_size()) + " sizes"));
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
  auto grants = context_.engine->Reserve(connection_, *ns, std::span(*keys).first(fits),
                                         std::span(sizes).first(fits), links);
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
    grants.push_back(SlotGrant{i < bytes_fit ? Busy(memory_refusal)
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
    return SetStatus(response, InvalidArgument("Commit has " + std::to_string(r.keys_size() / 2) +
                                               " keys but " + std::to_string(r.sizes_size()) + " sizes"));
  }
  if (r.checksums_size() != 0 && r.checksums_size() != r.sizes_size()) {
    return SetStatus(response, InvalidArgument("Commit has " + std::to_string(r.sizes_size()) + " keys but " +
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
  context_.engine->PinAsync(connection_, *ns, std::move(*keys),
                            [this, refused, room, why_refused = std::move(why_refused), response = std::move(response),
                             done = std::move(done)](std::vector<PinGrant> grants) mutable {
                              const uint64_t granted = static_cast<uint64_t>(std::count_if(
                                  grants.begin(), grants.end(), [](const PinGrant& g) { return g.status.ok(); }));
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
                            }, layers);
}

size_t RequestHandler::AbortExpiredReservations(ConnectionUsage::Clock::time_point now) {
  std::vector<BlockKey> expired = usage_.TakeExpired(now);
  if (expired.empty() || context_.engine == nullptr) return 0;
  return context_.engine->Abort(connection_, expired);
}

void RequestHandler::HandleRelease(const v1::ReleaseRequest& r, v1::Response& response) {
  std::vector<LeaseId> leases(r.leases().begin(), r.leases().end());
  auto statuses = context_.engine->Release(connection_, leases);
  usage_.Released(static_cast<uint64_t>(std::count_if(statuses.begin(), statuses.end(),
                                                      [](const Status& s) { return s.ok(); })));
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
  auto started = context_.engine->BeginLoad(connection_, *ns, *keys, r.device_pool(), r.verify());
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
    const uint64_t bytes = started->source == Tier::kHost ? started->layer_bytes * keys->size()
                                                          : started->below_bytes_per_layer;
    auto plan = context_.engine->PlanPreload(started->source, bytes, compute_us, started->layers, 0);
    if (plan.ok()) wire::ToProto(*plan, body->mutable_plan());
  }
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
