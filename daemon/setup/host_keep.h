// HostKeeper: keeps each host tier's arena and journal (tiers/host/
// host_tier.h, HostKeep) in systemd's file descriptor store, and hands the
// next kvtierd the pair its predecessor stored, so a crash or a restart
// keeps the host tier (docs/OPERATIONS.md "Restarts").
//
// Names in the store: "host-arena" and "host-journal" (a tenant's:
// "host-arena.<tenant>", "host-journal.<tenant>"). A tier that adopted
// its pair leaves the store as it is; a tier that started empty first
// removes whatever the store holds under its names (FDSTOREREMOVE), then
// stores its own. Passed fds no tier claimed (a tenant gone from the
// configuration, a name this build does not know) are closed and removed
// from the store, so their memory is freed.
//
// Passed fds come from the store (systemd, or `kvtier supervise`) or from
// a takeover (daemon/server/takeover.h). Enabled with
// host.keep_across_restarts: every host tier keeps a journal (a takeover
// may hand it over at any time), and it is stored only with $NOTIFY_SOCKET.
// Disabled, every passed fd is closed and no journal is kept.
// Thread-compatible: the main thread uses it at start.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "daemon/server/systemd_notify.h"
#include "tiers/host/host_tier.h"

namespace kvtier {

class HostKeeper {
 public:
  // Borrows `notifier` (outlives this). Takes the `passed` fds.
  // `release` (may be empty) is told each passed name this daemon will not
  // adopt, right after its fd is closed and before a new arena is
  // allocated: a takeover's predecessor closes its copy then
  // (TakeoverRequest::Release), so the memory is freed.
  HostKeeper(const SystemdNotifier& notifier, std::vector<PassedFd> passed, bool enabled,
             std::function<void(const std::string& name)> release = {});
  // Closes what no tier claimed, leaving it in the store: a start that
  // failed part way (one tenant's tier) must not cost the others theirs.
  ~HostKeeper();
  HostKeeper(const HostKeeper&) = delete;
  HostKeeper& operator=(const HostKeeper&) = delete;

  bool enabled() const { return enabled_; }
  // What HostTier::Open gets for `tenant`'s tier ("" without tenants): a
  // journal when enabled, and the kept pair when the store passed one,
  // with a release_kept that removes the pair from the store (a pair that
  // does not fit goes before a new arena is allocated). The fds become
  // the caller's.
  HostKeep KeptFor(const std::string& tenant);
  // After HostTier::Open: stores `host`'s arena and journal under
  // `tenant`'s names unless it adopted them (or there is no store). A failed store is logged
  // (the daemon runs on; its host tier will not survive it).
  void Store(const std::string& tenant, const HostTier& host);
  // Closes every passed fd no tier claimed and removes its name from the
  // store. Call once every tier opened.
  void DropUnclaimed();

  // The bytes of the kept arenas among `passed` of `tenants` ("": the
  // arena without tenants): memory a start that claims them takes back.
  // An arena no tenant of the configuration claims is not counted: it is
  // freed only once every new arena was allocated (DropUnclaimed).
  static uint64_t KeptArenaBytes(const std::vector<PassedFd>& passed, const std::vector<std::string>& tenants);

  static std::string ArenaName(const std::string& tenant);
  static std::string JournalName(const std::string& tenant);

 private:
  // The passed fd named `name`, now the caller's; -1 when none.
  int Claim(const std::string& name);
  // FDSTOREREMOVE of each name (empty ones skipped), and `release_` of
  // each; the first failure of the store.
  Status Remove(const std::vector<std::string>& names) const;

  const SystemdNotifier& notifier_;
  std::vector<PassedFd> passed_;
  const bool enabled_;
  const std::function<void(const std::string&)> release_;
};

}  // namespace kvtier
