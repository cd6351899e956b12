// kOptions: every kvtierd option, once, in documentation order. The TOML
// parser, `kvtierd --help`, the embedded defaults, `kvtier config get` and
// docs/OPERATIONS.md all come from this table (config.h).
#include <cstdint>

#include "daemon/config/config.h"
#include "daemon/config/option_choices.h"
#include "daemon/config/option_field.h"
#include "policy/option_defaults.h"
#include "policy/policy_registry.h"

namespace kvtier {
namespace {

using config_internal::DefaultBool;
using config_internal::DefaultBytes;
using config_internal::DefaultInt;
using config_internal::DefaultReal;
using config_internal::OptionFieldOf;

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * kKiB;
constexpr int64_t kGiB = 1024 * kMiB;
constexpr int64_t kTiB = 1024 * kGiB;

constexpr OptionSpec kOptions[] = {
    {"server.socket_path", OptionType::kString, "\"/run/kvtier/kvtierd.sock\"", 0, 0, "", false,
     "Unix socket clients connect to; its directory is created if missing.",
     OptionFieldOf<&DaemonConfig::socket_path>()},
    {"server.io_threads", OptionType::kInt, "2", 1, 256, "", false, "Threads serving client connections.",
     OptionFieldOf<&DaemonConfig::io_threads>()},
    {"server.max_frame_bytes", OptionType::kBytes, "\"1MiB\"", 4 * kKiB, 64 * kMiB, "", false,
     "Largest request frame accepted; larger frames are refused before parsing.",
     OptionFieldOf<&DaemonConfig::max_frame_bytes>()},
    {"server.drain_timeout_ms", OptionType::kInt, "5000", 0, 600000, "", false,
     "On SIGTERM, how long in-flight requests may take before connections are cut.",
     OptionFieldOf<&DaemonConfig::drain_timeout_ms>()},
    {"server.spin_wait_us", OptionType::kInt, "50", 0, 100000, "", false,
     "After its last request, how long an io thread keeps polling before it sleeps (CPU for latency).",
     OptionFieldOf<&DaemonConfig::spin_wait_us>()},
    {"server.max_connections", OptionType::kInt, "4096", 1, 1000000, "", false,
     "Open client connections at most; one past it is answered Busy and closed at once.",
     OptionFieldOf<&DaemonConfig::max_connections>()},
    {"server.reserved_connections_percent", OptionType::kInt, "50", 0, 100, "", false,
     "With [[tenant]] tables: this % of server.max_connections is split equally among the tenants and the "
     "operator, each part kept for its owner; the rest is shared, first come. A tenant past its part when no "
     "shared slot is free is answered Busy; the others still connect.",
     OptionFieldOf<&DaemonConfig::reserved_connections_percent>()},
    {"server.first_request_timeout_ms", OptionType::kInt, "5000", 100, 600000, "", false,
     "A connection that has sent no whole request this long after it was accepted is closed (clients send "
     "Hello at once); separate from server.idle_timeout_s, which counts from the last request.",
     OptionFieldOf<&DaemonConfig::first_request_timeout_ms>()},
    {"server.max_leases_per_connection", OptionType::kInt, "65536", 1, 100000000, "", false,
     "Blocks one connection may hold pinned (leases) at once; pins past it are refused Busy.",
     OptionFieldOf<&DaemonConfig::max_leases_per_connection>()},
    {"server.max_reserved_bytes_per_connection", OptionType::kBytes, "0", 1 * kMiB, 16 * kTiB, "", false,
     "Arena bytes one connection may hold reserved (written, not yet committed); reservations past it are "
     "refused Busy (one block is always allowed while it holds none). 0: half the arena (of its tenant's arena "
     "with tenants), whatever its size.",
     OptionFieldOf<&DaemonConfig::max_reserved_bytes_per_connection>(), false, 0, 0, /*zero_is_auto=*/true},
    {"server.reservation_timeout_s", OptionType::kInt, "60", 1, 86400, "", false,
     "A reservation not committed or aborted within this long is dropped and its key is free again.",
     OptionFieldOf<&DaemonConfig::reservation_timeout_s>()},
    {"server.idle_timeout_s", OptionType::kInt, "600", 0, 604800, "", false,
     "A connection that sent no request for this long and holds no leases or reservations is closed "
     "(clients reconnect on their next call). 0: never.",
     OptionFieldOf<&DaemonConfig::idle_timeout_s>()},
    {"server.frame_timeout_ms", OptionType::kInt, "10000", 100, 3600000, "", false,
     "A request frame must arrive whole within this long of its first byte, else the connection is closed.",
     OptionFieldOf<&DaemonConfig::frame_timeout_ms>()},
    {"server.partial_frame_bytes", OptionType::kBytes, "\"256MiB\"", 1 * kMiB, 64 * kGiB, "", false,
     "Memory all connections together may hold for frames still arriving (beyond 4 KiB each); a connection "
     "whose frame would need more is closed.",
     OptionFieldOf<&DaemonConfig::partial_frame_bytes>()},
    {"server.client_memory_bytes", OptionType::kBytes, "0", 8 * kMiB, 1 * kTiB, "", false,
     "Memory all connections together may make kvtierd hold for them: queue hints, leases, reservations, "
     "namespace registrations, loads, partial frames and answers not yet read. A request past it (or past its "
     "tenant's part) is answered Busy. 0: a sixteenth of the machine's memory (or of kvtierd's memory cgroup), "
     "within 32 MiB..4 GiB.",
     OptionFieldOf<&DaemonConfig::client_memory_bytes>(), false, 0, 0, /*zero_is_auto=*/true},
    {"server.reserved_client_memory_percent", OptionType::kInt, "50", 0, 100, "", false,
     "With [[tenant]] tables: this % of server.client_memory_bytes is split equally among the tenants and the "
     "operator, each part kept for its owner; the rest is shared, first come. A tenant past its part when "
     "nothing shared is left is answered Busy; the others keep their parts.",
     OptionFieldOf<&DaemonConfig::reserved_client_memory_percent>()},
    {"server.max_client_memory_per_connection", OptionType::kBytes, "\"64MiB\"", 1 * kMiB, 1 * kTiB, "", false,
     "Memory one connection may make kvtierd hold for it (as server.client_memory_bytes counts it); past it "
     "its requests that would add more are answered Busy.",
     OptionFieldOf<&DaemonConfig::max_client_memory_per_connection>()},
    {"server.socket_mode", OptionType::kString, "\"0660\"", 0, 0, "", false,
     "Permissions of the socket, an octal string (\"0660\": owner and group connect); the socket is bound under "
     "a umask that never makes it more open than this, in a directory created 0750 when missing.",
     OptionFieldOf<&DaemonConfig::socket_mode>()},
    {"server.socket_group", OptionType::kString, "\"\"", 0, 0, "", false,
     "Group that owns the socket (a name or numeric gid); its members may connect. Empty: the daemon's own group.",
     OptionFieldOf<&DaemonConfig::socket_group>(), /*may_be_empty=*/true},
    {"server.tenant_key_file", OptionType::kString, "\"\"", 0, 0, "", false,
     "With [[tenant]] tables: the file of the secret that scopes each tenant's keys in the shared tiers (created "
     "0600 on first start). Empty: nvme.index_path, else nvme.path, + \".tenant-key\"; without an NVMe tier a "
     "fresh key each start.",
     OptionFieldOf<&DaemonConfig::tenant_key_file>(), true},
    {"server.trust_shared_directories", OptionType::kBool, "false", 0, 1, "", false,
     "Start even when the directory of the socket, the NVMe file, its index or the tenant key can be written by "
     "someone other than root and kvtierd's user (they could swap the socket for their own listener or plant "
     "symlinks). false: such a directory stops the start with the reason.",
     OptionFieldOf<&DaemonConfig::trust_shared_directories>()},
    {"host.capacity_bytes", OptionType::kBytes, "0", 1 * kMiB, 16 * kTiB, "", false,
     "Size of the shared-memory arena (the host tier); 0: fit it to this machine, a quarter of its memory and "
     "at most half of what is available now, between 256 MiB and 64 GiB (logged at start).",
     OptionFieldOf<&DaemonConfig::host_capacity_bytes>(), false, 0, 0, /*zero_is_auto=*/true},
    {"host.lock_memory", OptionType::kChoice, "\"best_effort\"", 0, 0, kChoiceNames<LockMemory>, false,
     "mlock the arena: required fails start-up if RLIMIT_MEMLOCK is too low; best_effort logs a "
     "warning and continues unlocked.",
     OptionFieldOf<&DaemonConfig::host_lock_memory>()},
    {"host.allocate_at_start_bytes", OptionType::kBytes, "0", 0, 16 * kTiB, "", false,
     "Bytes of each host arena allocated before the socket opens; the rest is allocated behind it and the host "
     "tier grows as it is (kvtierd serves within a fraction of a second at any arena size). 0: all of it, the "
     "default: an engine that registers the arena with CUDA (vLLM's connector does, at its first copy) while "
     "the rest is being allocated allocates that rest itself, charged to its own memory cgroup.",
     OptionFieldOf<&DaemonConfig::host_allocate_at_start_bytes>()},
    {"host.directory", OptionType::kBool, "true", 0, 1, "", false,
     "Publish host blocks in a read-only shared table so clients serve lookups and copying gets without a round trip.",
     OptionFieldOf<&DaemonConfig::host_directory>()},
    {"host.directory_slots", OptionType::kInt, "0", 0, 1 << 26, "", false,
     "Slots of that table (rounded up to a power of two; holds 3/4 as many blocks); 0: one per 48 KiB of arena.",
     OptionFieldOf<&DaemonConfig::host_directory_slots>()},
    {"host.keep_across_restarts", OptionType::kBool, "true", 0, 1, "", false,
     "Keep a journal of the host arena's blocks, so that the next kvtierd adopts the arena (their bytes checked) "
     "instead of starting empty: after a takeover (--takeover), and under systemd (or kvtier supervise), which "
     "keeps the arena and the journal in its file descriptor store, after a crash or restart.",
     OptionFieldOf<&DaemonConfig::host_keep_across_restarts>()},
    {"host.verify_commits", OptionType::kBool, DefaultBool(defaults::kVerifyCommits), 0, 1, "", false,
     "Hash every committed block even when the client sent its checksum, failing a mismatch (one more pass over "
     "the bytes per put); false trusts the client's checksum, which demotion and verifying readers still check.",
     OptionFieldOf<&DaemonConfig::host_verify_commits>()},
    {"hbm.enabled", OptionType::kChoice, "\"auto\"", 0, 0, kChoiceNames<HbmEnabled>, false,
     "The HBM tier (spare GPU memory above the host tier): auto runs it when the daemon is built with CUDA and "
     "the GPU is there (else it logs why and runs without); on fails start-up instead; off never uses a GPU.",
     OptionFieldOf<&DaemonConfig::hbm_enabled>()},
    {"hbm.device", OptionType::kInt, "0", 0, 1023, "", false,
     "CUDA ordinal of the GPU whose memory the HBM tier takes (as this process sees it: CUDA_VISIBLE_DEVICES "
     "renumbers).",
     OptionFieldOf<&DaemonConfig::hbm_device>()},
    {"hbm.capacity_bytes", OptionType::kBytes, "\"4GiB\"", 1 * kMiB, 16 * kTiB, "", false,
     "Device memory the HBM tier allocates at start, once; leave it out of the inference engine's own share "
     "(vLLM's gpu_memory_utilization).",
     OptionFieldOf<&DaemonConfig::hbm_capacity_bytes>()},
    {"hbm.staging_bytes", OptionType::kBytes, "\"64MiB\"", 1 * kMiB, 64 * kGiB, "", false,
     "Page-locked host memory for the HBM tier's copies; a block larger than 3/4 of it never goes up.",
     OptionFieldOf<&DaemonConfig::hbm_staging_bytes>()},
    {"nvme.path", OptionType::kString, "\"\"", 0, 0, "", false,
     "File or block device of the NVMe tier; empty runs without one.", OptionFieldOf<&DaemonConfig::nvme_path>(),
     /*may_be_empty=*/true},
    {"nvme.capacity_bytes", OptionType::kBytes, "\"16GiB\"", 8 * kMiB, 1024 * kTiB, "", false,
     "Bytes of the NVMe tier: a file is created and preallocated to this size; a block device uses at most this.",
     OptionFieldOf<&DaemonConfig::nvme_capacity_bytes>()},
    {"nvme.region_bytes", OptionType::kBytes, DefaultBytes<defaults::kNvmeRegionBytes>(), 1 * kMiB, 4 * kGiB, "", false,
     "Unit of log-structured writes and of reclaim; the largest block the tier stores (less a 4 KiB header).",
     OptionFieldOf<&DaemonConfig::nvme_region_bytes>()},
    {"nvme.queue_depth", OptionType::kInt, DefaultInt<defaults::kNvmeQueueDepth>(), 1, 4096, "", false,
     "I/Os in flight per NVMe I/O thread.", OptionFieldOf<&DaemonConfig::nvme_queue_depth>()},
    {"nvme.io_threads", OptionType::kInt, DefaultInt<defaults::kNvmeIoThreads>(), 1, 64, "", false,
     "Threads doing NVMe I/O, one io_uring each.", OptionFieldOf<&DaemonConfig::nvme_io_threads>()},
    {"nvme.direct_io", OptionType::kBool, DefaultBool(defaults::kNvmeDirectIo), 0, 1, "", false,
     "Open the NVMe file with O_DIRECT (bypass the page cache); false for file systems without it (tmpfs).",
     OptionFieldOf<&DaemonConfig::nvme_direct_io>()},
    {"nvme.preallocate", OptionType::kBool, DefaultBool(defaults::kNvmePreallocate), 0, 1, "", false,
     "Allocate the whole NVMe file at start (a full disk fails start-up, never a write); false: sparse, may fill up "
     "later.",
     OptionFieldOf<&DaemonConfig::nvme_preallocate>()},
    {"nvme.io_engine", OptionType::kChoice, "\"auto\"", 0, 0, kChoiceNames<NvmeIoEngine>, false,
     "auto: io_uring, else a pread/pwrite thread pool (logged).", OptionFieldOf<&DaemonConfig::nvme_io_engine>()},
    {"nvme.index_path", OptionType::kString, "\"\"", 0, 0, "", false,
     "Directory of the RocksDB index; empty: nvme.path + \".index\".", OptionFieldOf<&DaemonConfig::nvme_index_path>(),
     /*may_be_empty=*/true},
    {"nvme.staging_bytes", OptionType::kBytes, DefaultBytes<defaults::kNvmeStagingBytes>(), 1 * kMiB, 64 * kGiB, "",
     false, "Aligned memory every NVMe I/O is staged in; bounds the bytes in flight.",
     OptionFieldOf<&DaemonConfig::nvme_staging_bytes>()},
    {"nvme.reinsert_percent", OptionType::kInt, DefaultInt<defaults::kNvmeReinsertPercent>(), 0, 100, "", false,
     "Before reclaiming a region, copy forward its blocks read since written, up to this % of the bytes written; 0: "
     "off.",
     OptionFieldOf<&DaemonConfig::nvme_reinsert_percent>()},
    {"nvme.eviction", OptionType::kChoice, "\"queue_aware\"", 0, 0, kEvictionPolicyChoices, false,
     "NVMe-tier eviction: regions are reclaimed oldest first; what reinsertion copies forward before: fifo "
     "nothing; lru blocks read since written, most read first; queue_aware blocks queued requests need, then lru's; "
     "lru2, s3fifo and arc the blocks that policy (fed the tier's writes and reads) would keep (docs/POLICIES.md).",
     OptionFieldOf<&DaemonConfig::nvme_eviction>()},
    {"nvme.admission", OptionType::kChoice, "\"dwpd\"", 0, 0, kNvmeAdmissionChoices, false,
     "Which evicted host blocks are written to NVMe: all; second_hit (blocks read at least once, whose parent is "
     "cached); dwpd (second_hit's rules within the drive's DWPD write budget).",
     OptionFieldOf<&DaemonConfig::nvme_admission>()},
    {"nvme.dwpd_drive_bytes", OptionType::kBytes, "0", 0, 1024 * kTiB, "", false,
     "dwpd: capacity of the drive the budget protects; 0: the size of the file system holding nvme.path.",
     OptionFieldOf<&DaemonConfig::nvme_dwpd_drive_bytes>()},
    {"nvme.dwpd", OptionType::kReal, DefaultReal<&defaults::kDwpd>(), 0, 0, "", false,
     "dwpd: the drive's rated drive writes per day.", OptionFieldOf<&DaemonConfig::nvme_dwpd>(), false, 0.01, 100},
    {"nvme.dwpd_warranty_years", OptionType::kReal, DefaultReal<&defaults::kDwpdWarrantyYears>(), 0, 0, "", false,
     "dwpd: the years the DWPD rating covers.", OptionFieldOf<&DaemonConfig::nvme_dwpd_warranty_years>(), false, 0.1,
     50},
    {"nvme.dwpd_planned_years", OptionType::kReal, DefaultReal<&defaults::kDwpdPlannedYears>(), 0, 0, "", false,
     "dwpd: the years the drive should last; longer than the warranty lowers the budget in proportion.",
     OptionFieldOf<&DaemonConfig::nvme_dwpd_planned_years>(), false, 0.1, 50},
    {"nvme.dwpd_share", OptionType::kReal, DefaultReal<&defaults::kDwpdShare>(), 0, 0, "", false,
     "dwpd: the part of the drive's write endurance kvtier may use (others share the drive).",
     OptionFieldOf<&DaemonConfig::nvme_dwpd_share>(), false, 0.001, 1},
    {"nvme.dwpd_max_write_rate", OptionType::kBytes, "0", 0, 1024 * kGiB, "", false,
     "dwpd: the fastest it may write (bytes per second) when catching up after idle time; 0: twice the daily rate.",
     OptionFieldOf<&DaemonConfig::nvme_dwpd_max_write_rate>()},
    {"nvme.sync_index", OptionType::kBool, "false", 0, 1, "", false,
     "fsync the index on every update: survives power loss, not only process crashes.",
     OptionFieldOf<&DaemonConfig::nvme_sync_index>()},
    {"remote.nodes", OptionType::kString, "\"\"", 0, 0, "", false,
     "The remote tier: some nodes of a Redis Cluster (or one Redis), \"host:port\" separated by commas; the rest "
     "are learned from CLUSTER SLOTS. Empty: no remote tier. Every kvtierd given the same cluster shares its blocks.",
     OptionFieldOf<&DaemonConfig::remote_nodes>(), /*may_be_empty=*/true},
    {"remote.cluster_networks", OptionType::kString, "\"\"", 0, 0, "", false,
     "Networks (\"10.0.0.0/16,fd00::/64\") where a Redis node that only another node's cluster map or redirect "
     "names may be connected to (and sent the password); others are refused unconnected. Empty: the /24 (IPv4) or "
     "/64 (IPv6) of each remote.nodes address. The remote.nodes themselves are always allowed.",
     OptionFieldOf<&DaemonConfig::remote_cluster_networks>(), /*may_be_empty=*/true},
    {"remote.capacity_bytes", OptionType::kBytes, DefaultBytes<defaults::kRemoteCapacityBytes>(), 1 * kMiB, 1024 * kTiB,
     "", false,
     "The share of the cluster's memory this node counts on (reported as the tier's capacity; the store's own "
     "maxmemory policy evicts).",
     OptionFieldOf<&DaemonConfig::remote_capacity_bytes>()},
    {"remote.admission", OptionType::kChoice, "\"rate\"", 0, 0, kRemoteAdmissionChoices, false,
     "Which blocks leaving the tier above (NVMe, or the host tier when NVMe refuses them) are written to the "
     "remote tier: rate = blocks with evidence of reuse whose prefix is held, within remote.write_rate.",
     OptionFieldOf<&DaemonConfig::remote_admission>()},
    {"remote.write_rate", OptionType::kBytes, "\"4GiB\"", 1 * kMiB, 1024 * kGiB, "", false,
     "rate admission: bytes per second this node may write to the cluster (a one-second bucket).",
     OptionFieldOf<&DaemonConfig::remote_write_rate>()},
    {"remote.timeout_ms", OptionType::kInt, DefaultInt<defaults::kRemoteTimeoutMs>(), 10, 600000, "", false,
     "Deadline of one remote read, write or erase, redirects and retries included.",
     OptionFieldOf<&DaemonConfig::remote_timeout_ms>()},
    {"remote.probe_timeout_ms", OptionType::kInt, DefaultInt<defaults::kRemoteProbeTimeoutMs>(), 1, 60000, "", false,
     "Deadline of one probe (a lookup asking the cluster which of its keys it holds, pipelined).",
     OptionFieldOf<&DaemonConfig::remote_probe_timeout_ms>()},
    {"remote.retry_ms", OptionType::kInt, DefaultInt<defaults::kRemoteRetryMs>(), 10, 600000, "", false,
     "While the cluster does not answer, the remote tier is skipped and tried again this often.",
     OptionFieldOf<&DaemonConfig::remote_retry_ms>()},
    {"remote.threads", OptionType::kInt, DefaultInt<defaults::kRemoteThreads>(), 1, 64, "", false,
     "Threads sending remote reads and writes (each with its own connections).",
     OptionFieldOf<&DaemonConfig::remote_threads>()},
    {"remote.staging_bytes", OptionType::kBytes, DefaultBytes<defaults::kRemoteStagingBytes>(), 1 * kMiB, 64 * kGiB, "",
     false,
     "Blocks accepted for the remote tier and not yet sent; past it writes are refused (Busy) and the demotion "
     "waits or is dropped.",
     OptionFieldOf<&DaemonConfig::remote_staging_bytes>()},
    {"remote.connections_per_node", OptionType::kInt, "8", 1, 1024, "", false,
     "Idle connections kept open to each cluster node.", OptionFieldOf<&DaemonConfig::remote_connections_per_node>()},
    {"remote.ttl_s", OptionType::kInt, DefaultInt<defaults::kRemoteTtlSeconds>(), 0, 365 * 86400, "", false,
     "Expiry set on each value written (EX); 0: none, the store's eviction policy decides.",
     OptionFieldOf<&DaemonConfig::remote_ttl_s>()},
    {"remote.user", OptionType::kString, "\"\"", 0, 0, "", false,
     "ACL user to AUTH as on every cluster connection (with remote.password_file); empty: the default user.",
     OptionFieldOf<&DaemonConfig::remote_user>(), /*may_be_empty=*/true},
    {"remote.password_file", OptionType::kString, "\"\"", 0, 0, "", false,
     "File holding the cluster's password (requirepass or the ACL user's; one trailing newline ignored), read "
     "at start; empty: no AUTH. A refused password stops the start.",
     OptionFieldOf<&DaemonConfig::remote_password_file>(), /*may_be_empty=*/true},
    {"remote.key_file", OptionType::kString, "\"/var/lib/kvtier/remote.key\"", 0, 0, "", false,
     "The cluster secret (32 bytes, mode 0600) that authenticates every remote value; every node of the cluster "
     "needs the same copy. Created when missing; refused when group/other may read it or its size is wrong.",
     OptionFieldOf<&DaemonConfig::remote_key_file>()},
    {"engine.shards", OptionType::kInt, DefaultInt<defaults::kEngineShards>(), 1, 256, "", false,
     "Index shards, each with its own lock and policy instances.", OptionFieldOf<&DaemonConfig::engine_shards>()},
    {"engine.eviction", OptionType::kChoice, "\"queue_aware\"", 0, 0, kEvictionPolicyChoices, false,
     "Host-tier eviction policy: queue_aware evicts closed conversations' blocks first, then the rest in the "
     "order of whichever of LRU, LRU-2 and ARC would be hitting most lately, and keeps what clients' queued "
     "requests need (Client::Enqueue) to the last; lru2, s3fifo and arc are the classic LRU-2, S3-FIFO and ARC "
     "(docs/POLICIES.md).",
     OptionFieldOf<&DaemonConfig::engine_eviction>()},
    {"engine.lookahead_ms", OptionType::kInt, DefaultInt<defaults::kLookaheadMs>(), 0, 3600000, "", false,
     "queue_aware: a block a queued request needs within this many ms is demoted to NVMe when evicted, never "
     "dropped (whatever nvme.admission says).",
     OptionFieldOf<&DaemonConfig::engine_lookahead_ms>()},
    {"engine.prefetch_percent", OptionType::kInt, DefaultInt<defaults::kPrefetchPercent>(), 0, 100, "", false,
     "With queue hints and an NVMe tier: each prefetch plan reads queued requests' NVMe-resident prefixes into at "
     "most this % of the host tier, earliest start first; 0: no prefetch.",
     OptionFieldOf<&DaemonConfig::engine_prefetch_percent>()},
    {"engine.prefetch_min_blocks", OptionType::kInt, DefaultInt<defaults::kPrefetchMinBlocks>(), 1, 1 << 20, "", false,
     "Prefetch skips a request whose cached prefix would be shorter than this many blocks.",
     OptionFieldOf<&DaemonConfig::engine_prefetch_min_blocks>()},
    {"engine.demotion_buffer_bytes", OptionType::kBytes, DefaultBytes<defaults::kDemotionBufferBytes>(), 0, 64 * kGiB,
     "", false,
     "Evicted blocks a busy tier below cannot take at once wait here (copied out of the host tier) for a mover "
     "thread to write them; past it they are dropped (engine.demotion_busy_drops). 0: drop at once.",
     OptionFieldOf<&DaemonConfig::engine_demotion_buffer_bytes>()},
    {"metrics.enabled", OptionType::kBool, "true", 0, 1, "", false,
     "Serve Prometheus metrics over HTTP (GET /metrics, GET /healthz) on metrics.address:metrics.port.",
     OptionFieldOf<&DaemonConfig::metrics_enabled>()},
    {"metrics.address", OptionType::kString, "\"127.0.0.1\"", 0, 0, "", false,
     "IP address the metrics endpoint listens on; 127.0.0.1 keeps it on the node, 0.0.0.0 or :: opens it to "
     "the network (put no secrets in labels either way).",
     OptionFieldOf<&DaemonConfig::metrics_address>()},
    {"metrics.port", OptionType::kInt, "9470", 0, 65535, "", false,
     "TCP port of the metrics endpoint; 0 takes any free port (logged, and printed as the 'metrics:' line).",
     OptionFieldOf<&DaemonConfig::metrics_port>()},
    {"metrics.bearer_token_file", OptionType::kString, "\"\"", 0, 0, "", false,
     "File of a bearer token (mode 0600; created with a random one when missing) that every scrape of /metrics "
     "must present (Authorization: Bearer <token>, else 401); such a scrape sees every series. Empty: no token.",
     OptionFieldOf<&DaemonConfig::metrics_bearer_token_file>(), /*may_be_empty=*/true},
    {"metrics.tenant_series", OptionType::kBool, "false", 0, 1, "", false,
     "With [[tenant]] tables and no metrics.bearer_token_file: true shows every series (each tenant's, with its "
     "model ids) to anyone who can reach the endpoint; false leaves out every series labelled with a tenant or a "
     "namespace. Without tenants, or with a token, it changes nothing.",
     OptionFieldOf<&DaemonConfig::metrics_tenant_series>()},
    {"events.enabled", OptionType::kBool, "true", 0, 1, "", false,
     "Publish KV events (what each tier stores and removes) over ZeroMQ in vLLM's KV-events form, for "
     "cache-aware routers (docs/OPERATIONS.md, \"KV events\").",
     OptionFieldOf<&DaemonConfig::events_enabled>()},
    {"events.endpoint", OptionType::kString, "\"\"", 0, 0, "", false,
     "ZeroMQ address the events PUB socket binds (ipc://PATH or tcp://HOST:PORT). Empty: "
     "ipc://<directory of server.socket_path>/kvtierd-events.sock.",
     OptionFieldOf<&DaemonConfig::events_endpoint>(), /*may_be_empty=*/true},
    {"events.replay_endpoint", OptionType::kString, "\"\"", 0, 0, "", false,
     "ZeroMQ address the events ROUTER socket binds: replays by sequence number, snapshots and ready-time "
     "estimates. Empty: ipc://<directory of server.socket_path>/kvtierd-events-replay.sock.",
     OptionFieldOf<&DaemonConfig::events_replay_endpoint>(), /*may_be_empty=*/true},
    {"events.topic", OptionType::kString, "\"\"", 0, 0, "", false,
     "The topic frame of every events batch (subscribers filter on its prefix).",
     OptionFieldOf<&DaemonConfig::events_topic>(), /*may_be_empty=*/true},
    {"events.format", OptionType::kChoice, "\"map\"", 0, 0, kChoiceNames<EventsFormat>, false,
     "The batch encoding: map (vLLM's current KVEventBatch, msgspec structs as maps) or array (its earlier "
     "array_like form).",
     OptionFieldOf<&DaemonConfig::events_format>()},
    {"events.queue_events", OptionType::kInt, "65536", 1, 16777216, "", false,
     "Events waiting for the publisher thread at most; past it they are dropped and the batch sequence skips a "
     "number (events.dropped_batches), so subscribers ask for a snapshot.",
     OptionFieldOf<&DaemonConfig::events_queue_events>()},
    {"events.buffer_batches", OptionType::kInt, "10000", 1, 10000000, "", false,
     "Batches kept for replay requests (and at most events.buffer_bytes of them).",
     OptionFieldOf<&DaemonConfig::events_buffer_batches>()},
    {"events.buffer_bytes", OptionType::kBytes, "\"64MiB\"", 4096, int64_t{1} << 40, "", false,
     "Bytes of batches kept for replay requests at most.", OptionFieldOf<&DaemonConfig::events_buffer_bytes>()},
    {"events.send_hwm", OptionType::kInt, "1000", 1, 1000000, "", false,
     "Batches queued per subscriber at most (ZeroMQ's high-water mark); a slower subscriber loses what follows, "
     "sees the gap in the sequence numbers and replays.",
     OptionFieldOf<&DaemonConfig::events_send_hwm>()},
    {"events.max_subscribers", OptionType::kInt, "8", 1, 4096, "", false,
     "Peers of each events socket at most (the PUB socket's subscribers, the ROUTER socket's requesters), per "
     "engine (per tenant with tenants); one more is refused at its handshake (events.refused_peers) and connects again "
     "later. "
     "With events.send_hwm it bounds what subscribers make the daemon hold.",
     OptionFieldOf<&DaemonConfig::events_max_subscribers>()},
    {"peer.listen", OptionType::kString, "\"\"", 0, 0, "", false,
     "Where this node serves its host memory to the peer tiers of the cluster's other nodes (host:port, UCX over "
     "the transport UCX_TLS allows); empty: it serves none. Readers prove remote.key_file's secret first.",
     OptionFieldOf<&DaemonConfig::peer_listen>(), /*may_be_empty=*/true},
    {"peer.members", OptionType::kString, "\"\"", 0, 0, "", false,
     "The peer servers (host:port, comma-separated) of the cluster: the peer tier asks them for prefixes the local "
     "tiers miss and reads hits from their memory, one-sided; this node's own address may be listed (it is skipped). "
     "Empty: no peer tier.",
     OptionFieldOf<&DaemonConfig::peer_members>(), /*may_be_empty=*/true},
    {"peer.discover", OptionType::kBool, "false", 0, 1, "", false,
     "Find the cluster's peer servers through the remote tier's Redis (remote.nodes): each node announces "
     "peer.advertise there every peer.discover_interval_ms, tagged with remote.key_file's MAC, and reads the others'. "
     "Discovered members are added to peer.members; one missing from 3 reads in a row is dropped. Needs peer.listen.",
     OptionFieldOf<&DaemonConfig::peer_discover>()},
    {"peer.advertise", OptionType::kString, "\"\"", 0, 0, "", false,
     "The address (host:port) other nodes reach this node's peer server at, announced by peer.discover; empty: "
     "peer.listen, which must then name a host, not a wildcard.",
     OptionFieldOf<&DaemonConfig::peer_advertise>(), /*may_be_empty=*/true},
    {"peer.discover_interval_ms", OptionType::kInt, "2000", 100, 600000, "", false,
     "How often peer.discover announces this node and reads the others; an announcement lapses after 10 of these, "
     "and a member missing from 3 reads in a row is dropped, so a node that stops is dropped by the others within "
     "about 13 intervals.",
     OptionFieldOf<&DaemonConfig::peer_discover_interval_ms>()},
    {"peer.timeout_ms", OptionType::kInt, "2000", 10, 600000, "", false,
     "A peer that does not answer a request or finish a read within this counts as stalled: its reads fail (the "
     "engine recomputes), its connection is closed and tried again after peer.retry_ms.",
     OptionFieldOf<&DaemonConfig::peer_timeout_ms>()},
    {"peer.probe_timeout_ms", OptionType::kInt, "20", 1, 60000, "", false,
     "How long a lookup that the local tiers miss waits for the peers' answers (those later still count for the next "
     "lookup).",
     OptionFieldOf<&DaemonConfig::peer_probe_timeout_ms>()},
    {"peer.probe_fanout", OptionType::kInt, "16", 1, 1024, "", false,
     "Members one lookup asks at most: first those whose KV events say they hold the prefix (only those when one "
     "holds all of it), then those nothing is known of, then the rest.",
     OptionFieldOf<&DaemonConfig::peer_probe_fanout>()},
    {"peer.events_max_blocks", OptionType::kInt, "1048576", 0, 1073741824, "", false,
     "Blocks of the members' KV events this node keeps at most (about 64 bytes each), to know which member holds "
     "what; a member past it is asked as if it had no events. 0: follow no member's events.",
     OptionFieldOf<&DaemonConfig::peer_events_max_blocks>()},
    {"peer.retry_ms", OptionType::kInt, "1000", 10, 600000, "", false,
     "How soon a peer that failed, stalled or refused is connected again.",
     OptionFieldOf<&DaemonConfig::peer_retry_ms>()},
    {"peer.max_readers", OptionType::kInt, "64", 1, 65536, "", false,
     "Peer readers connected to this node at most; one more is refused (peer_server.refused).",
     OptionFieldOf<&DaemonConfig::peer_max_readers>()},
    {"peer.max_pins_per_reader", OptionType::kInt, "4096", 1, 1048576, "", false,
     "Blocks one peer reader may hold pinned here at once; a pin past it is answered Busy. Its pins end when it goes "
     "away.",
     OptionFieldOf<&DaemonConfig::peer_max_pins_per_reader>()},
    {"log.level", OptionType::kChoice, "\"info\"", 0, 0, kChoiceNames<LogLevel>, true, "Log verbosity.",
     OptionFieldOf<&DaemonConfig::log_level>()},
    {"log.format", OptionType::kChoice, "\"text\"", 0, 0, kChoiceNames<LogFormat>, true,
     "text: spdlog's lines; json: one JSON object per line (time, level, thread, message). --log-format overrides.",
     OptionFieldOf<&DaemonConfig::log_format>()},
};

}  // namespace

std::span<const OptionSpec> ConfigOptions() { return kOptions; }

}  // namespace kvtier
