#include "daemon/config/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace kvtier {
namespace {

const char* FileKind(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file";
}

}  // namespace

Result<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes, std::string_view what_view) {
  const std::string what(what_view);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return IoError("cannot read " + what + " " + path + ": " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return IoError("cannot stat " + what + " " + path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgument(what + " " + path + " is not a regular file (it is " + FileKind(st.st_mode) +
                           "); name a regular file");
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return InvalidArgument(what + " " + path + " holds " + std::to_string(st.st_size) + " bytes, larger than " +
                           std::to_string(max_bytes));
  }
  // Read to the end, never past max_bytes + 1: the file may grow meanwhile.
  std::string text(static_cast<size_t>(st.st_size) + 1, '\0');
  size_t got = 0;
  for (;;) {
    if (got == text.size()) {
      if (text.size() > max_bytes) {
        return InvalidArgument(what + " " + path + " grew larger than " + std::to_string(max_bytes) +
                               " bytes while read");
      }
      text.resize(std::min<uint64_t>(text.size() * 2, max_bytes + 1));
    }
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return IoError("cannot read " + what + " " + path + ": " + std::strerror(errno));
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  text.resize(got);
  return text;
}

}  // namespace kvtier
