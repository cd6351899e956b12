// RequestHandler: the protocol state of one connection (Hello done or not,
// registered namespaces) and the translation of each Request into Engine
// calls. No sockets here: the connection (server_connection.cc) moves frames, this class
// decides what they mean, so protocol behaviour is testable without I/O.
//
// Thread-compatible: one connection drives it, one request at a time.
#pragma once

#include <chrono>
#include <functional>
#include <cstdint>
#include <string>
#include <vector>

#include "daemon/server/connection_usage.h"
#include "daemon/engine/engine.h"
#include "kvtier/v1/kvtier.pb.h"

namespace kvtier {

// Daemon-wide facts the handler reports in Hello and Stats.
// What a Hello offers of the tier above the host (the HBM tier's device
// pool, daemon/setup/hbm_setup.h): its CUDA IPC handle's bytes (empty: no such
// tier), size and GPU.
struct DevicePoolOffer {
  std::string ipc_handle;
  uint64_t bytes = 0;
  std::string pci_bus_id;
};

class TenantScope;

// One tenant's engine as an operator's connection sees it.
struct TenantView {
  std::string name;
  Engine* engine = nullptr;            // borrowed
  const TenantScope* scope = nullptr;  // borrowed; null without tenants
};

// What one kind of connection is served with: a tenant's (its engine and
// arena; without tenants, the one engine), or an operator's (no engine:
// admin requests over every tenant in `operator_view`).
struct HandlerContext {
  Engine* engine = nullptr;  // borrowed; null for an operator's connection
  // With tenants: the tenant's name, the scope its namespace fingerprints
  // get (borrowed; null without tenants) and the model ids it may register
  // (empty: any).
  std::string tenant;
  const TenantScope* scope = nullptr;
  std::vector<std::string> models;
  // An operator's connection: every tenant (with tenants configured).
  std::vector<TenantView> operator_view;
  // Counters of the tiers the tenants share, visited once (Stats of an
  // operator's connection); may be empty.
  std::function<void(CounterVisitor&)> visit_shared_counters;
  uint64_t arena_bytes = 0;
  // The bytes of the arena allocated so far (HostTier::allocated_bytes():
  // less than arena_bytes while it grows after a start); null: all of it.
  std::function<uint64_t()> arena_allocated_bytes;
  uint32_t max_frame_bytes = 0;
  // Per-connection limits; max_reserved_bytes is resolved (never 0 here).
  ConnectionLimits limits;
  // The memfds a successful Hello passes (not owned): the arena, and the
  // block directory (-1 and 0 bytes: none).
  int arena_fd = -1;
  int directory_fd = -1;
  uint64_t directory_bytes = 0;
  // The HBM tier's device pool, offered in Hello (empty handle: none).
  DevicePoolOffer device_pool;
  // The tenant's KV-events endpoints, told in Hello (empty: events off).
  std::string events_endpoint, events_replay_endpoint;
  // Adds the server's own counters to a Stats response; may be empty.
  std::function<void(CounterVisitor&)> visit_server_counters;
  // The running configuration as TOML (`kvtier config get`) as the tenant
  // named sees it (empty: all of it); may be empty.
  std::function<std::string(const std::string& tenant)> running_config;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
};

class RequestHandler {
 public:
  // `context` is borrowed and must outlive the handler. (A caller that is
  // no tenant's never gets a handler: the Server refuses it at accept.)
  // `account` is borrowed (null: client memory is not charged) and
  // outlives the handler.
  RequestHandler(const HandlerContext& context, ConnectionId connection, ClientMemoryAccount* account = nullptr)
      : context_(context),
        connection_(connection),
        usage_(context.limits.max_leases, context.limits.max_reserved_bytes, context.limits.reservation_timeout,
               account) {}

  struct Outcome {
    bool attach_arena_fd = false;  // send the arena (and directory) memfds with this response
    bool close_after = false;      // close the connection after sending it
    bool no_response = false;      // send nothing (Release with no_reply, UsageReport)
  };

  // Fills `response` (id, status, body) for `request`. Never throws. A Pin
  // that must promote blocks from NVMe blocks the caller until the reads
  // complete: the connection uses HandlePinAsync instead.
  Outcome Handle(const v1::Request& request, v1::Response& response);

  // Answers a Pin request (precondition: request.has_pin()) through `done`:
  // inline when no block needed I/O, else later on an NVMe device thread.
  // The outcome of a Pin is always the default Outcome.
  void HandlePinAsync(const v1::Request& request, std::function<void(v1::Response)> done);

  bool hello_done() const { return hello_done_; }
  // Aborts this connection's reservations older than
  // limits.reservation_timeout at `now` (their keys are free again); returns
  // how many. When the next one expires: usage().NextExpiry().
  size_t AbortExpiredReservations(ConnectionUsage::Clock::time_point now);
  // What the connection holds (leases, reservations) against its limits.
  ConnectionUsage& usage() { return usage_; }

  // The most namespaces one ListNamespaces page holds (and its default).
  static constexpr uint32_t kMaxListPageNamespaces = 256;
  // The most blocks one ListBlocks page holds (and its default): about
  // 45 bytes an entry, at most 110 with a 64-byte tenant name, so a page
  // stays under 450 KiB, below the 1 MiB any client accepts of a response
  // whatever its frame cap (client_lib/connection.cc).
  static constexpr uint32_t kMaxListPageBlocks = 4096;

  // A Lookup answered in steps of a bounded number of keys, so that the
  // connection can let its io thread serve other connections between them
  // (server_connection.cc). The answer is the one Handle gives.
  struct LookupSteps {
    uint64_t id = 0;
    NamespaceFingerprint ns;
    std::vector<BlockKey> keys;
    LookupCursor cursor;
    Status refused = Status::Ok();  // the request is answered with this at the first step
  };
  // Whether `request` is a Lookup worth answering in steps of
  // `chunk_keys`: more keys than that, from a tenant's connection after
  // Hello. Others go to Handle (which answers any refusal).
  bool LookupTakesSteps(const v1::Request& request, size_t chunk_keys) const;
  // Starts `request` (precondition: a Lookup). Cheap: resolves the
  // namespace and copies the keys; a bad namespace or key list is kept in
  // `refused`.
  LookupSteps BeginLookup(const v1::Request& request) const;
  // Places at most `chunk_keys` more keys; true once the Lookup is
  // answered, with `response` filled (id, status, body) as Handle would.
  bool StepLookup(LookupSteps& steps, size_t chunk_keys, v1::Response& response);

  // Whether a Pin may go to HandlePinAsync: the caller said Hello and is a
  // tenant's (an operator's connection has no engine). When not, the Pin
  // goes to Handle, which answers why.
  bool ServesPins() const { return hello_done_ && context_.engine != nullptr; }

  // Whether `request` is answered through HandleLater rather than Handle:
  // a Pin, or a corruption report (an Erase with `corrupt`), once
  // ServesPins. Both may wait for a tier or mover thread.
  bool AnswersLater(const v1::Request& request) const {
    return ServesPins() && (request.has_pin() || (request.has_erase() && request.erase().corrupt()));
  }
  // Answers a request AnswersLater accepts through `done`: inline or later
  // on a tier or mover thread; its outcome is the default Outcome. A
  // corruption report is answered once the engine has checked the blocks
  // (Engine::CheckReportedCorrupt), so the reporter's read returns after
  // a tampered block is gone.
  void HandleLater(const v1::Request& request, std::function<void(v1::Response)> done);

 private:
  Outcome HandleHello(const v1::HelloRequest& hello, v1::Response& response);
  // Resolves a request's namespace index; InvalidArgument if unregistered.
  Result<NamespaceFingerprint> Namespace(uint32_t ns) const;
  // The put path (request_handler_puts.cc).
  void HandleReserve(const v1::ReserveRequest& r, v1::Response& response);
  void HandleCommit(const v1::CommitRequest& r, v1::Response& response);
  void HandleAbort(const v1::AbortRequest& r, v1::Response& response);
  void HandlePublishLayers(const v1::PublishLayersRequest& r, v1::Response& response);
  // The read path (request_handler_gets.cc).
  void HandleLookup(const v1::Request& request, v1::Response& response);
  void HandleRelease(const v1::ReleaseRequest& r, v1::Response& response);
  void HandleErase(const v1::EraseRequest& r, v1::Response& response);
  // An Erase with `corrupt` (precondition: ServesPins()), through `done`.
  void HandleCorruptReportAsync(const v1::Request& request, std::function<void(v1::Response)> done);
  // The work ahead (request_handler_loads.cc).
  void HandlePreloadPlan(const v1::PreloadPlanRequest& r, v1::Response& response);
  // When the longest cached prefix of the request's keys can be in host and
  // GPU memory (Engine::EstimateReady): InvalidArgument for a namespace not
  // registered on this connection, bad keys or too many of them.
  void HandleReadyEstimate(const v1::ReadyEstimateRequest& r, v1::Response& response);
  // Starts a layer-wise load (Engine::BeginLoad), with its preload plan
  // when the request gives a compute time.
  void HandleBeginLoad(const v1::BeginLoadRequest& r, v1::Response& response);
  // Operations (request_handler_ops.cc).
  void HandleStats(v1::Response& response);
  // One page of the listing (proto ListNamespacesRequest); first forgets
  // each engine's unused registrations (Engine::ForgetUnusedNamespaces).
  void HandleListNamespaces(const v1::ListNamespacesRequest& r, v1::Response& response);
  // One page of every block every tier holds (proto ListBlocksRequest;
  // request_handler_blocks.cc).
  void HandleListBlocks(const v1::ListBlocksRequest& r, v1::Response& response);
  void HandleDrop(const v1::DropRequest& r, v1::Response& response);
  void HandleConfig(v1::Response& response);
  void HandleHealth(v1::Response& response);
  // Operator holds (request_handler_holds.cc): `kvtier pin` / `unpin`.
  void HandleHold(const v1::HoldRequest& r, v1::Response& response);
  void HandleUnhold(const v1::UnholdRequest& r, v1::Response& response);
  // The engines an admin request covers: the connection's own, or every
  // tenant's for an operator's connection.
  std::vector<TenantView> AdminEngines() const;
  // The engine an admin request about namespace `ns` goes to: the
  // connection's own, or for an operator's the tenant whose scope owns
  // `ns` (null: no tenant's).
  Engine* EngineFor(const NamespaceFingerprint& ns) const;
  // What a Hold or Unhold names: EngineFor its namespace, and its keys.
  // InvalidArgument (no fingerprint, bad or no keys; `verb` says which
  // request), NotFound (the namespace is no tenant's).
  struct HoldTarget {
    Engine* engine;
    NamespaceFingerprint ns;
    std::vector<BlockKey> keys;
  };
  Result<HoldTarget> HoldTargetOf(bool has_fingerprint, const v1::Key& fingerprint,
                                  const google::protobuf::RepeatedField<uint64_t>& words, std::string_view verb) const;
  // Whether `request` may run on an operator's connection (admin only).
  static bool AdminRequest(const v1::Request& request);
  // Feeds a client's report of directory reads and local lookups to the
  // engine. Never answered; a malformed report is dropped and counted.
  void HandleUsageReport(const v1::UsageReport& r);
  // Queue hints of the engine's scheduler (request_handler_loads.cc).
  void HandleQueueHint(const v1::QueueHint& q, v1::Response& response);

  const HandlerContext& context_;
  const ConnectionId connection_;
  bool hello_done_ = false;
  std::vector<NamespaceFingerprint> namespaces_;
  ConnectionUsage usage_;
};

}  // namespace kvtier
