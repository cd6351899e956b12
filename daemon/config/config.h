// kvtierd configuration: every option is declared once, in kOptions
// (config_options.cc), with its name, type, default, bounds, run-time
// changeability, a doc line and its typed field (the parser that checks a
// value and stores it, option_field.h). The TOML parser, `kvtierd --help`, the embedded default config
// and docs/OPERATIONS.md all come from that table.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "daemon/config/option_choices.h"
#include "kvtier/result.h"
#include "policy/policy_registry.h"

namespace kvtier {

// One [[tenant]] table (daemon/config/tenant_config.h parses and checks them; the
// daemon maps callers to tenants with daemon/tenants/tenants.h). Not changeable at
// run time.
struct TenantConfig {
  std::string name;                 // [A-Za-z0-9_.-], 1..64 characters, unique
  std::vector<uint32_t> uids;       // callers with one of these uids are this tenant's
  std::vector<uint32_t> gids;       // ... or with one of these as primary or supplementary group
  int64_t host_bytes = 0;           // its arena; 0: an equal share of what the others leave
  int64_t hbm_bytes = 0;            // its HBM pool; 0: an equal share of hbm.capacity_bytes
  int64_t nvme_bytes = 0;           // payload bytes it may keep in each tier below; 0: no quota
  std::vector<std::string> models;  // model ids it may register; empty: any

  friend bool operator==(const TenantConfig&, const TenantConfig&) = default;
};

// The options' values. A DaemonConfig{} holds zeros, not defaults: the
// defaults are kOptions', which ParseConfig applies first.
struct DaemonConfig {
  // [server]
  std::string socket_path;
  int64_t io_threads = 0;
  int64_t max_frame_bytes = 0;
  int64_t drain_timeout_ms = 0;
  int64_t spin_wait_us = 0;
  int64_t max_connections = 0;
  int64_t reserved_connections_percent = 0;
  int64_t first_request_timeout_ms = 0;
  int64_t max_leases_per_connection = 0;
  int64_t max_reserved_bytes_per_connection = 0;  // 0: AutoMaxReservedBytes
  int64_t reservation_timeout_s = 0;
  int64_t idle_timeout_s = 0;  // 0: never
  int64_t frame_timeout_ms = 0;
  int64_t partial_frame_bytes = 0;
  int64_t client_memory_bytes = 0;  // 0: auto (AutoClientMemory)
  int64_t reserved_client_memory_percent = 0;
  int64_t max_client_memory_per_connection = 0;
  std::string socket_mode;                // octal, e.g. "0660" (ParseFileMode)
  std::string socket_group;               // name or gid; empty: the daemon's group
  std::string tenant_key_file;            // empty: <nvme.path>.tenant-key, or a key per start without NVMe
  bool trust_shared_directories = false;  // skip CheckStateDirectories (directory_trust.h)
  // [host]
  int64_t host_capacity_bytes = 0;
  LockMemory host_lock_memory{};
  int64_t host_allocate_at_start_bytes = 0;  // 0: the whole arena before serving
  bool host_directory = false;
  int64_t host_directory_slots = 0;  // 0: HostDirectory::DefaultSlots
  bool host_keep_across_restarts = false;
  bool host_verify_commits = false;
  // [hbm]
  HbmEnabled hbm_enabled{};
  int64_t hbm_device = 0;
  int64_t hbm_capacity_bytes = 0;
  int64_t hbm_staging_bytes = 0;
  // [nvme]
  std::string nvme_path;  // empty: no NVMe tier
  int64_t nvme_capacity_bytes = 0;
  int64_t nvme_region_bytes = 0;
  int64_t nvme_queue_depth = 0;
  int64_t nvme_io_threads = 0;
  bool nvme_direct_io = false;
  bool nvme_preallocate = false;
  NvmeIoEngine nvme_io_engine{};
  std::string nvme_index_path;  // empty: <nvme.path>.index
  int64_t nvme_staging_bytes = 0;
  bool nvme_sync_index = false;
  int64_t nvme_reinsert_percent = 0;
  EvictionPolicyId nvme_eviction{};    // the reclaim order of that name
  AdmissionPolicyId nvme_admission{};  // all | second_hit | dwpd
  int64_t nvme_dwpd_drive_bytes = 0;   // 0: the file system holding nvme.path
  double nvme_dwpd = 0;
  double nvme_dwpd_warranty_years = 0;
  double nvme_dwpd_planned_years = 0;
  double nvme_dwpd_share = 0;
  int64_t nvme_dwpd_max_write_rate = 0;  // bytes/s; 0: twice the daily rate
  // [remote]
  std::string remote_nodes;             // "host:port,host:port"; empty: no remote tier
  std::string remote_cluster_networks;  // "cidr,cidr"; empty: the nodes' /24 or /64
  int64_t remote_capacity_bytes = 0;
  AdmissionPolicyId remote_admission{};  // all | second_hit | rate
  int64_t remote_write_rate = 0;         // bytes/s (rate admission)
  int64_t remote_timeout_ms = 0;
  int64_t remote_probe_timeout_ms = 0;
  int64_t remote_retry_ms = 0;
  int64_t remote_threads = 0;
  int64_t remote_staging_bytes = 0;
  int64_t remote_connections_per_node = 0;
  int64_t remote_ttl_s = 0;
  std::string remote_user;           // empty: AUTH without a user name
  std::string remote_password_file;  // empty: no AUTH
  std::string remote_key_file;       // the cluster secret (daemon/setup/remote_key_file.h)
  // [engine]
  int64_t engine_shards = 0;
  EvictionPolicyId engine_eviction{};  // the host tier's
  int64_t engine_lookahead_ms = 0;
  int64_t engine_prefetch_percent = 0;
  int64_t engine_demotion_buffer_bytes = 0;
  int64_t engine_prefetch_min_blocks = 0;
  // [metrics]
  bool metrics_enabled = false;
  std::string metrics_address;
  int64_t metrics_port = 0;
  std::string metrics_bearer_token_file;  // empty: no token (metrics_server.h)
  bool metrics_tenant_series = false;     // with tenants and no token, show their series anyway
  // [events]
  bool events_enabled = false;
  std::string events_endpoint;         // empty: ipc:// beside server.socket_path (EventEndpoints)
  std::string events_replay_endpoint;  // the same
  std::string events_topic;
  EventsFormat events_format{};
  int64_t events_queue_events = 0;
  int64_t events_buffer_batches = 0;
  int64_t events_buffer_bytes = 0;
  int64_t events_send_hwm = 0;
  int64_t events_max_subscribers = 0;
  // [peer]: the peer tier (tiers/peer/) and the server of this node's memory
  std::string peer_listen;     // "host:port"; empty: this node serves no peer
  std::string peer_members;    // "host:port,host:port": the cluster's peer servers; empty: no peer tier
  bool peer_discover = false;  // find the members through the remote tier's Redis
  std::string peer_advertise;  // "host:port" the others reach peer_listen at; empty: peer_listen
  int64_t peer_discover_interval_ms = 0;
  int64_t peer_timeout_ms = 0;
  int64_t peer_probe_timeout_ms = 0;
  int64_t peer_probe_fanout = 0;
  int64_t peer_events_max_blocks = 0;
  int64_t peer_retry_ms = 0;
  int64_t peer_max_readers = 0;
  int64_t peer_max_pins_per_reader = 0;
  // [log]
  LogLevel log_level{};
  LogFormat log_format{};
  // [[tenant]]: none means one tenant, everyone the socket admits.
  std::vector<TenantConfig> tenants;
};

// How a row's value is written in TOML and checked: kInt and kBytes (a
// size like "64MiB" or an integer) land in an int64_t field bounded by
// min/max; kBool in a bool; kReal in a double bounded by real_min/real_max;
// kString in a std::string; kChoice in a registry id (policy_registry.h)
// or an enum of option_choices.h, one of `choices`.
enum class OptionType { kInt, kBytes, kString, kChoice, kBool, kReal };

// A TOML value as read, before its row's parser checks it (monostate: an
// array, a table, a date or a time).
using OptionValue = std::variant<std::monostate, bool, int64_t, double, std::string>;

struct OptionSpec;

// A row's typed access to its DaemonConfig field (OptionFieldOf in
// option_field.h makes one for each field type). Plain functions: callable
// from any thread on configs the caller owns.
struct OptionField {
  // Checks `value` against `spec` (its type, bounds and choices) and stores
  // it in `config`. InvalidArgument otherwise, whose message is the text
  // that follows "<where>: <name>" in the error, e.g. " must be true or
  // false" or " = 7 is outside [1, 4]".
  Status (*parse)(const OptionSpec& spec, const OptionValue& value, DaemonConfig& config) = nullptr;
  // The field's value as TOML (what ConfigToml writes).
  std::string (*toml)(const OptionSpec& spec, const DaemonConfig& config) = nullptr;
  // Whether `a` and `b` hold the same value.
  bool (*same)(const DaemonConfig& a, const DaemonConfig& b) = nullptr;
  // Copies the value from `from` into `to` (a SIGHUP reload).
  void (*copy)(const DaemonConfig& from, DaemonConfig& to) = nullptr;
};

struct OptionSpec {
  std::string_view name;  // "section.key" as written in TOML
  OptionType type;
  std::string_view default_value;  // as it would be written in TOML
  int64_t min = 0;                 // kInt / kBytes bounds (inclusive)
  int64_t max = 0;
  std::string_view choices;  // kChoice: "a|b|c"
  bool runtime_changeable = false;
  std::string_view doc;
  OptionField field;          // where and how the value lands
  bool may_be_empty = false;  // kString: "" is a valid value (e.g. "feature off")
  double real_min = 0;        // kReal bounds (inclusive)
  double real_max = 0;
  // kInt / kBytes: 0 is also accepted, outside the bounds, and means "size
  // it to this machine" (the daemon resolves it at start and logs what).
  bool zero_is_auto = false;
};

// The table itself, in documentation order.
std::span<const OptionSpec> ConfigOptions();

// The defaults as a TOML document (what kvtierd runs with when given no file).
std::string DefaultConfigToml();

// `config` as a TOML document of every option (bytes as plain integers),
// which ParseConfig reads back to the same values: what `kvtier config
// get` shows of a running daemon.
std::string ConfigToml(const DaemonConfig& config);

// ConfigToml of `config` as tenant `tenant` may see it: its own [[tenant]]
// table only (not the others' uids, gids, quotas and models), and the paths
// of the secret files (server.tenant_key_file, remote.password_file)
// blanked, under a comment saying so.
std::string TenantConfigToml(DaemonConfig config, std::string_view tenant);

// `text` as a TOML basic string: quoted, with quotes, backslashes and
// control characters (DEL included) escaped, so any text reads back as it was.
std::string TomlQuoted(std::string_view text);

// Parses a TOML document on top of the defaults. Unknown keys, wrong types,
// values out of bounds and bad choices are InvalidArgument naming the key
// (and `origin`, e.g. the file name, plus the line where toml++ knows it).
Result<DaemonConfig> ParseConfig(std::string_view toml_text, std::string_view origin);

// The largest config file LoadConfigFile reads (a config of many hundred
// tenants is well under 1 MiB).
constexpr uint64_t kMaxConfigFileBytes = uint64_t{16} << 20;

// Reads and parses a file (ReadRegularFile: a symbolic link is followed,
// nothing blocks, so a FIFO at the path cannot stall a SIGHUP reload).
// IoError if it cannot be read; InvalidArgument if it is not a regular
// file, is larger than kMaxConfigFileBytes, or does not parse.
Result<DaemonConfig> LoadConfigFile(const std::string& path);

// Parses sizes like "1GiB", "512MiB", "4096", "64KiB", "2GB". Bytes as int.
Result<int64_t> ParseBytes(std::string_view text);

// Parses a file mode written in octal: "0660", "660" or "0o660", at most
// 0777. InvalidArgument otherwise (server.socket_mode).
Result<uint32_t> ParseFileMode(std::string_view text);

// The options whose values differ between `a` and `b`, in table order (what
// a SIGHUP reload compares).
std::vector<const OptionSpec*> ChangedOptions(const DaemonConfig& a, const DaemonConfig& b);

// A human-readable table of every option (for --help).
std::string OptionsHelp();

}  // namespace kvtier
