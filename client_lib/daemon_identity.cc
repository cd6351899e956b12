#include "client_lib/daemon_identity.h"

#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <optional>
#include <string_view>

namespace kvtier::internal {
namespace {

constexpr const char* kEnvironmentVariable = "KVTIER_TRUSTED_DAEMON_UIDS";

std::optional<uint32_t> UidOfUser(const std::string& name) {
  struct passwd entry {};
  struct passwd* found = nullptr;
  std::vector<char> buffer(16384);
  if (::getpwnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found) != 0 || found == nullptr) {
    return std::nullopt;
  }
  return found->pw_uid;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

Result<std::vector<uint32_t>> ParseUidList(std::string_view text) {
  std::vector<uint32_t> uids;
  while (true) {
    const size_t comma = text.find(',');
    const std::string_view item = Trim(text.substr(0, comma));
    if (item.empty()) {
      return InvalidArgument(std::string(kEnvironmentVariable) + ": an empty entry in \"" + std::string(text) + "\"");
    }
    uint32_t uid = 0;
    auto [end, error] = std::from_chars(item.data(), item.data() + item.size(), uid);
    if (error == std::errc() && end == item.data() + item.size()) {
      uids.push_back(uid);
    } else if (auto named = UidOfUser(std::string(item))) {
      uids.push_back(*named);
    } else {
      return InvalidArgument(std::string(kEnvironmentVariable) + ": \"" + std::string(item) +
                             "\" is neither a uid nor a user of this machine");
    }
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return uids;
}

std::string Join(const std::vector<uint32_t>& uids) {
  std::string out;
  for (uint32_t uid : uids) out += (out.empty() ? "" : ", ") + std::to_string(uid);
  return out;
}

}  // namespace

std::vector<uint32_t> DefaultTrustedDaemonUids() {
  std::vector<uint32_t> uids{0, static_cast<uint32_t>(::geteuid())};
  if (auto service = UidOfUser("kvtier")) uids.push_back(*service);
  return uids;
}

Result<std::vector<uint32_t>> TrustedDaemonUids(const ClientOptions& options, const char* environment) {
  if (!options.trusted_daemon_uids.empty()) return options.trusted_daemon_uids;
  if (environment != nullptr) return ParseUidList(environment);
  return DefaultTrustedDaemonUids();
}

Status CheckDaemonPeer(int fd, const std::string& socket_path, const std::vector<uint32_t>& trusted) {
  struct ucred peer {};
  socklen_t length = sizeof(peer);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) != 0) {
    return IoError("cannot read the credentials of the daemon at " + socket_path + ": " + std::strerror(errno));
  }
  if (std::find(trusted.begin(), trusted.end(), static_cast<uint32_t>(peer.uid)) != trusted.end()) return Status::Ok();
  return PermissionDenied("the process listening at " + socket_path + " (pid " + std::to_string(peer.pid) +
                          ") runs as uid " + std::to_string(peer.uid) +
                          ", which this client does not trust as "
                          "its kvtierd (trusted: " +
                          Join(trusted) +
                          "); if it is yours, name it in "
                          "ClientOptions::trusted_daemon_uids or " +
                          kEnvironmentVariable);
}

}  // namespace kvtier::internal
