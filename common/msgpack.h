// MessagePack (msgpack.org's specification), the subset KV events use:
// nil, booleans, integers, float64, strings, binaries, arrays and maps.
//
// MsgpackWriter appends values to a byte string in the smallest form the
// specification allows for each (what Python's msgpack and msgspec write,
// so a payload compares byte for byte with theirs). Containers are written
// as a header with their element count, then the elements.
//
// DecodeMsgpack parses one whole value into a tree, refusing (with
// InvalidArgument naming the offset) truncated input, trailing bytes, the
// types outside the subset (ext, float32 is accepted) and nesting deeper
// than kMaxDepth; every length is checked against the bytes left, so a
// hostile length never allocates more than the input's size.
//
// Thread-compatible values; no global state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "kvtier/result.h"

namespace kvtier {

class MsgpackWriter {
 public:
  void Nil();
  void Bool(bool v);
  void Int(int64_t v);  // non-negative values as unsigned, as the specification's encoders do
  void Uint(uint64_t v);
  void Double(double v);
  void Str(std::string_view v);
  void Bin(std::string_view bytes);
  void ArrayHeader(uint32_t count);
  void MapHeader(uint32_t count);

  const std::string& bytes() const { return out_; }
  std::string Take() { return std::move(out_); }
  size_t size() const { return out_.size(); }

 private:
  void Byte(uint8_t b) { out_.push_back(static_cast<char>(b)); }
  void BigEndian(uint64_t v, int bytes);
  std::string out_;
};

struct MsgpackValue;
struct MsgpackEntry;
using MsgpackArray = std::vector<MsgpackValue>;
using MsgpackMap = std::vector<MsgpackEntry>;  // in the order written

// A decoded value. Strings and binaries are both std::string, told apart
// by `is_binary`.
struct MsgpackValue {
  std::variant<std::monostate, bool, int64_t, uint64_t, double, std::string, MsgpackArray, MsgpackMap> v;
  bool is_binary = false;

  bool is_nil() const { return std::holds_alternative<std::monostate>(v); }
  const std::string* str() const { return std::get_if<std::string>(&v); }
  const MsgpackArray* array() const { return std::get_if<MsgpackArray>(&v); }
  const MsgpackMap* map() const { return std::get_if<MsgpackMap>(&v); }
  // An integer that fits int64_t (either stored form); nullptr otherwise.
  bool AsInt(int64_t* out) const;
  // The value of `key` in a map (the first such entry); nullptr when this
  // is no map or has no such key.
  const MsgpackValue* Find(std::string_view key) const;
};

struct MsgpackEntry {
  MsgpackValue key, value;
};

inline constexpr int kMsgpackMaxDepth = 32;
Result<MsgpackValue> DecodeMsgpack(std::string_view bytes);

}  // namespace kvtier
