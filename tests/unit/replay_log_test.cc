// Tests of the replay's NVMe log (tools/replay/replay_log.h): the daemon's region
// placement, reclaim turns and copies forward, hand-computed.
#include "tools/replay/replay_log.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace kvtier::tools {
namespace {

BlockKey K(uint32_t id) { return BlockKey{0x10c, id}; }

// 4 KiB payloads: 8 KiB records; regions of 2 records; 3 regions.
constexpr uint64_t kPayload = 4096;
constexpr uint64_t kRecord = 8192;

struct LogEvents {
  std::vector<uint32_t> dropped, offered;
  std::vector<uint64_t> offered_hits;  // each offered block's reads since written
  std::vector<uint32_t> needed;
};

std::unique_ptr<SimLog> MakeLog(ReclaimOrder order, double share, bool has_below, LogEvents& events) {
  SimLogOptions o;
  o.device_bytes = 3 * 2 * kRecord;
  o.region_bytes = 2 * kRecord;
  o.alignment_bytes = 4096;
  o.order = order;
  o.reinsert_share = share;
  SimLog::Hooks hooks;
  hooks.dropped = [&events](uint32_t id) { events.dropped.push_back(id); };
  hooks.offered = [&events](uint32_t id, uint64_t hits) {
    events.offered.push_back(id);
    events.offered_hits.push_back(hits);
  };
  hooks.needed = [&events](uint32_t id) {
    return std::find(events.needed.begin(), events.needed.end(), id) != events.needed.end();
  };
  hooks.has_below = has_below;
  auto log = SimLog::Create(o, hooks);
  EXPECT_TRUE(log.ok()) << log.status().ToString();
  return log.ok() ? std::move(log).value() : nullptr;
}

bool Write(SimLog& log, uint32_t id) { return log.Write(id, K(id), kPayload, id); }

TEST(SimLogTest, RecordsAreTheDaemonsAndTheGeometryIsChecked) {
  LogEvents events;
  auto log = MakeLog(ReclaimOrder::kFifo, 0.1, false, events);
  ASSERT_NE(log, nullptr);
  EXPECT_EQ(log->RecordBytesOf(kPayload), kRecord);
  EXPECT_EQ(log->RecordBytesOf(1), kRecord) << "header plus the payload rounded up";
  SimLogOptions one_region;
  one_region.device_bytes = 3 * kRecord;
  one_region.region_bytes = 2 * kRecord;
  EXPECT_EQ(SimLog::Create(one_region, {}).status().code(), StatusCode::kInvalidArgument);
  SimLogOptions unaligned;
  unaligned.device_bytes = 1 << 20;
  unaligned.region_bytes = 5000;
  EXPECT_EQ(SimLog::Create(unaligned, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(log->Write(9, K(9), 3 * kRecord, 0)) << "a record larger than a region is not placed";
  EXPECT_FALSE(log->Holds(9));
}

// Regions 0, 1, 2 of two records. 1, 2 fill region 0; 3, 4 region 1; 5
// opens region 2, the last free one: region 0's turn. lru copies 1 (read)
// forward, after 5, and offers 2 below; fifo copies nothing and offers
// both. The next write that finds region 2 full (6 under lru, 7 under
// fifo) reclaims region 0 (what is still there leaves) and reopens it:
// region 1's turn offers 3 and 4 (never read).
TEST(SimLogTest, ReclaimTakesTheOldestRegionAndLruCopiesItsReadBlocksForward) {
  for (ReclaimOrder order : {ReclaimOrder::kLru, ReclaimOrder::kFifo}) {
    SCOPED_TRACE(ReclaimOrderName(order));
    const bool lru = order == ReclaimOrder::kLru;
    LogEvents events;
    auto log = MakeLog(order, 1.0, /*has_below=*/true, events);
    ASSERT_NE(log, nullptr);
    for (uint32_t id = 1; id <= 4; ++id) ASSERT_TRUE(Write(*log, id));
    log->Read(1, 10);
    EXPECT_TRUE(events.offered.empty());
    ASSERT_TRUE(Write(*log, 5));
    const std::vector<uint32_t> first_offers = lru ? std::vector<uint32_t>{2} : std::vector<uint32_t>{1, 2};
    EXPECT_EQ(events.offered, first_offers) << "log order";
    // What the tier below's admission weighs: 1 was read once here.
    EXPECT_EQ(events.offered_hits, (lru ? std::vector<uint64_t>{0} : std::vector<uint64_t>{1, 0}));
    EXPECT_EQ(log->reinserted(), lru ? 1u : 0u);
    EXPECT_EQ(log->reinserted_bytes(), lru ? kRecord : 0u);
    EXPECT_TRUE(events.dropped.empty()) << "offered blocks stay readable until their region goes";
    EXPECT_TRUE(log->Holds(1) && log->Holds(2));
    ASSERT_TRUE(Write(*log, 6));
    EXPECT_EQ(events.dropped.size(), lru ? 1u : 0u);
    ASSERT_TRUE(Write(*log, 7));
    const std::vector<uint32_t> dropped = lru ? std::vector<uint32_t>{2} : std::vector<uint32_t>{1, 2};
    EXPECT_EQ(events.dropped, dropped);
    EXPECT_EQ(log->Holds(1), lru);
    EXPECT_FALSE(log->Holds(2));
    ASSERT_GE(events.offered.size(), 2u);
    EXPECT_EQ(std::vector<uint32_t>(events.offered.end() - 2, events.offered.end()), (std::vector<uint32_t>{3, 4}))
        << "region 1's turn";
    EXPECT_EQ(log->device_bytes_written(), (lru ? 8 : 7) * kRecord);
  }
}

TEST(SimLogTest, TheBudgetLimitsCopiesAndWithoutATierBelowNothingIsOffered) {
  // share 0.1 of 5 writes is half a record: nothing is copied, and 7
  // reclaims region 0 whole.
  LogEvents events;
  auto log = MakeLog(ReclaimOrder::kLru, 0.1, /*has_below=*/false, events);
  ASSERT_NE(log, nullptr);
  for (uint32_t id = 1; id <= 4; ++id) ASSERT_TRUE(Write(*log, id));
  log->Read(1, 10);
  for (uint32_t id = 5; id <= 7; ++id) ASSERT_TRUE(Write(*log, id));
  EXPECT_EQ(log->reinserted(), 0u);
  EXPECT_TRUE(events.offered.empty());
  EXPECT_EQ(events.dropped, (std::vector<uint32_t>{1, 2}));
}

TEST(SimLogTest, QueueAwareCopiesWhatAQueuedRequestNeeds) {
  LogEvents events;
  events.needed = {2};
  auto log = MakeLog(ReclaimOrder::kQueueAware, 1.0, /*has_below=*/false, events);
  ASSERT_NE(log, nullptr);
  for (uint32_t id = 1; id <= 5; ++id) ASSERT_TRUE(Write(*log, id));
  EXPECT_EQ(log->reinserted(), 1u);
  ASSERT_TRUE(Write(*log, 6));
  EXPECT_EQ(events.dropped, (std::vector<uint32_t>{1})) << "2, never read but needed, was copied forward";
  EXPECT_TRUE(log->Holds(2));
}

}  // namespace
}  // namespace kvtier::tools
