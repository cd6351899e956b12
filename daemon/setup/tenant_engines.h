// DaemonEngines: the engines kvtierd serves, built from its configuration
// over the tiers below the host (TierStack, owned by the caller).
//
// - Without [[tenant]] tables: one engine over one host arena (and the HBM
//   tier when there is one) and the whole stack, as kvtierd always ran.
// - With tenants: one engine per tenant, each with its own host arena of
//   the tenant's host_bytes (so a tenant's mapping holds only its own
//   blocks), its own HBM pool of hbm_bytes when the HBM tier runs, its own
//   policies and its own share of the DWPD budget (the drive's budget split
//   equally, so all tenants together stay inside it). The tiers below are
//   shared through SharedTier; each engine reaches them through a
//   TenantTier (its blocks only, its keys scoped with the daemon's tenant
//   key, its nvme_bytes quota). See daemon/tenants/tenant_tier.h.
//
// Destruction: the engines first (they wait for their movers), then the
// tenants' views of the shared tiers, then the shared tiers; the caller
// closes the stack after this. A takeover retires the engines first
// (Retire, RetiredEngines): stopped, not freed.
//
// Thread-compatible: built and destroyed by the daemon's main thread; the
// engines it owns are thread-safe.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "daemon/config/config.h"
#include "daemon/engine/engine.h"
#include "daemon/setup/events_setup.h"
#include "daemon/setup/hbm_setup.h"
#include "daemon/setup/host_keep.h"
#include "daemon/server/server.h"
#include "daemon/tenants/tenant_scope.h"
#include "daemon/tenants/tenant_tier.h"
#include "daemon/setup/tier_stack.h"
#include "tiers/host/host_tier.h"

namespace kvtier {

// The engine options kvtierd's configuration sets ([engine], host.verify_commits).
EngineOptions EngineOptionsFromConfig(const DaemonConfig& config);

// Where the tenant key lives: server.tenant_key_file, else next to the
// NVMe tier's index (nvme.index_path, or nvme.path, + ".tenant-key"), else
// nowhere (a fresh key each start: nothing persists that it must match).
std::string TenantKeyPath(const DaemonConfig& config);

// What a takeover keeps of the engines once they stopped
// (DaemonEngines::Retire): the engines, stopped, and their host tiers,
// still mapped. Freeing an engine's index and policy state costs seconds
// at millions of blocks (about 4.5 us a block here) and unmapping its
// arena a few tenths: neither needs to happen before the next kvtierd
// takes over. A stopped engine touches no tier, arena or host tier, also
// when destroyed (Engine::Stop), so it may go after them.
class RetiredEngines {
 public:
  struct Host {
    std::string tenant;  // "" without tenants
    std::unique_ptr<HostTier> host;
  };
  RetiredEngines() = default;
  RetiredEngines(std::vector<std::unique_ptr<Engine>> engines, std::vector<Host> hosts);
  RetiredEngines(const RetiredEngines&) = delete;
  RetiredEngines& operator=(const RetiredEngines&) = delete;
  // Unmaps the host tiers and abandons the engines: the process is about
  // to exit, and its end frees their memory at once. They stay reachable
  // (a leak checker sees them) and are never destroyed.
  ~RetiredEngines();

  // The next kvtierd will not adopt the kept arena or journal `name`
  // (HostKeeper's names; a takeover's "release"): its host tier is
  // unmapped now, so that its memory goes before the new arena is
  // allocated. Unknown names are ignored.
  void Release(const std::string& name);
  // After a failed takeover, before this daemon serves again: frees the
  // engines, then unmaps the host tiers.
  void Free();
  // Host tiers still mapped.
  size_t mapped_hosts() const { return hosts_.size(); }

 private:
  std::vector<std::unique_ptr<Engine>> engines_;
  std::vector<Host> hosts_;
};

class DaemonEngines {
 public:
  struct Tenant {
    TenantConfig config;                 // name empty without tenants
    std::unique_ptr<TenantScope> scope;  // null without tenants
    std::unique_ptr<HostTier> host;
    HbmSetup hbm;
    std::vector<std::unique_ptr<TenantTier>> below;  // its views of the shared tiers
    std::unique_ptr<EventJournal>
        events_journal;  // null: events off; outlives the engine until Retire (events_setup.h)
    std::unique_ptr<Engine> engine;
    std::unique_ptr<EventPublisher> events;  // declared last: stops before the engine goes
  };

  // `config` must have its auto sizes resolved (and, with tenants, their
  // shares: ResolveTenantShares). `stack` and `clock` are borrowed and
  // outlive the result. Errors name the tenant and the tier at fault.
  // With `keeper` (borrowed; null: nothing kept), each host tier adopts
  // the arena a previous daemon kept, or has its own kept (host_keep.h).
  static Result<std::unique_ptr<DaemonEngines>> Open(const DaemonConfig& config, TierStack& stack, Clock& clock,
                                                     HostKeeper* keeper = nullptr);
  ~DaemonEngines();

  bool has_tenants() const { return tenants_.front().scope != nullptr; }
  const std::vector<Tenant>& tenants() const { return tenants_; }

  // Starts each engine's KV-events publisher (events_setup.h), once the
  // daemon owns its socket: a second kvtierd on the same paths never
  // takes the first one's event sockets.
  Status StartEvents(const DaemonConfig& config);

  // What the server serves: one entry per tenant, in configuration order,
  // with the KV-events endpoints StartEvents binds (told at Hello).
  std::vector<ServedTenant> Served(const DaemonConfig& config) const;

  // For a takeover, once nothing calls the engines any more (the server,
  // the peer service and the metrics stopped): stops every publisher and
  // engine (Engine::Stop) and hands the engines and their host tiers to
  // the result, so that destroying this (tier views, HBM pools, event
  // journals) and then the stack (the NVMe tier's index closes) is quick.
  // Call once; afterwards only destruction.
  std::unique_ptr<RetiredEngines> Retire();

  // The shared tiers' own counters, once (nothing without tenants).
  void VisitSharedCounters(CounterVisitor& visitor) const;
  // Every engine's counters; with tenants each name carries
  // tenant="<name>", and the shared tiers' counters come first, once.
  void VisitCounters(CounterVisitor& visitor) const;

 private:
  DaemonEngines() = default;

  std::vector<std::unique_ptr<SharedTier>> shared_;  // one per tier of the stack, with tenants
  std::vector<Tenant> tenants_;
};

}  // namespace kvtier
