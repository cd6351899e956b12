// common/msgpack.h: the writer's bytes are the smallest forms, as Python's
// msgpack writes them (the expected bytes below are what
// `msgpack.packb(..., use_bin_type=True)` printed for the same values), and
// the decoder reads them back and refuses malformed input.
#include "common/msgpack.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>

namespace kvtier {
namespace {

std::string Hex(const std::string& bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) out += {kDigits[c >> 4], kDigits[c & 15]};
  return out;
}

std::string Unhex(std::string_view hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  return out;
}

TEST(Msgpack, WritesTheSmallestFormOfEachValueAsPythonDoes) {
  MsgpackWriter w;
  w.ArrayHeader(20);
  w.Nil();
  w.Bool(true);
  w.Bool(false);
  for (int64_t v :
       {0ll, 127ll, 128ll, 255ll, 256ll, 65536ll, 1ll << 32, -1ll, -32ll, -33ll, -129ll, -40000ll, -(1ll << 31) - 1}) {
    w.Int(v);
  }
  w.Double(1.5);
  w.Str("ab");
  w.Bin(std::string("\x01\x02", 2));
  w.MapHeader(1);
  w.Str("k");
  w.ArrayHeader(1);
  w.Uint(1);
  EXPECT_EQ(Hex(w.bytes()),
            "dc0014c0c3c2007fcc80ccffcd0100ce00010000cf0000000100000000ffe0d0dfd1ff7fd2ffff63c0d3ffffffff7fffffffcb3ff8"
            "000000000000a26162c402010281a16b9101");
}

TEST(Msgpack, LongerStringsArraysAndMapsTakeTheirWiderHeaders) {
  MsgpackWriter s, a, m;
  s.Str(std::string(40, 'x'));
  a.ArrayHeader(20);
  m.MapHeader(17);
  EXPECT_EQ(Hex(s.bytes()).substr(0, 8), "d9287878");
  EXPECT_EQ(Hex(a.bytes()), "dc0014");
  EXPECT_EQ(Hex(m.bytes()), "de0011");
}

TEST(Msgpack, DecodesWhatItWrites) {
  MsgpackWriter w;
  w.MapHeader(4);
  w.Str("ts");
  w.Double(12.25);
  w.Str("events");
  w.ArrayHeader(2);
  w.Int(-5);
  w.Uint(std::numeric_limits<uint64_t>::max());
  w.Str("hash");
  w.Bin(std::string(16, '\xab'));
  w.Str("none");
  w.Nil();
  Result<MsgpackValue> v = DecodeMsgpack(w.bytes());
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  const MsgpackValue* ts = v->Find("ts");
  ASSERT_NE(ts, nullptr);
  EXPECT_EQ(std::get<double>(ts->v), 12.25);
  const MsgpackArray* events = v->Find("events")->array();
  ASSERT_NE(events, nullptr);
  int64_t first = 0;
  ASSERT_TRUE((*events)[0].AsInt(&first));
  EXPECT_EQ(first, -5);
  int64_t too_big = 0;
  EXPECT_FALSE((*events)[1].AsInt(&too_big));
  EXPECT_EQ(std::get<uint64_t>((*events)[1].v), std::numeric_limits<uint64_t>::max());
  EXPECT_TRUE(v->Find("hash")->is_binary);
  EXPECT_EQ(*v->Find("hash")->str(), std::string(16, '\xab'));
  EXPECT_TRUE(v->Find("none")->is_nil());
  EXPECT_EQ(v->Find("missing"), nullptr);
}

TEST(Msgpack, DecodesPythonsBytes) {
  Result<MsgpackValue> v = DecodeMsgpack(Unhex("93d1ff7fd2ffff63c0ca3fc00000"));  // [-129, -40000, float32 1.5]
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  int64_t a = 0, b = 0;
  ASSERT_TRUE((*v->array())[0].AsInt(&a));
  ASSERT_TRUE((*v->array())[1].AsInt(&b));
  EXPECT_EQ(a, -129);
  EXPECT_EQ(b, -40000);
  EXPECT_EQ(std::get<double>((*v->array())[2].v), 1.5);
}

TEST(Msgpack, RefusesTruncatedTrailingHostileAndDeepInput) {
  EXPECT_FALSE(DecodeMsgpack("").ok());
  EXPECT_FALSE(DecodeMsgpack(Unhex("92c0")).ok());          // an array of 2 with one element
  EXPECT_FALSE(DecodeMsgpack(Unhex("c0c0")).ok());          // bytes after the value
  EXPECT_FALSE(DecodeMsgpack(Unhex("dbffffffff61")).ok());  // a 4 GiB string in 6 bytes
  EXPECT_FALSE(DecodeMsgpack(Unhex("ddffffffff")).ok());    // 4 billion elements promised
  EXPECT_FALSE(DecodeMsgpack(Unhex("d40100")).ok());        // fixext: outside the subset
  EXPECT_FALSE(DecodeMsgpack(std::string(kMsgpackMaxDepth + 2, '\x91') + '\xc0').ok());
  EXPECT_TRUE(DecodeMsgpack(std::string(kMsgpackMaxDepth, '\x91') + '\xc0').ok());
}

}  // namespace
}  // namespace kvtier
