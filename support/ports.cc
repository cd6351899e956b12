#include "support/ports.h"

#include <netinet/in.h>
#include <random>
#include <sys/socket.h>
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

}  // namespace

std::vector<int> ReserveLoopbackPorts(int count, int lowest, int highest, int companion_offset) {
  static thread_local std::mt19937 random{std::random_device{}()};
  std::uniform_int_distribution<int> pick(lowest, highest);
  std::vector<int> ports, held;
  for (int attempt = 0; attempt < 1000 && static_cast<int>(ports.size()) < count; ++attempt) {
    const int port = pick(random);
    const int fd = BindLoopback(port);
    if (fd < 0) continue;
    held.push_back(fd);
    if (companion_offset > 0) {
      const int companion_fd = BindLoopback(port + companion_offset);
      if (companion_fd < 0) continue;
      held.push_back(companion_fd);
    }
    ports.push_back(port);
  }
  for (int fd : held) ::close(fd);
  return ports;
}

}  // namespace kvtier::support
