// A secret kept in a file that only kvtierd's user may read: the tenant key
// (tenant_scope.h) and the remote tier's cluster key (remote_key_file.h).
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

}  // namespace kvtier
