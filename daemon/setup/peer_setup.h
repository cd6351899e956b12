// The peer tier and the peer server that kvtierd's [peer] section turns on
// (tiers/peer/): this node reads blocks other nodes hold in memory
// (peer.members, and with peer.discover those announced in the remote
// tier's Redis: the peer tier, a level of the stack between the NVMe and
// the remote tiers) and serves its own host memory to them (peer.listen).
// Both prove the cluster secret of remote.key_file (created when missing).
//
// With tenants, each engine's arena is a region of its own, and a peer's
// query names a tenant's scoped namespace and keys (the reader's tenant
// view of its peer tier scoped them, daemon/tenants/tenant_tier.h): the
// server answers it from the engine of the tenant whose tag the namespace
// carries, its keys unscoped with that tenant's scope. So a tenant reaches
// only its own namespaces on peers, and nodes share a tenant's blocks only
// when they share its name and server.tenant_key_file.
#pragma once

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "daemon/config/config.h"
#include "daemon/engine/engine.h"
#include "daemon/tenants/tenant_scope.h"
#include "tiers/host/host_tier.h"
#include "tiers/peer/peer_server.h"
#include "tiers/peer/peer_tier.h"

namespace kvtier {

// This process's peer node id: the same for its tier and its server, so
// that its tier skips its own server in peer.members.
uint64_t PeerNodeId();

// Null when peer.members is empty and peer.discover off. InvalidArgument
// for a bad member address, and for peer.discover without remote.nodes or
// without an address to announce (peer.advertise, else peer.listen, not a
// wildcard); remote.key_file's errors; Unavailable when UCX does not
// start. With peer.discover the tier's members also come from the
// registry in the remote tier's Redis (tiers/remote/member_registry.h),
// over a client of its own on `clock` (which outlives the tier).
Result<std::unique_ptr<PeerTier>> OpenPeerTier(const DaemonConfig& config, const Clock& clock);
// `tier` admitting nothing (it is only read), reported to clients as remote.
Result<LowerTier> PeerAdmissionFromConfig(const DaemonConfig& config, BlockTier& tier);

// A PeerSource over one engine and its host arena (one region): it
// answers for blocks in this node's host tier, the tier above it and the
// NVMe tier (never the remote or peer levels), and pins each for a reader
// as a connection of its own (ConnectionId with bit 62 set), so that
// EndReader ends every lease at once. Layer checksums a host block does not
// carry are computed from its bytes at the pin.
class EnginePeerSource final : public PeerSource {
 public:
  // Both borrowed; `region` names the arena in Regions and pins.
  EnginePeerSource(Engine& engine, HostTier& host, uint32_t region = 0)
      : engine_(engine), host_(host), region_(region) {}
  std::vector<Region> Regions() const override;
  std::vector<PeerHeld> Find(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) override;
  void Pin(uint64_t reader, const NamespaceFingerprint& ns, const BlockKey& key, PinDone done) override;
  void Release(uint64_t reader, std::span<const uint64_t> leases) override;
  void EndReader(uint64_t reader) override;
  // Engine::TakenByPeer: the handed-off blocks among `keys` leave the engine.
  size_t Taken(uint64_t reader, const NamespaceFingerprint& ns, std::span<const BlockKey> keys) override;
  // Blocks still being written (Engine::published_layers) are answered with
  // the layers published so far; the engine's publications reach `listener`.
  void SetPublishedListener(PublishedListener listener) override;

 private:
  Engine& engine_;
  HostTier& host_;
  const uint32_t region_;
};

// A PeerSource over the daemon's engines: one region each (its id the
// engine's index; with several engines the leases a reader gets are this
// source's, mapped to the engine's), a query or pin routed to
// the engine of the tenant whose tag its namespace carries, keys unscoped
// with that tenant's scope (without tenants: the one engine, keys as
// they are). A namespace of no tenant here is a miss.
class TenantsPeerSource final : public PeerSource {
 public:
  struct Part {
    Engine* engine = nullptr;            // borrowed
    HostTier* host = nullptr;            // borrowed
    const TenantScope* scope = nullptr;  // borrowed; null without tenants
  };
  explicit TenantsPeerSource(const std::vector<Part>& parts);
  std::vector<Region> Regions() const override;
  std::vector<PeerHeld> Find(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) override;
  void Pin(uint64_t reader, const NamespaceFingerprint& ns, const BlockKey& key, PinDone done) override;
  void Release(uint64_t reader, std::span<const uint64_t> leases) override;
  void EndReader(uint64_t reader) override;
  size_t Taken(uint64_t reader, const NamespaceFingerprint& ns, std::span<const BlockKey> keys) override;
  void SetPublishedListener(PublishedListener listener) override;

 private:
  struct Routed {
    const TenantScope* scope = nullptr;
    std::unique_ptr<EnginePeerSource> source;
  };
  // The part serving `ns`, or -1.
  int PartOf(const NamespaceFingerprint& ns) const;
  BlockKey Unscoped(int part, const BlockKey& key) const;
  std::vector<Routed> parts_;
  // (reader, the id it was given) -> (part, the engine's lease); several engines only. Shared with the pins'
  // answers, which may come after this source is gone.
  struct LeaseBook {
    Mutex mu;
    std::map<std::pair<uint64_t, uint64_t>, std::pair<int, uint64_t>> leases GUARDED_BY(mu);
    uint64_t next GUARDED_BY(mu) = 0;
  };
  std::shared_ptr<LeaseBook> book_ = std::make_shared<LeaseBook>();
};

// The server of this node's memory, when peer.listen is set (else null),
// over `parts` (each engine with its arena and tenant scope). Errors:
// remote.key_file's, UCX's (the address taken, ...).
struct PeerService {
  std::unique_ptr<TenantsPeerSource> source;
  std::unique_ptr<PeerServer> server;  // declared last: stops before the source goes
};
Result<std::unique_ptr<PeerService>> StartPeerService(const DaemonConfig& config,
                                                      const std::vector<TenantsPeerSource::Part>& parts);

}  // namespace kvtier
