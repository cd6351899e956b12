// Tests of RequestHandler, the per-connection protocol state machine, over a
// real Engine and HostTier and without sockets: the Hello handshake, every
// request type's round trip, and request-level errors.
#include "daemon/server/request_handler.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "proto/wire.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/test_daemon.h"
#include "tiers/host/host_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::CheckBlockBytes;
using ::kvtier::testing::FakeClock;
using ::kvtier::testing::FillBlockBytes;
using ::kvtier::testing::TestNamespace;

constexpr uint64_t kArenaBytes = 64 * 4096;
constexpr uint32_t kMaxFrameBytes = 1 << 20;

BlockKey Key(uint64_t i) { return BlockKey{0xfeed, i}; }

class RequestHandlerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    host_ = ::kvtier::testing::OpenTestHostTier(kArenaBytes);
    ASSERT_NE(host_, nullptr);
    auto engine = Engine::Create(EngineOptions{4, EvictionPolicyId::kLru}, *host_, clock_);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(*engine);
    context_.engine = engine_.get();
    context_.arena_bytes = host_->capacity_bytes();
    context_.max_frame_bytes = kMaxFrameBytes;
    handler_ = std::make_unique<RequestHandler>(context_, /*session=*/1);
  }

  static v1::Request HelloRequest(const std::vector<NamespaceDescriptor>& namespaces,
                                  uint32_t version = wire::kProtocolVersion) {
    v1::Request r;
    r.set_id(1);
    r.mutable_hello()->set_protocol_version(version);
    r.mutable_hello()->set_client_name("handler-test");
    for (const auto& d : namespaces) wire::ToProto(d, r.mutable_hello()->add_namespaces());
    return r;
  }

  // Sends `request` to `handler`, returning the response.
  static v1::Response Send(RequestHandler& handler, const v1::Request& request,
                           RequestHandler::Outcome* outcome = nullptr) {
    v1::Response response;
    RequestHandler::Outcome o = handler.Handle(request, response);
    if (outcome != nullptr) *outcome = o;
    EXPECT_EQ(response.id(), request.id());
    return response;
  }

  // A completed Hello with TestNamespace("rev-1") and ("rev-2").
  void HelloOk(RequestHandler& handler) {
    v1::Response r = Send(handler, HelloRequest({TestNamespace("rev-1"), TestNamespace("rev-2")}));
    ASSERT_EQ(r.status().code(), 0) << r.status().message();
  }

  static StatusCode Code(const v1::Response& r) { return static_cast<StatusCode>(r.status().code()); }

  // The client library's request builders, with an explicit id.
  static v1::Request WithId(uint64_t id, v1::Request r) {
    r.set_id(id);
    return r;
  }
  static v1::Request Lookup(uint64_t id, uint32_t ns, const std::vector<BlockKey>& keys) {
    return WithId(id, wire::MakeLookup(ns, keys));
  }
  static v1::Request Reserve(uint64_t id, uint32_t ns, const std::vector<BlockKey>& keys,
                             const std::vector<uint64_t>& sizes) {
    return WithId(id, wire::MakeReserve(ns, keys, sizes));
  }
  static v1::Request Commit(uint64_t id, uint32_t ns, const std::vector<BlockKey>& keys,
                            const std::vector<uint64_t>& sizes) {
    return WithId(id, wire::MakeCommit(ns, keys, sizes));
  }
  static v1::Request Abort(uint64_t id, uint32_t ns, const std::vector<BlockKey>& keys) {
    return WithId(id, wire::MakeAbort(ns, keys));
  }
  static v1::Request Pin(uint64_t id, uint32_t ns, const std::vector<BlockKey>& keys) {
    return WithId(id, wire::MakePin(ns, keys));
  }
  static v1::Request Release(uint64_t id, const std::vector<uint64_t>& leases) {
    return WithId(id, wire::MakeRelease(leases));
  }
  static v1::Request Erase(uint64_t id, uint32_t ns, const std::vector<BlockKey>& keys) {
    return WithId(id, wire::MakeErase(ns, keys));
  }
  static v1::Request Stats(uint64_t id) { return WithId(id, wire::MakeStats()); }

  FakeClock clock_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<Engine> engine_;
  HandlerContext context_;
  std::unique_ptr<RequestHandler> handler_;
};

TEST_F(RequestHandlerTest, HelloIsRequiredFirst) {
  for (const v1::Request& r :
       {Lookup(5, 0, {Key(1)}), Reserve(6, 0, {Key(1)}, {4096}), Pin(7, 0, {Key(1)}), Release(8, {1}), Stats(9)}) {
    RequestHandler::Outcome outcome;
    v1::Response response = Send(*handler_, r, &outcome);
    EXPECT_EQ(Code(response), StatusCode::kFailedPrecondition) << r.ShortDebugString();
    EXPECT_NE(response.status().message().find("Hello"), std::string::npos);
    EXPECT_EQ(response.body_case(), v1::Response::BODY_NOT_SET);
    EXPECT_FALSE(outcome.close_after);
    EXPECT_FALSE(outcome.attach_arena_fd);
  }
  EXPECT_FALSE(handler_->hello_done());
  EXPECT_EQ(host_->used_bytes(), 0u);  // nothing reached the engine
}

// ReserveRequest.parent names one key, and only for a chain.
TEST_F(RequestHandlerTest, AReserveParentIsOneKeyOfAChain) {
  HelloOk(*handler_);
  v1::Request no_chain = Reserve(2, 0, {Key(1)}, {4096});
  no_chain.mutable_reserve()->add_parent(7);
  no_chain.mutable_reserve()->add_parent(8);
  v1::Response r = Send(*handler_, no_chain);
  EXPECT_EQ(Code(r), StatusCode::kInvalidArgument) << r.status().message();
  EXPECT_NE(r.status().message().find("parent"), std::string::npos);
  v1::Request odd = WithId(3, wire::MakeReserve(0, std::vector<BlockKey>{Key(1)}, std::vector<uint64_t>{4096}, true));
  odd.mutable_reserve()->add_parent(7);
  EXPECT_EQ(Code(Send(*handler_, odd)), StatusCode::kInvalidArgument);
  v1::Request good =
      WithId(4, wire::MakeReserve(0, std::vector<BlockKey>{Key(1)}, std::vector<uint64_t>{4096}, true, Key(9)));
  r = Send(*handler_, good);
  ASSERT_EQ(Code(r), StatusCode::kOk) << r.status().message();
  EXPECT_EQ(r.reserve().slots_size(), 1);
}

TEST_F(RequestHandlerTest, VersionMismatchCloses) {
  // 1: a client of block keys v1, which must not share a daemon with v2 keys.
  static_assert(wire::kProtocolVersion == 2);
  for (uint32_t version : {0u, 1u, wire::kProtocolVersion + 1}) {
    RequestHandler handler(context_, 2);
    RequestHandler::Outcome outcome;
    v1::Response r = Send(handler, HelloRequest({TestNamespace()}, version), &outcome);
    EXPECT_EQ(Code(r), StatusCode::kVersionMismatch);
    EXPECT_TRUE(outcome.close_after);
    EXPECT_FALSE(outcome.attach_arena_fd);
    EXPECT_FALSE(handler.hello_done());
  }
}

TEST_F(RequestHandlerTest, BadDescriptorNamesItsIndexAndCloses) {
  NamespaceDescriptor bad = TestNamespace();
  bad.layer_count = 0;
  RequestHandler::Outcome outcome;
  v1::Response r = Send(*handler_, HelloRequest({TestNamespace(), TestNamespace("rev-2"), bad}), &outcome);
  EXPECT_EQ(Code(r), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("namespace 2"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("layer_count"), std::string::npos) << r.status().message();
  EXPECT_TRUE(outcome.close_after);
  EXPECT_FALSE(outcome.attach_arena_fd);
  EXPECT_FALSE(handler_->hello_done());
}

TEST_F(RequestHandlerTest, BadKeyV2FieldIsRefused) {
  struct Case {
    std::string field;
    void (*mutate)(NamespaceDescriptor&);
  };
  const std::vector<Case> cases = {
      {"pp_size", [](NamespaceDescriptor& ns) { ns.pp_size = 0; }},
      {"pp_rank",
       [](NamespaceDescriptor& ns) {
         ns.pp_rank = 2;
         ns.pp_size = 2;
       }},
      {"kv_format_version", [](NamespaceDescriptor& ns) { ns.kv_format_version = 0; }},
      {"object_kind", [](NamespaceDescriptor& ns) { ns.object_kind = "KV"; }},
  };
  for (const Case& c : cases) {
    NamespaceDescriptor bad = TestNamespace();
    c.mutate(bad);
    RequestHandler handler(context_, 2);
    RequestHandler::Outcome outcome;
    v1::Response r = Send(handler, HelloRequest({bad}), &outcome);
    EXPECT_EQ(Code(r), StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(r.status().message().find(c.field), std::string::npos) << r.status().message();
    EXPECT_TRUE(outcome.close_after);
  }
}

TEST_F(RequestHandlerTest, KeyV2FieldsGiveTheirOwnNamespaces) {
  NamespaceDescriptor pp = TestNamespace();
  pp.pp_size = 2;
  pp.pp_rank = 1;
  NamespaceDescriptor format = TestNamespace();
  format.kv_format_version = 2;
  NamespaceDescriptor state = TestNamespace();
  state.object_kind = "recurrent_state";
  const std::vector<NamespaceDescriptor> namespaces = {TestNamespace(), pp, format, state};
  v1::Response r = Send(*handler_, HelloRequest(namespaces));
  ASSERT_EQ(Code(r), StatusCode::kOk) << r.status().message();
  ASSERT_EQ(r.hello().namespace_fingerprints_size(), 4);
  std::set<BlockKey> distinct;
  for (int i = 0; i < 4; ++i) {
    const BlockKey fp = wire::FromProto(r.hello().namespace_fingerprints(i));
    EXPECT_EQ(fp, FingerprintNamespace(namespaces[i])) << i;
    distinct.insert(fp);
  }
  EXPECT_EQ(distinct.size(), 4u);
}

TEST_F(RequestHandlerTest, HelloReturnsFingerprintsAndArena) {
  const std::vector<NamespaceDescriptor> namespaces = {TestNamespace("rev-1"), TestNamespace("rev-2")};
  RequestHandler::Outcome outcome;
  v1::Response r = Send(*handler_, HelloRequest(namespaces), &outcome);
  ASSERT_EQ(Code(r), StatusCode::kOk) << r.status().message();
  ASSERT_TRUE(r.has_hello());
  EXPECT_TRUE(outcome.attach_arena_fd);
  EXPECT_FALSE(outcome.close_after);
  EXPECT_TRUE(handler_->hello_done());
  const v1::HelloResponse& h = r.hello();
  EXPECT_EQ(h.protocol_version(), wire::kProtocolVersion);
  ASSERT_EQ(h.namespace_fingerprints_size(), 2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(wire::FromProto(h.namespace_fingerprints(i)), FingerprintNamespace(namespaces[i])) << i;
  }
  EXPECT_NE(wire::FromProto(h.namespace_fingerprints(0)), wire::FromProto(h.namespace_fingerprints(1)));
  EXPECT_EQ(h.arena_bytes(), kArenaBytes);
  EXPECT_EQ(h.max_frame_bytes(), kMaxFrameBytes);
  EXPECT_FALSE(h.daemon_version().empty());

  // A second Hello is out of order; the first registration stands.
  v1::Response again = Send(*handler_, HelloRequest({TestNamespace("rev-3")}), &outcome);
  EXPECT_EQ(Code(again), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(outcome.attach_arena_fd);
  EXPECT_EQ(Code(Send(*handler_, Lookup(3, 1, {Key(1)}))), StatusCode::kOk);
}

TEST_F(RequestHandlerTest, HelloWithNoNamespacesIsAccepted) {
  v1::Response r = Send(*handler_, HelloRequest({}));
  EXPECT_EQ(Code(r), StatusCode::kOk);
  EXPECT_EQ(r.hello().namespace_fingerprints_size(), 0);
  // But no namespace index is valid then.
  EXPECT_EQ(Code(Send(*handler_, Lookup(2, 0, {Key(1)}))), StatusCode::kInvalidArgument);
}

TEST_F(RequestHandlerTest, AtMost64Namespaces) {
  std::vector<NamespaceDescriptor> namespaces;
  for (int i = 0; i < 65; ++i) namespaces.push_back(TestNamespace("rev-" + std::to_string(i)));
  RequestHandler::Outcome outcome;
  v1::Response r = Send(*handler_, HelloRequest(namespaces), &outcome);
  EXPECT_EQ(Code(r), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("64"), std::string::npos) << r.status().message();
  EXPECT_TRUE(outcome.close_after);
  EXPECT_FALSE(handler_->hello_done());

  namespaces.pop_back();
  RequestHandler handler(context_, 2);
  v1::Response ok = Send(handler, HelloRequest(namespaces), &outcome);
  EXPECT_EQ(Code(ok), StatusCode::kOk) << ok.status().message();
  EXPECT_EQ(ok.hello().namespace_fingerprints_size(), 64);
  EXPECT_EQ(Code(Send(handler, Lookup(2, 63, {Key(1)}))), StatusCode::kOk);
  EXPECT_EQ(Code(Send(handler, Lookup(3, 64, {Key(1)}))), StatusCode::kInvalidArgument);
}

TEST_F(RequestHandlerTest, EmptyBodyIsUnimplemented) {
  v1::Request empty;
  empty.set_id(42);
  RequestHandler::Outcome outcome;
  v1::Response before = Send(*handler_, empty, &outcome);
  EXPECT_EQ(Code(before), StatusCode::kUnimplemented);
  EXPECT_FALSE(outcome.close_after);
  HelloOk(*handler_);
  v1::Response after = Send(*handler_, empty, &outcome);
  EXPECT_EQ(Code(after), StatusCode::kUnimplemented);
  EXPECT_FALSE(outcome.close_after);
}

TEST_F(RequestHandlerTest, PutGetRoundTrip) {
  HelloOk(*handler_);
  const std::vector<BlockKey> keys = {Key(1), Key(2)};
  const std::vector<uint64_t> sizes = {5000, 4096};

  v1::Response reserve = Send(*handler_, Reserve(10, 0, keys, sizes));
  ASSERT_EQ(Code(reserve), StatusCode::kOk) << reserve.status().message();
  ASSERT_EQ(reserve.reserve().slots_size(), 2);
  for (int i = 0; i < 2; ++i) {
    const v1::Slot& slot = reserve.reserve().slots(i);
    ASSERT_EQ(slot.status().code(), 0) << slot.status().message();
    EXPECT_EQ(slot.length(), sizes[i]);
    FillBlockBytes(keys[i], 9, ::kvtier::testing::SlotBytes(*host_, slot.offset(), slot.length()));
  }
  // Reserving again reports per-key AlreadyExists inside an ok response.
  v1::Response again = Send(*handler_, Reserve(11, 0, {Key(1)}, {5000}));
  ASSERT_EQ(Code(again), StatusCode::kOk);
  EXPECT_EQ(static_cast<StatusCode>(again.reserve().slots(0).status().code()), StatusCode::kAlreadyExists);

  v1::Response commit = Send(*handler_, Commit(12, 0, keys, sizes));
  ASSERT_EQ(Code(commit), StatusCode::kOk);
  ASSERT_EQ(commit.commit().statuses_size(), 2);
  for (const auto& s : commit.commit().statuses()) EXPECT_EQ(s.code(), 0) << s.message();

  v1::Response lookup = Send(*handler_, Lookup(13, 0, {Key(1), Key(2), Key(3)}));
  ASSERT_EQ(Code(lookup), StatusCode::kOk);
  EXPECT_EQ(lookup.lookup().prefix_blocks(), 2u);
  ASSERT_EQ(lookup.lookup().tiers_size(), 2);
  EXPECT_EQ(lookup.lookup().tiers(0), static_cast<uint32_t>(Tier::kHost));
  // The other namespace does not see them.
  EXPECT_EQ(Send(*handler_, Lookup(14, 1, keys)).lookup().prefix_blocks(), 0u);

  v1::Response pin = Send(*handler_, Pin(15, 0, {Key(1), Key(3)}));
  ASSERT_EQ(Code(pin), StatusCode::kOk);
  ASSERT_EQ(pin.pin().blocks_size(), 2);
  const v1::PinnedBlock& b = pin.pin().blocks(0);
  ASSERT_EQ(b.status().code(), 0);
  EXPECT_EQ(b.offset(), reserve.reserve().slots(0).offset());
  EXPECT_EQ(b.length(), 5000u);
  EXPECT_NE(b.lease(), 0u);
  auto bytes = ::kvtier::testing::SlotBytes(*host_, b.offset(), b.length());
  EXPECT_TRUE(CheckBlockBytes(Key(1), 9, bytes));
  EXPECT_EQ(b.checksum(), BlockChecksum(bytes));
  EXPECT_EQ(static_cast<StatusCode>(pin.pin().blocks(1).status().code()), StatusCode::kNotFound);

  v1::Response release = Send(*handler_, Release(16, {b.lease(), b.lease()}));
  ASSERT_EQ(Code(release), StatusCode::kOk);
  ASSERT_EQ(release.release().statuses_size(), 2);
  EXPECT_EQ(release.release().statuses(0).code(), 0);
  EXPECT_EQ(static_cast<StatusCode>(release.release().statuses(1).code()), StatusCode::kNotFound);

  v1::Response erase = Send(*handler_, Erase(17, 0, {Key(1), Key(3)}));
  ASSERT_EQ(Code(erase), StatusCode::kOk);
  EXPECT_EQ(erase.erase().erased(), 1u);
  EXPECT_EQ(Send(*handler_, Lookup(18, 0, keys)).lookup().prefix_blocks(), 0u);
}

TEST_F(RequestHandlerTest, AbortRoundTrip) {
  HelloOk(*handler_);
  ASSERT_EQ(Code(Send(*handler_, Reserve(2, 0, {Key(1), Key(2)}, {4096, 4096}))), StatusCode::kOk);
  EXPECT_EQ(host_->used_bytes(), 2 * 4096u);
  v1::Response abort = Send(*handler_, Abort(3, 0, {Key(1), Key(2), Key(3)}));
  ASSERT_EQ(Code(abort), StatusCode::kOk);
  EXPECT_EQ(abort.abort().aborted(), 2u);
  EXPECT_EQ(host_->used_bytes(), 0u);
  v1::Response commit = Send(*handler_, Commit(4, 0, {Key(1)}, {4096}));
  EXPECT_EQ(static_cast<StatusCode>(commit.commit().statuses(0).code()), StatusCode::kFailedPrecondition);
}

// Found by request_handler_fuzz: a commit in another namespace than the
// reservation's is refused (FailedPrecondition) and leaves the reservation
// in place, so the connection must keep counting it and let it expire;
// forgetting it left the engine holding it until the connection closed.
TEST_F(RequestHandlerTest, AReservationCommittedInAnotherNamespaceStillExpires) {
  HelloOk(*handler_);
  ASSERT_EQ(Code(Send(*handler_, Reserve(2, 0, {Key(1)}, {4096}))), StatusCode::kOk);
  v1::Response commit = Send(*handler_, Commit(3, 1, {Key(1)}, {4096}));
  ASSERT_EQ(static_cast<StatusCode>(commit.commit().statuses(0).code()), StatusCode::kFailedPrecondition);
  EXPECT_EQ(handler_->usage().reservations(), 1u);
  const auto later = std::chrono::steady_clock::now() + context_.limits.reservation_timeout + std::chrono::hours(1);
  EXPECT_EQ(handler_->AbortExpiredReservations(later), 1u);
  EXPECT_EQ(handler_->usage().reservations(), 0u);
  EXPECT_EQ(host_->used_bytes(), 0u) << "the engine still holds the reservation";
}

TEST_F(RequestHandlerTest, MismatchedKeysAndSizesAreInvalidArgument) {
  HelloOk(*handler_);
  EXPECT_EQ(Code(Send(*handler_, Reserve(2, 0, {Key(1), Key(2)}, {4096}))), StatusCode::kInvalidArgument);
  EXPECT_EQ(host_->used_bytes(), 0u);
  EXPECT_EQ(Code(Send(*handler_, Commit(3, 0, {Key(1)}, {}))), StatusCode::kInvalidArgument);
}

TEST_F(RequestHandlerTest, UnregisteredNamespaceIsInvalidArgument) {
  HelloOk(*handler_);  // namespaces 0 and 1
  for (const v1::Request& r : {Lookup(2, 2, {Key(1)}), Reserve(3, 2, {Key(1)}, {4096}), Commit(4, 7, {Key(1)}, {4096}),
                               Pin(5, 2, {Key(1)}), Erase(6, 1000, {Key(1)})}) {
    v1::Response response = Send(*handler_, r);
    EXPECT_EQ(Code(response), StatusCode::kInvalidArgument) << r.ShortDebugString();
    EXPECT_NE(response.status().message().find("not registered"), std::string::npos) << response.status().message();
  }
  EXPECT_EQ(host_->used_bytes(), 0u);
}

// AbortRequest carries a namespace like every other keyed request; an index
// that was never registered must be refused the same way.
TEST_F(RequestHandlerTest, AbortWithUnregisteredNamespaceIsInvalidArgument) {
  HelloOk(*handler_);
  ASSERT_EQ(Code(Send(*handler_, Reserve(2, 0, {Key(1)}, {4096}))), StatusCode::kOk);
  v1::Response response = Send(*handler_, Abort(3, 5, {Key(1)}));
  EXPECT_EQ(Code(response), StatusCode::kInvalidArgument);
  EXPECT_EQ(host_->used_bytes(), 4096u) << "the reservation must survive a refused Abort";
}

TEST_F(RequestHandlerTest, LeasesBelongToTheirConnection) {
  HelloOk(*handler_);
  RequestHandler other(context_, 2);
  HelloOk(other);
  ASSERT_EQ(Code(Send(*handler_, Reserve(2, 0, {Key(1)}, {4096}))), StatusCode::kOk);
  // The other connection can neither commit nor abort this reservation.
  EXPECT_EQ(static_cast<StatusCode>(Send(other, Commit(3, 0, {Key(1)}, {4096})).commit().statuses(0).code()),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(Send(other, Abort(4, 0, {Key(1)})).abort().aborted(), 0u);
  ASSERT_EQ(Send(*handler_, Commit(5, 0, {Key(1)}, {4096})).commit().statuses(0).code(), 0);
  v1::Response pin = Send(*handler_, Pin(6, 0, {Key(1)}));
  const uint64_t lease = pin.pin().blocks(0).lease();
  v1::Response foreign = Send(other, Release(7, {lease}));
  EXPECT_EQ(static_cast<StatusCode>(foreign.release().statuses(0).code()), StatusCode::kPermissionDenied);
  EXPECT_EQ(Send(*handler_, Release(8, {lease})).release().statuses(0).code(), 0);
}

// A Release with no_reply is carried out like any other but asks the session
// to send nothing; every other request, a plain Release included, is answered.
TEST_F(RequestHandlerTest, ReleaseWithNoReplyIsHandledAndNotAnswered) {
  HelloOk(*handler_);
  std::vector<std::byte> block(4096);
  FillBlockBytes(Key(1), 3, block);
  v1::Response reserve = Send(*handler_, Reserve(2, 0, {Key(1)}, {block.size()}));
  ASSERT_EQ(reserve.reserve().slots(0).status().code(), 0);
  auto slot = ::kvtier::testing::SlotBytes(*host_, reserve.reserve().slots(0).offset(), block.size());
  std::copy(block.begin(), block.end(), slot.begin());
  ASSERT_EQ(Send(*handler_, Commit(3, 0, {Key(1)}, {block.size()})).commit().statuses(0).code(), 0);
  const uint64_t first = Send(*handler_, Pin(4, 0, {Key(1)})).pin().blocks(0).lease();
  const uint64_t second = Send(*handler_, Pin(5, 0, {Key(1)})).pin().blocks(0).lease();

  RequestHandler::Outcome outcome;
  Send(*handler_, Release(6, {first}), &outcome);
  EXPECT_FALSE(outcome.no_response) << "a plain Release is answered";
  Send(*handler_, WithId(7, wire::MakeReleaseNoReply(std::vector<uint64_t>{second, 999})), &outcome);
  EXPECT_TRUE(outcome.no_response);
  EXPECT_FALSE(outcome.close_after);
  Send(*handler_, Stats(8), &outcome);
  EXPECT_FALSE(outcome.no_response);

  CounterCollector counters;
  engine_->VisitCounters(counters);
  std::map<std::string, int64_t> c(counters.counters().begin(), counters.counters().end());
  EXPECT_EQ(c["engine.leases"], 0) << "the unanswered release was carried out";
  EXPECT_EQ(c["engine.pinned_blocks"], 0);
  EXPECT_EQ(c["engine.release_failures"], 1) << "the unknown lease 999 counts as a failure";
}

// A UsageReport is never answered; its uses count for blocks of registered
// namespaces, a group naming an unregistered one is dropped and counted, and
// the local lookup counts land in the lookup counters.
TEST_F(RequestHandlerTest, UsageReportIsRecordedAndNotAnswered) {
  HelloOk(*handler_);
  std::vector<std::byte> block(4096);
  FillBlockBytes(Key(1), 3, block);
  v1::Response reserve = Send(*handler_, Reserve(2, 0, {Key(1)}, {block.size()}));
  ASSERT_EQ(reserve.reserve().slots(0).status().code(), 0);
  ASSERT_EQ(Send(*handler_, Commit(3, 0, {Key(1)}, {block.size()})).commit().statuses(0).code(), 0);

  const std::pair<uint32_t, BlockKey> uses[] = {{0, Key(1)}, {0, Key(2)}, {7, Key(1)}};
  RequestHandler::Outcome outcome;
  Send(*handler_, WithId(4, wire::MakeUsageReport(uses, 2, 128, 64)), &outcome);
  EXPECT_TRUE(outcome.no_response);
  EXPECT_FALSE(outcome.close_after);

  CounterCollector counters;
  engine_->VisitCounters(counters);
  std::map<std::string, int64_t> c(counters.counters().begin(), counters.counters().end());
  EXPECT_EQ(c["engine.directory_uses"], 1) << "Key(1) is cached";
  EXPECT_EQ(c["engine.directory_stale_uses"], 1) << "Key(2) is not";
  EXPECT_EQ(c["engine.bad_usage_reports"], 1) << "namespace 7 is not registered";
  EXPECT_EQ(c["engine.local_lookups"], 2);
  EXPECT_EQ(c["engine.lookup_keys"], 128);
  EXPECT_EQ(c["engine.lookup_hit_blocks"], 64);
}

std::map<std::string, int64_t> StatsMap(const v1::Response& r) {
  std::map<std::string, int64_t> out;
  for (const auto& c : r.stats().counters()) out[c.name()] = c.value();
  return out;
}

TEST_F(RequestHandlerTest, StatsReportsEngineCounters) {
  HelloOk(*handler_);
  ASSERT_EQ(Code(Send(*handler_, Reserve(2, 0, {Key(1)}, {4096}))), StatusCode::kOk);
  ASSERT_EQ(Send(*handler_, Commit(3, 0, {Key(1)}, {4096})).commit().statuses(0).code(), 0);
  Send(*handler_, Lookup(4, 0, {Key(1)}));
  v1::Response r = Send(*handler_, Stats(5));
  ASSERT_EQ(Code(r), StatusCode::kOk);
  ASSERT_TRUE(r.has_stats());
  auto stats = StatsMap(r);
  EXPECT_EQ(stats["engine.blocks"], 1);
  EXPECT_EQ(stats["engine.lookups"], 1);
  EXPECT_EQ(stats["engine.commits"], 1);
  EXPECT_EQ(stats.count("host.alloc.used_bytes"), 1u);
  EXPECT_EQ(stats["tier.written_bytes{tier=\"host\"}"], 4096) << "the tier families the engine reports";
  EXPECT_EQ(stats["tier.hits{tier=\"host\"}"], 1);
  for (const auto& [name, value] : stats) {
    EXPECT_TRUE(name.rfind("engine.", 0) == 0 || name.rfind("host.", 0) == 0 || name.rfind("tier.", 0) == 0 ||
                name.rfind("namespace.", 0) == 0)
        << name;
  }
}

TEST_F(RequestHandlerTest, StatsIncludesServerCountersWhenHooked) {
  int calls = 0;
  context_.visit_server_counters = [&calls](CounterVisitor& v) {
    ++calls;
    v.Visit("server.connections", 3);
    v.Visit("server.frames_in", 17);
  };
  RequestHandler handler(context_, 5);
  HelloOk(handler);
  v1::Response r = Send(handler, Stats(2));
  ASSERT_EQ(Code(r), StatusCode::kOk);
  EXPECT_EQ(calls, 1);
  auto stats = StatsMap(r);
  EXPECT_EQ(stats["server.connections"], 3);
  EXPECT_EQ(stats["server.frames_in"], 17);
  EXPECT_EQ(stats.count("engine.blocks"), 1u);
}

// The counters of `engine` whose name starts with `prefix`.
std::map<std::string, int64_t> CountersOf(const Engine& engine, const std::string& prefix) {
  CounterCollector collector;
  engine.VisitCounters(collector);
  std::map<std::string, int64_t> out;
  for (const auto& [name, value] : collector.counters()) {
    if (name.starts_with(prefix)) out[name] = value;
  }
  return out;
}

TEST_F(RequestHandlerTest, ALookupInStepsAnswersExactlyAsOneInOneGo) {
  HelloOk(*handler_);
  // Keys 1..40 cached, then key 17 erased: a prefix of 16, and cached keys
  // after the miss that must not count.
  std::vector<BlockKey> cached;
  for (uint64_t i = 1; i <= 40; ++i) cached.push_back(Key(i));
  const std::vector<uint64_t> sizes(cached.size(), 4096);
  ASSERT_EQ(Code(Send(*handler_, Reserve(2, 0, cached, sizes))), StatusCode::kOk);
  ASSERT_EQ(Code(Send(*handler_, Commit(3, 0, cached, sizes))), StatusCode::kOk);
  std::vector<BlockKey> all_hit(cached.begin(), cached.end());
  std::vector<BlockKey> with_tail = all_hit;
  for (uint64_t i = 100; i < 110; ++i) with_tail.push_back(Key(i));  // never cached
  uint64_t id = 10;
  for (const bool erased : {false, true}) {
    if (erased) {
      ASSERT_EQ(Send(*handler_, Erase(4, 0, {Key(17)})).erase().erased(), 1u);
    }
    for (const auto* keys : {&all_hit, &with_tail}) {
      const v1::Request request = Lookup(++id, 0, *keys);
      const auto before = CountersOf(*engine_, "engine.lookup");
      const v1::Response whole = Send(*handler_, request);
      ASSERT_EQ(Code(whole), StatusCode::kOk);
      EXPECT_EQ(whole.lookup().prefix_blocks(), erased ? 16u : 40u);
      const auto after_whole = CountersOf(*engine_, "engine.lookup");
      for (const size_t chunk : {size_t{1}, size_t{2}, size_t{5}, size_t{16}, size_t{17}, size_t{40}, size_t{1000}}) {
        const auto before_steps = CountersOf(*engine_, "engine.lookup");
        RequestHandler::LookupSteps steps = handler_->BeginLookup(request);
        v1::Response stepped;
        size_t step_count = 1;
        while (!handler_->StepLookup(steps, chunk, stepped)) ++step_count;
        EXPECT_EQ(stepped.SerializeAsString(), whole.SerializeAsString())
            << "chunk " << chunk << ": " << stepped.ShortDebugString() << " vs " << whole.ShortDebugString();
        const size_t placed = std::min(keys->size(), size_t{erased ? 17u : 41u});  // up to the first miss
        EXPECT_EQ(step_count, std::max<size_t>(1, (placed + chunk - 1) / chunk)) << "chunk " << chunk;
        // Counted as one lookup of all its keys, as the whole one was.
        const auto after_steps = CountersOf(*engine_, "engine.lookup");
        for (const auto& [name, value] : after_steps) {
          EXPECT_EQ(value - before_steps.at(name), after_whole.at(name) - before.at(name))
              << name << " chunk " << chunk;
        }
      }
    }
  }
}

TEST_F(RequestHandlerTest, OnlyATenantsBigLookupAfterHelloTakesSteps) {
  std::vector<BlockKey> many;
  for (uint64_t i = 0; i < 9; ++i) many.push_back(Key(i));
  EXPECT_FALSE(handler_->LookupTakesSteps(Lookup(2, 0, many), 8)) << "before Hello: Handle refuses it";
  HelloOk(*handler_);
  EXPECT_TRUE(handler_->LookupTakesSteps(Lookup(3, 0, many), 8));
  EXPECT_FALSE(handler_->LookupTakesSteps(Lookup(4, 0, many), 9));
  EXPECT_FALSE(handler_->LookupTakesSteps(Pin(5, 0, many), 8));
  // A bad namespace is answered at the first step, as Handle answers it.
  const v1::Request bad = Lookup(6, 7, many);
  RequestHandler::LookupSteps steps = handler_->BeginLookup(bad);
  v1::Response stepped;
  EXPECT_TRUE(handler_->StepLookup(steps, 8, stepped));
  EXPECT_EQ(stepped.SerializeAsString(), Send(*handler_, bad).SerializeAsString());
}

}  // namespace
}  // namespace kvtier
