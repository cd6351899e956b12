#include "support/fd_store.h"

#include <cerrno>
#include <cstring>
#include <sstream>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

namespace kvtier::support {
namespace {

constexpr size_t kMaxMessageBytes = 8192;
constexpr size_t kMaxFdsPerMessage = 64;

std::string Errno(const std::string& what, int err) { return what + ": " + std::strerror(err); }

// What systemd accepts as an FDNAME: it must survive LISTEN_FDNAMES's ':'.
bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 255) return false;
  for (char c : name) {
    if (c < 0x20 || c > 0x7e || c == ':') return false;
  }
  return true;
}

}  // namespace

Result<std::unique_ptr<FdStore>> FdStore::Open(const std::string& socket_path, size_t max_fds) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.empty() || socket_path.size() >= sizeof(addr.sun_path)) {
    return InvalidArgument("fd store socket path must be 1.." + std::to_string(sizeof(addr.sun_path) - 1) +
                           " bytes: " + socket_path);
  }
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return IoError(Errno("socket", errno));
  ::unlink(socket_path.c_str());
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::chmod(socket_path.c_str(), 0600) != 0) {
    const int err = errno;
    ::close(fd);
    return IoError(Errno("bind " + socket_path, err));
  }
  return std::unique_ptr<FdStore>(new FdStore(fd, socket_path, max_fds));
}

FdStore::FdStore(int socket_fd, std::string socket_path, size_t max_fds)
    : socket_fd_(socket_fd), socket_path_(std::move(socket_path)), max_fds_(max_fds) {}

FdStore::~FdStore() {
  Clear();
  ::close(socket_fd_);
  ::unlink(socket_path_.c_str());
}

Status FdStore::Drain() {
  std::vector<char> data(kMaxMessageBytes);
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  for (;;) {
    iovec iov{data.data(), data.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(socket_fd_, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::Ok();
      return IoError(Errno("recvmsg on " + socket_path_, errno));
    }
    std::vector<int> fds;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const unsigned char* p = CMSG_DATA(c);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, p + i * sizeof(int), sizeof(int));
        fds.push_back(fd);
      }
    }
    if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
      for (int fd : fds) ::close(fd);
      refused_ += fds.size();
      continue;
    }
    Apply(std::string(data.data(), static_cast<size_t>(n)), fds);
  }
}

void FdStore::Apply(const std::string& text, std::vector<int>& fds) {
  bool store = false;
  bool remove = false;
  bool named = false;
  std::string name = "stored";
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = line.substr(0, eq);
    const std::string value = line.substr(eq + 1);
    if (key == "FDSTORE") store = value == "1";
    if (key == "FDSTOREREMOVE") remove = value == "1";
    if (key == "FDNAME") {
      name = value;
      named = true;
    }
    if (key == "READY" && value == "1") ++ready_count_;
    if (key == "STATUS") status_ = value;
  }
  const bool valid = ValidName(name);
  if (remove && named && valid) {
    for (auto it = held_.begin(); it != held_.end();) {
      if (it->name != name) {
        ++it;
        continue;
      }
      ::close(it->fd);
      it = held_.erase(it);
    }
  }
  for (int fd : fds) {
    if (store && valid) {
      Hold(name, fd);
      continue;
    }
    ::close(fd);
    if (store) ++refused_;
  }
  fds.clear();
}

void FdStore::Hold(const std::string& name, int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    ++refused_;
    return;
  }
  for (const Held& h : held_) {
    if (h.dev == st.st_dev && h.ino == st.st_ino) {
      ::close(fd);  // the same file, already held: keep the first
      return;
    }
  }
  if (held_.size() >= max_fds_) {
    ::close(fd);
    ++refused_;
    return;
  }
  held_.push_back({name, fd, st.st_dev, st.st_ino});
}

void FdStore::Clear() {
  for (const Held& h : held_) ::close(h.fd);
  held_.clear();
}

void FdStore::PrepareSpawn(SpawnOptions* options) const {
  options->env.push_back("NOTIFY_SOCKET=" + socket_path_);
  if (held_.empty()) {
    options->pass_fds.clear();
    options->env.insert(options->env.end(), {"LISTEN_FDS", "LISTEN_FDNAMES", "LISTEN_PID"});
    options->listen_pid = false;
    return;
  }
  std::string joined;
  for (const Held& h : held_) joined += (joined.empty() ? "" : ":") + h.name;
  options->pass_fds = fds();
  options->env.push_back("LISTEN_FDS=" + std::to_string(held_.size()));
  options->env.push_back("LISTEN_FDNAMES=" + joined);
  options->listen_pid = true;
}

std::vector<std::string> FdStore::names() const {
  std::vector<std::string> out;
  for (const Held& h : held_) out.push_back(h.name);
  return out;
}

std::vector<int> FdStore::fds() const {
  std::vector<int> out;
  for (const Held& h : held_) out.push_back(h.fd);
  return out;
}

}  // namespace kvtier::support
