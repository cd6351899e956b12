#include "daemon/config/config.h"

#include <charconv>
#include <cstdio>
#include <sstream>
#include <toml++/toml.h>

#include "daemon/config/regular_file.h"
#include "daemon/config/tenant_config.h"

namespace kvtier {
namespace {

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * kKiB;
constexpr int64_t kGiB = 1024 * kMiB;
constexpr int64_t kTiB = 1024 * kGiB;

constexpr OptionSpec kOptions[] = {
    {"server.socket_path", OptionType::kString, "\"/run/kvtier/kvtierd.sock\"", 0, 0, "", false,
     "Unix socket clients connect to; its directory is created if missing.",
     nullptr, &DaemonConfig::socket_path},
    {"server.io_threads", OptionType::kInt, "2", 1, 256, "", false,
     "Threads serving client connections.",
     &DaemonConfig::io_threads, nullptr},
    {"server.max_frame_bytes", OptionType::kBytes, "\"1MiB\"", 4 * kKiB, 64 * kMiB, "", false,
     "Largest request frame accepted; larger frames are refused before parsing.",
     &DaemonConfig::max_frame_bytes, nullptr},
    {"server.drain_timeout_ms", OptionType::kInt, "5000", 0, 600000, "", false,
     "On SIGTERM, how long in-flight requests may take before connections are cut.",
     &DaemonConfig::drain_timeout_ms, nullptr},
    {"server.spin_wait_us", OptionType::kInt, "50", 0, 100000, "", false,
     "After its last request, how long an io thread keeps polling before it sleeps (CPU for latency).",
     &DaemonConfig::spin_wait_us, nullptr},
    {"server.max_connections", OptionType::kInt, "4096", 1, 1000000, "", false,
     "Open client connections at most; one past it is answered Busy and closed at once.",
     &DaemonConfig::max_connections, nullptr},
    {"server.reserved_connections_percent", OptionType::kInt, "50", 0, 100, "", false,
     "With [[tenant]] tables: this % of server.max_connections is split equally among the tenants and the "
     "operator, each part kept for its owner; the rest is shared, first come. A tenant past its part when no "
     "shared slot is free is answered Busy; the others still connect.",
     &DaemonConfig::reserved_connections_percent, nullptr},
    {"server.first_request_timeout_ms", OptionType::kInt, "5000", 100, 600000, "", false,
     "A connection that has sent no whole request this long after it was accepted is closed (clients send "
     "Hello at once); separate from server.idle_timeout_s, which counts from the last request.",
     &DaemonConfig::first_request_timeout_ms, nullptr},
    {"server.max_leases_per_connection", OptionType::kInt, "65536", 1, 100000000, "", false,
     "Blocks one connection may hold pinned (leases) at once; pins past it are refused Busy.",
     &DaemonConfig::max_leases_per_connection, nullptr},
    {"server.max_reserved_bytes_per_connection", OptionType::kBytes, "0", 1 * kMiB, 16 * kTiB, "", false,
     "Arena bytes one connection may hold reserved (written, not yet committed); reservations past it are "
     "refused Busy (one block is always allowed while it holds none). 0: half the arena (of its tenant's arena "
     "with tenants), whatever its size.",
     &DaemonConfig::max_reserved_bytes_per_connection, nullptr, false, nullptr, 0, 0, /*zero_is_auto=*/true},
    {"server.reservation_timeout_s", OptionType::kInt, "60", 1, 86400, "", false,
     "A reservation not committed or aborted within this long is dropped and its key is free again.",
     &DaemonConfig::reservation_timeout_s, nullptr},
    {"server.idle_timeout_s", OptionType::kInt, "600", 0, 604800, "", false,
     "A connection that sent no request for this long and holds no leases or reservations is closed "
     "(clients reconnect on their next call). 0: never.",
     &DaemonConfig::idle_timeout_s, nullptr},
    {"server.frame_timeout_ms", OptionType::kInt, "10000", 100, 3600000, "", false,
     "A request frame must arrive whole within this long of its first byte, else the connection is closed.",
     &DaemonConfig::frame_timeout_ms, nullptr},
    {"server.partial_frame_bytes", OptionType::kBytes, "\"256MiB\"", 1 * kMiB, 64 * kGiB, "", false,
     "Memory all connections together may hold for frames still arriving (beyond 4 KiB each); a connection "
     "whose frame would need more is closed.",
     &DaemonConfig::partial_frame_bytes, nullptr},
    {"server.client_memory_bytes", OptionType::kBytes, "0", 8 * kMiB, 1 * kTiB, "", false,
     "Memory all connections together may make kvtierd hold for them: queue hints, leases, reservations, "
     "namespace registrations, loads, partial frames and answers not yet read. A request past it (or past its "
     "tenant's part) is answered Busy. 0: a sixteenth of the machine's memory (or of kvtierd's memory cgroup), "
     "within 32 MiB..4 GiB.",
     &DaemonConfig::client_memory_bytes, nullptr, false, nullptr, 0, 0, /*zero_is_auto=*/true},
    {"server.reserved_client_memory_percent", OptionType::kInt, "50", 0, 100, "", false,
     "With [[tenant]] tables: this % of server.client_memory_bytes is split equally among the tenants and the "
     "operator, each part kept for its owner; the rest is shared, first come. A tenant past its part when "
     "nothing shared is left is answered Busy; the others keep their parts.",
     &DaemonConfig::reserved_client_memory_percent, nullptr},
    {"server.max_client_memory_per_connection", OptionType::kBytes, "\"64MiB\"", 1 * kMiB, 1 * kTiB, "", false,
     "Memory one connection may make kvtierd hold for it (as server.client_memory_bytes counts it); past it "
     "its requests that would add more are answered Busy.",
     &DaemonConfig::max_client_memory_per_connection, nullptr},
    {"server.socket_mode", OptionType::kString, "\"0660\"", 0, 0, "", false,
     "Permissions of the socket, an octal string (\"0660\": owner and group connect); the socket is bound under "
     "a umask that never makes it more open than this, in a directory created 0750 when missing.",
     nullptr, &DaemonConfig::socket_mode},
    {"server.socket_group", OptionType::kString, "\"\"", 0, 0, "", false,
     "Group that owns the socket (a name or numeric gid); its members may connect. Empty: the daemon's own group.",
     nullptr, &DaemonConfig::socket_group, /*may_be_empty=*/true},
    {"server.tenant_key_file", OptionType::kString, "\"\"", 0, 0, "", false,
     "With [[tenant]] tables: the file of the secret that scopes each tenant's keys in the shared tiers (created "
     "0600 on first start). Empty: nvme.index_path, else nvme.path, + \".tenant-key\"; without an NVMe tier a "
     "fresh key each start.",
     nullptr, &DaemonConfig::tenant_key_file, true},
    {"server.trust_shared_directories", OptionType::kBool, "false", 0, 1, "", false,
     "Start even when the directory of the socket, the NVMe file, its index or the tenant key can be written by "
     "someone other than root and kvtierd's user (they could swap the socket for their own listener or plant "
     "symlinks). false: such a directory stops the start with the reason.",
     &DaemonConfig::trust_shared_directories, nullptr},
    {"host.capacity_bytes", OptionType::kBytes, "0", 1 * kMiB, 16 * kTiB, "", false,
     "Size of the shared-memory arena (the host tier); 0: fit it to this machine, a quarter of its memory and "
     "at most half of what is available now, between 256 MiB and 64 GiB (logged at start).",
     &DaemonConfig::host_capacity_bytes, nullptr, false, nullptr, 0, 0, /*zero_is_auto=*/true},
    {"host.lock_memory", OptionType::kChoice, "\"best_effort\"", 0, 0, "required|best_effort|off",
     false,
     "mlock the arena: required fails start-up if RLIMIT_MEMLOCK is too low; best_effort logs a "
     "warning and continues unlocked.",
     nullptr, &DaemonConfig::host_lock_memory},
    {"host.directory", OptionType::kBool, "true", 0, 1, "", false,
     "Publish host blocks in a read-only shared table so clients serve lookups and copying gets without a round trip.",
     &DaemonConfig::host_directory, nullptr},
    {"host.directory_slots", OptionType::kInt, "0", 0, 1 << 26, "", false,
     "Slots of that table (rounded up to a power of two; holds 3/4 as many blocks); 0: one per 48 KiB of arena.",
     &DaemonConfig::host_directory_slots, nullptr},
    {"host.verify_commits", OptionType::kBool, "false", 0, 1, "", false,
     "Hash every committed block even when the client sent its checksum, failing a mismatch (one more pass over "
     "the bytes per put); false trusts the client's checksum, which demotion and verifying readers still check.",
     &DaemonConfig::host_verify_commits, nullptr},
    {"hbm.enabled", OptionType::kChoice, "\"auto\"", 0, 0, "auto|on|off", false,
     "The HBM tier (spare GPU memory above the host tier): auto runs it when the daemon is built with CUDA and "
     "the GPU is there (else it logs why and runs without); on fails start-up instead; off never uses a GPU.",
     nullptr, &DaemonConfig::hbm_enabled},
    {"hbm.device", OptionType::kInt, "0", 0, 1023, "", false,
     "CUDA ordinal of the GPU whose memory the HBM tier takes (as this process sees it: CUDA_VISIBLE_DEVICES "
     "renumbers).",
     &DaemonConfig::hbm_device, nullptr},
    {"hbm.capacity_bytes", OptionType::kBytes, "\"4GiB\"", 1 * kMiB, 16 * kTiB, "", false,
     "Device memory the HBM tier allocates at start, once; leave it out of the inference engine's own share "
     "(vLLM's gpu_memory_utilization).",
     &DaemonConfig::hbm_capacity_bytes, nullptr},
    {"hbm.staging_bytes", OptionType::kBytes, "\"64MiB\"", 1 * kMiB, 64 * kGiB, "", false,
     "Page-locked host memory for the HBM tier's copies; a block larger than 3/4 of it never goes up.",
     &DaemonConfig::hbm_staging_bytes, nullptr},
    {"nvme.path", OptionType::kString, "\"\"", 0, 0, "", false,
     "File or block device of the NVMe tier; empty runs without one.",
     nullptr, &DaemonConfig::nvme_path, /*may_be_empty=*/true},
    {"nvme.capacity_bytes", OptionType::kBytes, "\"16GiB\"", 8 * kMiB, 1024 * kTiB, "", false,
     "Bytes of the NVMe tier: a file is created and preallocated to this size; a block device uses at most this.",
     &DaemonConfig::nvme_capacity_bytes, nullptr},
    {"nvme.region_bytes", OptionType::kBytes, "\"64MiB\"", 1 * kMiB, 4 * kGiB, "", false,
     "Unit of log-structured writes and of reclaim; the largest block the tier stores (less a 4 KiB header).",
     &DaemonConfig::nvme_region_bytes, nullptr},
    {"nvme.queue_depth", OptionType::kInt, "32", 1, 4096, "", false,
     "I/Os in flight per NVMe I/O thread.",
     &DaemonConfig::nvme_queue_depth, nullptr},
    {"nvme.io_threads", OptionType::kInt, "1", 1, 64, "", false,
     "Threads doing NVMe I/O, one io_uring each.",
     &DaemonConfig::nvme_io_threads, nullptr},
    {"nvme.direct_io", OptionType::kBool, "true", 0, 1, "", false,
     "Open the NVMe file with O_DIRECT (bypass the page cache); false for file systems without it (tmpfs).",
     &DaemonConfig::nvme_direct_io, nullptr},
    {"nvme.preallocate", OptionType::kBool, "true", 0, 1, "", false,
     "Allocate the whole NVMe file at start (a full disk fails start-up, never a write); false: sparse, may fill up later.",
     &DaemonConfig::nvme_preallocate, nullptr},
    {"nvme.io_engine", OptionType::kChoice, "\"auto\"", 0, 0, "auto|io_uring|threads", false,
     "auto: io_uring, else a pread/pwrite thread pool (logged).",
     nullptr, &DaemonConfig::nvme_io_engine},
    {"nvme.index_path", OptionType::kString, "\"\"", 0, 0, "", false,
     "Directory of the RocksDB index; empty: nvme.path + \".index\".",
     nullptr, &DaemonConfig::nvme_index_path, /*may_be_empty=*/true},
    {"nvme.staging_bytes", OptionType::kBytes, "\"256MiB\"", 1 * kMiB, 64 * kGiB, "", false,
     "Aligned memory every NVMe I/O is staged in; bounds the bytes in flight.",
     &DaemonConfig::nvme_staging_bytes, nullptr},
    {"nvme.reinsert_percent", OptionType::kInt, "10", 0, 100, "", false,
     "Before reclaiming a region, copy forward its blocks read since written, up to this % of the bytes written; 0: off.",
     &DaemonConfig::nvme_reinsert_percent, nullptr},
    {"nvme.eviction", OptionType::kChoice, "\"queue_aware\"", 0, 0, "fifo|lru|lru2|s3fifo|arc|queue_aware", false,
     "NVMe-tier eviction: regions are reclaimed oldest first; what reinsertion copies forward before: fifo "
     "nothing; lru blocks read since written, most read first; queue_aware blocks queued requests need, then lru's; "
     "lru2, s3fifo and arc the blocks that policy (fed the tier's writes and reads) would keep (docs/POLICIES.md).",
     nullptr, &DaemonConfig::nvme_eviction},
    {"nvme.admission", OptionType::kChoice, "\"dwpd\"", 0, 0, "all|second_hit|dwpd", false,
     "Which evicted host blocks are written to NVMe: all; second_hit (blocks read at least once, whose parent is "
     "cached); dwpd (second_hit's rules within the drive's DWPD write budget).",
     nullptr, &DaemonConfig::nvme_admission},
    {"nvme.dwpd_drive_bytes", OptionType::kBytes, "0", 0, 1024 * kTiB, "", false,
     "dwpd: capacity of the drive the budget protects; 0: the size of the file system holding nvme.path.",
     &DaemonConfig::nvme_dwpd_drive_bytes, nullptr},
    {"nvme.dwpd", OptionType::kReal, "1.0", 0, 0, "", false,
     "dwpd: the drive's rated drive writes per day.",
     nullptr, nullptr, false, &DaemonConfig::nvme_dwpd, 0.01, 100},
    {"nvme.dwpd_warranty_years", OptionType::kReal, "5.0", 0, 0, "", false,
     "dwpd: the years the DWPD rating covers.",
     nullptr, nullptr, false, &DaemonConfig::nvme_dwpd_warranty_years, 0.1, 50},
    {"nvme.dwpd_planned_years", OptionType::kReal, "5.0", 0, 0, "", false,
     "dwpd: the years the drive should last; longer than the warranty lowers the budget in proportion.",
     nullptr, nullptr, false, &DaemonConfig::nvme_dwpd_planned_years, 0.1, 50},
    {"nvme.dwpd_share", OptionType::kReal, "1.0", 0, 0, "", false,
     "dwpd: the part of the drive's write endurance kvtier may use (others share the drive).",
     nullptr, nullptr, false, &DaemonConfig::nvme_dwpd_share, 0.001, 1},
    {"nvme.dwpd_max_write_rate", OptionType::kBytes, "0", 0, 1024 * kGiB, "", false,
     "dwpd: the fastest it may write (bytes per second) when catching up after idle time; 0: twice the daily rate.",
     &DaemonConfig::nvme_dwpd_max_write_rate, nullptr},
    {"nvme.sync_index", OptionType::kBool, "false", 0, 1, "", false,
     "fsync the index on every update: survives power loss, not only process crashes.",
     &DaemonConfig::nvme_sync_index, nullptr},
    {"remote.nodes", OptionType::kString, "\"\"", 0, 0, "", false,
     "The remote tier: some nodes of a Redis Cluster (or one Redis), \"host:port\" separated by commas; the rest "
     "are learned from CLUSTER SLOTS. Empty: no remote tier. Every kvtierd given the same cluster shares its blocks.",
     nullptr, &DaemonConfig::remote_nodes, /*may_be_empty=*/true},
    {"remote.cluster_networks", OptionType::kString, "\"\"", 0, 0, "", false,
     "Networks (\"10.0.0.0/16,fd00::/64\") where a Redis node that only another node's cluster map or redirect "
     "names may be connected to (and sent the password); others are refused unconnected. Empty: the /24 (IPv4) or "
     "/64 (IPv6) of each remote.nodes address. The remote.nodes themselves are always allowed.",
     nullptr, &DaemonConfig::remote_cluster_networks, /*may_be_empty=*/true},
    {"remote.capacity_bytes", OptionType::kBytes, "\"64GiB\"", 1 * kMiB, 1024 * kTiB, "", false,
     "The share of the cluster's memory this node counts on (reported as the tier's capacity; the store's own "
     "maxmemory policy evicts).",
     &DaemonConfig::remote_capacity_bytes, nullptr},
    {"remote.admission", OptionType::kChoice, "\"rate\"", 0, 0, "all|second_hit|rate", false,
     "Which blocks leaving the tier above (NVMe, or the host tier when NVMe refuses them) are written to the "
     "remote tier: rate = blocks with evidence of reuse whose prefix is held, within remote.write_rate.",
     nullptr, &DaemonConfig::remote_admission},
    {"remote.write_rate", OptionType::kBytes, "\"4GiB\"", 1 * kMiB, 1024 * kGiB, "", false,
     "rate admission: bytes per second this node may write to the cluster (a one-second bucket).",
     &DaemonConfig::remote_write_rate, nullptr},
    {"remote.timeout_ms", OptionType::kInt, "2000", 10, 600000, "", false,
     "Deadline of one remote read, write or erase, redirects and retries included.",
     &DaemonConfig::remote_timeout_ms, nullptr},
    {"remote.probe_timeout_ms", OptionType::kInt, "50", 1, 60000, "", false,
     "Deadline of one probe (a lookup asking the cluster which of its keys it holds, pipelined).",
     &DaemonConfig::remote_probe_timeout_ms, nullptr},
    {"remote.retry_ms", OptionType::kInt, "1000", 10, 600000, "", false,
     "While the cluster does not answer, the remote tier is skipped and tried again this often.",
     &DaemonConfig::remote_retry_ms, nullptr},
    {"remote.threads", OptionType::kInt, "4", 1, 64, "", false,
     "Threads sending remote reads and writes (each with its own connections).",
     &DaemonConfig::remote_threads, nullptr},
    {"remote.staging_bytes", OptionType::kBytes, "\"256MiB\"", 1 * kMiB, 64 * kGiB, "", false,
     "Blocks accepted for the remote tier and not yet sent; past it writes are refused (Busy) and the demotion "
     "waits or is dropped.",
     &DaemonConfig::remote_staging_bytes, nullptr},
    {"remote.connections_per_node", OptionType::kInt, "8", 1, 1024, "", false,
     "Idle connections kept open to each cluster node.",
     &DaemonConfig::remote_connections_per_node, nullptr},
    {"remote.ttl_s", OptionType::kInt, "0", 0, 365 * 86400, "", false,
     "Expiry set on each value written (EX); 0: none, the store's eviction policy decides.",
     &DaemonConfig::remote_ttl_s, nullptr},
    {"remote.user", OptionType::kString, "\"\"", 0, 0, "", false,
     "ACL user to AUTH as on every cluster connection (with remote.password_file); empty: the default user.",
     nullptr, &DaemonConfig::remote_user, /*may_be_empty=*/true},
    {"remote.password_file", OptionType::kString, "\"\"", 0, 0, "", false,
     "File holding the cluster's password (requirepass or the ACL user's; one trailing newline ignored), read "
     "at start; empty: no AUTH. A refused password stops the start.",
     nullptr, &DaemonConfig::remote_password_file, /*may_be_empty=*/true},
    {"remote.key_file", OptionType::kString, "\"/var/lib/kvtier/remote.key\"", 0, 0, "", false,
     "The cluster secret (32 bytes, mode 0600) that authenticates every remote value; every node of the cluster "
     "needs the same copy. Created when missing; refused when group/other may read it or its size is wrong.",
     nullptr, &DaemonConfig::remote_key_file},
    {"engine.shards", OptionType::kInt, "8", 1, 256, "", false,
     "Index shards, each with its own lock and policy instances.",
     &DaemonConfig::engine_shards, nullptr},
    {"engine.eviction", OptionType::kChoice, "\"queue_aware\"", 0, 0, "lru|fifo|lru2|s3fifo|arc|queue_aware", false,
     "Host-tier eviction policy: queue_aware evicts closed conversations' blocks first, then the rest in the "
     "order of whichever of LRU, LRU-2 and ARC would be hitting most lately, and keeps what clients' queued "
     "requests need (Client::Enqueue) to the last; lru2, s3fifo and arc are the classic LRU-2, S3-FIFO and ARC "
     "(docs/POLICIES.md).",
     nullptr, &DaemonConfig::engine_eviction},
    {"engine.lookahead_ms", OptionType::kInt, "2000", 0, 3600000, "", false,
     "queue_aware: a block a queued request needs within this many ms is demoted to NVMe when evicted, never "
     "dropped (whatever nvme.admission says).",
     &DaemonConfig::engine_lookahead_ms, nullptr},
    {"engine.prefetch_percent", OptionType::kInt, "25", 0, 100, "", false,
     "With queue hints and an NVMe tier: each prefetch plan reads queued requests' NVMe-resident prefixes into at "
     "most this % of the host tier, earliest start first; 0: no prefetch.",
     &DaemonConfig::engine_prefetch_percent, nullptr},
    {"engine.prefetch_min_blocks", OptionType::kInt, "2", 1, 1 << 20, "", false,
     "Prefetch skips a request whose cached prefix would be shorter than this many blocks.",
     &DaemonConfig::engine_prefetch_min_blocks, nullptr},
    {"engine.demotion_buffer_bytes", OptionType::kBytes, "\"256MiB\"", 0, 64 * kGiB, "", false,
     "Evicted blocks a busy tier below cannot take at once wait here (copied out of the host tier) for a mover "
     "thread to write them; past it they are dropped (engine.demotion_busy_drops). 0: drop at once.",
     &DaemonConfig::engine_demotion_buffer_bytes, nullptr},
    {"metrics.enabled", OptionType::kBool, "true", 0, 1, "", false,
     "Serve Prometheus metrics over HTTP (GET /metrics, GET /healthz) on metrics.address:metrics.port.",
     &DaemonConfig::metrics_enabled, nullptr},
    {"metrics.address", OptionType::kString, "\"127.0.0.1\"", 0, 0, "", false,
     "IP address the metrics endpoint listens on; 127.0.0.1 keeps it on the node, 0.0.0.0 or :: opens it to "
     "the network (put no secrets in labels either way).",
     nullptr, &DaemonConfig::metrics_address},
    {"metrics.port", OptionType::kInt, "9470", 0, 65535, "", false,
     "TCP port of the metrics endpoint; 0 takes any free port (logged, and printed as the 'metrics:' line).",
     &DaemonConfig::metrics_port, nullptr},
    {"metrics.bearer_token_file", OptionType::kString, "\"\"", 0, 0, "", false,
     "File of a bearer token (mode 0600; created with a random one when missing) that every scrape of /metrics "
     "must present (Authorization: Bearer <token>, else 401); such a scrape sees every series. Empty: no token.",
     nullptr, &DaemonConfig::metrics_bearer_token_file, /*may_be_empty=*/true},
    {"metrics.tenant_series", OptionType::kBool, "false", 0, 1, "", false,
     "With [[tenant]] tables and no metrics.bearer_token_file: true shows every series (each tenant's, with its "
     "model ids) to anyone who can reach the endpoint; false leaves out every series labelled with a tenant or a "
     "namespace. Without tenants, or with a token, it changes nothing.",
     &DaemonConfig::metrics_tenant_series, nullptr},
    {"log.level", OptionType::kChoice, "\"info\"", 0, 0, "trace|debug|info|warn|error|critical|off",
     true, "Log verbosity.",
     nullptr, &DaemonConfig::log_level},
    {"log.format", OptionType::kChoice, "\"text\"", 0, 0, "text|json", true,
     "text: spdlog's lines; json: one JSON object per line (time, level, thread, message). --log-format overrides.",
     nullptr, &DaemonConfig::log_format},
};

std::string Where(std::string_view origin, const toml::node& node) {
  std::ostringstream out;
  out << origin;
  if (node.source().begin) out << ":" << node.source().begin.line;
  return out.str();
}

bool IsChoice(std::string_view choices, std::string_view value) {
  while (!choices.empty()) {
    size_t bar = choices.find('|');
    if (choices.substr(0, bar) == value) return true;
    if (bar == std::string_view::npos) break;
    choices.remove_prefix(bar + 1);
  }
  return false;
}

// Checks one TOML value against its spec and stores it.
Status ApplyOption(const OptionSpec& spec, const toml::node& node, std::string_view origin,
                   DaemonConfig& config) {
  const std::string where = Where(origin, node);
  const std::string name(spec.name);
  int64_t number = 0;
  double real = 0;
  std::string text;
  switch (spec.type) {
    case OptionType::kReal:
      if (node.is_floating_point()) real = node.as_floating_point()->get();
      else if (node.is_integer()) real = static_cast<double>(node.as_integer()->get());
      else return InvalidArgument(where + ": " + name + " must be a number");
      if (!(real >= spec.real_min && real <= spec.real_max)) {
        std::ostringstream out;
        out << where << ": " << name << " = " << real << " is outside [" << spec.real_min << ", " << spec.real_max
            << "]";
        return InvalidArgument(out.str());
      }
      break;
    case OptionType::kInt:
      if (!node.is_integer()) return InvalidArgument(where + ": " + name + " must be an integer");
      number = node.as_integer()->get();
      break;
    case OptionType::kBytes:
      if (node.is_integer()) {
        number = node.as_integer()->get();
      } else if (node.is_string()) {
        auto parsed = ParseBytes(node.as_string()->get());
        if (!parsed.ok()) return InvalidArgument(where + ": " + name + ": " + parsed.status().message());
        number = *parsed;
      } else {
        return InvalidArgument(where + ": " + name + " must be a size like \"64MiB\" or an integer");
      }
      break;
    case OptionType::kBool:
      if (!node.is_boolean()) return InvalidArgument(where + ": " + name + " must be true or false");
      number = node.as_boolean()->get() ? 1 : 0;
      break;
    case OptionType::kString:
    case OptionType::kChoice:
      if (!node.is_string()) return InvalidArgument(where + ": " + name + " must be a string");
      text = node.as_string()->get();
      if (spec.type == OptionType::kChoice && !IsChoice(spec.choices, text)) {
        return InvalidArgument(where + ": " + name + " = \"" + text + "\" is not one of " +
                               std::string(spec.choices));
      }
      if (spec.type == OptionType::kString && text.empty() && !spec.may_be_empty) {
        return InvalidArgument(where + ": " + name + " must not be empty");
      }
      break;
  }
  if ((spec.type == OptionType::kInt || spec.type == OptionType::kBytes) &&
      (number < spec.min || number > spec.max) && !(spec.zero_is_auto && number == 0)) {
    return InvalidArgument(where + ": " + name + " = " + std::to_string(number) +
                           " is outside [" + std::to_string(spec.min) + ", " +
                           std::to_string(spec.max) + "]");
  }
  if (spec.int_field != nullptr) config.*spec.int_field = number;
  if (spec.string_field != nullptr) config.*spec.string_field = text;
  if (spec.real_field != nullptr) config.*spec.real_field = real;
  return Status::Ok();
}

const OptionSpec* FindOption(std::string_view name) {
  for (const auto& spec : kOptions) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

// Applies every key of `table` (two levels: section.key); unknown keys fail.
Status ApplyTable(const toml::table& table, std::string_view origin, DaemonConfig& config) {
  for (const auto& [section, section_node] : table) {
    if (section.str() == "tenant") {
      Status s = ApplyTenants(section_node, origin, config.tenants);
      if (!s.ok()) return s;
      continue;
    }
    const auto* section_table = section_node.as_table();
    if (section_table == nullptr) {
      return InvalidArgument(Where(origin, section_node) + ": unknown option '" +
                             std::string(section.str()) + "' (options live in sections, e.g. [host])");
    }
    for (const auto& [key, node] : *section_table) {
      std::string name = std::string(section.str()) + "." + std::string(key.str());
      const OptionSpec* spec = FindOption(name);
      if (spec == nullptr) {
        return InvalidArgument(Where(origin, node) + ": unknown option '" + name + "'");
      }
      Status s = ApplyOption(*spec, node, origin, config);
      if (!s.ok()) return s;
    }
  }
  return Status::Ok();
}

Result<toml::table> ParseToml(std::string_view text, std::string_view origin) {
  try {
    return toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    std::ostringstream out;
    out << origin << ":" << e.source().begin.line << ": " << e.description();
    return InvalidArgument(out.str());
  }
}

}  // namespace

std::span<const OptionSpec> ConfigOptions() { return kOptions; }

std::string DefaultConfigToml() {
  std::string out = "# kvtierd embedded defaults (kvtierd --print-default-config)\n";
  std::string_view current_section;
  for (const auto& spec : kOptions) {
    size_t dot = spec.name.find('.');
    std::string_view section = spec.name.substr(0, dot);
    if (section != current_section) {
      out += "\n[" + std::string(section) + "]\n";
      current_section = section;
    }
    out += "# " + std::string(spec.doc) + "\n";
    out += std::string(spec.name.substr(dot + 1)) + " = " + std::string(spec.default_value) + "\n";
  }
  return out;
}

std::string TomlQuoted(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (byte < 0x20 || byte == 0x7f) {
      char buffer[8];
      std::snprintf(buffer, sizeof buffer, "\\u%04x", static_cast<unsigned>(byte));
      out += buffer;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

namespace {

std::string TomlValue(const OptionSpec& spec, const DaemonConfig& config) {
  if (spec.string_field != nullptr) return TomlQuoted(config.*spec.string_field);
  if (spec.real_field != nullptr) {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%.17g", config.*spec.real_field);
    std::string out = buffer;
    if (out.find_first_of(".eEn") == std::string::npos) out += ".0";  // a TOML float
    return out;
  }
  const int64_t v = config.*spec.int_field;
  if (spec.type == OptionType::kBool) return v != 0 ? "true" : "false";
  return std::to_string(v);
}

}  // namespace

std::string ConfigToml(const DaemonConfig& config) {
  std::string out;
  std::string_view current_section;
  for (const auto& spec : kOptions) {
    const size_t dot = spec.name.find('.');
    const std::string_view section = spec.name.substr(0, dot);
    if (section != current_section) {
      out += (out.empty() ? "[" : "\n[") + std::string(section) + "]\n";
      current_section = section;
    }
    out += std::string(spec.name.substr(dot + 1)) + " = " + TomlValue(spec, config) + "\n";
  }
  return out + TenantsToml(config.tenants);
}

std::string TenantConfigToml(DaemonConfig config, std::string_view tenant) {
  std::erase_if(config.tenants, [tenant](const TenantConfig& t) { return t.name != tenant; });
  config.tenant_key_file.clear();
  config.remote_password_file.clear();
  config.metrics_bearer_token_file.clear();
  return "# the running configuration as tenant " + std::string(tenant) +
         " sees it: its own [[tenant]] table only; the secret files' paths are the operator's\n" + ConfigToml(config);
}

Result<DaemonConfig> ParseConfig(std::string_view toml_text, std::string_view origin) {
  DaemonConfig config;
  auto defaults = ParseToml(DefaultConfigToml(), "<embedded defaults>");
  if (!defaults.ok()) return defaults.status();
  Status s = ApplyTable(*defaults, "<embedded defaults>", config);
  if (!s.ok()) return s;
  auto user = ParseToml(toml_text, origin);
  if (!user.ok()) return user.status();
  s = ApplyTable(*user, origin, config);
  if (!s.ok()) return s;
  if (auto mode = ParseFileMode(config.socket_mode); !mode.ok()) {
    return InvalidArgument(std::string(origin) + ": server.socket_mode: " + mode.status().message());
  }
  return config;
}

Result<DaemonConfig> LoadConfigFile(const std::string& path) {
  auto text = ReadRegularFile(path, kMaxConfigFileBytes, "config file");
  if (!text.ok()) return text.status();
  return ParseConfig(*text, path);
}

Result<int64_t> ParseBytes(std::string_view text) {
  int64_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || value < 0) return InvalidArgument("'" + std::string(text) + "' is not a size");
  std::string_view unit(ptr, text.data() + text.size() - ptr);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  struct Unit { std::string_view name; int64_t factor; };
  static constexpr Unit kUnits[] = {
      {"", 1}, {"B", 1}, {"KiB", kKiB}, {"MiB", kMiB}, {"GiB", kGiB}, {"TiB", kTiB},
      {"KB", 1000}, {"MB", 1000 * 1000}, {"GB", 1000LL * 1000 * 1000},
      {"TB", 1000LL * 1000 * 1000 * 1000}};
  for (const auto& u : kUnits) {
    if (unit == u.name) {
      if (value > INT64_MAX / u.factor) return InvalidArgument("'" + std::string(text) + "' is too large");
      return value * u.factor;
    }
  }
  return InvalidArgument("'" + std::string(text) + "' has an unknown unit (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
}

Result<uint32_t> ParseFileMode(std::string_view text) {
  std::string_view digits = text;
  if (digits.starts_with("0o")) digits.remove_prefix(2);
  uint32_t mode = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), mode, 8);
  if (digits.empty() || ec != std::errc() || ptr != digits.data() + digits.size() || mode > 0777) {
    return InvalidArgument("'" + std::string(text) + "' is not an octal file mode like \"0660\"");
  }
  return mode;
}

std::vector<const OptionSpec*> ChangedOptions(const DaemonConfig& a, const DaemonConfig& b) {
  std::vector<const OptionSpec*> changed;
  for (const auto& spec : kOptions) {
    const bool differs = (spec.int_field != nullptr && a.*spec.int_field != b.*spec.int_field) ||
                         (spec.string_field != nullptr && a.*spec.string_field != b.*spec.string_field) ||
                         (spec.real_field != nullptr && a.*spec.real_field != b.*spec.real_field);
    if (differs) changed.push_back(&spec);
  }
  return changed;
}

std::string OptionsHelp() {
  std::ostringstream out;
  out << "Configuration options (TOML, --config FILE; defaults embedded):\n";
  for (const auto& spec : kOptions) {
    out << "  " << spec.name << " = " << spec.default_value;
    if (spec.type == OptionType::kChoice) out << "  (" << spec.choices << ")";
    if (spec.type == OptionType::kInt || spec.type == OptionType::kBytes) {
      out << "  [" << spec.min << ".." << spec.max << "]" << (spec.zero_is_auto ? " or 0 (auto)" : "");
    }
    if (spec.type == OptionType::kReal) out << "  [" << spec.real_min << ".." << spec.real_max << "]";
    if (spec.runtime_changeable) out << "  (run-time)";
    out << "\n      " << spec.doc << "\n";
  }
  return out.str();
}

}  // namespace kvtier
