// A secret kept in a file that only kvtierd's user may read: the tenant key
// (tenant_scope.h), the remote tier's cluster key (remote_key_file.h) and
// the metrics endpoint's bearer token (metrics_server.h).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "kvtier/result.h"

namespace kvtier {

// `bytes` random bytes from getrandom. IoError when it fails.
Result<std::string> RandomSecret(size_t bytes);

// The secret of `bytes` bytes in `path`, `what` naming it in errors ("the
// tenant key"). When `path` does not exist a fresh one is written to a
// temporary file of its own in the same directory (O_CREAT|O_EXCL|
// O_NOFOLLOW, mode 0600, fsynced) and published with link(2), which never
// replaces a file: nothing half-written is ever visible under `path`, and
// when another process publishes first, its secret is the one read.
// `*created` (when given) says whether this call made it. Errors, each
// naming the file:
//   InvalidArgument  a symbolic link, not a regular file, group or other
//                    permission bits set (0600 or 0400 expected), a size
//                    other than `bytes`;
//   IoError          cannot be opened, read, created or written.
Result<std::string> LoadOrCreateSecret(const std::string& path, size_t bytes, std::string_view what,
                                       bool* created = nullptr);

// A bearer token (printable text, RFC 6750's token68 characters) of
// kMinTokenBytes..kMaxTokenBytes bytes in `path`, one trailing newline
// (LF or CRLF) not part of it; the file is checked, and created when
// missing (64 hex digits of 32 random bytes and a newline), exactly as
// LoadOrCreateSecret's. InvalidArgument also for a token of another size or
// with other characters.
inline constexpr size_t kMinTokenBytes = 32;
inline constexpr size_t kMaxTokenBytes = 4096;
Result<std::string> LoadOrCreateToken(const std::string& path, std::string_view what, bool* created = nullptr);

}  // namespace kvtier
