#include "daemon/setup/directory_trust.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "daemon/config/config.h"

namespace kvtier {
namespace {

std::string Octal(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof(text), "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

// The directory that holds `path`: its parent, made absolute ("" for a path
// that has none, such as "/").
std::string DirectoryOf(const std::string& path) {
  std::error_code ec;
  std::filesystem::path absolute = std::filesystem::absolute(path, ec);
  if (ec) absolute = path;
  return absolute.parent_path().string();
}

}  // namespace

Status CheckTrustedDirectory(const std::string& dir, std::string_view what, uid_t self) {
  std::filesystem::path at = dir.empty() ? std::filesystem::path(".") : std::filesystem::path(dir);
  struct stat st {};
  // A missing directory is created by kvtierd inside its nearest existing
  // ancestor: that ancestor is what someone else could tamper with.
  while (::stat(at.c_str(), &st) != 0) {
    if (errno != ENOENT || !at.has_parent_path() || at.parent_path() == at) {
      return IoError("cannot examine " + at.string() + " (" + std::string(what) + "): " + std::strerror(errno));
    }
    at = at.parent_path();
  }
  const std::string fix =
      "; give it to root or kvtierd's user with mode 0755 or tighter (or set server.trust_shared_directories = "
      "true to accept the risk: whoever can write there can swap the socket or plant symlinks)";
  if (!S_ISDIR(st.st_mode)) return PermissionDenied(at.string() + " (" + std::string(what) + ") is not a directory");
  if (st.st_uid != 0 && st.st_uid != self) {
    return PermissionDenied(std::string(what) + ": " + at.string() + " belongs to uid " + std::to_string(st.st_uid) +
                            ", not to root or kvtierd's uid " + std::to_string(self) + fix);
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return PermissionDenied(std::string(what) + ": " + at.string() + " has mode " + Octal(st.st_mode) +
                            ((st.st_mode & S_IWOTH) != 0 ? ", so anyone" : ", so its group") +
                            " may create and rename entries in it" + fix);
  }
  return Status::Ok();
}

Status CheckStateDirectories(const DaemonConfig& config, uid_t self) {
  if (config.trust_shared_directories) return Status::Ok();
  struct Place {
    std::string dir;
    const char* what;
  };
  std::vector<Place> places;
  if (!config.socket_path.empty())
    places.push_back({DirectoryOf(config.socket_path), "server.socket_path's directory"});
  if (!config.nvme_path.empty()) {
    struct stat st {};
    const bool device = ::stat(config.nvme_path.c_str(), &st) == 0 && S_ISBLK(st.st_mode);
    if (!device) places.push_back({DirectoryOf(config.nvme_path), "nvme.path's directory"});
    const std::string index = config.nvme_index_path.empty() ? config.nvme_path + ".index" : config.nvme_index_path;
    places.push_back({DirectoryOf(index), "nvme.index_path's directory"});
    places.push_back({index, "nvme.index_path"});
  }
  if (!config.tenant_key_file.empty())
    places.push_back({DirectoryOf(config.tenant_key_file), "server.tenant_key_file's directory"});
  if (config.metrics_enabled && !config.metrics_bearer_token_file.empty()) {
    places.push_back({DirectoryOf(config.metrics_bearer_token_file), "metrics.bearer_token_file's directory"});
  }
  if (!config.remote_nodes.empty() && !config.remote_key_file.empty()) {
    places.push_back({DirectoryOf(config.remote_key_file), "remote.key_file's directory"});
  }
  for (const Place& p : places) {
    Status trusted = CheckTrustedDirectory(p.dir, p.what, self);
    if (!trusted.ok()) return trusted;
  }
  return Status::Ok();
}

}  // namespace kvtier
