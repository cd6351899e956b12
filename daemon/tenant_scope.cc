#include "daemon/tenant_scope.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

namespace kvtier {

uint32_t TenantScope::TagOf(std::string_view name) {
  const std::string domain = std::string("kvtier tenant tag\0", 18) + std::string(name);
  return static_cast<uint32_t>(XXH3_64bits(domain.data(), domain.size()));
}

TenantScope::TenantScope(std::string_view secret, std::string_view name) : tag_(TagOf(name)) {
  for (size_t i = 0; i < round_keys_.size(); ++i) {
    std::string material = std::string("kvtier tenant key round\0", 24);
    material += static_cast<char>(i);
    material += secret;
    material += '\0';
    material += name;
    round_keys_[i] = XXH3_64bits(material.data(), material.size());
  }
}

NamespaceFingerprint TenantScope::ScopeNamespace(const NamespaceFingerprint& fingerprint) const {
  NamespaceFingerprint scoped = fingerprint;
  scoped.hi = (static_cast<uint64_t>(tag_) << 32) | (fingerprint.hi & 0xffffffffULL);
  return scoped;
}

uint64_t TenantScope::Round(int round, uint64_t half) const {
  return XXH3_64bits_withSeed(&half, sizeof half, round_keys_[static_cast<size_t>(round)]);
}

BlockKey TenantScope::Scope(const BlockKey& key) const {
  uint64_t left = key.hi, right = key.lo;
  for (int r = 0; r < 4; ++r) {
    const uint64_t next = left ^ Round(r, right);
    left = right;
    right = next;
  }
  return BlockKey{left, right};
}

BlockKey TenantScope::Unscope(const BlockKey& scoped) const {
  uint64_t left = scoped.hi, right = scoped.lo;
  for (int r = 3; r >= 0; --r) {
    const uint64_t previous = right ^ Round(r, left);
    right = left;
    left = previous;
  }
  return BlockKey{left, right};
}

namespace {

Result<std::string> RandomKey() {
  std::string key(kTenantKeyBytes, '\0');
  size_t filled = 0;
  while (filled < key.size()) {
    const ssize_t n = ::getrandom(key.data() + filled, key.size() - filled, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return IoError(std::string("getrandom: ") + std::strerror(errno));
    filled += static_cast<size_t>(n);
  }
  return key;
}

Result<std::string> ReadKey(const std::string& path, int fd) {
  std::string key(kTenantKeyBytes, '\0');
  size_t got = 0;
  while (got < key.size()) {
    const ssize_t n = ::read(fd, key.data() + got, key.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return IoError("cannot read the tenant key " + path + ": " + std::strerror(errno));
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got < key.size()) {
    return InvalidArgument("the tenant key " + path + " holds " + std::to_string(got) + " bytes, not " +
                           std::to_string(kTenantKeyBytes));
  }
  return key;
}

Status WriteKey(const std::string& path, const std::string& key) {
  const std::string temporary = path + ".tmp";
  // A leftover from a crash is removed (a symlink planted there goes, not
  // its target); O_EXCL | O_NOFOLLOW then create a file of our own only.
  ::unlink(temporary.c_str());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return IoError("cannot create the tenant key " + temporary + ": " + std::strerror(errno));
  const bool written = ::write(fd, key.data(), key.size()) == static_cast<ssize_t>(key.size()) && ::fsync(fd) == 0;
  const int saved = errno;
  ::close(fd);
  if (!written || ::rename(temporary.c_str(), path.c_str()) != 0) {
    ::unlink(temporary.c_str());
    return IoError("cannot write the tenant key " + path + ": " + std::strerror(written ? errno : saved));
  }
  return Status::Ok();
}

}  // namespace

Result<std::string> LoadTenantKey(const std::string& path) {
  if (path.empty()) return RandomKey();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd >= 0) {
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (st.st_mode & 077) != 0) {
      ::close(fd);
      return PermissionDenied("the tenant key " + path + " must be a regular file that only its owner may read "
                              "(mode 0600)");
    }
    auto key = ReadKey(path, fd);
    ::close(fd);
    return key;
  }
  if (errno == ELOOP) return PermissionDenied("the tenant key " + path + " is a symlink; kvtierd does not follow it");
  if (errno != ENOENT) return IoError("cannot open the tenant key " + path + ": " + std::strerror(errno));
  auto key = RandomKey();
  if (!key.ok()) return key.status();
  Status written = WriteKey(path, *key);
  if (!written.ok()) return written;
  return key;
}

}  // namespace kvtier
