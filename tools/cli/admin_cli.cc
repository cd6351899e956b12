#include "tools/cli/admin_cli.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include "common/logging.h"
#include "kvtier/client.h"
#include "tools/cli/block_listing.h"

namespace kvtier::tools {
namespace {

constexpr int kDone = 0, kFailed = 1, kUsage = 2, kUnreachable = 3;

int Fail(const char* command, int code, const std::string& why) {
  std::fprintf(stderr, "kvtier %s: %s\n", command, why.c_str());
  return code;
}

// The daemon, or the exit code saying why not.
Result<std::unique_ptr<Client>> Connect(const AdminOptions& options) {
  ClientOptions o;
  o.socket_path = options.socket_path;
  o.client_name = "kvtier-admin";
  o.use_directory = false;
  o.prefault_arena = false;  // an admin command never touches the arena
  o.reconnect = false;
  return Client::Connect(o);
}

// A refused caller (PermissionDenied: no tenant of this kvtierd) is
// refused, not unreachable.
int ConnectExit(const Status& status) {
  return status.code() == StatusCode::kPermissionDenied ? kFailed : kUnreachable;
}

std::string Quoted(std::string_view text) {
  std::string out;
  AppendJsonString(out, text);
  return out;
}

std::string Dash(const std::string& s) { return s.empty() ? "-" : s; }

std::string HumanBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  size_t u = 0;
  while (v >= 1024 && u + 1 < std::size(units)) {
    v /= 1024;
    ++u;
  }
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buffer;
}

std::string NamespaceJson(const NamespaceInfo& n) {
  std::string out = "{\"fingerprint\":" + Quoted(n.fingerprint.ToHex());
  if (!n.tenant.empty()) out += ",\"tenant\":" + Quoted(n.tenant);
  if (n.descriptor) {
    const NamespaceDescriptor& d = *n.descriptor;
    out += ",\"model_id\":" + Quoted(d.model_id) + ",\"model_revision\":" + Quoted(d.model_revision) +
           ",\"adapter_id\":" + Quoted(d.adapter_id) + ",\"adapter_revision\":" + Quoted(d.adapter_revision) +
           ",\"kv_dtype\":" + Quoted(d.kv_dtype) + ",\"block_tokens\":" + std::to_string(d.block_tokens) +
           ",\"layer_count\":" + std::to_string(d.layer_count) + ",\"tp_rank\":" + std::to_string(d.tp_rank) +
           ",\"tp_size\":" + std::to_string(d.tp_size) + ",\"pp_rank\":" + std::to_string(d.pp_rank) +
           ",\"pp_size\":" + std::to_string(d.pp_size) + ",\"object_kind\":" + Quoted(d.object_kind);
  }
  out += ",\"tiers\":{";
  for (size_t i = 0; i < n.tiers.size(); ++i) {
    if (i > 0) out += ",";
    out += Quoted(n.tiers[i].tier) + ":{\"blocks\":" + std::to_string(n.tiers[i].blocks) +
           ",\"bytes\":" + std::to_string(n.tiers[i].bytes) + "}";
  }
  return out + "}}";
}

// One row per namespace: fingerprint (16 hex), model, revision, adapter,
// then blocks and bytes per tier.
void PrintNamespaces(const std::vector<NamespaceInfo>& namespaces) {
  const bool tenants =
      std::any_of(namespaces.begin(), namespaces.end(), [](const NamespaceInfo& n) { return !n.tenant.empty(); });
  if (tenants) std::printf("%-16s  ", "TENANT");
  std::printf("%-16s  %-32s %-12s %-16s", "NAMESPACE", "MODEL", "REVISION", "ADAPTER");
  if (!namespaces.empty()) {
    for (const auto& t : namespaces.front().tiers) std::printf("  %22s", (t.tier + " blocks/bytes").c_str());
  }
  std::printf("\n");
  for (const NamespaceInfo& n : namespaces) {
    const std::string model = n.descriptor ? n.descriptor->model_id : "(unregistered since start)";
    const std::string revision = n.descriptor ? n.descriptor->model_revision : "";
    std::string adapter = n.descriptor ? n.descriptor->adapter_id : "";
    if (n.descriptor && n.descriptor->tp_size * n.descriptor->pp_size > 1) {
      adapter += (adapter.empty() ? "" : " ") + std::string("tp") + std::to_string(n.descriptor->tp_rank) + "/" +
                 std::to_string(n.descriptor->tp_size) + " pp" + std::to_string(n.descriptor->pp_rank) + "/" +
                 std::to_string(n.descriptor->pp_size);
    }
    if (tenants) std::printf("%-16s  ", Dash(n.tenant).c_str());
    std::printf("%-16s  %-32s %-12s %-16s", n.fingerprint.ToHex().substr(0, 16).c_str(), model.c_str(),
                Dash(revision).c_str(), Dash(adapter).c_str());
    for (const auto& t : n.tiers) {
      std::printf("  %22s", (std::to_string(t.blocks) + " / " + HumanBytes(t.bytes)).c_str());
    }
    std::printf("\n");
  }
}

// A namespace named on the command line.
struct NamedNamespace {
  NamespaceFingerprint fingerprint;
  std::optional<NamespaceDescriptor> descriptor;  // known when `ls` lists it with one
};

// Resolves `--ns TEXT`: 32 hex digits, or a unique prefix of 8 or more of a
// namespace `ls` lists (`listed` is fetched on first need and kept). With
// `describe` a full fingerprint is looked up in the listing too, for its
// descriptor. Returns kDone with `out` set, or the exit code after saying why.
int ResolveNamespace(const char* command, Client& client, const std::string& text, bool describe,
                     std::vector<NamespaceInfo>& listed, NamedNamespace& out) {
  if (text.size() == 32) {
    auto key = BlockKey::FromHex(text);
    if (!key.ok()) return Fail(command, kUsage, "--ns " + text + ": " + key.status().message());
    out.fingerprint = *key;
    if (!describe) return kDone;
  } else if (text.size() < 8) {
    return Fail(command, kUsage, "--ns " + text + ": give at least 8 hex digits");
  }
  if (listed.empty()) {
    auto all = client.ListNamespaces();
    if (!all.ok()) return Fail(command, kFailed, all.status().ToString());
    listed = std::move(*all);
  }
  std::vector<const NamespaceInfo*> matches;
  for (const auto& n : listed) {
    if (n.fingerprint.ToHex().starts_with(text)) matches.push_back(&n);
  }
  if (text.size() == 32 && matches.empty()) return kDone;  // not listed: no descriptor known
  if (matches.size() != 1) {
    return Fail(command, matches.empty() ? kFailed : kUsage,
                "--ns " + text + (matches.empty() ? ": no such namespace" : ": more than one namespace starts so"));
  }
  out.fingerprint = matches.front()->fingerprint;
  out.descriptor = matches.front()->descriptor;
  return kDone;
}

// `--ttl`: a whole number of s, m, h or d (90s, 10m, 2h, 1d), at most 30 days.
std::optional<std::chrono::milliseconds> ParseTtl(const std::string& text) {
  if (text.size() < 2) return std::nullopt;
  const std::string digits = text.substr(0, text.size() - 1);
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  const uint64_t n = std::stoull(digits);
  uint64_t seconds = 0;
  switch (text.back()) {
    case 's':
      seconds = n;
      break;
    case 'm':
      seconds = n * 60;
      break;
    case 'h':
      seconds = n * 3600;
      break;
    case 'd':
      seconds = n * 86400;
      break;
    default:
      return std::nullopt;
  }
  if (seconds == 0 || seconds > 30ull * 86400) return std::nullopt;
  return std::chrono::milliseconds(seconds * 1000);
}

// Whitespace-separated token ids (unsigned 32-bit) from `path`.
Result<std::vector<uint32_t>> ReadTokens(const std::string& path) {
  std::ifstream in(path);
  if (!in) return InvalidArgument("cannot read " + path);
  std::vector<uint32_t> tokens;
  for (std::string word; in >> word;) {
    if (word.size() > 10 || word.find_first_not_of("0123456789") != std::string::npos ||
        std::stoull(word) > UINT32_MAX) {
      return InvalidArgument(path + ": '" + word + "' is not a token id (a whole number below 2^32)");
    }
    tokens.push_back(static_cast<uint32_t>(std::stoull(word)));
  }
  return tokens;
}

// Keys per Hold / Unhold request: well within the default frame cap.
constexpr size_t kKeysPerRequest = 4096;
// How long `pin` waits for blocks being read into the host tier to land.
constexpr int kPendingPolls = 50;
constexpr auto kPendingPoll = std::chrono::milliseconds(20);

// pin and unpin: the namespace and its blocks from the command line (keys,
// or a token file chained with the namespace's descriptor), then one
// request per batch of keys. One line per key, then a summary.
int RunHoldCommand(const AdminOptions& options, bool pin) {
  const char* command = pin ? "pin" : "unpin";
  if (options.ns.empty()) return Fail(command, kUsage, "name the namespace: --ns FINGERPRINT");
  if (options.block_keys.empty() == options.tokens_file.empty()) {
    return Fail(command, kUsage, "name the blocks: --key HEX (repeatable) or --tokens FILE, one of them");
  }
  std::vector<BlockKey> keys;
  for (const std::string& text : options.block_keys) {
    auto key = BlockKey::FromHex(text);
    if (!key.ok()) return Fail(command, kUsage, "--key " + text + ": " + key.status().message());
    keys.push_back(*key);
  }
  std::vector<uint32_t> tokens;
  if (!options.tokens_file.empty()) {
    auto read = ReadTokens(options.tokens_file);
    if (!read.ok()) return Fail(command, kUsage, "--tokens: " + read.status().message());
    tokens = std::move(*read);
  }
  std::chrono::milliseconds ttl{0};
  if (pin) {
    if (options.ttl.empty()) return Fail(command, kUsage, "say how long to hold them: --ttl 90s|10m|2h|1d");
    auto parsed = ParseTtl(options.ttl);
    if (!parsed) return Fail(command, kUsage, "--ttl " + options.ttl + ": give 1s to 30d as 90s, 10m, 2h or 1d");
    ttl = *parsed;
  }
  auto client = Connect(options);
  if (!client.ok()) return Fail(command, ConnectExit(client.status()), client.status().ToString());
  std::vector<NamespaceInfo> listed;
  NamedNamespace ns;
  if (int code = ResolveNamespace(command, **client, options.ns, !options.tokens_file.empty(), listed, ns);
      code != kDone) {
    return code;
  }
  if (!options.tokens_file.empty()) {
    if (!ns.descriptor) {
      return Fail(command, kFailed,
                  "namespace " + ns.fingerprint.ToHex() +
                      " has no known descriptor (no engine registered it since kvtierd started): "
                      "name its blocks with --key");
    }
    auto hasher = ChainHasher::Create(*ns.descriptor);
    if (!hasher.ok()) return Fail(command, kFailed, hasher.status().ToString());
    keys = hasher->Keys(tokens);
    if (keys.empty()) {
      return Fail(command, kUsage,
                  "--tokens " + options.tokens_file + ": " + std::to_string(tokens.size()) +
                      " tokens, not one full block of " + std::to_string(hasher->block_tokens()));
    }
  }
  // Per key: its outcome so far.
  std::vector<HoldOutcome> outcomes(keys.size());
  auto send = [&](const std::vector<size_t>& which) -> Status {
    for (size_t first = 0; first < which.size(); first += kKeysPerRequest) {
      std::vector<BlockKey> batch;
      for (size_t i = first; i < std::min(which.size(), first + kKeysPerRequest); ++i) batch.push_back(keys[which[i]]);
      if (pin) {
        auto held = (*client)->Hold(ns.fingerprint, batch, ttl);
        if (!held.ok()) return held.status();
        for (size_t i = 0; i < batch.size(); ++i) outcomes[which[first + i]] = (*held)[i];
      } else {
        auto released = (*client)->Unhold(ns.fingerprint, batch);
        if (!released.ok()) return released.status();
        for (size_t i = 0; i < batch.size(); ++i) outcomes[which[first + i]] = HoldOutcome{(*released)[i], false};
      }
    }
    return Status::Ok();
  };
  std::vector<size_t> all(keys.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  if (Status s = send(all); !s.ok()) return Fail(command, kFailed, s.ToString());
  // Blocks read in from a tier below are held once they land: ask again
  // (a hold of a held key only renews its expiry) until none is pending.
  for (int poll = 0; pin && poll < kPendingPolls; ++poll) {
    std::vector<size_t> pending;
    for (size_t i = 0; i < outcomes.size(); ++i) {
      if (outcomes[i].status.ok() && outcomes[i].pending) pending.push_back(i);
    }
    if (pending.empty()) break;
    std::this_thread::sleep_for(kPendingPoll);
    if (Status s = send(pending); !s.ok()) return Fail(command, kFailed, s.ToString());
  }
  size_t done = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const HoldOutcome& o = outcomes[i];
    if (o.status.ok() && !o.pending) {
      ++done;
      std::printf("%s %s\n", pin ? "held" : "unpinned", keys[i].ToHex().c_str());
    } else if (o.status.ok()) {
      std::printf("pending %s: still being read into the host tier; held once it lands\n", keys[i].ToHex().c_str());
    } else {
      std::printf("not held %s: %s\n", keys[i].ToHex().c_str(), o.status.ToString().c_str());
    }
  }
  if (pin) {
    std::printf("pinned %zu of %zu blocks of %s for %s\n", done, keys.size(), ns.fingerprint.ToHex().c_str(),
                options.ttl.c_str());
  } else {
    std::printf("unpinned %zu of %zu blocks of %s\n", done, keys.size(), ns.fingerprint.ToHex().c_str());
  }
  return done == keys.size() ? kDone : kFailed;
}

}  // namespace

AdminCommands AddAdminCommands(CLI::App& app, AdminOptions& options) {
  options.socket_path = ClientOptions().socket_path;
  AdminCommands c;
  auto socket = [&options](CLI::App* sub) {
    sub->add_option("--socket", options.socket_path, "kvtierd socket")->capture_default_str();
  };
  c.stats = app.add_subcommand("stats", "Print every counter of a running kvtierd");
  socket(c.stats);
  c.stats->add_flag("--json", options.json, "One JSON object {name: value}");
  c.ls = app.add_subcommand(
      "ls", "List namespaces: model, revision, adapter, blocks and bytes per tier (--blocks: every block)");
  socket(c.ls);
  c.ls->add_flag("--json", options.json, "One JSON array");
  c.ls->add_flag("--blocks", options.blocks,
                 "Every block every tier holds (tier, namespace, key), not namespaces; read in pages, so not one "
                 "atomic snapshot");
  c.drop = app.add_subcommand("drop", "Remove namespaces, or a model (revision), from every tier");
  socket(c.drop);
  c.drop->add_option("--ns", options.namespaces, "Namespace fingerprint (32 hex, or a unique prefix of 8+ from `ls`)");
  auto* model = c.drop->add_option("--model", options.model_id, "Every registered namespace of this model id");
  c.drop->add_option("--revision", options.model_revision, "Only this revision of --model")->needs(model);
  for (bool pin : {true, false}) {
    CLI::App* sub = pin ? app.add_subcommand("pin",
                                             "Hold blocks of a namespace in the host tier until unpinned or "
                                             "the TTL passes")
                        : app.add_subcommand("unpin", "End holds that pin took");
    socket(sub);
    sub->add_option("--ns", options.ns, "Namespace fingerprint (32 hex, or a unique prefix of 8+ from `ls`)");
    sub->add_option("--key", options.block_keys, "A block key (32 hex); repeatable");
    sub->add_option("--tokens", options.tokens_file,
                    "A file of whitespace-separated token ids: the blocks of its prefix chain (the namespace's "
                    "descriptor must be known to `ls`)");
    if (pin) sub->add_option("--ttl", options.ttl, "How long to hold them: 90s, 10m, 2h, 1d (at most 30d)");
    (pin ? c.pin : c.unpin) = sub;
  }
  auto* config = app.add_subcommand("config", "The running configuration");
  config->require_subcommand(1);
  c.config_get = config->add_subcommand("get", "Print the running configuration, or one option (section.key)");
  socket(c.config_get);
  c.config_get->add_option("key", options.key, "An option, e.g. host.capacity_bytes");
  c.health = app.add_subcommand("health", "Whether the daemon serves normally (exit 0) or not (1), and why");
  socket(c.health);
  c.health->add_flag("--json", options.json, "One JSON object");
  return c;
}

int RunStats(const AdminOptions& options) {
  auto client = Connect(options);
  if (!client.ok()) return Fail("stats", ConnectExit(client.status()), client.status().ToString());
  auto counters = (*client)->Stats();
  if (!counters.ok()) return Fail("stats", kFailed, counters.status().ToString());
  if (options.json) {
    std::string out = "{";
    for (size_t i = 0; i < counters->size(); ++i) {
      out += (i > 0 ? "," : "") + Quoted((*counters)[i].name) + ":" + std::to_string((*counters)[i].value);
    }
    std::printf("%s}\n", out.c_str());
    return kDone;
  }
  for (const auto& c : *counters) std::printf("%-44s %lld\n", c.name.c_str(), static_cast<long long>(c.value));
  return kDone;
}

int RunLs(const AdminOptions& options) {
  auto client = Connect(options);
  if (!client.ok()) return Fail("ls", ConnectExit(client.status()), client.status().ToString());
  if (options.blocks) {
    auto blocks = (*client)->ListBlocks();
    if (!blocks.ok()) return Fail("ls", kFailed, blocks.status().ToString());
    PrintBlocks(std::move(*blocks), options.json);
    return kDone;
  }
  auto namespaces = (*client)->ListNamespaces();
  if (!namespaces.ok()) return Fail("ls", kFailed, namespaces.status().ToString());
  if (options.json) {
    std::string out = "[";
    for (size_t i = 0; i < namespaces->size(); ++i) out += (i > 0 ? "," : "") + NamespaceJson((*namespaces)[i]);
    std::printf("%s]\n", out.c_str());
    return kDone;
  }
  PrintNamespaces(*namespaces);
  return kDone;
}

int RunDrop(const AdminOptions& options) {
  if (options.namespaces.empty() && options.model_id.empty()) {
    return Fail("drop", kUsage, "name what to drop: --ns FINGERPRINT or --model ID [--revision REV]");
  }
  auto client = Connect(options);
  if (!client.ok()) return Fail("drop", ConnectExit(client.status()), client.status().ToString());
  // Fingerprints in full, or prefixes resolved against what the daemon lists.
  std::vector<NamespaceFingerprint> targets;
  std::vector<NamespaceInfo> listed;
  for (const std::string& text : options.namespaces) {
    NamedNamespace ns;
    if (int code = ResolveNamespace("drop", **client, text, false, listed, ns); code != kDone) return code;
    targets.push_back(ns.fingerprint);
  }
  auto dropped = (*client)->DropNamespaces(targets, options.model_id, options.model_revision);
  if (!dropped.ok()) return Fail("drop", kFailed, dropped.status().ToString());
  if (dropped->empty()) return Fail("drop", kFailed, "model " + options.model_id + " has no registered namespace");
  for (const NamespaceInfo& n : *dropped) {
    std::string line = "dropped " + n.fingerprint.ToHex();
    if (n.descriptor) line += " (" + n.descriptor->model_id + " " + n.descriptor->model_revision + ")";
    line += ":";
    for (const auto& t : n.tiers) line += " " + t.tier + " " + std::to_string(t.blocks) + " blocks";
    std::printf("%s\n", line.c_str());
  }
  return kDone;
}

int RunPin(const AdminOptions& options) { return RunHoldCommand(options, true); }

int RunUnpin(const AdminOptions& options) { return RunHoldCommand(options, false); }

int RunConfigGet(const AdminOptions& options) {
  auto client = Connect(options);
  if (!client.ok()) return Fail("config get", ConnectExit(client.status()), client.status().ToString());
  auto toml = (*client)->RunningConfig();
  if (!toml.ok()) return Fail("config get", kFailed, toml.status().ToString());
  if (options.key.empty()) {
    std::fputs(toml->c_str(), stdout);
    return kDone;
  }
  const size_t dot = options.key.find('.');
  if (dot == std::string::npos) return Fail("config get", kUsage, "give the option as section.key");
  const std::string section = "[" + options.key.substr(0, dot) + "]";
  const std::string key = options.key.substr(dot + 1) + " = ";
  std::istringstream in(*toml);
  std::string current;
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("[")) {
      current = line;
    } else if (current == section && line.starts_with(key)) {
      std::printf("%s\n", line.substr(key.size()).c_str());
      return kDone;
    }
  }
  return Fail("config get", kUsage, "no option " + options.key + " (kvtierd --help lists them)");
}

int RunHealth(const AdminOptions& options) {
  auto client = Connect(options);
  if (!client.ok()) return Fail("health", ConnectExit(client.status()), client.status().ToString());
  auto health = (*client)->Health();
  if (!health.ok()) return Fail("health", kFailed, health.status().ToString());
  if (options.json) {
    auto list = [](const std::vector<std::string>& items) {
      std::string out = "[";
      for (size_t i = 0; i < items.size(); ++i) out += (i > 0 ? "," : "") + Quoted(items[i]);
      return out + "]";
    };
    std::printf("{\"healthy\":%s,\"problems\":%s,\"warnings\":%s,\"version\":%s,\"uptime_s\":%llu,\"tiers\":%s}\n",
                health->healthy ? "true" : "false", list(health->problems).c_str(), list(health->warnings).c_str(),
                Quoted(health->version).c_str(), static_cast<unsigned long long>(health->uptime_s),
                list(health->tiers).c_str());
  } else {
    std::string tiers;
    for (const auto& t : health->tiers) tiers += (tiers.empty() ? "" : " ") + t;
    std::printf("%s: kvtierd %s, up %llu s, tiers %s\n", health->healthy ? "healthy" : "UNHEALTHY",
                health->version.c_str(), static_cast<unsigned long long>(health->uptime_s), tiers.c_str());
    for (const auto& p : health->problems) std::printf("problem: %s\n", p.c_str());
    for (const auto& w : health->warnings) std::printf("warning: %s\n", w.c_str());
  }
  return health->healthy ? kDone : kFailed;
}

}  // namespace kvtier::tools
