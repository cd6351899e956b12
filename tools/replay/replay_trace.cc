#include "tools/replay/replay_trace.h"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <optional>
#include <string_view>

namespace kvtier::tools {
namespace {

// A reader of one JSON object per line, just enough for block traces:
// objects, arrays, strings, numbers, true/false/null. Values the trace
// needs (unsigned integers and arrays of them) are returned; the others
// are checked and skipped.
class LineParser {
 public:
  explicit LineParser(std::string_view text) : s_(text) {}

  struct Fields {
    std::optional<uint64_t> timestamp, input_length, output_length, session;
    std::optional<std::vector<uint64_t>> hash_ids;
  };

  // Fills `out` from one object; the error names what is wrong.
  Status ParseObject(Fields& out) {
    Skip();
    if (!Eat('{')) return Error("expected a JSON object");
    Skip();
    if (Eat('}')) return Status::Ok();
    for (;;) {
      std::string key;
      if (Status s = ParseString(&key); !s.ok()) return s;
      Skip();
      if (!Eat(':')) return Error("expected ':' after \"" + key + "\"");
      Skip();
      Status s = Status::Ok();
      if (key == "timestamp") {
        s = ParseUnsigned(key, out.timestamp);
      } else if (key == "input_length") {
        s = ParseUnsigned(key, out.input_length);
      } else if (key == "output_length") {
        s = ParseUnsigned(key, out.output_length);
      } else if (key == "session") {
        s = ParseUnsigned(key, out.session);
      } else if (key == "hash_ids") {
        s = ParseIds(out.hash_ids);
      } else {
        s = SkipValue(0);
      }
      if (!s.ok()) return s;
      Skip();
      if (Eat('}')) break;
      if (!Eat(',')) return Error("expected ',' or '}'");
      Skip();
    }
    Skip();
    if (pos_ != s_.size()) return Error("text after the object");
    return Status::Ok();
  }

 private:
  Status Error(const std::string& what) const {
    return InvalidArgument(what + " (column " + std::to_string(pos_ + 1) + ")");
  }
  void Skip() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool Eat(char c) {
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  Status ParseString(std::string* out) {
    if (!Eat('"')) return Error("expected a string");
    while (pos_ < s_.size() && s_[pos_] != '"') {
      if (s_[pos_] == '\\') {
        if (++pos_ >= s_.size()) break;
        if (s_[pos_] == 'u') pos_ += 4;  // kept as-is: keys we read are ASCII
      }
      if (out != nullptr && pos_ < s_.size()) out->push_back(s_[pos_]);
      ++pos_;
    }
    if (!Eat('"')) return Error("unterminated string");
    return Status::Ok();
  }
  // A JSON number: its text, checked for shape.
  Status ParseNumber(std::string_view* text) {
    const size_t start = pos_;
    if (pos_ < s_.size() && (s_[pos_] == '-' || s_[pos_] == '+')) ++pos_;
    while (pos_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '.' ||
                                s_[pos_] == 'e' || s_[pos_] == 'E' || s_[pos_] == '-' || s_[pos_] == '+')) {
      ++pos_;
    }
    if (pos_ == start) return Error("expected a number");
    *text = s_.substr(start, pos_ - start);
    return Status::Ok();
  }
  Status ToUnsigned(const std::string& name, std::string_view text, uint64_t* out) {
    if (text.empty() || text[0] == '-') return Error("\"" + name + "\" is negative: " + std::string(text));
    uint64_t v = 0;
    for (char c : text) {
      if (!std::isdigit(static_cast<unsigned char>(c))) {
        return Error("\"" + name + "\" must be a whole number, got " + std::string(text));
      }
      if (v > (UINT64_MAX - 9) / 10) return Error("\"" + name + "\" is too large");
      v = v * 10 + uint64_t(c - '0');
    }
    *out = v;
    return Status::Ok();
  }
  Status ParseUnsigned(const std::string& name, std::optional<uint64_t>& out) {
    std::string_view text;
    if (Status s = ParseNumber(&text); !s.ok()) return Error("\"" + name + "\" must be a number");
    uint64_t v = 0;
    if (Status s = ToUnsigned(name, text, &v); !s.ok()) return s;
    out = v;
    return Status::Ok();
  }
  Status ParseIds(std::optional<std::vector<uint64_t>>& out) {
    if (!Eat('[')) return Error("\"hash_ids\" must be an array");
    std::vector<uint64_t> ids;
    Skip();
    if (!Eat(']')) {
      for (;;) {
        Skip();
        std::string_view text;
        if (Status s = ParseNumber(&text); !s.ok()) return Error("\"hash_ids\" entries must be numbers");
        uint64_t v = 0;
        if (Status s = ToUnsigned("hash_ids", text, &v); !s.ok()) return s;
        ids.push_back(v);
        Skip();
        if (Eat(']')) break;
        if (!Eat(',')) return Error("expected ',' or ']' in \"hash_ids\"");
      }
    }
    out = std::move(ids);
    return Status::Ok();
  }
  Status SkipValue(int depth) {
    if (depth > 64) return Error("nested too deeply");
    Skip();
    if (pos_ >= s_.size()) return Error("expected a value");
    const char c = s_[pos_];
    if (c == '"') return ParseString(nullptr);
    if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      ++pos_;
      Skip();
      if (Eat(close)) return Status::Ok();
      for (;;) {
        if (c == '{') {
          if (Status s = ParseString(nullptr); !s.ok()) return s;
          Skip();
          if (!Eat(':')) return Error("expected ':'");
        }
        if (Status s = SkipValue(depth + 1); !s.ok()) return s;
        Skip();
        if (Eat(close)) return Status::Ok();
        if (!Eat(',')) return Error(std::string("expected ',' or '") + close + "'");
        Skip();
      }
    }
    for (std::string_view word : {"true", "false", "null"}) {
      if (s_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return Status::Ok();
      }
    }
    std::string_view number;
    return ParseNumber(&number);
  }

  std::string_view s_;
  size_t pos_ = 0;
};

// Sessions are namespaced per file above this (trace_index << 48).
constexpr uint64_t kMaxSession = uint64_t{1} << 48;

}  // namespace

Result<Trace> ReadMooncakeTrace(const std::string& path, uint32_t block_tokens, uint64_t trace_index,
                                bool require_session) {
  if (block_tokens == 0) return InvalidArgument("block tokens must be at least 1");
  std::ifstream in(path);
  if (!in) return NotFound(path + ": cannot open the trace");
  Trace trace;
  trace.path = path;
  trace.block_tokens = block_tokens;
  std::string line;
  uint64_t line_no = 0;
  const uint64_t ns = 0x7a6e'0000'0000'0000ull | trace_index;  // the trace's block namespace
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines
    LineParser parser(line);
    LineParser::Fields f;
    Status s = parser.ParseObject(f);
    const std::string where = path + ":" + std::to_string(line_no) + ": ";
    if (!s.ok()) return InvalidArgument(where + s.message());
    for (const auto& [name, present] : {std::pair<const char*, bool>{"timestamp", f.timestamp.has_value()},
                                        {"input_length", f.input_length.has_value()},
                                        {"hash_ids", f.hash_ids.has_value()}}) {
      if (!present) return InvalidArgument(where + "missing field \"" + name + "\"");
    }
    if (require_session && !f.session) {
      return InvalidArgument(where + "missing field \"session\" (the converted ShareGPT form names each conversation)");
    }
    // 0 is "no conversation" (TraceRequest::session), which a line of the
    // converted form cannot mean; past 2^48 the file's index (bits 48 and
    // up) could no longer keep conversations of different files apart.
    if (require_session && *f.session == 0) {
      return InvalidArgument(where +
                             "\"session\" must be at least 1 (the converted ShareGPT form numbers them from 1)");
    }
    if (f.session.value_or(0) >= kMaxSession) {
      return InvalidArgument(where + "\"session\" is too large (at most 2^48 - 1)");
    }
    TraceRequest r;
    if (*f.timestamp > UINT64_MAX / 1000) return InvalidArgument(where + "\"timestamp\" is too large");
    r.arrival_us = *f.timestamp * 1000;
    r.input_tokens = *f.input_length;
    r.output_tokens = f.output_length.value_or(0);
    // Conversations are namespaced per file like the blocks.
    r.session = f.session.value_or(0) == 0 ? 0 : (trace_index << 48) | *f.session;
    // Rounded up without the overflow of (n + b - 1) / b near 2^64.
    const uint64_t covered = r.input_tokens / block_tokens + (r.input_tokens % block_tokens != 0 ? 1 : 0);
    if (f.hash_ids->size() > covered) {
      return InvalidArgument(where + std::to_string(f.hash_ids->size()) + " hash_ids but input_length " +
                             std::to_string(r.input_tokens) + " fills only " + std::to_string(covered) + " blocks of " +
                             std::to_string(block_tokens) + " tokens");
    }
    r.blocks.reserve(f.hash_ids->size());
    for (uint64_t id : *f.hash_ids) r.blocks.push_back(BlockKey{ns, id});
    trace.requests.push_back(std::move(r));
  }
  if (in.bad()) return IoError(path + ": read failed");
  return trace;
}

}  // namespace kvtier::tools
