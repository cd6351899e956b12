// Who sees which series of /metrics (daemon/server/metrics_scope.h,
// daemon/server/metrics_server.h): daemon-wide series by label, the bearer token
// check of a request head, and the token file (daemon/config/secret_file.h).
#include "daemon/server/metrics_scope.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <sys/stat.h>

#include "daemon/server/metrics_format.h"
#include "daemon/server/metrics_server.h"
#include "daemon/config/secret_file.h"
#include "tests/testing/test_daemon.h"

namespace kvtier {
namespace {

TEST(MetricsScopeTest, OnlySeriesWithDaemonLabelsAreDaemonWide) {
  EXPECT_TRUE(IsDaemonWideSeries("server.connections_open"));
  EXPECT_TRUE(IsDaemonWideSeries("tier.hits{tier=\"nvme\"}"));
  EXPECT_TRUE(IsDaemonWideSeries("tier.evictions{tier=\"host\",reason=\"capacity\"}"));
  EXPECT_TRUE(IsDaemonWideSeries("admission.refusals{tier=\"nvme\",class=\"first_sighting\"}"));
  EXPECT_TRUE(IsDaemonWideSeries("build_info{version=\"1.2\"}"));
  EXPECT_FALSE(IsDaemonWideSeries("engine.lookups{tenant=\"alpha\"}"));
  EXPECT_FALSE(IsDaemonWideSeries("tier.hits{tier=\"host\",tenant=\"alpha\"}"));
  EXPECT_FALSE(
      IsDaemonWideSeries("namespace.bytes{ns=\"0123\",model=\"m\",revision=\"r\",adapter=\"\",tier=\"host\"}"));
  EXPECT_FALSE(IsDaemonWideSeries("x{client=\"new label nobody reviewed\"}"));
}

TEST(MetricsScopeTest, AValueThatLooksLikeLabelsDoesNotHideOne) {
  // An escaped quote inside a value does not end it: the tenant label after
  // it is still seen.
  EXPECT_FALSE(IsDaemonWideSeries("x{tier=\"a\\\",tier=\\\"b\",tenant=\"t\"}"));
  EXPECT_TRUE(IsDaemonWideSeries("x{tier=\"a\\\",tenant=\\\"b\"}"));
}

TEST(MetricsScopeTest, LabelsThatDoNotParseAreNotDaemonWide) {
  EXPECT_FALSE(IsDaemonWideSeries("x{tier}"));
  EXPECT_FALSE(IsDaemonWideSeries("x{tier=nvme}"));
  EXPECT_FALSE(IsDaemonWideSeries("x{tier=\"nvme\""));
  EXPECT_FALSE(IsDaemonWideSeries("x{tier=\"nvme}"));
  EXPECT_FALSE(IsDaemonWideSeries("x{tier=\"nvme\"tenant=\"a\"}"));
  EXPECT_FALSE(IsDaemonWideSeries("x{"));
}

TEST(MetricsScopeTest, TheVisitorForwardsDaemonWideSeriesOfEveryKind) {
  PrometheusWriter writer;
  DaemonWideVisitor visitor(writer);
  visitor.Visit("engine.lookups", 3);
  visitor.Visit("engine.lookups{tenant=\"alpha\"}", 4);
  visitor.VisitGauge("tier.used_bytes{tier=\"host\"}", 5);
  visitor.VisitGauge("namespace.bytes{ns=\"ab\",model=\"secret/model\",tier=\"host\"}", 6);
  LatencyHistogram h;
  visitor.VisitHistogram("tier.read_seconds{tier=\"nvme\"}", h.Snapshot());
  visitor.VisitHistogram("tier.read_seconds{tier=\"nvme\",tenant=\"alpha\"}", h.Snapshot());
  const std::string text = writer.Text();
  EXPECT_NE(text.find("kvtier_engine_lookups_total 3"), std::string::npos) << text;
  EXPECT_NE(text.find("kvtier_tier_used_bytes{tier=\"host\"} 5"), std::string::npos) << text;
  EXPECT_NE(text.find("kvtier_tier_read_seconds_count{tier=\"nvme\"} 0"), std::string::npos) << text;
  EXPECT_EQ(text.find("alpha"), std::string::npos) << text;
  EXPECT_EQ(text.find("secret/model"), std::string::npos) << text;
}

std::string Head(const std::string& headers) { return "GET /metrics HTTP/1.1\r\nHost: x\r\n" + headers + "\r\n"; }

TEST(BearerTokenTest, TheRightTokenInAnyCaseOfNameAndScheme) {
  const std::string token = "abcdefghijklmnopqrstuvwxyz012345";
  EXPECT_TRUE(HasBearerToken(Head("Authorization: Bearer " + token + "\r\n"), token));
  EXPECT_TRUE(HasBearerToken(Head("authorization:bearer   " + token + " \r\n"), token));
  EXPECT_TRUE(HasBearerToken(Head("AUTHORIZATION: BEARER " + token + "\r\nAccept: */*\r\n"), token));
}

TEST(BearerTokenTest, AnythingElseIsRefused) {
  const std::string token = "abcdefghijklmnopqrstuvwxyz012345";
  EXPECT_FALSE(HasBearerToken(Head(""), token));
  EXPECT_FALSE(HasBearerToken(Head("Authorization: Bearer " + token.substr(1) + "\r\n"), token));
  EXPECT_FALSE(HasBearerToken(Head("Authorization: Bearer " + token + "x\r\n"), token));
  EXPECT_FALSE(HasBearerToken(Head("Authorization: Bearer\r\n"), token));
  EXPECT_FALSE(HasBearerToken(Head("Authorization: Basic " + token + "\r\n"), token));
  EXPECT_FALSE(HasBearerToken(Head("X-Authorization: Bearer " + token + "\r\n"), token));
  EXPECT_FALSE(HasBearerToken("GET /metrics?Authorization:%20Bearer%20" + token + " HTTP/1.1\r\n\r\n", token));
  // Two of them, whatever the order: refused.
  EXPECT_FALSE(HasBearerToken(Head("Authorization: Bearer " + token + "\r\nAuthorization: Bearer wrong\r\n"), token));
  EXPECT_FALSE(HasBearerToken(Head("Authorization: Bearer wrong\r\nAuthorization: Bearer " + token + "\r\n"), token));
  EXPECT_FALSE(
      HasBearerToken(Head("Authorization: Bearer " + token + "\r\nAuthorization: Bearer " + token + "\r\n"), token));
}

class TokenFileTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir(); }
  void TearDown() override { testing::RemoveTree(dir_); }
  std::string Write(const std::string& name, const std::string& text, mode_t mode = 0600) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    ::chmod(path.c_str(), mode);
    return path;
  }
  std::string dir_;
};

TEST_F(TokenFileTest, AMissingFileGetsARandomPrintableTokenMode0600) {
  const std::string path = dir_ + "/metrics.token";
  bool created = false;
  auto token = LoadOrCreateToken(path, "the token", &created);
  ASSERT_TRUE(token.ok()) << token.status().ToString();
  EXPECT_TRUE(created);
  EXPECT_EQ(token->size(), 64u);
  EXPECT_EQ(token->find_first_not_of("0123456789abcdef"), std::string::npos) << *token;
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  auto again = LoadOrCreateToken(path, "the token", &created);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(created);
  EXPECT_EQ(*again, *token);
}

TEST_F(TokenFileTest, AnOperatorsTokenIsReadWithoutItsTrailingNewline) {
  const std::string token(40, 'T');
  auto read = LoadOrCreateToken(Write("a", token + "\n"), "the token");
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, token);
  read = LoadOrCreateToken(Write("b", token + "\r\n"), "the token");
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  EXPECT_EQ(*read, token);
}

TEST_F(TokenFileTest, ShortOddOrOpenTokensAreRefused) {
  const std::string good(40, 'T');
  const std::pair<std::string, mode_t> bad[] = {{std::string(31, 'T'), 0600},     // too short to be a secret
                                                {good + " " + good, 0600},        // a space
                                                {good + "\n\n", 0600},            // two newlines
                                                {good + "\xc3\xa9", 0600},        // not token68
                                                {good, 0640},                     // the group may read it
                                                {std::string(5000, 'T'), 0600}};  // too long
  int i = 0;
  for (const auto& [text, mode] : bad) {
    const std::string path = Write("bad" + std::to_string(i++), text, mode);
    auto read = LoadOrCreateToken(path, "the token");
    EXPECT_EQ(read.status().code(), StatusCode::kInvalidArgument) << text.substr(0, 50);
    EXPECT_NE(read.status().message().find(path), std::string::npos) << read.status().message();
  }
}

}  // namespace
}  // namespace kvtier
