// Reading a small file the operator names (the config file) without ever
// blocking on what is not a file: a FIFO at the path would block open(2)
// and read(2) (and with them the thread that handles SIGTERM), a device
// such as /dev/zero would never end, a directory would read as empty.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kvtier/result.h"

namespace kvtier {

// The whole of the regular file at `path` (a symbolic link is followed to
// it), `what` naming it in errors ("config file"). Opened with O_NONBLOCK,
// so opening a FIFO returns at once, and checked with fstat before any
// read. Never blocks on anything but the file system. Errors, each naming
// the file:
//   InvalidArgument  not a regular file (a FIFO, a device, a directory, a
//                    socket), or larger than `max_bytes`;
//   IoError          cannot be opened or read.
Result<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes, std::string_view what);

}  // namespace kvtier
