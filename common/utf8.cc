#include "common/utf8.h"

#include <cstdint>

namespace kvtier {

size_t Utf8CharBytes(std::string_view text) {
  if (text.empty()) return 0;
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const auto continuation = [&](size_t i) { return i < text.size() && (byte(i) & 0xc0) == 0x80; };
  const uint8_t lead = byte(0);
  if (lead < 0x80) return 1;
  if (lead >= 0xc2 && lead <= 0xdf) return continuation(1) ? 2 : 0;
  if (lead >= 0xe0 && lead <= 0xef) {
    if (!continuation(1) || !continuation(2)) return 0;
    if (lead == 0xe0 && byte(1) < 0xa0) return 0;   // overlong
    if (lead == 0xed && byte(1) >= 0xa0) return 0;  // surrogate
    return 3;
  }
  if (lead >= 0xf0 && lead <= 0xf4) {
    if (!continuation(1) || !continuation(2) || !continuation(3)) return 0;
    if (lead == 0xf0 && byte(1) < 0x90) return 0;   // overlong
    if (lead == 0xf4 && byte(1) >= 0x90) return 0;  // above U+10FFFF
    return 4;
  }
  return 0;
}

bool IsValidUtf8(std::string_view text) {
  while (!text.empty()) {
    const size_t n = Utf8CharBytes(text);
    if (n == 0) return false;
    text.remove_prefix(n);
  }
  return true;
}

std::string_view Utf8Prefix(std::string_view text, size_t max_bytes) {
  size_t end = 0;
  while (end < text.size()) {
    const size_t n = Utf8CharBytes(text.substr(end));
    const size_t step = n == 0 ? 1 : n;
    if (end + step > max_bytes) break;
    end += step;
  }
  return text.substr(0, end);
}

std::string PrometheusLabelValue(std::string_view text, size_t max_bytes) {
  static constexpr std::string_view kReplacement = "\xef\xbf\xbd";  // U+FFFD
  std::string out;
  size_t kept = 0;  // bytes of `out` before escaping
  while (!text.empty()) {
    const size_t n = Utf8CharBytes(text);
    const std::string_view ch = n == 0 ? kReplacement : text.substr(0, n);
    if (kept + ch.size() > max_bytes) break;
    kept += ch.size();
    text.remove_prefix(n == 0 ? 1 : n);
    if (ch == "\\") {
      out += "\\\\";
    } else if (ch == "\"") {
      out += "\\\"";
    } else if (ch == "\n") {
      out += "\\n";
    } else if (ch.size() == 1 && (static_cast<uint8_t>(ch[0]) < 0x20 || ch[0] == 0x7f)) {
      out += '_';
    } else {
      out += ch;
    }
  }
  return out;
}

}  // namespace kvtier
