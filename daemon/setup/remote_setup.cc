#include "daemon/setup/remote_setup.h"

#include <string_view>
#include <vector>

#include "common/logging.h"
#include "daemon/config/regular_file.h"
#include "daemon/setup/remote_key_file.h"
#include "tiers/remote/cluster_networks.h"
#include "policy/policy_registry.h"

namespace kvtier {
namespace {

// A Redis password is a line; anything larger is not one.
constexpr uint64_t kMaxPasswordFileBytes = 64 * 1024;

}  // namespace

std::vector<std::string> SplitList(std::string_view list) {
  std::vector<std::string> out;
  while (!list.empty()) {
    const size_t comma = list.find(',');
    std::string_view item = list.substr(0, comma);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (!item.empty()) out.emplace_back(item);
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
  }
  return out;
}

Result<RemoteTierOptions> RemoteOptionsFromConfig(const DaemonConfig& config) {
  RemoteTierOptions o;
  o.cluster.username = config.remote_user;
  if (!config.remote_password_file.empty()) {
    // Never blocks on a FIFO or a device at the path (daemon/config/regular_file.h).
    Result<std::string> read =
        ReadRegularFile(config.remote_password_file, kMaxPasswordFileBytes, "remote.password_file");
    if (!read.ok()) return read.status();
    std::string password = std::move(*read);
    if (!password.empty() && password.back() == '\n') password.pop_back();
    if (!password.empty() && password.back() == '\r') password.pop_back();
    if (password.empty())
      return InvalidArgument("remote.password_file: '" + config.remote_password_file + "' is empty");
    o.cluster.password = std::move(password);
  }
  o.cluster.seeds = SplitList(config.remote_nodes);
  o.cluster.networks = SplitList(config.remote_cluster_networks);
  if (auto networks = ClusterNetworks::Parse(o.cluster.networks); !networks.ok()) {
    return InvalidArgument("remote.cluster_networks: " + networks.status().message());
  }
  o.cluster.idle_connections_per_node = static_cast<size_t>(config.remote_connections_per_node);
  o.capacity_bytes = static_cast<uint64_t>(config.remote_capacity_bytes);
  o.timeout = std::chrono::milliseconds(config.remote_timeout_ms);
  o.probe_timeout = std::chrono::milliseconds(config.remote_probe_timeout_ms);
  o.retry_interval = std::chrono::milliseconds(config.remote_retry_ms);
  o.threads = static_cast<unsigned>(config.remote_threads);
  o.staging_bytes = static_cast<uint64_t>(config.remote_staging_bytes);
  o.ttl_seconds = static_cast<uint32_t>(config.remote_ttl_s);
  return o;
}

Status LoadClusterSecret(const DaemonConfig& config, RemoteTierOptions& options) {
  auto secret = LoadRemoteKey(config.remote_key_file);
  if (!secret.ok()) return Status(secret.status().code(), "remote.key_file: " + secret.status().message());
  options.cluster_secret = std::move(*secret);
  return Status::Ok();
}

Result<std::unique_ptr<RemoteTier>> OpenRemoteTier(const DaemonConfig& config, const Clock& clock) {
  if (config.remote_nodes.empty()) return std::unique_ptr<RemoteTier>();
  auto made = RemoteOptionsFromConfig(config);
  if (!made.ok()) return made.status();
  if (Status loaded = LoadClusterSecret(config, *made); !loaded.ok()) return loaded;
  const RemoteTierOptions& options = *made;
  auto tier = RemoteTier::Open(options, clock);
  if (!tier.ok()) return tier.status();
  if ((*tier)->available()) {
    spdlog::info("tier remote: redis cluster via {} ({} nodes known), share {} bytes", config.remote_nodes,
                 options.cluster.seeds.size(), options.capacity_bytes);
  } else {
    spdlog::warn("tier remote: redis cluster via {} does not answer yet; serving without it, retrying every {} ms",
                 config.remote_nodes, config.remote_retry_ms);
  }
  return tier;
}

Result<LowerTier> RemoteAdmissionFromConfig(const DaemonConfig& config, BlockTier& tier) {
  LowerTier lower;
  lower.tier = &tier;
  lower.admission = config.remote_admission;
  lower.rate_bytes_per_second = static_cast<uint64_t>(config.remote_write_rate);
  if (lower.admission == AdmissionPolicyId::kRate) {
    spdlog::info("remote admission: rate, {} bytes/s", lower.rate_bytes_per_second);
  } else {
    spdlog::info("remote admission: {}", AdmissionPolicyName(lower.admission));
  }
  return lower;
}

}  // namespace kvtier
