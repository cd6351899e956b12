// Checksums sent with Commit (issue 12): the daemon records a client's
// checksum as the block's, hashes the block itself when none is sent, and
// with verify_commits hashes anyway and refuses a block whose bytes do not
// match (dropping its reservation). Over a real Engine and HostTier,
// through RequestHandler (the wire), and the client's Commit builder.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "client_lib/put_path.h"
#include "common/checksum.h"
#include "common/counters.h"
#include "daemon/config/config.h"
#include "daemon/engine/engine.h"
#include "daemon/server/request_handler.h"
#include "proto/wire.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/test_daemon.h"
#include "tiers/host/host_tier.h"

namespace kvtier {
namespace {

using ::kvtier::testing::FakeClock;
using ::kvtier::testing::FillBlockBytes;
using ::kvtier::testing::SlotBytes;
using ::kvtier::testing::TestNamespace;

constexpr uint64_t kBlockBytes = 4096;
constexpr uint64_t kArenaBytes = 16 * kBlockBytes;
constexpr ConnectionId kWriter = 1;
constexpr ConnectionId kReader = 2;

BlockKey Key(uint64_t i) { return BlockKey{0xc0ffee, i}; }
std::vector<BlockKey> Keys(std::initializer_list<BlockKey> keys) { return keys; }
std::vector<uint64_t> Words(std::initializer_list<uint64_t> words) { return words; }

class CommitChecksumTest : public ::testing::Test {
 protected:
  void Make(bool verify_commits) {
    handler_.reset();
    engine_.reset();
    host_ = ::kvtier::testing::OpenTestHostTier(kArenaBytes);
    ASSERT_NE(host_, nullptr);
    EngineOptions options{2, EvictionPolicyId::kLru};
    options.verify_commits = verify_commits;
    auto engine = Engine::Create(options, *host_, clock_);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    engine_ = std::move(*engine);
    context_.engine = engine_.get();
    context_.arena_bytes = host_->capacity_bytes();
    context_.max_frame_bytes = 1 << 20;
    handler_ = std::make_unique<RequestHandler>(context_, kWriter);
  }
  void SetUp() override { Make(/*verify_commits=*/false); }

  // Reserves `key` and fills its slot with FillBlockBytes(key, salt); returns
  // the checksum of those bytes.
  uint64_t ReserveAndFill(const BlockKey& key, uint64_t salt = 1) {
    const uint64_t size = kBlockBytes;
    auto grant = engine_->Reserve(kWriter, ns_, {&key, 1}, {&size, 1})[0];
    EXPECT_TRUE(grant.status.ok()) << grant.status.ToString();
    auto bytes = SlotBytes(*host_, grant.offset, grant.length);
    FillBlockBytes(key, salt, bytes);
    return BlockChecksum(bytes);
  }
  Status CommitOne(const BlockKey& key, std::span<const uint64_t> checksums) {
    const uint64_t size = kBlockBytes;
    return engine_->Commit(kWriter, ns_, {&key, 1}, {&size, 1}, checksums)[0];
  }
  // The checksum a Pin of `key` hands out (the lease is released); NotFound
  // etc. as a test failure and 0.
  uint64_t PinnedChecksum(const BlockKey& key) {
    PinGrant g = engine_->Pin(kReader, ns_, {&key, 1})[0];
    EXPECT_TRUE(g.status.ok()) << g.status.ToString();
    if (!g.status.ok()) return 0;
    EXPECT_TRUE(engine_->Release(kReader, {&g.lease, 1})[0].ok());
    return g.checksum;
  }
  size_t Cached(const BlockKey& key) { return engine_->Lookup(ns_, {&key, 1}).prefix_blocks; }
  int64_t Counter(std::string_view name) {
    CounterCollector collector;
    engine_->VisitCounters(collector);
    return ::kvtier::testing::FindCounter(collector, name);
  }
  v1::Response Send(const v1::Request& request) {
    v1::Response response;
    handler_->Handle(request, response);
    return response;
  }
  void HelloOk() {
    v1::Request hello;
    hello.set_id(1);
    hello.mutable_hello()->set_protocol_version(wire::kProtocolVersion);
    wire::ToProto(TestNamespace(), hello.mutable_hello()->add_namespaces());
    ASSERT_EQ(Send(hello).status().code(), 0);
  }

  FakeClock clock_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<Engine> engine_;
  HandlerContext context_;
  std::unique_ptr<RequestHandler> handler_;
  const NamespaceFingerprint ns_ = FingerprintNamespace(TestNamespace());
};

TEST_F(CommitChecksumTest, ClientChecksumIsRecordedAndServedByPin) {
  const uint64_t checksum = ReserveAndFill(Key(1));
  ASSERT_TRUE(CommitOne(Key(1), std::span(&checksum, 1)).ok());
  EXPECT_EQ(PinnedChecksum(Key(1)), checksum);
}

TEST_F(CommitChecksumTest, WithoutVerificationTheClientChecksumIsTakenAsSent) {
  // The trade-off of verify_commits = false: the engine does not read the
  // block, so a wrong value is kept (readers that verify, and demotion, then
  // treat the block as corrupt).
  const uint64_t wrong = ReserveAndFill(Key(1)) ^ 1;
  ASSERT_TRUE(CommitOne(Key(1), std::span(&wrong, 1)).ok());
  EXPECT_EQ(PinnedChecksum(Key(1)), wrong);
}

TEST_F(CommitChecksumTest, WithoutChecksumsTheEngineHashesTheBlock) {
  const uint64_t checksum = ReserveAndFill(Key(1));
  ASSERT_TRUE(CommitOne(Key(1), {}).ok());
  EXPECT_EQ(PinnedChecksum(Key(1)), checksum);
}

TEST_F(CommitChecksumTest, VerifiedCommitAcceptsTheRightChecksum) {
  Make(/*verify_commits=*/true);
  const uint64_t checksum = ReserveAndFill(Key(1));
  ASSERT_TRUE(CommitOne(Key(1), std::span(&checksum, 1)).ok());
  EXPECT_EQ(PinnedChecksum(Key(1)), checksum);
  // And a commit without checksums is hashed as always.
  const uint64_t other = ReserveAndFill(Key(2), 7);
  ASSERT_TRUE(CommitOne(Key(2), {}).ok());
  EXPECT_EQ(PinnedChecksum(Key(2)), other);
}

TEST_F(CommitChecksumTest, VerifiedCommitRefusesAWrongChecksumAndDropsTheReservation) {
  Make(/*verify_commits=*/true);
  const uint64_t wrong = ReserveAndFill(Key(1)) ^ 0x8000;
  EXPECT_EQ(host_->used_bytes(), kBlockBytes);
  Status s = CommitOne(Key(1), std::span(&wrong, 1));
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_EQ(Counter("engine.commit_failures"), 1);
  EXPECT_EQ(Counter("engine.commits"), 0);
  // Nothing is visible, the space is back, and the reservation is gone.
  EXPECT_EQ(Cached(Key(1)), 0u);
  EXPECT_EQ(host_->used_bytes(), 0u);
  const uint64_t checksum = BlockChecksum(std::vector<std::byte>(1));  // any value
  EXPECT_EQ(CommitOne(Key(1), std::span(&checksum, 1)).code(), StatusCode::kFailedPrecondition);
  // The key can be put again.
  const uint64_t right = ReserveAndFill(Key(1));
  EXPECT_TRUE(CommitOne(Key(1), std::span(&right, 1)).ok());
}

TEST_F(CommitChecksumTest, VerifiedBatchFailsOnlyTheMismatchedBlock) {
  Make(/*verify_commits=*/true);
  const std::vector<BlockKey> keys = {Key(1), Key(2), Key(3)};
  std::vector<uint64_t> checksums;
  for (const auto& k : keys) checksums.push_back(ReserveAndFill(k));
  checksums[1] += 1;
  const std::vector<uint64_t> sizes(3, kBlockBytes);
  auto statuses = engine_->Commit(kWriter, ns_, keys, sizes, checksums);
  ASSERT_EQ(statuses.size(), 3u);
  EXPECT_TRUE(statuses[0].ok());
  EXPECT_EQ(statuses[1].code(), StatusCode::kCorruption);
  EXPECT_TRUE(statuses[2].ok());
  EXPECT_EQ(Cached(Key(2)), 0u);
  EXPECT_EQ(PinnedChecksum(Key(3)), checksums[2]);
}

TEST_F(CommitChecksumTest, HandlerPassesChecksumsFromTheWire) {
  HelloOk();
  const uint64_t checksum = ReserveAndFill(Key(1));  // reserved by kWriter, the handler's connection
  const uint64_t sent = checksum ^ 0xff;             // distinguishable from the engine's own hash
  v1::Request commit = wire::MakeCommit(0, Keys({Key(1)}), Words({kBlockBytes}), Words({sent}));
  commit.set_id(2);
  v1::Response r = Send(commit);
  ASSERT_EQ(r.status().code(), 0) << r.status().message();
  ASSERT_EQ(r.commit().statuses_size(), 1);
  EXPECT_EQ(r.commit().statuses(0).code(), 0) << r.commit().statuses(0).message();
  EXPECT_EQ(PinnedChecksum(Key(1)), sent);
}

TEST_F(CommitChecksumTest, HandlerRefusesAChecksumCountThatIsNeitherZeroNorOnePerKey) {
  HelloOk();
  ReserveAndFill(Key(1));
  ReserveAndFill(Key(2));
  v1::Request commit = wire::MakeCommit(0, Keys({Key(1), Key(2)}), Words({kBlockBytes, kBlockBytes}), Words({42}));
  commit.set_id(2);
  v1::Response r = Send(commit);
  EXPECT_EQ(static_cast<StatusCode>(r.status().code()), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("checksums"), std::string::npos) << r.status().message();
  EXPECT_EQ(Cached(Key(1)), 0u);
}

TEST_F(CommitChecksumTest, HandlerWithoutChecksumsHashes) {
  HelloOk();
  const uint64_t checksum = ReserveAndFill(Key(1));
  v1::Request commit = wire::MakeCommit(0, Keys({Key(1)}), Words({kBlockBytes}));
  commit.set_id(2);
  EXPECT_EQ(commit.commit().checksums_size(), 0);
  v1::Response r = Send(commit);
  ASSERT_EQ(r.status().code(), 0);
  EXPECT_EQ(r.commit().statuses(0).code(), 0);
  EXPECT_EQ(PinnedChecksum(Key(1)), checksum);
}

TEST(ClientCommitBuilder, SendsChecksumsOnlyWhenEveryOkBlockHasOne) {
  std::vector<std::byte> arena(3 * kBlockBytes);
  std::vector<WritableBlock> blocks(3);
  for (size_t i = 0; i < blocks.size(); ++i) {
    blocks[i].key = Key(i);
    blocks[i].data = std::span(arena).subspan(i * kBlockBytes, kBlockBytes);
    blocks[i].checksum = 100 + i;
  }
  blocks[1].status = AlreadyExists("cached");  // not committed, so its checksum does not travel
  v1::Request request;
  ASSERT_TRUE(internal::BuildCommit(0, blocks, request));
  ASSERT_EQ(request.commit().sizes_size(), 2);
  ASSERT_EQ(request.commit().checksums_size(), 2);
  EXPECT_EQ(request.commit().checksums(0), 100u);
  EXPECT_EQ(request.commit().checksums(1), 102u);

  blocks[2].checksum.reset();
  v1::Request partial;
  ASSERT_TRUE(internal::BuildCommit(0, blocks, partial));
  EXPECT_EQ(partial.commit().sizes_size(), 2);
  EXPECT_EQ(partial.commit().checksums_size(), 0) << "one per key or none: the daemon hashes them all";
}

TEST(VerifyCommitsOption, DefaultsToOffAndParses) {
  auto defaults = ParseConfig("", "test.toml");
  ASSERT_TRUE(defaults.ok()) << defaults.status().ToString();
  EXPECT_FALSE(defaults->host_verify_commits);
  auto on = ParseConfig("[host]\nverify_commits = true\n", "test.toml");
  ASSERT_TRUE(on.ok()) << on.status().ToString();
  EXPECT_TRUE(on->host_verify_commits);
  EXPECT_FALSE(ParseConfig("[host]\nverify_commits = 1\n", "test.toml").ok());
}

}  // namespace
}  // namespace kvtier
