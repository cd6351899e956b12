#include "daemon/config/secret_file.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

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

// The whole file, of `min_bytes`..`max_bytes` bytes, after the checks
// LoadOrCreateSecret states.
Result<std::string> ReadSecret(const std::string& path, int fd, size_t min_bytes, size_t max_bytes,
                               const std::string& what) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return IoError("cannot stat " + what + " " + path + ": " + Errno());
  if (!S_ISREG(st.st_mode)) return InvalidArgument(what + " " + path + " is not a regular file");
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return InvalidArgument(what + " " + path + " has mode " + mode +
                           ": group or others may read it; chmod 0600 it (whoever reads it holds the secret)");
  }
  if (st.st_size < static_cast<off_t>(min_bytes) || st.st_size > static_cast<off_t>(max_bytes)) {
    const std::string wanted = min_bytes == max_bytes ? std::to_string(min_bytes)
                                                      : std::to_string(min_bytes) + " to " + std::to_string(max_bytes);
    return InvalidArgument(what + " " + path + " holds " + std::to_string(st.st_size) + " bytes, not " + wanted);
  }
  std::string secret(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < secret.size()) {
    const ssize_t n = ::read(fd, secret.data() + got, secret.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return IoError("cannot read " + what + " " + path + ": " + Errno());
    if (n == 0) return InvalidArgument(what + " " + path + " was cut short while read");
    got += static_cast<size_t>(n);
  }
  return secret;
}

// Writes `secret` to a fresh temporary file beside `path` and links it in.
// AlreadyExists when `path` appeared meanwhile (the caller reads that one).
Status PublishSecret(const std::string& path, const std::string& secret, const std::string& what) {
  auto suffix = RandomSecret(8);
  if (!suffix.ok()) return suffix.status();
  char hex[17];
  for (size_t i = 0; i < 8; ++i) std::snprintf(hex + 2 * i, 3, "%02x", static_cast<unsigned char>((*suffix)[i]));
  const std::string temporary = path + ".tmp-" + hex;
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return IoError("cannot create " + what + " " + path + " (" + temporary + "): " + Errno());
  FdCloser closer{fd};
  size_t put = 0;
  while (put < secret.size()) {
    const ssize_t n = ::write(fd, secret.data() + put, secret.size() - put);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    put += static_cast<size_t>(n);
  }
  Status published = Status::Ok();
  if (put < secret.size() || ::fsync(fd) != 0) {
    published = IoError("cannot write " + what + " " + path + ": " + Errno());
  } else if (::link(temporary.c_str(), path.c_str()) != 0) {
    published = errno == EEXIST ? AlreadyExists(path) : IoError("cannot create " + what + " " + path + ": " + Errno());
  }
  ::unlink(temporary.c_str());
  return published;
}

}  // namespace

Result<std::string> RandomSecret(size_t bytes) {
  std::string secret(bytes, '\0');
  size_t filled = 0;
  while (filled < secret.size()) {
    const ssize_t n = ::getrandom(secret.data() + filled, secret.size() - filled, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return IoError("getrandom: " + Errno());
    filled += static_cast<size_t>(n);
  }
  return secret;
}

namespace {

// LoadOrCreateSecret's body: reads `path` (min_bytes..max_bytes) or, when
// it does not exist, publishes `fresh()` there.
template <typename Fresh>
Result<std::string> LoadOrCreate(const std::string& path, size_t min_bytes, size_t max_bytes, const std::string& what,
                                 bool* created, Fresh fresh) {
  if (created != nullptr) *created = false;
  if (path.empty()) return InvalidArgument("no file named for " + what);
  for (int attempt = 0; attempt < 2; ++attempt) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
      FdCloser closer{fd};
      return ReadSecret(path, fd, min_bytes, max_bytes, what);
    }
    if (errno == ELOOP) return InvalidArgument(what + " " + path + " is a symbolic link; name the file itself");
    if (errno != ENOENT) return IoError("cannot open " + what + " " + path + ": " + Errno());
    Result<std::string> secret = fresh();
    if (!secret.ok()) return secret.status();
    Status published = PublishSecret(path, *secret, what);
    if (published.ok()) {
      if (created != nullptr) *created = true;
      return secret;
    }
    if (published.code() != StatusCode::kAlreadyExists) return published;
  }
  return IoError(what + " " + path + " appeared and vanished while it was opened");
}

// A character of RFC 6750's b64token (token68): what a bearer token may hold.
bool TokenCharacter(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
         c == '_' || c == '~' || c == '+' || c == '/' || c == '=';
}

}  // namespace

Result<std::string> LoadOrCreateSecret(const std::string& path, size_t bytes, std::string_view what, bool* created) {
  return LoadOrCreate(path, bytes, bytes, std::string(what), created, [bytes] { return RandomSecret(bytes); });
}

Result<std::string> LoadOrCreateToken(const std::string& path, std::string_view what_view, bool* created) {
  const std::string what(what_view);
  auto text = LoadOrCreate(path, kMinTokenBytes, kMaxTokenBytes + 2, what, created, []() -> Result<std::string> {
    auto random = RandomSecret(kMinTokenBytes);
    if (!random.ok()) return random.status();
    std::string hex;
    for (char c : *random) {
      char two[3];
      std::snprintf(two, sizeof two, "%02x", static_cast<unsigned char>(c));
      hex += two;
    }
    return hex + "\n";
  });
  if (!text.ok()) return text.status();
  std::string token = std::move(*text);
  if (token.ends_with("\n")) token.pop_back();
  if (token.ends_with("\r")) token.pop_back();
  if (token.size() < kMinTokenBytes || token.size() > kMaxTokenBytes) {
    return InvalidArgument(what + " " + path + " holds a token of " + std::to_string(token.size()) + " bytes, not " +
                           std::to_string(kMinTokenBytes) + " to " + std::to_string(kMaxTokenBytes));
  }
  for (char c : token) {
    if (!TokenCharacter(c)) {
      return InvalidArgument(what + " " + path +
                             " holds a character a bearer token may not carry (letters, digits and -._~+/= only; "
                             "one trailing newline is allowed)");
    }
  }
  return token;
}

}  // namespace kvtier
