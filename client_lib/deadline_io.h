// Socket I/O of the client library bounded by a deadline, so that a daemon
// which stops answering costs a caller at most its ClientOptions timeout.
// The blocking helpers of common/unix_socket.h wait forever; these poll.
// Internal. Stateless functions; none owns the fds passed in.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

#include "kvtier/result.h"

namespace kvtier::internal {

using Deadline = std::chrono::steady_clock::time_point;
inline constexpr Deadline kNoDeadline = Deadline::max();

// now + `timeout`; kNoDeadline for a timeout of 0 (wait forever).
Deadline DeadlineAfter(std::chrono::milliseconds timeout);

// The poll(2) timeout that ends at `deadline`: -1 for kNoDeadline, 0 once
// it has passed, else the milliseconds left rounded up.
int PollTimeoutMs(Deadline deadline);

// Connects to the Unix stream socket at `path`, waiting at most until
// `deadline` for room in the listener's backlog. Unavailable if nothing
// listens there, TimedOut if the backlog stayed full, InvalidArgument for a
// path that is too long, IoError otherwise. The fd is blocking and
// close-on-exec; the caller owns it.
Result<int> ConnectUnixBefore(const std::string& path, Deadline deadline);

// Writes all `len` bytes (never raising SIGPIPE). Unavailable if the peer
// closed, TimedOut if the socket accepted no more bytes by `deadline`
// (possibly after part of them went out), IoError otherwise.
Status SendAllBefore(int fd, const void* data, size_t len, Deadline deadline);

// Reads exactly `len` bytes; fds arriving with them as SCM_RIGHTS are
// appended to `*received` (close-on-exec, owned by the caller, also on
// error). Unavailable on EOF, TimedOut if the bytes did not all come by
// `deadline`, IoError otherwise.
Status ReadAllBefore(int fd, void* data, size_t len, std::vector<int>* received, Deadline deadline);

}  // namespace kvtier::internal
