// Blocking helpers for Unix stream sockets and SCM_RIGHTS fd passing.
// All functions retry on EINTR. None of them owns the fds passed in.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "kvtier/result.h"

namespace kvtier {

// Connects to the Unix stream socket at `path`. Unavailable if nothing
// listens there (ENOENT, ECONNREFUSED), InvalidArgument if the path is too
// long, IoError otherwise. The returned fd is blocking and close-on-exec.
Result<int> ConnectUnix(const std::string& path);

// Writes all `len` bytes. Unavailable if the peer closed, IoError otherwise.
Status WriteAll(int fd, const void* data, size_t len);

// Reads exactly `len` bytes. Unavailable on EOF before `len` bytes (the
// message says how many arrived), IoError otherwise.
Status ReadAll(int fd, void* data, size_t len);

// Sends `len` (> 0) bytes with `passed_fd` attached as SCM_RIGHTS. Returns
// the number of bytes sent (may be short on a non-blocking socket; the fd
// travels with the first byte), or IoError / Busy (EAGAIN before any byte).
Result<size_t> SendWithFd(int sock, const void* data, size_t len, int passed_fd);

// Reads exactly `len` bytes; if an fd arrives as SCM_RIGHTS with them it is
// stored in *received_fd (close-on-exec), else *received_fd is -1.
Status ReadAllWithFd(int sock, void* data, size_t len, int* received_fd);

}  // namespace kvtier
