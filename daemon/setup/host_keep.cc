#include "daemon/setup/host_keep.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <set>

#include "common/logging.h"

namespace kvtier {

HostKeeper::HostKeeper(const SystemdNotifier& notifier, std::vector<PassedFd> passed, bool enabled,
                       std::function<void(const std::string& name)> release)
    : notifier_(notifier), passed_(std::move(passed)), enabled_(enabled), release_(std::move(release)) {
  if (!enabled_) DropUnclaimed();
}

HostKeeper::~HostKeeper() {
  for (PassedFd& p : passed_) {
    if (p.fd >= 0) ::close(p.fd);  // still in the store: a start that failed drops nothing
  }
}

uint64_t HostKeeper::KeptArenaBytes(const std::vector<PassedFd>& passed, const std::vector<std::string>& tenants) {
  uint64_t bytes = 0;
  for (const PassedFd& p : passed) {
    const bool claimed = std::any_of(tenants.begin(), tenants.end(),
                                     [&p](const std::string& tenant) { return p.name == ArenaName(tenant); });
    struct stat st {};
    if (claimed && ::fstat(p.fd, &st) == 0) bytes += static_cast<uint64_t>(st.st_size);
  }
  return bytes;
}

std::string HostKeeper::ArenaName(const std::string& tenant) {
  return tenant.empty() ? "host-arena" : "host-arena." + tenant;
}

std::string HostKeeper::JournalName(const std::string& tenant) {
  return tenant.empty() ? "host-journal" : "host-journal." + tenant;
}

int HostKeeper::Claim(const std::string& name) {
  for (PassedFd& p : passed_) {
    if (p.fd >= 0 && p.name == name) return std::exchange(p.fd, -1);
  }
  return -1;
}

HostKeep HostKeeper::KeptFor(const std::string& tenant) {
  HostKeep keep;
  if (!enabled_) return keep;
  keep.journal = true;
  keep.arena_fd = Claim(ArenaName(tenant));
  keep.journal_fd = Claim(JournalName(tenant));
  keep.release_kept = [this, tenant] {
    if (Status s = Remove({ArenaName(tenant), JournalName(tenant)}); !s.ok()) {
      spdlog::warn("file descriptor store: could not drop the kept pair of {}: {}",
                   tenant.empty() ? "the host tier" : "tenant " + tenant, s.ToString());
    }
  };
  return keep;
}

void HostKeeper::Store(const std::string& tenant, const HostTier& host) {
  if (!enabled_ || !notifier_.enabled() || host.adopted() || host.journal() == nullptr) return;
  const std::string arena = ArenaName(tenant);
  const std::string journal = JournalName(tenant);
  Status s = Remove({arena, journal});
  // The journal first: an arena stored without its journal is dropped at
  // the next start, never adopted blind.
  const int journal_fd = host.journal()->fd();
  const int arena_fd = host.memfd();
  if (s.ok()) s = notifier_.NotifyWithFds("FDSTORE=1\nFDPOLL=0\nFDNAME=" + journal, {&journal_fd, 1});
  if (s.ok()) s = notifier_.NotifyWithFds("FDSTORE=1\nFDPOLL=0\nFDNAME=" + arena, {&arena_fd, 1});
  if (!s.ok()) {
    spdlog::warn(
        "host tier{}: could not keep the arena in the file descriptor store ({}); a restart will start it "
        "empty",
        tenant.empty() ? "" : " of tenant " + tenant, s.ToString());
  }
}

Status HostKeeper::Remove(const std::vector<std::string>& names) const {
  Status first = Status::Ok();
  for (const std::string& name : names) {
    if (name.empty()) continue;
    if (release_) release_(name);
    if (!notifier_.enabled() || !first.ok()) continue;
    first = notifier_.Notify("FDSTOREREMOVE=1\nFDNAME=" + name);
  }
  return first;
}

void HostKeeper::DropUnclaimed() {
  std::set<std::string> names;
  for (PassedFd& p : passed_) {
    if (p.fd < 0) continue;
    ::close(p.fd);
    p.fd = -1;
    names.insert(p.name);
  }
  passed_.clear();
  for (const std::string& name : names) {
    spdlog::info("file descriptor store: dropping \"{}\", which no host tier of this configuration claims", name);
  }
  Remove({names.begin(), names.end()}).IgnoreError();  // best effort: the next start drops them again
}

}  // namespace kvtier
