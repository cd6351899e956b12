#include "daemon/setup/peer_setup.h"

#include <algorithm>
#include <cstdio>
#include <netinet/in.h>
#include <string_view>

#include "common/checksum.h"
#include "common/log_rate_limiter.h"
#include "common/logging.h"
#include "daemon/setup/remote_key_file.h"
#include "daemon/setup/remote_setup.h"
#include "subscriber/held_directory.h"
#include "tiers/remote/member_registry.h"

namespace kvtier {
namespace {

Result<std::string> PeerSecret(const DaemonConfig& config) {
  auto secret = LoadRemoteKey(config.remote_key_file);
  if (!secret.ok()) return Status(secret.status().code(), "remote.key_file: " + secret.status().message());
  return std::move(*secret);
}

constexpr uint64_t kReaderConnectionBit = uint64_t{1} << 62;

}  // namespace

uint64_t PeerNodeId() {
  static const uint64_t id = FreshNodeId();
  return id;
}

namespace {

// The address peer.discover announces: peer.advertise, else peer.listen,
// either naming a host others can reach (not a wildcard).
Result<std::string> AdvertisedAddress(const DaemonConfig& config) {
  if (config.peer_listen.empty()) {
    return InvalidArgument("peer.discover needs peer.listen: a node is announced only where it serves");
  }
  const std::string& address = config.peer_advertise.empty() ? config.peer_listen : config.peer_advertise;
  const char* option = config.peer_advertise.empty() ? "peer.listen" : "peer.advertise";
  auto parsed = ParsePeerAddress(address);
  if (!parsed.ok()) return InvalidArgument(std::string(option) + ": " + parsed.status().message());
  const auto* any4 = reinterpret_cast<const sockaddr_in*>(&parsed->addr);
  const auto* any6 = reinterpret_cast<const sockaddr_in6*>(&parsed->addr);
  if ((parsed->addr.ss_family == AF_INET && any4->sin_addr.s_addr == htonl(INADDR_ANY)) ||
      (parsed->addr.ss_family == AF_INET6 && IN6_IS_ADDR_UNSPECIFIED(&any6->sin6_addr))) {
    return InvalidArgument(std::string(option) + " '" + address +
                           "' is a wildcard the other nodes cannot connect to; set peer.advertise to this node's "
                           "address on the cluster's network");
  }
  return parsed->text;
}

// peer.discover: the registry in the remote tier's Redis, over a client of its own.
Status AddDiscovery(const DaemonConfig& config, const Clock& clock, const std::string& secret, PeerTierOptions& o) {
  if (config.remote_nodes.empty()) {
    return InvalidArgument("peer.discover needs the remote tier's Redis (remote.nodes)");
  }
  auto advertised = AdvertisedAddress(config);
  if (!advertised.ok()) return advertised.status();
  auto remote = RemoteOptionsFromConfig(config);
  if (!remote.ok()) return remote.status();
  auto client = ClusterClient::Create(remote->cluster, clock);
  if (!client.ok()) return Status(client.status().code(), "peer.discover: " + client.status().message());
  MemberRegistryOptions r;
  char id[17];
  std::snprintf(id, sizeof(id), "%016llx", static_cast<unsigned long long>(PeerNodeId()));
  r.self_id = id;
  r.self_address = *advertised;
  r.ttl = 10 * std::chrono::milliseconds(config.peer_discover_interval_ms);
  r.timeout = std::chrono::milliseconds(config.remote_timeout_ms);
  auto registry = MemberRegistry::Create(std::move(*client), secret, std::move(r));
  if (!registry.ok()) return Status(registry.status().code(), "peer.discover: " + registry.status().message());
  std::shared_ptr<MemberRegistry> shared = std::move(*registry);
  o.discover = [shared]() -> Result<std::vector<std::string>> {
    auto members = shared->Refresh();
    if (!members.ok()) return members.status();
    if (!members->announce_failure.ok()) {
      static LogRateLimiter limiter(1, std::chrono::minutes(1));
      if (uint64_t suppressed = 0; limiter.Allow(suppressed)) {
        spdlog::warn("peer.discover: this node's announcement was not written ({}); the others are still read",
                     members->announce_failure.ToString());
      }
    }
    if (members->refused > 0) {
      static LogRateLimiter limiter(1, std::chrono::minutes(1));
      if (uint64_t suppressed = 0; limiter.Allow(suppressed)) {
        spdlog::warn(
            "peer.discover: {} entries of the registry do not carry this cluster's MAC (another cluster's, "
            "or forged); ignored",
            members->refused);
      }
    }
    return std::move(members->addresses);
  };
  o.leave = [shared] {
    if (Status s = shared->Leave(); !s.ok()) spdlog::warn("peer.discover: leaving the registry: {}", s.ToString());
  };
  o.discover_interval = std::chrono::milliseconds(config.peer_discover_interval_ms);
  spdlog::info("peer.discover: announcing {} through the remote tier every {} ms", *advertised,
               config.peer_discover_interval_ms);
  return Status::Ok();
}

// The members' KV events as the peer tier asks them (subscriber/held_directory.h).
class DirectoryHolders final : public PeerHolders {
 public:
  explicit DirectoryHolders(events::HeldDirectoryOptions o) : directory_(std::move(o)) {}
  void Follow(const std::string& member, const std::string& endpoint, const std::string& replay_endpoint) override {
    directory_.Follow(member, endpoint, replay_endpoint);
  }
  void Unfollow(const std::string& member) override { directory_.Unfollow(member); }
  std::optional<size_t> Leading(const std::string& member, std::span<const BlockKey> keys) const override {
    return directory_.Leading(member, keys);
  }
  void VisitCounters(CounterVisitor& v) const override { directory_.VisitCounters(v); }

 private:
  events::HeldDirectory directory_;
};

// "tcp://HOST:PORT" with a port number (not ZeroMQ's "*"): an endpoint
// other nodes can be told.
bool IsTcpWithPort(const std::string& endpoint) {
  if (!endpoint.starts_with("tcp://")) return false;
  const size_t colon = endpoint.rfind(':');
  return colon != std::string::npos && colon + 1 < endpoint.size() &&
         endpoint.find_first_not_of("0123456789", colon + 1) == std::string::npos;
}

}  // namespace

Result<std::unique_ptr<PeerTier>> OpenPeerTier(const DaemonConfig& config, const Clock& clock) {
  if (config.peer_members.empty() && !config.peer_discover) return std::unique_ptr<PeerTier>();
  auto secret = PeerSecret(config);
  if (!secret.ok()) return secret.status();
  PeerTierOptions o;
  if (config.peer_discover) {
    if (Status s = AddDiscovery(config, clock, *secret, o); !s.ok()) return s;
  }
  // This node's own server, when listed (the same list on every node), is left out: no connection to itself.
  for (std::string& member : SplitList(config.peer_members)) {
    if (member != config.peer_listen) o.members.push_back(std::move(member));
  }
  o.secret = std::move(*secret);
  o.node_id = PeerNodeId();
  o.timeout = std::chrono::milliseconds(config.peer_timeout_ms);
  o.probe_timeout = std::chrono::milliseconds(config.peer_probe_timeout_ms);
  o.retry = std::chrono::milliseconds(config.peer_retry_ms);
  o.probe_fanout = static_cast<size_t>(config.peer_probe_fanout);
  if (config.peer_events_max_blocks > 0) {
    events::HeldDirectoryOptions d;
    d.max_blocks = static_cast<size_t>(config.peer_events_max_blocks);
    d.retry = std::max(std::chrono::milliseconds(config.peer_retry_ms), std::chrono::milliseconds(1000));
    d.answer_timeout = std::chrono::milliseconds(config.peer_timeout_ms);
    o.holders = std::make_shared<DirectoryHolders>(std::move(d));
  }
  auto tier = PeerTier::Open(o);
  if (!tier.ok()) return tier.status();
  spdlog::info("tier peer: {} members ({}){}, reads one-sided over UCX", o.members.size(), config.peer_members,
               config.peer_discover ? " and those discovered" : "");
  return tier;
}

Result<LowerTier> PeerAdmissionFromConfig(const DaemonConfig&, BlockTier& tier) {
  LowerTier lower;
  lower.tier = &tier;
  lower.admission = AdmissionPolicyId::kNone;
  return lower;
}

std::vector<PeerSource::Region> EnginePeerSource::Regions() const {
  std::span<std::byte> arena = host_.Bytes(HostTier::Extent{0, host_.capacity_bytes()});
  return {Region{region_, arena.data(), arena.size()}};
}

namespace {

// Where `key` is on this node, for a peer: placed in its HBM, host or NVMe
// tier (the remote level, Redis and this node's own peer tier, is no more
// this node's than the reader's).
//
// BeingWrittenFirst: a source looks for a block's published layers before
// it looks for the committed block. A commit turns the reservation into the
// committed block in one step under its shard's lock, so in this order a
// look that races the commit finds one or the other; in the other order it
// can miss both (reader's streamed load then ends at that block).
std::optional<Locator::Placed> PlacedHere(const Engine& engine, const NamespaceFingerprint& ns, const BlockKey& key) {
  auto placed = engine.Where(ns, key);
  if (!placed || placed->tier == Tier::kNone || placed->tier == Tier::kRemote || placed->bytes == 0) {
    return std::nullopt;
  }
  return placed;
}

}  // namespace

std::vector<PeerHeld> EnginePeerSource::Find(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  std::vector<PeerHeld> out(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    // A block still being written, with its layers published so far; else a committed one (BeingWrittenFirst).
    if (auto partial = engine_.published_layers().Find(ns, keys[i])) {
      out[i] = PeerHeld{true, partial->bytes, partial->layer_count,
                        static_cast<uint32_t>(partial->layer_checksums.size()), 0};
      continue;
    }
    auto placed = PlacedHere(engine_, ns, keys[i]);
    if (!placed) break;
    const uint32_t layers = engine_.LayersOf(ns, placed->bytes);
    out[i] = PeerHeld{true, placed->bytes, layers, layers, 0};
  }
  return out;
}

size_t EnginePeerSource::Taken(uint64_t, const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  return engine_.TakenByPeer(ns, keys);
}

void EnginePeerSource::SetPublishedListener(PublishedListener listener) {
  engine_.published_layers().SetListener(std::move(listener));
}

void EnginePeerSource::Pin(uint64_t reader, const NamespaceFingerprint& ns, const BlockKey& key, PinDone done) {
  // A block still being written: the layers published so far, read in
  // place (no lease: the reader verifies each layer). Else a committed one
  // (BeingWrittenFirst).
  if (auto partial = engine_.published_layers().Find(ns, key)) {
    PeerPinned p;
    p.region = region_;
    p.offset = partial->offset;
    p.payload_bytes = partial->bytes;
    p.layer_count = partial->layer_count;
    p.layers_ready = static_cast<uint32_t>(partial->layer_checksums.size());
    p.layer_checksums = std::move(partial->layer_checksums);
    return done(std::move(p));
  }
  auto placed = PlacedHere(engine_, ns, key);
  if (!placed) {
    PeerPinned miss;
    miss.code = StatusCode::kNotFound;
    return done(std::move(miss));
  }
  const uint32_t layers = engine_.LayersOf(ns, placed->bytes);
  // The whole block as a layer range: every layer's checksum comes with the grant where it is known.
  engine_.PinAsync(
      kReaderConnectionBit | reader, ns, {key},
      // May run after this source is gone (a block read from NVMe): it uses the arena (alive until the engine
      // is), not `this`.
      [host = &host_, region = region_, layers, done = std::move(done)](std::vector<PinGrant> grants) {
        PeerPinned p;
        if (grants.size() != 1 || !grants[0].status.ok()) {
          p.code = grants.empty() ? StatusCode::kNotFound : grants[0].status.code();
          return done(std::move(p));
        }
        const PinGrant& g = grants[0];
        p.lease = g.lease;
        p.region = region;
        p.offset = g.offset;
        p.payload_bytes = g.length;
        p.layer_count = layers;
        p.layers_ready = layers;
        p.payload_checksum = g.checksum;
        p.layer_checksums = g.layer_checksums;
        if (p.layer_checksums.size() != layers && layers > 0 && g.length % layers == 0) {
          std::span<const std::byte> bytes = host->Bytes(HostTier::Extent{g.offset, g.length});
          p.layer_checksums.clear();
          const uint64_t layer_bytes = g.length / layers;
          for (uint32_t l = 0; l < layers; ++l) {
            p.layer_checksums.push_back(BlockChecksum(bytes.subspan(l * layer_bytes, layer_bytes)));
          }
        }
        done(std::move(p));
      },
      LayerSpan{0, layers});
}

void EnginePeerSource::Release(uint64_t reader, std::span<const uint64_t> leases) {
  engine_.Release(kReaderConnectionBit | reader, leases);
}

void EnginePeerSource::EndReader(uint64_t reader) { engine_.CloseConnection(kReaderConnectionBit | reader); }

TenantsPeerSource::TenantsPeerSource(const std::vector<Part>& parts) {
  for (size_t i = 0; i < parts.size(); ++i) {
    parts_.push_back(Routed{parts[i].scope, std::make_unique<EnginePeerSource>(*parts[i].engine, *parts[i].host,
                                                                               static_cast<uint32_t>(i))});
  }
}

int TenantsPeerSource::PartOf(const NamespaceFingerprint& ns) const {
  for (size_t i = 0; i < parts_.size(); ++i) {
    if (parts_[i].scope == nullptr || parts_[i].scope->Owns(ns)) return static_cast<int>(i);
  }
  return -1;
}

BlockKey TenantsPeerSource::Unscoped(int part, const BlockKey& key) const {
  const TenantScope* scope = parts_[part].scope;
  return scope == nullptr ? key : scope->Unscope(key);
}

std::vector<PeerSource::Region> TenantsPeerSource::Regions() const {
  std::vector<Region> out;
  for (const Routed& p : parts_) {
    for (const Region& r : p.source->Regions()) out.push_back(r);
  }
  return out;
}

std::vector<PeerHeld> TenantsPeerSource::Find(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  const int part = PartOf(ns);
  if (part < 0) return std::vector<PeerHeld>(keys.size());
  std::vector<BlockKey> unscoped;
  unscoped.reserve(keys.size());
  for (const BlockKey& k : keys) unscoped.push_back(Unscoped(part, k));
  return parts_[part].source->Find(ns, unscoped);
}

void TenantsPeerSource::Pin(uint64_t reader, const NamespaceFingerprint& ns, const BlockKey& key, PinDone done) {
  const int part = PartOf(ns);
  if (part < 0) {
    PeerPinned miss;
    miss.code = StatusCode::kNotFound;
    return done(std::move(miss));
  }
  if (parts_.size() == 1) return parts_[0].source->Pin(reader, ns, Unscoped(part, key), std::move(done));
  // Engines number their leases alike: the reader gets an id of this source's, mapped to (engine, lease).
  // The answer may come after this source is gone: the lease book outlives it.
  parts_[part].source->Pin(reader, ns, Unscoped(part, key),
                           [book = book_, reader, part, done = std::move(done)](PeerPinned p) {
                             if (p.code == StatusCode::kOk && p.lease != 0) {
                               MutexLock lock(book->mu);
                               const uint64_t id = ++book->next;
                               book->leases[{reader, id}] = {part, p.lease};
                               p.lease = id;
                             }
                             done(std::move(p));
                           });
}

void TenantsPeerSource::Release(uint64_t reader, std::span<const uint64_t> leases) {
  if (parts_.size() == 1) return parts_[0].source->Release(reader, leases);
  std::vector<std::vector<uint64_t>> by_part(parts_.size());
  {
    MutexLock lock(book_->mu);
    for (uint64_t id : leases) {
      auto it = book_->leases.find({reader, id});
      if (it == book_->leases.end()) continue;
      by_part[it->second.first].push_back(it->second.second);
      book_->leases.erase(it);
    }
  }
  for (size_t i = 0; i < parts_.size(); ++i) {
    if (!by_part[i].empty()) parts_[i].source->Release(reader, by_part[i]);
  }
}

size_t TenantsPeerSource::Taken(uint64_t reader, const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  const int part = PartOf(ns);
  if (part < 0) return 0;
  std::vector<BlockKey> unscoped;
  unscoped.reserve(keys.size());
  for (const BlockKey& k : keys) unscoped.push_back(Unscoped(part, k));
  return parts_[part].source->Taken(reader, ns, unscoped);
}

void TenantsPeerSource::EndReader(uint64_t reader) {
  for (Routed& p : parts_) p.source->EndReader(reader);
  MutexLock lock(book_->mu);
  std::erase_if(book_->leases, [reader](const auto& entry) { return entry.first.first == reader; });
}

void TenantsPeerSource::SetPublishedListener(PublishedListener listener) {
  for (Routed& p : parts_) {
    if (!listener) {
      p.source->SetPublishedListener({});
      continue;
    }
    // The engine names its own (unscoped) key; the readers watch the scoped one.
    p.source->SetPublishedListener(
        [listener, scope = p.scope](const BlockKey& key) { listener(scope == nullptr ? key : scope->Scope(key)); });
  }
}

Result<std::unique_ptr<PeerService>> StartPeerService(const DaemonConfig& config,
                                                      const std::vector<TenantsPeerSource::Part>& parts) {
  if (config.peer_listen.empty()) return std::unique_ptr<PeerService>();
  auto secret = PeerSecret(config);
  if (!secret.ok()) return secret.status();
  auto service = std::make_unique<PeerService>();
  service->source = std::make_unique<TenantsPeerSource>(parts);
  PeerServerOptions o;
  o.listen = config.peer_listen;
  o.secret = std::move(*secret);
  o.max_readers = static_cast<uint32_t>(config.peer_max_readers);
  o.max_pins_per_reader = static_cast<uint32_t>(config.peer_max_pins_per_reader);
  o.node_id = PeerNodeId();
  // The KV events, told to readers so that they ask this node for what it
  // holds: only where other nodes reach them (tcp with a port) and only
  // without tenants (each tenant's are ipc, for its own uid).
  const bool one_engine = parts.size() == 1 && parts.front().scope == nullptr;
  if (config.events_enabled && one_engine && IsTcpWithPort(config.events_endpoint) &&
      IsTcpWithPort(config.events_replay_endpoint)) {
    o.events_endpoint = config.events_endpoint;
    o.events_replay_endpoint = config.events_replay_endpoint;
  }
  auto server = PeerServer::Start(o, *service->source);
  if (!server.ok()) return Status(server.status().code(), "peer.listen: " + server.status().message());
  service->server = std::move(*server);
  spdlog::info("peer server: serving this node's host memory ({} arena{}) on {}{}", parts.size(),
               parts.size() == 1 ? "" : "s, one per tenant", service->server->address(),
               o.events_endpoint.empty() ? "" : ", telling readers its KV events at " + o.events_endpoint);
  return service;
}

}  // namespace kvtier
