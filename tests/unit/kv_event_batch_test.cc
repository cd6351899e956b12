// kvtier events' decoder (subscriber/kv_event_batch.h) reads what the
// daemon's encoder (daemon/events/event_encoding.h) writes, in both forms,
// event for event; refuses what is no batch with a reason; and the block
// listing (tools/cli/block_listing.h) prints sorted, each block once.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/kv_event_forms.h"
#include "common/msgpack.h"
#include "daemon/events/event_encoding.h"
#include "tools/cli/block_listing.h"
#include "subscriber/kv_event_batch.h"

namespace kvtier::tools {
using events::DecodeKvEventBatch;
using events::KvEventBatch;
using events::KvEventKind;

namespace {

const NamespaceFingerprint kNs{0x0102030405060708, 0x1112131415161718};

std::vector<BlockEvent> SomeEvents() {
  const BlockKey a{1, 1}, b{2, 2}, c{3, 3};
  return {
      BlockEvent{BlockEventKind::kCleared, Tier::kNone, {}, {}, std::nullopt},
      BlockEvent{BlockEventKind::kStored, Tier::kHost, kNs, a, std::nullopt},  // a chain: one event
      BlockEvent{BlockEventKind::kStored, Tier::kHost, kNs, b, a},
      BlockEvent{BlockEventKind::kStored, Tier::kNvme, kNs, c, b},
      BlockEvent{BlockEventKind::kRemoved, Tier::kHost, kNs, a, std::nullopt},
      BlockEvent{BlockEventKind::kRemoved, Tier::kHost, kNs, b, std::nullopt},
      BlockEvent{BlockEventKind::kStored, Tier::kRemote, kNs, a, std::nullopt},
      BlockEvent{BlockEventKind::kStored, Tier::kHbm, kNs, b, BlockKey{9, 9}},
  };
}

class KvEventBatchTest : public ::testing::TestWithParam<EventFormat> {};

TEST_P(KvEventBatchTest, DecodesWhatTheDaemonEncodes) {
  const std::string payload = EncodeEventBatch(1234.5, SomeEvents(), GetParam(), nullptr);
  auto batch = DecodeKvEventBatch(payload);
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  EXPECT_DOUBLE_EQ(batch->ts, 1234.5);
  ASSERT_EQ(batch->events.size(), 6u);
  const auto& e = batch->events;
  EXPECT_EQ(e[0].kind, KvEventKind::kCleared);
  EXPECT_EQ(e[1].kind, KvEventKind::kStored);
  EXPECT_EQ(e[1].tier, Tier::kHost);
  EXPECT_EQ(e[1].ns, kNs);
  EXPECT_EQ(e[1].keys, (std::vector<BlockKey>{{1, 1}, {2, 2}}));
  EXPECT_FALSE(e[1].parent.has_value());
  EXPECT_EQ(e[2].tier, Tier::kNvme);
  EXPECT_EQ(e[2].parent, (BlockKey{2, 2}));
  EXPECT_EQ(e[3].kind, KvEventKind::kRemoved);
  EXPECT_EQ(e[3].keys, (std::vector<BlockKey>{{1, 1}, {2, 2}}));
  EXPECT_EQ(e[4].tier, Tier::kRemote);
  EXPECT_EQ(e[5].tier, Tier::kHbm);
  EXPECT_EQ(e[5].parent, (BlockKey{9, 9}));
}

INSTANTIATE_TEST_SUITE_P(BothForms, KvEventBatchTest, ::testing::Values(EventFormat::kMap, EventFormat::kArray),
                         [](const auto& info) { return info.param == EventFormat::kMap ? "Map" : "Array"; });

TEST(KvEventBatch, RefusesWhatIsNoBatch) {
  auto refused = [](const std::string& payload) {
    auto batch = DecodeKvEventBatch(payload);
    EXPECT_FALSE(batch.ok());
    return batch.ok() ? std::string() : batch.status().message();
  };
  EXPECT_FALSE(refused("\xc1").empty());
  MsgpackWriter no_events;
  no_events.MapHeader(1);
  no_events.Str("ts");
  no_events.Double(1);
  EXPECT_NE(refused(no_events.Take()).find("events"), std::string::npos);
  auto one_event = [](const std::string& type, const std::string& key, const std::string& medium) {
    MsgpackWriter w;
    w.MapHeader(2);
    w.Str("ts");
    w.Double(1);
    w.Str("events");
    w.ArrayHeader(1);
    w.MapHeader(4);
    w.Str("type");
    w.Str(type);
    w.Str("block_hashes");
    w.ArrayHeader(1);
    w.Bin(key);
    w.Str("medium");
    w.Str(medium);
    w.Str("kvtier_namespace");
    w.Bin(KeyBytes(kNs));
    return w.Take();
  };
  EXPECT_TRUE(DecodeKvEventBatch(one_event("BlockRemoved", KeyBytes({1, 2}), "DISK")).ok());
  EXPECT_NE(refused(one_event("BlockRemoved", std::string(15, 'k'), "DISK")).find("16-byte"), std::string::npos);
  EXPECT_NE(refused(one_event("BlockRemoved", KeyBytes({1, 2}), "TAPE")).find("TAPE"), std::string::npos);
  EXPECT_NE(refused(one_event("BlockMoved", KeyBytes({1, 2}), "DISK")).find("BlockMoved"), std::string::npos);
}

TEST(KvEventBatch, MediaAndKeysRoundTrip) {
  for (Tier t : {Tier::kHbm, Tier::kHost, Tier::kNvme, Tier::kRemote}) EXPECT_EQ(TierOfMedium(MediumName(t)), t);
  EXPECT_EQ(TierOfMedium("CPU"), Tier::kNone);
  const BlockKey k{0x0123456789abcdef, 0xfedcba9876543210};
  EXPECT_EQ(KeyFromBytes(KeyBytes(k)), k);
  EXPECT_FALSE(KeyFromBytes("short").has_value());
}

TEST(KvEventBatch, SequenceFramesAreBigEndianAndRoundTrip) {
  EXPECT_EQ(SeqBytes(0x0102030405060708), std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8));
  EXPECT_EQ(SeqBytes(kEventEndSeq), std::string(8, '\xff'));  // vLLM's end marker: -1, 8 bytes
  for (int64_t seq : {int64_t{0}, int64_t{1}, int64_t{1} << 40, kEventEndSeq})
    EXPECT_EQ(SeqFromBytes(SeqBytes(seq)), seq);
}

std::string Printed(const std::vector<HeldBlockInfo>& blocks, bool json) {
  std::FILE* f = std::tmpfile();
  PrintBlocks(blocks, json, f);
  std::string out(static_cast<size_t>(std::ftell(f)), '\0');
  std::rewind(f);
  EXPECT_EQ(std::fread(out.data(), 1, out.size(), f), out.size());
  std::fclose(f);
  return out;
}

TEST(BlockListing, PrintsSortedEachBlockOnce) {
  const BlockKey a{0, 1}, b{0, 2};
  const std::vector<HeldBlockInfo> blocks = {
      {Tier::kNvme, kNs, a, ""}, {Tier::kHost, kNs, b, ""}, {Tier::kHost, kNs, a, ""}, {Tier::kHost, kNs, b, ""}};
  EXPECT_EQ(Printed(blocks, true), "[\n{\"tier\":\"host\",\"namespace\":\"" + kNs.ToHex() + "\",\"key\":\"" +
                                       a.ToHex() + "\"},\n{\"tier\":\"host\",\"namespace\":\"" + kNs.ToHex() +
                                       "\",\"key\":\"" + b.ToHex() + "\"},\n{\"tier\":\"nvme\",\"namespace\":\"" +
                                       kNs.ToHex() + "\",\"key\":\"" + a.ToHex() + "\"}\n]\n");
  const std::string text = Printed(blocks, false);
  EXPECT_EQ(text.substr(0, text.find('\n')).find("TIER"), 0u);
  EXPECT_NE(text.find("host    " + kNs.ToHex() + "  " + a.ToHex() + "\nhost    "), std::string::npos) << text;
  EXPECT_EQ(Printed({}, true), "[]\n");
  EXPECT_NE(Printed({{Tier::kHost, kNs, a, "alpha"}}, true).find("\"tenant\":\"alpha\""), std::string::npos);
  EXPECT_EQ(Printed({{Tier::kHost, kNs, a, "alpha"}}, false).find("TENANT"), 0u);
}

}  // namespace
}  // namespace kvtier::tools
