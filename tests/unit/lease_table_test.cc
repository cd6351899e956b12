// Tests of LeaseTable: ids name their shard, Release checks the holder,
// and a closing connection takes exactly its own leases.
#include "daemon/engine/lease_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace kvtier {
namespace {

BlockKey Key(uint64_t i) { return BlockKey{0x1ea5e, i}; }

TEST(LeaseTableTest, IdsAreDistinctAndNameTheirShard) {
  LeaseTable table(37, 1);
  std::set<LeaseId> ids;
  for (uint64_t i = 0; i < 100; ++i) {
    const LeaseId lease = table.Grant(1, Key(i % 3), i);
    EXPECT_EQ(LeaseShard(lease), 37u);
    EXPECT_NE(lease, 0u);
    ids.insert(lease);
  }
  EXPECT_EQ(ids.size(), 100u) << "a block pinned twice holds two leases";
  EXPECT_EQ(table.size(), 100u);
}

TEST(LeaseTableTest, OnlyTheHolderReleasesAndOnlyOnce) {
  LeaseTable table(0, 1);
  const LeaseId lease = table.Grant(7, Key(1), 11);
  Result<LeaseRecord> foreign = table.Take(8, lease);
  EXPECT_EQ(foreign.status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(table.size(), 1u) << "a refused release leaves the lease held";
  Result<LeaseRecord> mine = table.Take(7, lease);
  ASSERT_TRUE(mine.ok());
  EXPECT_EQ(mine->connection, 7u);
  EXPECT_EQ(mine->key, Key(1));
  EXPECT_EQ(mine->handle, 11u);
  EXPECT_EQ(table.Take(7, lease).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(table.Take(7, 12345).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(table.size(), 0u);
}

TEST(LeaseTableTest, TakeAllEndsOneConnectionsLeasesAndNoOthers) {
  LeaseTable table(2, 1);
  const LeaseId a = table.Grant(1, Key(1), 1);
  const LeaseId b = table.Grant(1, Key(2), 2);
  const LeaseId other = table.Grant(2, Key(1), 1);
  ASSERT_TRUE(table.Take(1, a).ok());
  std::vector<LeaseRecord> taken = table.TakeAll(1);
  ASSERT_EQ(taken.size(), 1u) << "a released lease is not taken again";
  EXPECT_EQ(taken[0].key, Key(2));
  EXPECT_EQ(table.Take(1, b).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(table.TakeAll(1).empty());
  EXPECT_EQ(table.size(), 1u);
  EXPECT_TRUE(table.Take(2, other).ok());
}

TEST(LeaseTableTest, NumbersCountFromTheirFirstSequence) {
  LeaseTable first(5, 1), second(5, 1000);
  const LeaseId a = first.Grant(1, Key(1), 1);
  const LeaseId b = second.Grant(1, Key(1), 1);
  EXPECT_EQ(a >> kLeaseShardBits, 1u);
  EXPECT_EQ(b >> kLeaseShardBits, 1000u);
  EXPECT_EQ(first.Take(1, b).status().code(), StatusCode::kNotFound) << "another table's number names nothing here";
}

}  // namespace
}  // namespace kvtier
