#include "daemon/remote_key_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tiers/remote/value_mac.h"

namespace kvtier {
namespace {

std::string Errno() { return std::strerror(errno); }

// Closes a descriptor when it leaves scope.
struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

Result<std::string> ReadKey(const std::string& path, int fd) {
  struct stat st{};
  if (::fstat(fd, &st) != 0) return IoError("cannot stat the remote key " + path + ": " + Errno());
  if (!S_ISREG(st.st_mode)) return InvalidArgument("the remote key " + path + " is not a regular file");
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return InvalidArgument("the remote key " + path + " has mode " + mode +
                           ": group or others may use it; chmod 0600 it (whoever reads it can forge values)");
  }
  if (st.st_size != static_cast<off_t>(kClusterSecretBytes)) {
    return InvalidArgument("the remote key " + path + " holds " + std::to_string(st.st_size) + " bytes, not " +
                           std::to_string(kClusterSecretBytes) + " (copy the cluster's key file here, or remove it "
                           "to generate a new one)");
  }
  std::string key(kClusterSecretBytes, '\0');
  size_t got = 0;
  while (got < key.size()) {
    const ssize_t n = ::read(fd, key.data() + got, key.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return IoError("cannot read the remote key " + path + ": " + Errno());
    if (n == 0) return InvalidArgument("the remote key " + path + " was cut short while read");
    got += static_cast<size_t>(n);
  }
  return key;
}

Result<std::string> RandomKey() {
  std::string key(kClusterSecretBytes, '\0');
  size_t filled = 0;
  while (filled < key.size()) {
    const ssize_t n = ::getrandom(key.data() + filled, key.size() - filled, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return IoError("getrandom: " + Errno());
    filled += static_cast<size_t>(n);
  }
  return key;
}

// Creates `path` holding a fresh key. EEXIST (another process made it
// meanwhile) comes back as AlreadyExists so the caller reads that one.
Result<std::string> CreateKey(const std::string& path) {
  auto key = RandomKey();
  if (!key.ok()) return key.status();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST) return AlreadyExists(path);
  if (fd < 0) return IoError("cannot create the remote key " + path + ": " + Errno());
  FdCloser closer{fd};
  size_t put = 0;
  while (put < key->size()) {
    const ssize_t n = ::write(fd, key->data() + put, key->size() - put);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    put += static_cast<size_t>(n);
  }
  if (put < key->size() || ::fsync(fd) != 0) {
    const std::string why = Errno();
    ::unlink(path.c_str());
    return IoError("cannot write the remote key " + path + ": " + why);
  }
  spdlog::warn("remote tier: created a new cluster key {}; every node of this cluster needs a copy of it "
               "(remote.key_file, mode 0600), else it misses the others' values",
               path);
  return key;
}

}  // namespace

Result<std::string> LoadRemoteKey(const std::string& path) {
  if (path.empty()) return InvalidArgument("no remote key file named");
  for (int attempt = 0; attempt < 2; ++attempt) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
      FdCloser closer{fd};
      return ReadKey(path, fd);
    }
    if (errno == ELOOP) return InvalidArgument("the remote key " + path + " is a symbolic link; name the file itself");
    if (errno != ENOENT) return IoError("cannot open the remote key " + path + ": " + Errno());
    auto created = CreateKey(path);
    if (created.status().code() != StatusCode::kAlreadyExists) return created;
  }
  return IoError("the remote key " + path + " appeared and vanished while it was opened");
}

}  // namespace kvtier
