#include "daemon/server/systemd_notify.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <vector>

#include "common/logging.h"
#include "common/unix_socket.h"

namespace kvtier {
namespace {

// A positive decimal from the environment; 0 when unset or malformed.
uint64_t EnvNumber(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr) return 0;
  uint64_t value = 0;
  const char* end = text + std::strlen(text);
  auto [ptr, ec] = std::from_chars(text, end, value);
  if (ec != std::errc() || ptr != end) return 0;
  return value;
}

}  // namespace

std::vector<PassedFd> TakePassedFds() {
  std::vector<PassedFd> out;
  const uint64_t count = std::min<uint64_t>(EnvNumber("LISTEN_FDS"), kMaxListenFds);
  const bool ours = EnvNumber("LISTEN_PID") == static_cast<uint64_t>(::getpid());
  const char* names = std::getenv("LISTEN_FDNAMES");
  std::string all = names == nullptr ? std::string() : std::string(names);
  ::unsetenv("LISTEN_FDS");
  ::unsetenv("LISTEN_PID");
  ::unsetenv("LISTEN_FDNAMES");
  if (!ours || count == 0) return out;
  size_t from = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const size_t colon = all.find(':', from);
    PassedFd passed;
    passed.fd = static_cast<int>(kFirstPassedFd + i);
    passed.name = from <= all.size() ? all.substr(from, colon == std::string::npos ? std::string::npos : colon - from)
                                     : std::string();
    from = colon == std::string::npos ? all.size() + 1 : colon + 1;
    ::fcntl(passed.fd, F_SETFD, FD_CLOEXEC);  // none of them reaches a child
    out.push_back(std::move(passed));
  }
  return out;
}

SystemdNotifier SystemdNotifier::FromEnvironment() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  uint64_t watchdog_usec = EnvNumber("WATCHDOG_USEC");
  // WATCHDOG_PID names the process the watchdog is meant for (a wrapper
  // may have exec'd us, or we may be its child): ping only when it is us.
  if (std::getenv("WATCHDOG_PID") != nullptr && EnvNumber("WATCHDOG_PID") != static_cast<uint64_t>(::getpid())) {
    watchdog_usec = 0;
  }
  return SystemdNotifier(socket == nullptr ? std::string() : std::string(socket), watchdog_usec);
}

Status SystemdNotifier::Notify(std::string_view state) const { return NotifyWithFds(state, {}); }

Status SystemdNotifier::NotifyWithFds(std::string_view state, std::span<const int> fds) const {
  if (!enabled()) return Status::Ok();
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (socket_path_.size() < 2 || socket_path_.size() >= sizeof(address.sun_path) ||
      (socket_path_[0] != '/' && socket_path_[0] != '@')) {
    return InvalidArgument("NOTIFY_SOCKET=" + socket_path_ + " is not an absolute path or @abstract name");
  }
  std::memcpy(address.sun_path, socket_path_.data(), socket_path_.size());
  socklen_t length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + socket_path_.size());
  if (address.sun_path[0] == '@') {
    address.sun_path[0] = '\0';  // abstract namespace: no terminator counted
  } else {
    ++length;  // a path: count its terminating NUL
  }
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return IoError(std::string("sd_notify socket: ") + std::strerror(errno));
  // A connected datagram socket, so the fds go through the one SCM_RIGHTS
  // sender the project has (common/unix_socket.h).
  ssize_t sent = -1;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), length) == 0) {
    if (fds.empty()) {
      sent = ::send(fd, state.data(), state.size(), MSG_NOSIGNAL);
    } else {
      Result<size_t> passed = SendWithFds(fd, state.data(), state.size(), fds);
      if (!passed.ok()) {
        ::close(fd);
        return Status(passed.status().code(), "sd_notify to " + socket_path_ + ": " + passed.status().message());
      }
      sent = static_cast<ssize_t>(*passed);
    }
  }
  const int error = errno;
  ::close(fd);
  if (sent < 0) return IoError("sd_notify to " + socket_path_ + ": " + std::strerror(error));
  if (static_cast<size_t>(sent) != state.size()) return IoError("sd_notify to " + socket_path_ + ": short send");
  return Status::Ok();
}

WatchdogPinger::WatchdogPinger(const SystemdNotifier& notifier, std::function<bool()> healthy)
    : notifier_(notifier), healthy_(std::move(healthy)) {
  const uint64_t interval_us = notifier_.watchdog_usec() / 2;
  if (interval_us == 0) return;
  thread_ = std::thread([this, interval_us] { Run(interval_us); });
}

WatchdogPinger::~WatchdogPinger() { Stop(); }

void WatchdogPinger::Stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  stop_cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

void WatchdogPinger::Run(uint64_t interval_us) {
  bool was_healthy = true;
  for (;;) {
    {
      MutexLock lock(mu_);
      const auto wake = std::chrono::steady_clock::now() + std::chrono::microseconds(interval_us);
      while (!stopping_ && stop_cv_.WaitUntil(mu_, wake)) {
      }
      if (stopping_) return;
    }
    // Outside the lock: the probe may take a while (or never return).
    const bool healthy = healthy_();
    if (!healthy) {
      if (was_healthy) spdlog::error("watchdog: the daemon does not answer its health probe; not pinging systemd");
      was_healthy = false;
      continue;
    }
    if (!was_healthy) spdlog::warn("watchdog: the health probe answers again; pinging systemd");
    was_healthy = true;
    Status s = notifier_.Notify("WATCHDOG=1");
    if (!s.ok()) spdlog::warn("watchdog: {}", s.ToString());
  }
}

}  // namespace kvtier
