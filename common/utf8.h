// UTF-8 checks and the safe shortening of client-supplied text for display
// (metric labels, log lines): never cut inside a character, never pass
// invalid bytes on. Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kvtier {

// Bytes of the well-formed character at the start of `text`, or 0 when it
// does not start with one (a stray continuation byte, an overlong form, a
// surrogate, a code point past U+10FFFF, a truncated sequence, or nothing).
size_t Utf8CharBytes(std::string_view text);

// Whether `text` is well-formed UTF-8 (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF).
bool IsValidUtf8(std::string_view text);

// The longest prefix of `text` of at most `max_bytes` bytes that ends on a
// character boundary. `text` should be valid UTF-8 (an invalid byte is
// taken as a one-byte character).
std::string_view Utf8Prefix(std::string_view text, size_t max_bytes);

// `text` as a Prometheus text-format label value (without the quotes):
// each invalid UTF-8 byte becomes U+FFFD, the result is cut to at most
// `max_bytes` characters' bytes before escaping (on a character boundary),
// then '\\', '"' and newline are escaped as "\\\\", "\\\"" and "\\n" and
// the other ASCII control characters become '_'. Always valid UTF-8.
std::string PrometheusLabelValue(std::string_view text, size_t max_bytes);

}  // namespace kvtier
