// Chain links on puts (issue 12, item 4.4): a client that stores a prefix
// says its blocks form one chain (and which block came before it), and the
// daemon's SSD admission then keeps prefix closure without any queue hint:
// a block whose prefix is cached nowhere is never written to NVMe.
#include <gtest/gtest.h>

#include <vector>

#include "tests/testing/test_daemon.h"

namespace kvtier::testing {
namespace {

constexpr size_t kBlock = 256 << 10;

TEST(PutChain, ABlockWhosePrefixIsCachedNowhereIsNotWrittenToNvme) {
  TestDaemonOptions o;
  o.arena_bytes = 8 * kBlock;
  o.nvme_in_memory = true;
  o.nvme_bytes = 32 << 20;
  o.nvme_region_bytes = 1 << 20;
  o.nvme_admission = AdmissionPolicyId::kSecondHit;  // a block read once qualifies, if its prefix can be found
  TestDaemon daemon(o);
  auto client = daemon.ConnectSocketOnly();
  ASSERT_NE(client, nullptr);
  const auto keys = TestKeys(TestNamespace(), 20, 3);
  const auto put = [&](std::vector<BlockKey> chain, const ChainLinks& links) {
    std::vector<std::vector<std::byte>> bytes;
    std::vector<std::span<const std::byte>> data;
    for (const BlockKey& k : chain) bytes.push_back(Block(k, kBlock));
    for (const auto& b : bytes) data.emplace_back(b);
    for (const Status& s : client->PutBatch(0, chain, data, links)) ASSERT_TRUE(s.ok()) << s.ToString();
  };
  put({keys[1], keys[2]}, ChainLinks{true, keys[0]});  // keys[0] is never stored
  put({keys[3], keys[4]}, ChainLinks{true, std::nullopt});
  std::vector<std::byte> dst(kBlock);
  for (size_t i = 1; i <= 4; ++i) ASSERT_TRUE(client->Get(0, keys[i], dst).ok()) << i;  // one use each
  for (size_t i = 10; i < 20; ++i) ASSERT_TRUE(client->Put(0, keys[i], Block(keys[i], kBlock)).ok()) << i;
  daemon.engine().WaitForIdle();
  EXPECT_FALSE(daemon.nvme()->Find(keys[1])) << "its parent was never stored";
  EXPECT_FALSE(daemon.nvme()->Find(keys[2])) << "its parent was not kept";
  EXPECT_TRUE(daemon.nvme()->Find(keys[3]));
  EXPECT_TRUE(daemon.nvme()->Find(keys[4]));
  EXPECT_EQ(StatsCounter(*client, "nvme.admission.rejected_parent_missing"), 2);
  EXPECT_EQ(StatsCounter(*client, "engine.chain_links"), 4) << "the two chained puts, not the plain ones";
}

}  // namespace
}  // namespace kvtier::testing
