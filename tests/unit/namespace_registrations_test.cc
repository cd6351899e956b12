// Namespace registrations a client's Hello makes (daemon/server/request_handler.cc,
// daemon/engine/engine_namespaces.cc): over-long or refused descriptors leave
// nothing behind, a registration no connection uses and no block holds is
// forgotten, listings are paged, and metric labels of client strings stay
// valid UTF-8.
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/utf8.h"
#include "daemon/engine/engine.h"
#include "daemon/server/metrics_format.h"
#include "daemon/server/request_handler.h"
#include "proto/wire.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/test_daemon.h"

namespace kvtier {
namespace {

using ::kvtier::testing::TestNamespace;

constexpr uint64_t kArenaBytes = 64 * 4096;
constexpr uint64_t kBlockBytes = 64 << 10;  // TestNamespace's

class NamespaceRegistrationsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    host_ = ::kvtier::testing::OpenTestHostTier(4 * kBlockBytes);
    ASSERT_NE(host_, nullptr);
    auto engine = Engine::Create(EngineOptions{2, EvictionPolicyId::kLru}, *host_, clock_);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(*engine);
    context_.engine = engine_.get();
    context_.arena_bytes = host_->capacity_bytes();
    context_.max_frame_bytes = 1 << 20;
  }

  static v1::Request Hello(const std::vector<NamespaceDescriptor>& namespaces) {
    v1::Request r;
    r.set_id(1);
    r.mutable_hello()->set_protocol_version(wire::kProtocolVersion);
    r.mutable_hello()->set_client_name("registrations-test");
    for (const auto& d : namespaces) wire::ToProto(d, r.mutable_hello()->add_namespaces());
    return r;
  }
  static v1::Response Send(RequestHandler& handler, const v1::Request& request, bool* closes = nullptr) {
    v1::Response response;
    const RequestHandler::Outcome o = handler.Handle(request, response);
    if (closes != nullptr) *closes = o.close_after;
    return response;
  }
  static StatusCode Code(const v1::Response& r) { return static_cast<StatusCode>(r.status().code()); }
  // Every namespace of a listing, fetched `page_size` at a time.
  std::vector<v1::NamespaceUse> ListAll(RequestHandler& handler, uint32_t page_size, int* pages) {
    std::vector<v1::NamespaceUse> out;
    std::string token;
    *pages = 0;
    do {
      v1::Request r = wire::MakeListNamespaces(token, page_size);
      r.set_id(2);
      v1::Response page = Send(handler, r);
      EXPECT_EQ(Code(page), StatusCode::kOk) << page.status().message();
      EXPECT_LE(page.list_namespaces().namespaces_size(), static_cast<int>(page_size));
      for (const auto& u : page.list_namespaces().namespaces()) out.push_back(u);
      token = page.list_namespaces().next_page_token();
      ++*pages;
    } while (!token.empty() && *pages < 100);
    return out;
  }

  ::kvtier::testing::FakeClock clock_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<Engine> engine_;
  HandlerContext context_;
};

TEST_F(NamespaceRegistrationsTest, AnOverLongStringIsRefusedNamingItsFieldAndLimit) {
  NamespaceDescriptor d = TestNamespace();
  d.model_revision = std::string(kMaxDescriptorRevisionBytes + 1, 'r');
  RequestHandler refused(context_, 1);
  bool closes = false;
  v1::Response r = Send(refused, Hello({d}), &closes);
  EXPECT_EQ(Code(r), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("model_revision"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(std::to_string(kMaxDescriptorRevisionBytes)), std::string::npos);
  EXPECT_TRUE(closes);
  EXPECT_EQ(engine_->RegisteredNamespaces(), 0u);
  RequestHandler next(context_, 2);  // and the daemon keeps serving
  EXPECT_EQ(Code(Send(next, Hello({TestNamespace()}))), StatusCode::kOk);
  d.model_revision = "rev-\xff";
  EXPECT_EQ(Code(Send(*std::make_unique<RequestHandler>(context_, 3), Hello({d}))), StatusCode::kInvalidArgument);
}

TEST_F(NamespaceRegistrationsTest, RegistrationsTheTenantsModelsRefuseLeaveNothing) {
  context_.models = {"allowed/model"};
  for (int i = 0; i < 50; ++i) {
    RequestHandler handler(context_, static_cast<ConnectionId>(i + 1));
    std::vector<NamespaceDescriptor> many;
    for (int j = 0; j < 8; ++j)
      many.push_back(::kvtier::testing::ModelNamespace("allowed/model", "r" + std::to_string(j)));
    many.push_back(::kvtier::testing::ModelNamespace(std::string(400, 'm'), "rev"));
    EXPECT_EQ(Code(Send(handler, Hello(many))), StatusCode::kPermissionDenied);
    engine_->CloseConnection(static_cast<ConnectionId>(i + 1));
  }
  EXPECT_EQ(engine_->RegisteredNamespaces(), 0u);
  EXPECT_TRUE(engine_->NamespaceUses().empty());
}

TEST_F(NamespaceRegistrationsTest, AnUnusedRegistrationIsForgottenUnlessItHasBlocks) {
  const NamespaceDescriptor with = TestNamespace("with-blocks"), without = TestNamespace("without-blocks");
  RequestHandler handler(context_, 1);
  ASSERT_EQ(Code(Send(handler, Hello({with, without}))), StatusCode::kOk);
  const NamespaceFingerprint fw = FingerprintNamespace(with), fwo = FingerprintNamespace(without);
  ASSERT_TRUE(::kvtier::testing::PutFilledBlock(*engine_, *host_, 1, fw, BlockKey{7, 7}, kBlockBytes).ok());
  EXPECT_EQ(engine_->RegisteredNamespaces(), 2u);
  engine_->CloseConnection(1);
  EXPECT_EQ(engine_->ForgetUnusedNamespaces(), 1u);
  const auto uses = engine_->NamespaceUses();
  ASSERT_EQ(uses.size(), 1u);  // the one with blocks stays, its descriptor too
  EXPECT_EQ(uses[0].ns, fw);
  EXPECT_TRUE(uses[0].descriptor.has_value());
  engine_->DropNamespace(fw);  // its last block gone: forgotten at the next sweep
  EXPECT_EQ(engine_->ForgetUnusedNamespaces(), 1u);
  EXPECT_EQ(engine_->RegisteredNamespaces(), 0u);
  (void)fwo;
}

TEST_F(NamespaceRegistrationsTest, ANamespaceAnotherConnectionStillUsesStays) {
  RequestHandler a(context_, 1), b(context_, 2);
  ASSERT_EQ(Code(Send(a, Hello({TestNamespace()}))), StatusCode::kOk);
  ASSERT_EQ(Code(Send(b, Hello({TestNamespace()}))), StatusCode::kOk);
  engine_->CloseConnection(1);
  EXPECT_EQ(engine_->ForgetUnusedNamespaces(), 0u);
  EXPECT_EQ(engine_->RegisteredNamespaces(), 1u);
  engine_->CloseConnection(2);
  EXPECT_EQ(engine_->ForgetUnusedNamespaces(), 1u);
}

TEST_F(NamespaceRegistrationsTest, AListingOfMoreThanAPageIsCompleteThroughPaging) {
  std::vector<std::unique_ptr<RequestHandler>> connections;
  std::set<std::string> registered;
  for (int c = 0; c < 5; ++c) {  // 5 * 64 = 320 namespaces: more than one 256 page
    connections.push_back(std::make_unique<RequestHandler>(context_, static_cast<ConnectionId>(c + 1)));
    std::vector<NamespaceDescriptor> many;
    for (int j = 0; j < 64; ++j) many.push_back(TestNamespace("rev-" + std::to_string(c) + "-" + std::to_string(j)));
    v1::Response r = Send(*connections.back(), Hello(many));
    ASSERT_EQ(Code(r), StatusCode::kOk) << r.status().message();
    for (const auto& k : r.hello().namespace_fingerprints()) registered.insert(wire::FromProto(k).ToHex());
  }
  ASSERT_EQ(registered.size(), 320u);
  for (uint32_t page_size : {0u, 7u, 256u}) {
    int pages = 0;
    const auto all = ListAll(*connections[0], page_size == 0 ? 256 : page_size, &pages);
    std::set<std::string> listed;
    for (const auto& u : all) listed.insert(wire::FromProto(u.fingerprint()).ToHex());
    EXPECT_EQ(all.size(), 320u) << "page size " << page_size;  // none twice
    EXPECT_EQ(listed, registered) << "page size " << page_size;
    EXPECT_GT(pages, 1);
  }
  v1::Request too_big = wire::MakeListNamespaces("", RequestHandler::kMaxListPageNamespaces + 1);
  EXPECT_EQ(Code(Send(*connections[0], too_big)), StatusCode::kInvalidArgument);
  EXPECT_EQ(Code(Send(*connections[0], wire::MakeListNamespaces("0:nothex"))), StatusCode::kInvalidArgument);
}

TEST_F(NamespaceRegistrationsTest, A129ByteMultiByteModelIdGivesValidUtf8Metrics) {
  std::string model;
  for (int i = 0; i < 43; ++i) model += "\xe2\x82\xac";  // 129 bytes; byte 128 is inside a character
  const NamespaceDescriptor d = ::kvtier::testing::ModelNamespace(model, "rev\"\\\n");
  RequestHandler handler(context_, 1);
  v1::Response hello = Send(handler, Hello({d}));
  ASSERT_EQ(Code(hello), StatusCode::kOk) << hello.status().message();
  const NamespaceFingerprint ns = wire::FromProto(hello.hello().namespace_fingerprints(0));
  ASSERT_TRUE(::kvtier::testing::PutFilledBlock(*engine_, *host_, 1, ns, BlockKey{1, 1}, kBlockBytes).ok());
  PrometheusWriter writer;
  engine_->VisitNamespaceUse(writer);
  const std::string text = writer.Text();
  EXPECT_TRUE(IsValidUtf8(text));
  EXPECT_NE(text.find("model=\"" + model.substr(0, 126) + "\""), std::string::npos) << text;
  EXPECT_NE(text.find("revision=\"rev\\\"\\\\\\n\""), std::string::npos) << text;
  // The Stats path carries the same names in proto strings: they must parse.
  v1::Request stats = wire::MakeStats();
  stats.set_id(3);
  v1::Response response = Send(handler, stats);
  std::string bytes;
  ASSERT_TRUE(response.SerializeToString(&bytes));
  v1::Response parsed;
  EXPECT_TRUE(parsed.ParseFromString(bytes));
}

}  // namespace
}  // namespace kvtier
