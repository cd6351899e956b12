// Fuzzes every request handler of kvtierd (daemon/server/request_handler.h): the
// input is a stream of framed kvtier.v1.Requests (tests/fuzz/request_stream.h)
// run through one connection's RequestHandler over a real Engine and a
// host tier of 32 blocks of 4 KiB, as the server would: Pins through
// HandlePinAsync once the connection serves them, the rest through Handle,
// nothing after a response that closes the connection. Frames that do not
// parse are skipped (the server answers them and goes on). Unless the
// input says otherwise a valid Hello goes first, so later requests reach
// their handlers; the fake clock moves 1 ms per request, so short holds
// and queue hints expire within one input. An empty frame stands for the
// connection's timer finding every reservation expired. Small lease
// numbers in a Release stand for the leases granted so far (see
// Connection::TranslateLeases).
//
// Checked beyond "no crash, no leak, no UB":
// - every answer carries its request's id and Pins are answered exactly
//   once, inline (no tier below the host needs I/O);
// - every granted slot and pinned block lies inside the arena, and the
//   host tier never uses more than its capacity;
// - once every reservation has expired neither the connection nor the
//   engine holds one;
// - once the connection closes and every namespace is dropped, the arena
//   is empty: no request leaks arena space.
#include <google/protobuf/stubs/logging.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/counters.h"
#include "daemon/engine/engine.h"
#include "daemon/server/request_handler.h"
#include "proto/wire.h"
#include "tests/fuzz/request_stream.h"
#include "tests/testing/fake_clock.h"
#include "tiers/host/host_tier.h"

namespace kvtier::fuzz {
namespace {

constexpr uint64_t kArenaBytes = 32 * kFuzzBlockBytes;
constexpr uint32_t kMaxFrameBytes = 1u << 20;
constexpr ConnectionId kTenantConnection = 1;
constexpr ConnectionId kOperatorConnectionId = 2;
// Low, so that inputs reach the connection's lease limit.
constexpr uint64_t kMaxLeases = 64;

[[noreturn]] void Fail(const char* what, const v1::Request& request) {
  std::fprintf(stderr, "request_handler_fuzz: %s\nrequest: %s\n", what, request.ShortDebugString().c_str());
  std::abort();
}

// The engine and host tier of one input, torn down engine first.
struct Stack {
  testing::FakeClock clock;
  std::unique_ptr<HostTier> host;
  std::unique_ptr<Engine> engine;

  explicit Stack(EvictionPolicyId eviction) {
    HostArenaOptions arena;
    arena.capacity_bytes = kArenaBytes;
    arena.lock = HostArenaOptions::LockMode::kOff;
    arena.name = "kvtier-fuzz-arena";
    auto opened = HostTier::Open(arena);
    if (!opened.ok()) {
      std::fprintf(stderr, "HostTier::Open: %s\n", opened.status().ToString().c_str());
      std::abort();
    }
    host = std::move(*opened);
    auto created = Engine::Create(EngineOptions{2, eviction}, *host, clock);
    if (!created.ok()) {
      std::fprintf(stderr, "Engine::Create: %s\n", created.status().ToString().c_str());
      std::abort();
    }
    engine = std::move(*created);
  }
  ~Stack() { engine.reset(); }
};

[[noreturn]] void FailAfter(const char* what) {
  std::fprintf(stderr, "request_handler_fuzz: %s\n", what);
  std::abort();
}

// The engine's counter `name` (-1: no such counter).
int64_t Counter(const Engine& engine, std::string_view name) {
  CounterCollector counters;
  engine.VisitCounters(counters);
  for (const auto& [counter, value] : counters.counters()) {
    if (counter == name) return value;
  }
  return -1;
}

// REQUEST_HANDLER_FUZZ_VERBOSE=1 prints every request and answer (to read
// what a reproducer does).
bool Verbose() {
  static const bool verbose = std::getenv("REQUEST_HANDLER_FUZZ_VERBOSE") != nullptr;
  return verbose;
}

void CheckInArena(uint64_t offset, uint64_t length, const v1::Request& request) {
  if (offset > kArenaBytes || length > kArenaBytes - offset) Fail("a slot or pin outside the arena", request);
}

// What one answer must hold, whatever the request was.
void CheckResponse(const v1::Request& request, const v1::Response& response, const HostTier& host) {
  if (response.id() != request.id()) Fail("the response carries another id", request);
  if (response.has_reserve()) {
    for (const v1::Slot& slot : response.reserve().slots()) {
      if (slot.status().code() == 0) CheckInArena(slot.offset(), slot.length(), request);
    }
  }
  if (response.has_pin()) {
    for (const v1::PinnedBlock& block : response.pin().blocks()) {
      if (block.status().code() == 0) CheckInArena(block.offset(), block.length(), request);
    }
  }
  if (host.used_bytes() > host.capacity_bytes()) Fail("the host tier is over its capacity", request);
}

// One connection as the server drives it (daemon/server/server_connection.cc).
class Connection {
 public:
  Connection(const HandlerContext& context, ConnectionId id) : handler_(context, id) {}

  // The connection's timer, run when every reservation has expired: the
  // connection then holds none, and neither does the engine (only this
  // connection reserves).
  void ExpireReservations(const HandlerContext& context) {
    const auto later = std::chrono::steady_clock::now() + context.limits.reservation_timeout + std::chrono::hours(1);
    handler_.AbortExpiredReservations(later);
    if (handler_.usage().reservations() != 0 || handler_.usage().reserved_bytes() != 0) {
      FailAfter("the connection holds reservations after all expired");
    }
    if (Counter(*context.engine, "engine.reserved_blocks") != 0) {
      FailAfter("the engine holds reservations after the connection's all expired");
    }
  }

  // Runs `request`; false once the connection is closed.
  bool Serve(v1::Request& request, const HostTier& host) {
    if (closed_) return false;
    if (request.has_release()) TranslateLeases(*request.mutable_release());
    v1::Response response;
    RequestHandler::Outcome outcome;
    if (request.body_case() == v1::Request::kPin && handler_.ServesPins()) {
      std::optional<v1::Response> answer;
      int answers = 0;
      handler_.HandlePinAsync(request, [&](v1::Response r) {
        ++answers;
        answer = std::move(r);
      });
      if (answers != 1) Fail("a Pin over the host tier alone was not answered once, inline", request);
      response = std::move(*answer);
    } else {
      outcome = handler_.Handle(request, response);
    }
    if (Verbose()) {
      std::fprintf(stderr, "> %s\n< %s\n", request.ShortDebugString().c_str(),
                   outcome.no_response ? "(no response)" : response.ShortDebugString().c_str());
    }
    if (!outcome.no_response) CheckResponse(request, response, host);
    if (response.has_pin()) {
      for (const v1::PinnedBlock& block : response.pin().blocks()) {
        if (block.status().code() == 0) granted_leases_.push_back(block.lease());
      }
    }
    closed_ = outcome.close_after;
    return !closed_;
  }

 private:
  // Lease ids start at a random point per engine, which an input cannot
  // know: a lease below kLeaseIndexes in a Release names the n-th lease
  // this connection was granted (mod their count; released ones stay
  // listed, so releasing twice is reachable). Others go as they are.
  static constexpr uint64_t kLeaseIndexes = 1 << 16;
  void TranslateLeases(v1::ReleaseRequest& release) const {
    if (granted_leases_.empty()) return;
    for (uint64_t& lease : *release.mutable_leases()) {
      if (lease < kLeaseIndexes) lease = granted_leases_[lease % granted_leases_.size()];
    }
  }

  RequestHandler handler_;
  bool closed_ = false;
  std::vector<uint64_t> granted_leases_;
};

v1::Request HelloRequest(bool with_namespaces) {
  v1::Request r;
  r.set_id(0);
  r.mutable_hello()->set_protocol_version(wire::kProtocolVersion);
  r.mutable_hello()->set_client_name("request-handler-fuzz");
  if (with_namespaces) {
    for (const NamespaceDescriptor& d : FuzzNamespaces()) wire::ToProto(d, r.mutable_hello()->add_namespaces());
  }
  return r;
}

void RunStream(uint8_t flags, std::span<const uint8_t> frames) {
  Stack stack(EvictionPolicy(flags));
  HandlerContext tenant;
  tenant.engine = stack.engine.get();
  tenant.arena_bytes = stack.host->capacity_bytes();
  tenant.max_frame_bytes = kMaxFrameBytes;
  tenant.limits.max_leases = kMaxLeases;
  tenant.limits.max_reserved_bytes = kArenaBytes / 4;  // what kvtierd resolves 0 to
  if ((flags & kModelAllowList) != 0) tenant.models = {"fuzz/allowed"};
  tenant.running_config = [](const std::string&) { return std::string("[server]\nio_threads = 2\n"); };
  HandlerContext operator_view;
  operator_view.operator_view = {TenantView{"default", stack.engine.get(), nullptr}};
  operator_view.max_frame_bytes = kMaxFrameBytes;

  Connection tenant_connection(tenant, kTenantConnection);
  std::optional<Connection> operator_connection;
  if ((flags & kOperatorConnection) != 0) operator_connection.emplace(operator_view, kOperatorConnectionId);
  if ((flags & kSkipHello) == 0) {
    v1::Request hello = HelloRequest(true);
    tenant_connection.Serve(hello, *stack.host);
    if (operator_connection) {
      hello = HelloRequest(false);
      operator_connection->Serve(hello, *stack.host);
    }
  }

  for (std::span<const uint8_t> frame : SplitFrames(frames)) {
    if (frame.empty()) {  // the connection's timer (request_stream.h)
      tenant_connection.ExpireReservations(tenant);
      continue;
    }
    v1::Request request;
    if (!request.ParseFromArray(frame.data(), static_cast<int>(frame.size()))) continue;
    Connection& to = operator_connection && request.id() % 2 == 1 ? *operator_connection : tenant_connection;
    to.Serve(request, *stack.host);
    stack.clock.AdvanceUs(1000);
  }

  tenant_connection.ExpireReservations(tenant);
  // The connection closes: its reservations, pins and loads go. Dropping
  // every namespace then takes every block (held ones too).
  stack.engine->CloseConnection(kTenantConnection);
  for (const Engine::NamespaceUse& use : stack.engine->NamespaceUses()) stack.engine->DropNamespace(use.ns);
  if (stack.host->used_bytes() != 0) FailAfter("arena bytes still used after the close and the drops");
}

}  // namespace
}  // namespace kvtier::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Invalid UTF-8 in a string field is a parse failure the fuzzer meets all
  // the time; protobuf would log each one.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  kvtier::fuzz::RunStream(data[0], std::span<const uint8_t>(data + 1, size - 1));
  return 0;
}
