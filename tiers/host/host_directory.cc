#include "tiers/host/host_directory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <string>

namespace kvtier {
namespace {

constexpr uint32_t kMinDefaultSlots = 1024;
constexpr uint32_t kMaxDefaultSlots = 1u << 24;
constexpr uint32_t kMaxSlots = 1u << 26;
constexpr uint64_t kBytesPerDefaultSlot = 48 * 1024;  // 64 KiB blocks at the 3/4 load limit

Status SysError(const char* what) {
  return IoError(std::string(what) + " of the block directory: " + std::strerror(errno));
}

}  // namespace

uint32_t HostDirectory::DefaultSlots(uint64_t arena_bytes) {
  const uint64_t wanted = std::clamp<uint64_t>(arena_bytes / kBytesPerDefaultSlot, kMinDefaultSlots, kMaxDefaultSlots);
  return static_cast<uint32_t>(std::bit_ceil(wanted));
}

Result<std::unique_ptr<HostDirectory>> HostDirectory::Open(uint32_t slots) {
  if (slots < 2 || slots > kMaxSlots || !std::has_single_bit(slots)) {
    return InvalidArgument("block directory slots must be a power of two in [2, " + std::to_string(kMaxSlots) +
                           "], got " + std::to_string(slots));
  }
  const uint64_t bytes = DirectoryBytes(slots);
  const int fd = ::memfd_create("kvtier-directory", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return SysError("memfd_create");
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    Status s = SysError("ftruncate");
    ::close(fd);
    return s;
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (base == MAP_FAILED) {
    Status s = SysError("mmap");
    ::close(fd);
    return s;
  }
  // Format before sealing; the writable mapping made before the seal stays.
  std::unique_ptr<HostDirectory> dir(new HostDirectory(fd, static_cast<std::byte*>(base), bytes, slots));
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0) {
    return SysError("fcntl(F_ADD_SEALS)");
  }
  return dir;
}

HostDirectory::~HostDirectory() {
  ::munmap(base_, bytes_);
  ::close(fd_);
}

bool HostDirectory::Publish(const NamespaceFingerprint& ns, const BlockKey& key, uint64_t offset, uint64_t length,
                            uint64_t checksum) {
  MutexLock lock(mu_);
  return writer_.Publish(ns, key, offset, length, checksum);
}

void HostDirectory::Withdraw(const BlockKey& key) {
  MutexLock lock(mu_);
  writer_.Withdraw(key);
}

void HostDirectory::ForgetUnpublished() {
  MutexLock lock(mu_);
  writer_.ForgetUnpublished();
}

void HostDirectory::SetLowerTiers(bool present) {
  MutexLock lock(mu_);
  writer_.SetLowerTiers(present);
}

void HostDirectory::VisitCounters(CounterVisitor& v) const {
  MutexLock lock(mu_);
  v.VisitGauge("host.directory.slots", writer_.slot_count());
  v.VisitGauge("host.directory.entries", static_cast<int64_t>(writer_.entries()));
  v.VisitGauge("host.directory.unpublished", static_cast<int64_t>(writer_.unpublished()));
  v.VisitGauge("host.directory.bytes", static_cast<int64_t>(bytes_));
}

}  // namespace kvtier
