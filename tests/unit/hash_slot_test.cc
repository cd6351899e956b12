// Redis Cluster's key placement (tiers/remote/hash_slot.h), against the
// published CRC16 check value and slots redis-server itself gives (read
// with CLUSTER KEYSLOT on Debian's redis-server 7; the integration test
// hash_slot_redis_test.cc compares many more keys with a live server).
#include "tiers/remote/hash_slot.h"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

TEST(HashSlotTest, Crc16IsXmodem) {
  EXPECT_EQ(Crc16Xmodem("123456789"), 0x31C3);  // the CRC-16/XMODEM check value
  EXPECT_EQ(Crc16Xmodem(""), 0);
}

TEST(HashSlotTest, SlotsAgreeWithRedisServer) {
  EXPECT_EQ(HashSlot("somekey"), 11058);
  EXPECT_EQ(HashSlot("foo"), 12182);
  EXPECT_EQ(HashSlot("123456789"), 12739);
}

TEST(HashSlotTest, OnlyTheFirstNonEmptyHashTagIsHashed) {
  EXPECT_EQ(HashSlot("foo{hash_tag}"), 2515);
  EXPECT_EQ(HashSlot("bar{hash_tag}"), 2515);
  EXPECT_EQ(HashSlot("{user1000}.following"), HashSlot("user1000"));
  EXPECT_EQ(HashSlot("a{}{b}"), 15033) << "an empty tag: the whole key";
  EXPECT_EQ(HashSlot("a{}{b}"), HashSlot(std::string_view("a{}{b}")));
  EXPECT_EQ(HashSlot("foo{{bar}}zap"), 4015) << "the tag is \"{bar\"";
  EXPECT_EQ(HashSlot("foo{bar}{zap}"), HashSlot("bar"));
  EXPECT_EQ(HashSlot("no{close"), Crc16Xmodem("no{close") % kClusterSlots);
}

TEST(HashSlotTest, SlotsStayInRange) {
  for (int i = 0; i < 10000; ++i) EXPECT_LT(HashSlot("k" + std::to_string(i)), kClusterSlots);
}

}  // namespace
}  // namespace kvtier
