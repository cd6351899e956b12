#include "daemon/setup/tenant_engines.h"

#include <algorithm>
#include <bit>

#include "common/logging.h"
#include "daemon/setup/auto_size.h"
#include "policy/policy_registry.h"

namespace kvtier {
namespace {

HostArenaOptions::LockMode LockModeOf(LockMemory lock) {
  switch (lock) {
    case LockMemory::kRequired:
      return HostArenaOptions::LockMode::kRequired;
    case LockMemory::kBestEffort:
      return HostArenaOptions::LockMode::kBestEffort;
    case LockMemory::kOff:
      return HostArenaOptions::LockMode::kOff;
  }
  KVTIER_CHECK(false, "a host.lock_memory outside its table");
  return HostArenaOptions::LockMode::kBestEffort;
}

// Slots of a block directory next to an arena of `arena_bytes`; 0 when
// the directory is off.
uint32_t DirectorySlots(const DaemonConfig& config, uint64_t arena_bytes) {
  if (!config.host_directory) return 0;
  if (config.host_directory_slots == 0) return HostDirectory::DefaultSlots(arena_bytes);
  return std::bit_ceil(static_cast<uint32_t>(std::max<int64_t>(config.host_directory_slots, 2)));
}

// The arena's memfd is named kvtier-arena, or kvtier-arena-<tenant> with
// tenants (as /proc/<pid>/maps shows it).
// With a keeper, the arena a previous daemon kept is adopted (or a new
// one kept).
Result<std::unique_ptr<HostTier>> OpenHost(const DaemonConfig& config, const std::string& tenant, uint64_t arena_bytes,
                                           HostKeeper* keeper) {
  HostArenaOptions arena;
  if (!tenant.empty()) arena.name += "-" + tenant;
  arena.capacity_bytes = arena_bytes;
  arena.lock = LockModeOf(config.host_lock_memory);
  // The socket opens once host.allocate_at_start_bytes (0: all) of the arena
  // are allocated; the rest is allocated, the host tier growing as it is,
  // and all is faulted in, behind it (host_arena.h).
  arena.warm_in_background = true;
  if (config.host_allocate_at_start_bytes > 0) {
    arena.allocate_at_open_bytes = static_cast<uint64_t>(config.host_allocate_at_start_bytes);
  }
  arena.meminfo_path = MeminfoPath();
  const HostKeep keep = keeper != nullptr ? keeper->KeptFor(tenant) : HostKeep{};
  auto host = HostTier::Open(arena, DirectorySlots(config, arena_bytes), keep);
  if (host.ok() && keeper != nullptr) keeper->Store(tenant, **host);
  return host;
}

// Opens `tenant`'s host arena, HBM pool and engine over `below`.
Status OpenEngine(const DaemonConfig& config, uint64_t host_bytes, const DaemonConfig& hbm_config,
                  std::vector<LowerTier> below, Clock& clock, HostKeeper* keeper, DaemonEngines::Tenant& tenant) {
  const std::string whose = tenant.config.name.empty() ? "" : "tenant " + tenant.config.name + ": ";
  auto host = OpenHost(config, tenant.config.name, host_bytes, keeper);
  if (!host.ok()) return Status(host.status().code(), whose + "host tier: " + host.status().message());
  tenant.host = std::move(*host);
  auto hbm = OpenHbmTier(hbm_config);
  if (!hbm.ok()) return Status(hbm.status().code(), whose + hbm.status().message());
  tenant.hbm = std::move(*hbm);
  tenant.events_journal = MakeEventJournal(config);
  EngineOptions options = EngineOptionsFromConfig(config);
  options.events = tenant.events_journal.get();
  auto engine = Engine::Create(options, *tenant.host, clock, std::move(below), tenant.hbm.tier.get());
  if (!engine.ok()) return Status(engine.status().code(), whose + "engine: " + engine.status().message());
  tenant.engine = std::move(*engine);
  tenant.engine->StartAdoption();
  return Status::Ok();
}

std::string Joined(const std::vector<uint32_t>& ids) {
  std::string out;
  for (uint32_t id : ids) out += (out.empty() ? "" : ", ") + std::to_string(id);
  return out;
}

// The tenants' quotas are their protected shares on a tier that protects
// shares: they must fit what it can protect (ReclaimShares::shareable_bytes).
Status CheckSharesFit(const std::vector<TenantConfig>& tenants, BlockTier& tier) {
  const uint64_t shareable = tier.reclaim_shares() != nullptr ? tier.reclaim_shares()->shareable_bytes() : 0;
  if (shareable == 0) return Status::Ok();
  uint64_t quotas = 0;
  for (const TenantConfig& t : tenants) quotas += static_cast<uint64_t>(t.nvme_bytes);
  if (quotas <= shareable) return Status::Ok();
  return InvalidArgument("the tenants' nvme_bytes add up to " + std::to_string(quotas) + " bytes, more than the " +
                         std::to_string(shareable) + " bytes the " + std::string(tier.name()) +
                         " tier can keep as protected shares (its " + std::to_string(tier.capacity_bytes()) +
                         " bytes less 3 regions); lower the quotas or grow the tier");
}

}  // namespace

EngineOptions EngineOptionsFromConfig(const DaemonConfig& config) {
  EngineOptions options{static_cast<uint32_t>(config.engine_shards), config.engine_eviction};
  options.lookahead_us = static_cast<uint64_t>(config.engine_lookahead_ms) * 1000;
  options.prefetch_share = static_cast<double>(config.engine_prefetch_percent) / 100.0;
  options.demotion_buffer_bytes = static_cast<uint64_t>(config.engine_demotion_buffer_bytes);
  options.prefetch_min_blocks = static_cast<uint32_t>(config.engine_prefetch_min_blocks);
  options.verify_commits = config.host_verify_commits;
  return options;
}

std::string TenantKeyPath(const DaemonConfig& config) {
  if (!config.tenant_key_file.empty()) return config.tenant_key_file;
  if (!config.nvme_index_path.empty()) return config.nvme_index_path + ".tenant-key";
  if (!config.nvme_path.empty()) return config.nvme_path + ".tenant-key";
  return "";
}

Result<std::unique_ptr<DaemonEngines>> DaemonEngines::Open(const DaemonConfig& config, TierStack& stack, Clock& clock,
                                                           HostKeeper* keeper) {
  std::unique_ptr<DaemonEngines> engines(new DaemonEngines());
  if (config.tenants.empty()) {
    engines->tenants_.emplace_back();
    Status opened = OpenEngine(config, static_cast<uint64_t>(config.host_capacity_bytes), config, stack.lower, clock,
                               keeper, engines->tenants_.back());
    if (!opened.ok()) return opened;
    return engines;
  }
  const std::string key_path = TenantKeyPath(config);
  auto secret = LoadTenantKey(key_path);
  if (!secret.ok()) return Status(secret.status().code(), "server.tenant_key_file: " + secret.status().message());
  if (key_path.empty()) spdlog::info("tenants: no NVMe tier, so a fresh tenant key for this run");
  for (const LowerTier& lower : stack.lower) {
    if (Status fits = CheckSharesFit(config.tenants, *lower.tier); !fits.ok()) return fits;
    engines->shared_.push_back(std::make_unique<SharedTier>(*lower.tier));
  }
  const double tenant_count = static_cast<double>(config.tenants.size());
  for (const TenantConfig& tenant_config : config.tenants) {
    Tenant& tenant = engines->tenants_.emplace_back();
    tenant.config = tenant_config;
    tenant.scope = std::make_unique<TenantScope>(*secret, tenant_config.name);
    std::vector<LowerTier> below;
    for (size_t i = 0; i < stack.lower.size(); ++i) {
      tenant.below.push_back(std::make_unique<TenantTier>(*engines->shared_[i], *tenant.scope,
                                                          static_cast<uint64_t>(tenant_config.nvme_bytes)));
      LowerTier view = stack.lower[i];
      view.tier = tenant.below.back().get();
      view.dwpd.share /= tenant_count;  // every tenant's writes together stay within the drive's budget
      below.push_back(view);
    }
    DaemonConfig hbm_config = config;
    hbm_config.hbm_capacity_bytes = tenant_config.hbm_bytes;
    Status opened = OpenEngine(config, static_cast<uint64_t>(tenant_config.host_bytes), hbm_config, std::move(below),
                               clock, keeper, tenant);
    if (!opened.ok()) return opened;
    spdlog::info(
        "tenant {}: host arena {} bytes, hbm {}, quota below the host {}, uids [{}], gids [{}]", tenant_config.name,
        tenant_config.host_bytes,
        tenant.hbm.tier != nullptr ? std::to_string(tenant_config.hbm_bytes) + " bytes" : "off",
        tenant_config.nvme_bytes == 0 ? std::string("none") : std::to_string(tenant_config.nvme_bytes) + " bytes",
        Joined(tenant_config.uids), Joined(tenant_config.gids));
  }
  return engines;
}

DaemonEngines::~DaemonEngines() {
  // Every publisher first (its thread reads the engine: snapshots,
  // estimates, namespace names), then every engine before any tier it shares.
  for (Tenant& tenant : tenants_) tenant.events.reset();
  for (Tenant& tenant : tenants_) tenant.engine.reset();
  tenants_.clear();
  shared_.clear();
}

RetiredEngines::RetiredEngines(std::vector<std::unique_ptr<Engine>> engines, std::vector<Host> hosts)
    : engines_(std::move(engines)), hosts_(std::move(hosts)) {}

RetiredEngines::~RetiredEngines() {
  hosts_.clear();
  static auto* abandoned = new std::vector<std::unique_ptr<Engine>>;
  for (auto& engine : engines_) abandoned->push_back(std::move(engine));
}

void RetiredEngines::Release(const std::string& name) {
  std::erase_if(hosts_, [&name](const Host& h) {
    return name == HostKeeper::ArenaName(h.tenant) || name == HostKeeper::JournalName(h.tenant);
  });
}

void RetiredEngines::Free() {
  engines_.clear();
  hosts_.clear();
}

std::unique_ptr<RetiredEngines> DaemonEngines::Retire() {
  for (Tenant& tenant : tenants_) tenant.events.reset();
  std::vector<std::unique_ptr<Engine>> engines;
  std::vector<RetiredEngines::Host> hosts;
  for (Tenant& tenant : tenants_) {
    if (tenant.engine == nullptr) continue;
    tenant.engine->Stop();
    engines.push_back(std::move(tenant.engine));
    hosts.push_back({tenant.config.name, std::move(tenant.host)});
  }
  return std::make_unique<RetiredEngines>(std::move(engines), std::move(hosts));
}

std::vector<ServedTenant> DaemonEngines::Served(const DaemonConfig& config) const {
  std::vector<ServedTenant> served;
  for (const Tenant& t : tenants_) {
    ServedTenant s{t.config.name, t.engine.get(), t.host.get(), t.scope.get(), t.config.models, t.hbm.offer};
    if (t.events_journal != nullptr) {
      // An endpoint StartEvents refuses fails the start anyway.
      if (auto endpoints = EventEndpointsFor(config, t.config.name); endpoints.ok()) {
        s.events_endpoint = endpoints->events;
        s.events_replay_endpoint = endpoints->replay;
      }
    }
    served.push_back(std::move(s));
  }
  return served;
}

void DaemonEngines::VisitSharedCounters(CounterVisitor& visitor) const {
  for (const auto& shared : shared_) shared->VisitCounters(visitor);
}

Status DaemonEngines::StartEvents(const DaemonConfig& config) {
  for (Tenant& t : tenants_) {
    if (t.events_journal == nullptr) continue;
    auto events = kvtier::StartEvents(config, t.scope != nullptr ? &t.config : nullptr, *t.events_journal, *t.engine);
    if (!events.ok()) {
      const std::string whose = t.config.name.empty() ? "" : "tenant " + t.config.name + ": ";
      return Status(events.status().code(), whose + events.status().message());
    }
    t.events = std::move(*events);
  }
  return Status::Ok();
}

void DaemonEngines::VisitCounters(CounterVisitor& visitor) const {
  VisitSharedCounters(visitor);
  for (const Tenant& t : tenants_) {
    if (t.scope == nullptr) {
      t.engine->VisitCounters(visitor);
      if (t.events) t.events->VisitCounters(visitor);
      continue;
    }
    const std::string label = "tenant=\"" + t.config.name + "\"";  // names are [A-Za-z0-9_.-]
    LabellingVisitor labelled(visitor, label);
    t.engine->VisitCounters(labelled);
    if (t.events) t.events->VisitCounters(labelled);
  }
}

}  // namespace kvtier
