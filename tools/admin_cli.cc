#include "tools/admin_cli.h"

#include <cstdio>
#include <memory>
#include <sstream>

#include "common/logging.h"
#include "kvtier/client.h"

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
  o.reconnect = false;
  return Client::Connect(o);
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
    std::printf("%-16s  %-32s %-12s %-16s", n.fingerprint.ToHex().substr(0, 16).c_str(), model.c_str(),
                Dash(revision).c_str(), Dash(adapter).c_str());
    for (const auto& t : n.tiers) {
      std::printf("  %22s", (std::to_string(t.blocks) + " / " + HumanBytes(t.bytes)).c_str());
    }
    std::printf("\n");
  }
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
  c.ls = app.add_subcommand("ls", "List namespaces: model, revision, adapter, blocks and bytes per tier");
  socket(c.ls);
  c.ls->add_flag("--json", options.json, "One JSON array");
  c.drop = app.add_subcommand("drop", "Remove namespaces, or a model (revision), from every tier");
  socket(c.drop);
  c.drop->add_option("--ns", options.namespaces, "Namespace fingerprint (32 hex, or a unique prefix of 8+ from `ls`)");
  auto* model = c.drop->add_option("--model", options.model_id, "Every registered namespace of this model id");
  c.drop->add_option("--revision", options.model_revision, "Only this revision of --model")->needs(model);
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
  if (!client.ok()) return Fail("stats", kUnreachable, client.status().ToString());
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
  if (!client.ok()) return Fail("ls", kUnreachable, client.status().ToString());
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
  if (!client.ok()) return Fail("drop", kUnreachable, client.status().ToString());
  // Fingerprints in full, or prefixes resolved against what the daemon lists.
  std::vector<NamespaceFingerprint> targets;
  std::vector<NamespaceInfo> listed;
  for (const std::string& text : options.namespaces) {
    if (text.size() == 32) {
      auto key = BlockKey::FromHex(text);
      if (!key.ok()) return Fail("drop", kUsage, "--ns " + text + ": " + key.status().message());
      targets.push_back(*key);
      continue;
    }
    if (text.size() < 8) return Fail("drop", kUsage, "--ns " + text + ": give at least 8 hex digits");
    if (listed.empty()) {
      auto all = (*client)->ListNamespaces();
      if (!all.ok()) return Fail("drop", kFailed, all.status().ToString());
      listed = std::move(*all);
    }
    std::vector<NamespaceFingerprint> matches;
    for (const auto& n : listed) {
      if (n.fingerprint.ToHex().starts_with(text)) matches.push_back(n.fingerprint);
    }
    if (matches.size() != 1) {
      return Fail("drop", matches.empty() ? kFailed : kUsage,
                  "--ns " + text + (matches.empty() ? ": no such namespace" : ": more than one namespace starts so"));
    }
    targets.push_back(matches.front());
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

int RunConfigGet(const AdminOptions& options) {
  auto client = Connect(options);
  if (!client.ok()) return Fail("config get", kUnreachable, client.status().ToString());
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
  if (!client.ok()) return Fail("health", kUnreachable, client.status().ToString());
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
