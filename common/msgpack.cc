#include "common/msgpack.h"

#include <bit>
#include <cstring>
#include <limits>

namespace kvtier {

void MsgpackWriter::BigEndian(uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) Byte(static_cast<uint8_t>(v >> (8 * i)));
}

void MsgpackWriter::Nil() { Byte(0xc0); }

void MsgpackWriter::Bool(bool v) { Byte(v ? 0xc3 : 0xc2); }

void MsgpackWriter::Uint(uint64_t v) {
  if (v < 0x80) {
    Byte(static_cast<uint8_t>(v));
  } else if (v <= 0xff) {
    Byte(0xcc), BigEndian(v, 1);
  } else if (v <= 0xffff) {
    Byte(0xcd), BigEndian(v, 2);
  } else if (v <= 0xffffffffull) {
    Byte(0xce), BigEndian(v, 4);
  } else {
    Byte(0xcf), BigEndian(v, 8);
  }
}

void MsgpackWriter::Int(int64_t v) {
  if (v >= 0) return Uint(static_cast<uint64_t>(v));
  if (v >= -32) {
    Byte(static_cast<uint8_t>(v));
  } else if (v >= std::numeric_limits<int8_t>::min()) {
    Byte(0xd0), BigEndian(static_cast<uint64_t>(v), 1);
  } else if (v >= std::numeric_limits<int16_t>::min()) {
    Byte(0xd1), BigEndian(static_cast<uint64_t>(v), 2);
  } else if (v >= std::numeric_limits<int32_t>::min()) {
    Byte(0xd2), BigEndian(static_cast<uint64_t>(v), 4);
  } else {
    Byte(0xd3), BigEndian(static_cast<uint64_t>(v), 8);
  }
}

void MsgpackWriter::Double(double v) {
  Byte(0xcb);
  BigEndian(std::bit_cast<uint64_t>(v), 8);
}

void MsgpackWriter::Str(std::string_view v) {
  const uint64_t n = v.size();
  if (n < 32) {
    Byte(static_cast<uint8_t>(0xa0 | n));
  } else if (n <= 0xff) {
    Byte(0xd9), BigEndian(n, 1);
  } else if (n <= 0xffff) {
    Byte(0xda), BigEndian(n, 2);
  } else {
    Byte(0xdb), BigEndian(n, 4);
  }
  out_.append(v);
}

void MsgpackWriter::Bin(std::string_view bytes) {
  const uint64_t n = bytes.size();
  if (n <= 0xff) {
    Byte(0xc4), BigEndian(n, 1);
  } else if (n <= 0xffff) {
    Byte(0xc5), BigEndian(n, 2);
  } else {
    Byte(0xc6), BigEndian(n, 4);
  }
  out_.append(bytes);
}

void MsgpackWriter::ArrayHeader(uint32_t count) {
  if (count < 16) {
    Byte(static_cast<uint8_t>(0x90 | count));
  } else if (count <= 0xffff) {
    Byte(0xdc), BigEndian(count, 2);
  } else {
    Byte(0xdd), BigEndian(count, 4);
  }
}

void MsgpackWriter::MapHeader(uint32_t count) {
  if (count < 16) {
    Byte(static_cast<uint8_t>(0x80 | count));
  } else if (count <= 0xffff) {
    Byte(0xde), BigEndian(count, 2);
  } else {
    Byte(0xdf), BigEndian(count, 4);
  }
}

bool MsgpackValue::AsInt(int64_t* out) const {
  if (const auto* i = std::get_if<int64_t>(&v)) return *out = *i, true;
  if (const auto* u = std::get_if<uint64_t>(&v); u && *u <= uint64_t(std::numeric_limits<int64_t>::max())) {
    return *out = static_cast<int64_t>(*u), true;
  }
  return false;
}

const MsgpackValue* MsgpackValue::Find(std::string_view key) const {
  const MsgpackMap* m = map();
  if (m == nullptr) return nullptr;
  for (const auto& [k, value] : *m) {
    if (const std::string* s = k.str(); s != nullptr && !k.is_binary && *s == key) return &value;
  }
  return nullptr;
}

namespace {

// A cursor over the input; every read checks the bytes left.
class Decoder {
 public:
  explicit Decoder(std::string_view in) : in_(in) {}

  Result<MsgpackValue> Value(int depth);
  size_t offset() const { return pos_; }
  bool done() const { return pos_ == in_.size(); }

 private:
  Status Short() const { return InvalidArgument("msgpack: truncated at byte " + std::to_string(pos_)); }
  bool Take(size_t n, uint64_t* out) {
    if (in_.size() - pos_ < n) return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v = (v << 8) | static_cast<uint8_t>(in_[pos_ + i]);
    pos_ += n;
    *out = v;
    return true;
  }
  Result<MsgpackValue> Bytes(uint64_t n, bool binary);
  Result<MsgpackValue> Array(uint64_t n, int depth);
  Result<MsgpackValue> Map(uint64_t n, int depth);
  Result<MsgpackValue> Sized(uint8_t tag, int depth);

  std::string_view in_;
  size_t pos_ = 0;
};

Result<MsgpackValue> Decoder::Bytes(uint64_t n, bool binary) {
  if (in_.size() - pos_ < n) return Short();
  MsgpackValue out;
  out.v = std::string(in_.substr(pos_, n));
  out.is_binary = binary;
  pos_ += n;
  return out;
}

Result<MsgpackValue> Decoder::Array(uint64_t n, int depth) {
  // Every element takes at least one byte: a count beyond the input is a lie.
  if (in_.size() - pos_ < n) return Short();
  MsgpackArray items;
  items.reserve(n);
  for (uint64_t i = 0; i < n; ++i) {
    Result<MsgpackValue> item = Value(depth + 1);
    if (!item.ok()) return item.status();
    items.push_back(std::move(*item));
  }
  MsgpackValue out;
  out.v = std::move(items);
  return out;
}

Result<MsgpackValue> Decoder::Map(uint64_t n, int depth) {
  if ((in_.size() - pos_) / 2 < n) return Short();
  MsgpackMap entries;
  entries.reserve(n);
  for (uint64_t i = 0; i < n; ++i) {
    Result<MsgpackValue> key = Value(depth + 1);
    if (!key.ok()) return key.status();
    Result<MsgpackValue> value = Value(depth + 1);
    if (!value.ok()) return value.status();
    entries.push_back(MsgpackEntry{std::move(*key), std::move(*value)});
  }
  MsgpackValue out;
  out.v = std::move(entries);
  return out;
}

// The tags 0xc0..0xdf.
Result<MsgpackValue> Decoder::Sized(uint8_t tag, int depth) {
  MsgpackValue out;
  uint64_t n = 0;
  switch (tag) {
    case 0xc0:
      return out;
    case 0xc2:
      out.v = false;
      return out;
    case 0xc3:
      out.v = true;
      return out;
    case 0xc4:
    case 0xc5:
    case 0xc6:
      if (!Take(size_t{1} << (tag - 0xc4), &n)) return Short();
      return Bytes(n, true);
    case 0xca:
      if (!Take(4, &n)) return Short();
      out.v = double{std::bit_cast<float>(static_cast<uint32_t>(n))};
      return out;
    case 0xcb:
      if (!Take(8, &n)) return Short();
      out.v = std::bit_cast<double>(n);
      return out;
    case 0xcc:
    case 0xcd:
    case 0xce:
    case 0xcf:
      if (!Take(size_t{1} << (tag - 0xcc), &n)) return Short();
      out.v = n;
      return out;
    case 0xd0:
    case 0xd1:
    case 0xd2:
    case 0xd3: {
      const int bytes = 1 << (tag - 0xd0);
      if (!Take(bytes, &n)) return Short();
      const int shift = 64 - 8 * bytes;  // sign-extend
      out.v = shift == 0 ? static_cast<int64_t>(n) : static_cast<int64_t>(n << shift) >> shift;
      return out;
    }
    case 0xd9:
    case 0xda:
    case 0xdb:
      if (!Take(size_t{1} << (tag - 0xd9), &n)) return Short();
      return Bytes(n, false);
    case 0xdc:
    case 0xdd:
      if (!Take(tag == 0xdc ? 2 : 4, &n)) return Short();
      return Array(n, depth);
    case 0xde:
    case 0xdf:
      if (!Take(tag == 0xde ? 2 : 4, &n)) return Short();
      return Map(n, depth);
    default:
      return InvalidArgument("msgpack: unsupported type 0x" + std::to_string(tag) + " at byte " +
                             std::to_string(pos_ - 1));
  }
}

Result<MsgpackValue> Decoder::Value(int depth) {
  if (depth > kMsgpackMaxDepth)
    return InvalidArgument("msgpack: nested deeper than " + std::to_string(kMsgpackMaxDepth));
  uint64_t tag64 = 0;
  if (!Take(1, &tag64)) return Short();
  const auto tag = static_cast<uint8_t>(tag64);
  MsgpackValue out;
  if (tag < 0x80) return out.v = uint64_t{tag}, out;
  if (tag >= 0xe0) return out.v = int64_t{static_cast<int8_t>(tag)}, out;
  if (tag < 0x90) return Map(tag & 0x0f, depth);
  if (tag < 0xa0) return Array(tag & 0x0f, depth);
  if (tag < 0xc0) return Bytes(tag & 0x1f, false);
  return Sized(tag, depth);
}

}  // namespace

Result<MsgpackValue> DecodeMsgpack(std::string_view bytes) {
  Decoder d(bytes);
  Result<MsgpackValue> v = d.Value(0);
  if (!v.ok()) return v;
  if (!d.done())
    return InvalidArgument("msgpack: " + std::to_string(bytes.size() - d.offset()) + " bytes after the value");
  return v;
}

}  // namespace kvtier
