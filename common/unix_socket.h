// Blocking helpers for Unix stream sockets and SCM_RIGHTS fd passing.
// All functions retry on EINTR. None of them owns the fds passed in.
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

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

// Most fds one message carries.
inline constexpr size_t kMaxPassedFds = 4;

// Sends `len` (> 0) bytes with `fds` (1..kMaxPassedFds) attached as
// SCM_RIGHTS. Returns the number of bytes sent (may be short on a
// non-blocking socket; the fds travel with the first byte), or IoError /
// Busy (EAGAIN before any byte).
Result<size_t> SendWithFds(int sock, const void* data, size_t len, std::span<const int> fds);

// Reads exactly `len` bytes; fds that arrive with them as SCM_RIGHTS are
// appended to *received in order (close-on-exec, owned by the caller).
Status ReadAllWithFds(int sock, void* data, size_t len, std::vector<int>* received);

// One recvmsg(2) of up to `len` bytes with `flags` (MSG_CMSG_CLOEXEC
// added); descriptors that arrive as SCM_RIGHTS (up to kMaxPassedFds) are
// appended to *received, owned by the caller. Returns what recvmsg
// returns (errno set on -1).
ssize_t RecvWithFds(int sock, void* data, size_t len, int flags, std::vector<int>* received);

}  // namespace kvtier
