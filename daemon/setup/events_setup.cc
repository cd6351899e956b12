#include "daemon/setup/events_setup.h"

#include <filesystem>
#include <sys/stat.h>
#include <unistd.h>

#include "common/logging.h"
#include "common/msgpack.h"

namespace kvtier {
namespace {

constexpr std::string_view kIpc = "ipc://";

// "ipc:///run/kvtier/kvtierd-events.sock" -> ".../kvtierd-events-<tenant>.sock".
std::string ForTenant(const std::string& endpoint, const std::string& tenant) {
  if (tenant.empty()) return endpoint;
  const size_t dot = endpoint.rfind(".sock");
  if (dot != std::string::npos && dot + 5 == endpoint.size()) return endpoint.substr(0, dot) + "-" + tenant + ".sock";
  return endpoint + "-" + tenant;
}

// Only the tenant (and the daemon's uid, and root) may connect.
Status HandToTenant(const std::string& endpoint, const TenantConfig& tenant) {
  const std::string path = endpoint.substr(kIpc.size());
  if (::chmod(path.c_str(), 0600) != 0) return IoError("events: chmod " + path + ": " + std::strerror(errno));
  const uid_t uid = tenant.uids.empty() ? static_cast<uid_t>(-1) : tenant.uids.front();
  const gid_t gid = tenant.gids.empty() ? static_cast<gid_t>(-1) : tenant.gids.front();
  if (::chown(path.c_str(), uid, gid) != 0) {
    return IoError("events: cannot give " + path + " to tenant " + tenant.name + ": " + std::strerror(errno));
  }
  return Status::Ok();
}

// A 16-byte key of a request (KeyFromBytes); nullopt for anything else.
std::optional<BlockKey> KeyOf(const MsgpackValue& v) {
  const std::string* s = v.str();
  return s != nullptr ? KeyFromBytes(*s) : std::nullopt;
}

// {"type": "estimate", "namespace": 16 bytes, "keys": [16 bytes, ...]} ->
// the engine's ReadyEstimate as a map (docs/OPERATIONS.md, "KV events").
std::string AnswerEstimate(Engine& engine, const MsgpackValue& request) {
  const MsgpackValue* ns_value = request.Find("namespace");
  const MsgpackValue* keys_value = request.Find("keys");
  const std::optional<BlockKey> ns = ns_value != nullptr ? KeyOf(*ns_value) : std::nullopt;
  const MsgpackArray* key_array = keys_value != nullptr ? keys_value->array() : nullptr;
  if (!ns || key_array == nullptr)
    return EncodeEventError("estimate: needs \"namespace\" (16 bytes) and \"keys\" (a list)");
  std::vector<BlockKey> keys;
  keys.reserve(key_array->size());
  for (const MsgpackValue& k : *key_array) {
    std::optional<BlockKey> key = KeyOf(k);
    if (!key) return EncodeEventError("estimate: every key is 16 bytes");
    keys.push_back(*key);
  }
  Result<ReadyEstimate> e = engine.EstimateReady(*ns, keys);
  if (!e.ok()) return EncodeEventError(e.status().ToString());
  MsgpackWriter w;
  w.MapHeader(5);
  w.Str("prefix_blocks");
  w.Uint(e->prefix_blocks);
  w.Str("media");
  w.ArrayHeader(static_cast<uint32_t>(e->tiers.size()));
  for (Tier t : e->tiers) w.Str(MediumName(t));
  w.Str("host_ready_us");
  w.Double(e->host_ready_us);
  w.Str("gpu_ready_us");
  w.Double(e->gpu_ready_us);
  w.Str("tiers");
  w.ArrayHeader(static_cast<uint32_t>(e->below.size()));
  for (const ReadyTierShare& s : e->below) {
    w.MapHeader(6);
    w.Str("medium");
    w.Str(MediumName(s.tier));
    w.Str("blocks");
    w.Uint(s.blocks);
    w.Str("bytes");
    w.Uint(s.bytes);
    w.Str("queued_bytes");
    w.Uint(s.queued_bytes);
    w.Str("read_bytes_per_s");
    w.Double(s.read_bytes_per_s);
    w.Str("ready_us");
    w.Double(s.ready_us);
  }
  return w.Take();
}

EventPublisher::Source SourceOf(Engine& engine) {
  EventPublisher::Source source;
  source.contents = [&engine](const EventPublisher::Source::BlockVisitor& visit) { engine.ForEachHeldBlock(visit); };
  source.namespace_info = [&engine](const NamespaceFingerprint& ns) -> std::optional<EventNamespaceInfo> {
    std::optional<NamespaceDescriptor> d = engine.DescriptorOf(ns);
    if (!d) return std::nullopt;
    return EventNamespaceInfo{d->block_tokens, d->adapter_id};
  };
  source.estimate = [&engine](const MsgpackValue& request) { return AnswerEstimate(engine, request); };
  return source;
}

}  // namespace

Result<EventEndpoints> EventEndpointsFor(const DaemonConfig& config, const std::string& tenant) {
  EventEndpoints out;
  const std::string dir = std::filesystem::path(config.socket_path).parent_path().string();
  const std::string base = std::string(kIpc) + (dir.empty() ? "." : dir) + "/";
  out.derived = config.events_endpoint.empty() && config.events_replay_endpoint.empty();
  out.events =
      ForTenant(config.events_endpoint.empty() ? base + "kvtierd-events.sock" : config.events_endpoint, tenant);
  out.replay = ForTenant(
      config.events_replay_endpoint.empty() ? base + "kvtierd-events-replay.sock" : config.events_replay_endpoint,
      tenant);
  if (!tenant.empty()) {
    for (const std::string* e : {&out.events, &out.replay}) {
      if (!e->starts_with(kIpc)) {
        return InvalidArgument(
            "events: with [[tenant]] tables the events endpoints must be ipc:// (each tenant's "
            "socket file is its own), not " +
            *e);
      }
    }
  }
  return out;
}

std::unique_ptr<EventJournal> MakeEventJournal(const DaemonConfig& config) {
  if (!config.events_enabled) return nullptr;
  return std::make_unique<EventJournal>(static_cast<size_t>(config.events_queue_events));
}

Result<std::unique_ptr<EventPublisher>> StartEvents(const DaemonConfig& config, const TenantConfig* tenant,
                                                    EventJournal& journal, Engine& engine) {
  const std::string name = tenant != nullptr ? tenant->name : "";
  auto endpoints = EventEndpointsFor(config, name);
  if (!endpoints.ok()) return endpoints.status();
  EventPublisherOptions options;
  options.endpoint = endpoints->events;
  options.replay_endpoint = endpoints->replay;
  options.topic = config.events_topic;
  options.format = config.events_format == EventsFormat::kArray ? EventFormat::kArray : EventFormat::kMap;
  options.buffer_batches = static_cast<size_t>(config.events_buffer_batches);
  options.buffer_bytes = static_cast<uint64_t>(config.events_buffer_bytes);
  options.send_hwm = static_cast<int>(config.events_send_hwm);
  options.max_subscribers = static_cast<uint32_t>(config.events_max_subscribers);
  auto publisher = EventPublisher::Start(options, journal, SourceOf(engine));
  if (!publisher.ok()) {
    if (!endpoints->derived) return publisher.status();
    spdlog::warn("{}; serving without KV events (set events.endpoint, or events.enabled = false)",
                 publisher.status().message());
    return std::unique_ptr<EventPublisher>();
  }
  if (tenant != nullptr) {
    for (const std::string& e : {endpoints->events, endpoints->replay}) {
      if (Status s = HandToTenant(e, *tenant); !s.ok()) return s;
    }
  }
  spdlog::info("KV events{}: {} (replay, snapshots, estimates: {})", name.empty() ? "" : " of tenant " + name,
               endpoints->events, endpoints->replay);
  return publisher;
}

}  // namespace kvtier
