#include "support/ports.h"

#include <cerrno>
#include <fcntl.h>
#include <netinet/in.h>
#include <random>
#include <string>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

namespace kvtier::support {
namespace {

// A socket bound to 127.0.0.1:`port`, or -1 if taken.
int BindLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A claim on `port` against every other process drawing through
// ReserveLoopbackPorts (or tests/python/peer_pair.py, which keeps the same
// convention): an exclusive flock on /tmp/kvtier-ports-<uid>/<port>. Binding
// alone proves a port free only until it is released, and tests running in
// parallel drew the same port in that window. Returns the descriptor holding
// the claim, -1 when another process holds it, or -2 when no claim can be
// made (the directory cannot be created): the bind check then stands alone.
int ClaimAcrossProcesses(int port) {
  const std::string dir = "/tmp/kvtier-ports-" + std::to_string(::getuid());
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return -2;
  const std::string path = dir + "/" + std::to_string(port);
  const int fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return -2;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Claims `port` across processes and checks that it is free; the claim is
// kept (its descriptor left open until the process exits) and the bound
// socket is pushed on `held`. False, with nothing kept, otherwise.
bool TakePort(int port, std::vector<int>& held) {
  const int claim = ClaimAcrossProcesses(port);
  if (claim == -1) return false;
  const int fd = BindLoopback(port);
  if (fd < 0) {
    if (claim >= 0) ::close(claim);
    return false;
  }
  held.push_back(fd);
  return true;
}

}  // namespace

std::vector<int> ReserveLoopbackPorts(int count, int lowest, int highest, int companion_offset) {
  static thread_local std::mt19937 random{std::random_device{}()};
  std::uniform_int_distribution<int> pick(lowest, highest);
  std::vector<int> ports, held;
  for (int attempt = 0; attempt < 1000 && static_cast<int>(ports.size()) < count; ++attempt) {
    const int port = pick(random);
    if (!TakePort(port, held)) continue;
    if (companion_offset > 0 && !TakePort(port + companion_offset, held)) continue;
    ports.push_back(port);
  }
  for (int fd : held) ::close(fd);
  return ports;
}

}  // namespace kvtier::support
