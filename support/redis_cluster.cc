#include "support/redis_cluster.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <csignal>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include "support/ports.h"
#include "support/process.h"
#include "support/redis_cluster_nodes.h"
#include "support/temp_dir.h"

namespace kvtier::support {
namespace {

using redis_cluster_internal::Canonical;
using redis_cluster_internal::LastLines;
using redis_cluster_internal::Myself;
using redis_cluster_internal::NodeLine;
using redis_cluster_internal::ParseNodeLine;
using redis_cluster_internal::Split;
using redis_cluster_internal::ToInt;

constexpr const char* kRedisServer = "/usr/bin/redis-server";
constexpr const char* kRedisCli = "/usr/bin/redis-cli";
constexpr const char* kTimeout = "/usr/bin/timeout";
constexpr int kSlots = 16384;
constexpr int kBusPortOffset = 10000;  // Redis Cluster's bus listens on port + 10000
// Node ports are drawn from [kLowestPort, kHighestPort]: with their bus ports
// they stay below Linux's ephemeral range (32768 and up by default), where
// the kernel never hands out a port of ours to an outgoing connection.
constexpr int kLowestPort = 10000;
constexpr int kHighestPort = 22767;
constexpr int kStartAttempts = 5;  // per node, when its port was taken under it
constexpr std::chrono::milliseconds kPoll{50};
constexpr std::chrono::seconds kProbeTimeout{3};  // one redis-cli run while polling

// `count` distinct ports from [kLowestPort, kHighestPort] whose port and bus
// port were both free a moment ago (support::ReserveLoopbackPorts). Fewer
// when the range is crowded.
std::vector<int> ReserveNodePorts(int count) {
  return support::ReserveLoopbackPorts(count, kLowestPort, kHighestPort, kBusPortOffset);
}

// Forks and execs `argv` with stdout and stderr appended to `log_path`. The
// child is SIGKILLed when the calling thread ends, so a crashed test leaves
// no server behind. -1 if it cannot be started.
pid_t SpawnChild(const std::vector<std::string>& argv, const std::string& log_path) {
  const int fd = ::open(log_path.c_str(), O_CREAT | O_WRONLY | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return -1;
  support::SpawnOptions options;
  options.search_path = false;
  options.parent_death_signal = SIGKILL;
  options.stdin_null = false;
  options.reset_signal_mask = false;
  const Result<pid_t> pid = support::Spawn(argv, fd, options);
  ::close(fd);
  return pid.ok() ? *pid : -1;
}

// RunCommand's output; a command that could not run is exit -1 with why.
CommandOutput Run(const std::vector<std::string>& argv) {
  Result<CommandOutput> run = RunCommand(argv);
  return run.ok() ? *run : CommandOutput{-1, run.status().ToString()};
}

// The whole of the file at `path` ("" if it cannot be read).
std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// True once the child `pid` has exited (reaped now) or is not ours to wait
// for any more; the caller must forget `pid` then.
bool Exited(pid_t pid) {
  int status = 0;
  return ::waitpid(pid, &status, WNOHANG) != 0;
}

// What a finished redis-cli run (under timeout(1)) amounts to; see Cli().
Result<std::string> CliOutcome(const CommandOutput& run, const std::string& where) {
  std::string output = run.output;
  if (!output.empty() && output.back() == '\n') output.pop_back();
  if (run.exit_code == 0) return output;
  if (run.exit_code == 124 || run.exit_code == 137) return TimedOut(where + ": redis-cli timed out");
  if (output.rfind("Could not connect", 0) == 0) return Unavailable(where + ": " + output);
  return IoError(where + ": " + output);
}

std::vector<std::string> CliArgv(int port, std::chrono::seconds timeout, bool follow_redirects) {
  std::vector<std::string> argv = {
      kTimeout, "-k",   "1", std::to_string(timeout.count()), kRedisCli, "-h", "127.0.0.1", "-p", std::to_string(port),
      "-e",     "--raw"};
  if (follow_redirects) argv.push_back("-c");
  return argv;
}

// `port`'s CLUSTER NODES, parsed.
Result<std::vector<NodeLine>> ClusterNodes(const RedisCluster& cluster, int port) {
  const Result<std::string> text = cluster.Cli(port, {"CLUSTER", "NODES"}, kProbeTimeout);
  if (!text.ok()) return text.status();
  std::vector<NodeLine> lines;
  for (const auto& line : Split(*text, '\n')) lines.push_back(ParseNodeLine(line));
  return lines;
}

// The "name:value" lines of `port`'s answer to `args` (INFO, CLUSTER INFO).
Result<std::map<std::string, std::string>> InfoFields(const RedisCluster& cluster, int port,
                                                      const std::vector<std::string>& args) {
  const Result<std::string> text = cluster.Cli(port, args, kProbeTimeout);
  if (!text.ok()) return text.status();
  std::map<std::string, std::string> fields;
  for (const auto& line : Split(*text, '\n')) {
    const size_t colon = line.find(':');
    if (line[0] != '#' && colon != std::string::npos) fields[line.substr(0, colon)] = line.substr(colon + 1);
  }
  return fields;
}

}  // namespace

int FreeRedisPort() {
  const std::vector<int> port = ReserveNodePorts(1);
  return port.empty() ? -1 : port[0];
}

std::string RedisCluster::Unavailable() {
  for (const char* path : {kRedisServer, kRedisCli, kTimeout}) {
    if (::access(path, X_OK) != 0) return std::string(path) + " is not installed";
  }
  const CommandOutput server = Run({kRedisServer, "--version"});
  if (server.exit_code != 0) return "redis-server --version failed: " + server.output;
  const CommandOutput cli = Run({kRedisCli, "--version"});
  // "redis-cli 7.0.15": -e (exit status on an error reply) came in 7.0.
  const size_t space = cli.output.find(' ');
  const int64_t major =
      space == std::string::npos ? -1 : ToInt(cli.output.substr(space + 1, cli.output.find('.') - space - 1));
  if (cli.exit_code != 0 || major < 7) return "redis-cli 7.0 or later is needed, found: " + cli.output;
  return "";
}

RedisCluster::RedisCluster(const Options& options, std::string dir) : options_(options), dir_(std::move(dir)) {}

Result<std::unique_ptr<RedisCluster>> RedisCluster::Start(const Options& options) {
  if (std::string why = Unavailable(); !why.empty()) return FailedPrecondition(why);
  if (options.masters < 3 || options.replicas_per_master < 0 || options.node_timeout_ms <= 0) {
    return InvalidArgument("RedisCluster needs 3 masters or more, replicas >= 0, node timeout > 0");
  }
  Result<std::string> dir = MakeTempDir("kvtier-redis-cluster-");
  if (!dir.ok()) return dir.status();
  std::unique_ptr<RedisCluster> cluster(new RedisCluster(options, std::move(*dir)));
  if (Status s = cluster->StartNodes(); !s.ok()) return s;
  if (Status s = cluster->CreateCluster(); !s.ok()) return s;
  if (Status s = cluster->AwaitFormed(std::chrono::seconds(30)); !s.ok()) return s;
  return cluster;
}

RedisCluster::~RedisCluster() {
  for (const Node& node : nodes_) {
    if (node.pid > 0) ::kill(node.pid, SIGTERM);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (Node& node : nodes_) {
    if (node.pid < 0) continue;
    bool gone = Exited(node.pid);
    while (!gone && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      gone = Exited(node.pid);
    }
    if (!gone) {
      ::kill(node.pid, SIGKILL);
      ::waitpid(node.pid, nullptr, 0);
    }
    node.pid = -1;
  }
  RemoveTree(dir_);
}

Status RedisCluster::StartNodes() {
  const int count = options_.masters * (1 + options_.replicas_per_master);
  const std::vector<int> ports = ReserveNodePorts(count);
  if (static_cast<int>(ports.size()) < count) return kvtier::Unavailable("no free loopback ports for the cluster");
  for (int i = 0; i < count; ++i) {
    Node node{dir_ + "/node-" + std::to_string(i), ports[i]};
    std::error_code error;
    std::filesystem::create_directory(node.dir, error);
    if (error) return IoError("cannot create " + node.dir + ": " + error.message());
    nodes_.push_back(node);
  }
  for (Node& node : nodes_) {  // all start in parallel
    if (Status s = StartNode(node); !s.ok()) return s;
  }
  for (Node& node : nodes_) {
    Status ready = AwaitPing(node);
    // Another process may take a port between its choice and its bind: retry there.
    for (int attempt = 1; !ready.ok() && attempt < kStartAttempts &&
                          LogTail(node.port, 5).find("Address already in use") != std::string::npos;
         ++attempt) {
      const std::vector<int> port = ReserveNodePorts(1);
      if (port.empty()) break;
      node.port = port[0];
      std::filesystem::remove(node.dir + "/nodes.conf");
      if (Status s = StartNode(node); !s.ok()) return s;
      ready = AwaitPing(node);
    }
    if (!ready.ok()) return ready;
  }
  return Status::Ok();
}

Status RedisCluster::StartNode(Node& node) {
  node.pid = SpawnChild({kRedisServer,
                         "--port",
                         std::to_string(node.port),
                         "--bind",
                         "127.0.0.1",
                         "--dir",
                         node.dir,
                         "--cluster-enabled",
                         "yes",
                         "--cluster-config-file",
                         node.dir + "/nodes.conf",
                         "--cluster-node-timeout",
                         std::to_string(options_.node_timeout_ms),
                         "--cluster-replica-validity-factor",
                         "0",  // a replica always takes over its dead master
                         "--cluster-require-full-coverage",
                         options_.require_full_coverage ? "yes" : "no",
                         "--save",
                         "",
                         "--appendonly",
                         "no",
                         "--repl-diskless-sync-delay",
                         "0",
                         "--maxmemory",
                         options_.maxmemory,
                         "--maxmemory-policy",
                         options_.maxmemory_policy,
                         "--enable-debug-command",
                         "local",
                         "--daemonize",
                         "no",
                         "--logfile",
                         ""},
                        node.dir + "/redis.log");
  if (node.pid < 0) return IoError("cannot start redis-server for " + Seed(node.port));
  return Status::Ok();
}

Status RedisCluster::AwaitPing(Node& node) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    if (Exited(node.pid)) {
      node.pid = -1;
      return IoError("redis-server " + Seed(node.port) + " exited at start:\n" + LogTail(node.port));
    }
    const Result<std::string> pong = Cli(node.port, {"PING"}, kProbeTimeout);
    if (pong.ok() && *pong == "PONG") return Status::Ok();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return TimedOut("redis-server " + Seed(node.port) + " did not answer PING in 10 s:\n" + LogTail(node.port));
}

Status RedisCluster::CreateCluster() {
  std::vector<std::string> argv = {kTimeout, "-k", "5", "60", kRedisCli, "--cluster", "create"};
  for (const auto& seed : Seeds()) argv.push_back(seed);
  argv.insert(argv.end(), {"--cluster-replicas", std::to_string(options_.replicas_per_master), "--cluster-yes"});
  const CommandOutput created = Run(argv);
  std::ofstream(dir_ + "/cluster-create.log") << created.output;
  if (created.exit_code != 0) {
    return IoError("redis-cli --cluster create failed (exit " + std::to_string(created.exit_code) + "):\n" +
                   LastLines(created.output, 30));
  }
  return Status::Ok();
}

Status RedisCluster::AwaitFormed(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    int culprit_port = -1;
    const Status formed = CheckFormed(&culprit_port);
    if (formed.ok()) return formed;
    if (std::chrono::steady_clock::now() >= deadline) {
      return TimedOut(
          "cluster not formed after " + std::to_string(timeout.count()) + " ms: " + formed.message() +
          (culprit_port < 0 ? "" : "\n--- log of " + Seed(culprit_port) + " ---\n" + LogTail(culprit_port)));
    }
    std::this_thread::sleep_for(kPoll);
  }
}

// The first reason the cluster is not yet formed (see Start), naming the
// node concerned in `culprit_port`.
Status RedisCluster::CheckFormed(int* culprit_port) {
  std::string agreed_view;
  int agreed_port = -1;
  for (Node& node : nodes_) {
    *culprit_port = node.port;
    const std::string who = "node " + Seed(node.port);
    if (node.pid < 0 || Exited(node.pid)) {
      node.pid = -1;
      return IoError(who + " exited");
    }
    const auto info = InfoFields(*this, node.port, {"CLUSTER", "INFO"});
    if (!info.ok()) return info.status();
    const auto field = [&](const char* name) {
      auto it = info->find(name);
      return it == info->end() ? "" : it->second;
    };
    if (field("cluster_state") != "ok")
      return kvtier::Unavailable(who + ": cluster_state is " + field("cluster_state"));
    if (ToInt(field("cluster_slots_assigned")) != kSlots)
      return kvtier::Unavailable(who + ": not every slot is assigned");
    if (ToInt(field("cluster_known_nodes")) != static_cast<int64_t>(nodes_.size())) {
      return kvtier::Unavailable(who + " knows " + field("cluster_known_nodes") + " nodes");
    }
    const auto lines = ClusterNodes(*this, node.port);
    if (!lines.ok()) return lines.status();
    const std::string view = Canonical(*lines);
    if (agreed_port < 0) {
      agreed_view = view;
      agreed_port = node.port;
    } else if (view != agreed_view) {
      return kvtier::Unavailable(who + " and " + Seed(agreed_port) + " disagree:\n" + view + "versus\n" + agreed_view);
    }
    const NodeLine* self = Myself(*lines);
    if (self == nullptr) return kvtier::Unavailable(who + " does not list itself");
    if (!self->master) {
      const auto replication = InfoFields(*this, node.port, {"INFO", "replication"});
      if (!replication.ok()) return replication.status();
      const auto link = replication->find("master_link_status");
      if (link == replication->end() || link->second != "up")
        return kvtier::Unavailable(who + ": link to its master not up");
    }
  }
  *culprit_port = -1;
  const int masters = static_cast<int>(Masters().size());
  if (masters != options_.masters) {
    return kvtier::Unavailable(std::to_string(masters) + " masters instead of " + std::to_string(options_.masters));
  }
  return Status::Ok();
}

std::vector<std::string> RedisCluster::Seeds() const {
  std::vector<std::string> seeds;
  for (const Node& node : nodes_) seeds.push_back(Seed(node.port));
  return seeds;
}

std::vector<int> RedisCluster::Ports() const {
  std::vector<int> ports;
  for (const Node& node : nodes_) ports.push_back(node.port);
  return ports;
}

Result<std::string> RedisCluster::Cli(int port, const std::vector<std::string>& args,
                                      std::chrono::seconds timeout) const {
  std::vector<std::string> argv = CliArgv(port, timeout, /*follow_redirects=*/false);
  argv.insert(argv.end(), args.begin(), args.end());
  return CliOutcome(Run(argv), Seed(port) + " " + (args.empty() ? "" : args[0]));
}

Result<std::string> RedisCluster::ClusterCli(const std::vector<std::string>& args) const {
  for (int port : LivePorts()) {
    if (!Cli(port, {"PING"}, kProbeTimeout).ok()) continue;
    std::vector<std::string> argv = CliArgv(port, kCliTimeout, /*follow_redirects=*/true);
    argv.insert(argv.end(), args.begin(), args.end());
    return CliOutcome(Run(argv), "cluster via " + Seed(port) + " " + (args.empty() ? "" : args[0]));
  }
  return kvtier::Unavailable("no node of the cluster answers");
}

int RedisCluster::SlotOf(const std::string& key) const {
  for (int port : LivePorts()) {
    const Result<std::string> slot = Cli(port, {"CLUSTER", "KEYSLOT", key}, kProbeTimeout);
    if (slot.ok()) return static_cast<int>(ToInt(*slot));
  }
  return -1;
}

int RedisCluster::MasterOf(int slot) const {
  int owner = -1;
  int64_t owner_epoch = -1;
  for (int port : LivePorts()) {
    const auto lines = ClusterNodes(*this, port);
    const NodeLine* self = lines.ok() ? Myself(*lines) : nullptr;
    if (self != nullptr && self->master && self->Holds(slot) && self->config_epoch > owner_epoch) {
      owner = port;
      owner_epoch = self->config_epoch;
    }
  }
  return owner;
}

std::vector<int> RedisCluster::Masters() const {
  std::vector<int> masters;
  for (int port : LivePorts()) {
    const auto lines = ClusterNodes(*this, port);
    const NodeLine* self = lines.ok() ? Myself(*lines) : nullptr;
    if (self != nullptr && self->master) masters.push_back(port);
  }
  return masters;
}

Status RedisCluster::Kill(int port) {
  Node* node = FindNode(port);
  if (node == nullptr || node->pid < 0) return NotFound("no node of the cluster runs on " + Seed(port));
  ::kill(node->pid, SIGKILL);
  ::waitpid(node->pid, nullptr, 0);
  node->pid = -1;
  return Status::Ok();
}

Status RedisCluster::KillAll() {
  for (int port : LivePorts()) {
    if (Status s = Kill(port); !s.ok()) return s;
  }
  return Status::Ok();
}

Result<int> RedisCluster::WaitForSlotServed(int slot, std::chrono::milliseconds timeout) {
  if (slot < 0 || slot >= kSlots) return InvalidArgument("no slot " + std::to_string(slot));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const int owner = MasterOf(slot);
    int culprit_port = owner;
    const Status served = owner < 0 ? kvtier::Unavailable("no live master serves slot " + std::to_string(slot))
                                    : CheckSlotRouted(slot, owner, /*require_state_ok=*/true, &culprit_port);
    if (served.ok()) return owner;
    if (std::chrono::steady_clock::now() >= deadline) {
      return TimedOut(
          "slot " + std::to_string(slot) + " not served after " + std::to_string(timeout.count()) +
          " ms: " + served.message() +
          (culprit_port < 0 ? "" : "\n--- log of " + Seed(culprit_port) + " ---\n" + LogTail(culprit_port)));
    }
    std::this_thread::sleep_for(kPoll);
  }
}

// Ok when every live node routes `slot` to the master at `owner_port` (and,
// if asked, reports cluster_state:ok); else why not, naming the node in
// `culprit_port`.
Status RedisCluster::CheckSlotRouted(int slot, int owner_port, bool require_state_ok, int* culprit_port) const {
  for (int port : LivePorts()) {
    *culprit_port = port;
    const std::string who = "node " + Seed(port);
    if (require_state_ok) {
      const auto info = InfoFields(*this, port, {"CLUSTER", "INFO"});
      if (!info.ok()) return info.status();
      const auto state = info->find("cluster_state");
      if (state == info->end() || state->second != "ok") return kvtier::Unavailable(who + ": cluster_state not ok");
    }
    const auto lines = ClusterNodes(*this, port);
    if (!lines.ok()) return lines.status();
    const auto holder =
        std::find_if(lines->begin(), lines->end(), [slot](const NodeLine& n) { return n.master && n.Holds(slot); });
    if (holder == lines->end() || holder->port != owner_port || holder->failing) {
      return kvtier::Unavailable(who + " routes slot " + std::to_string(slot) + " to " +
                                 (holder == lines->end() ? "nobody" : Seed(holder->port)) + ", not " +
                                 Seed(owner_port));
    }
  }
  *culprit_port = -1;
  return Status::Ok();
}

std::string RedisCluster::LogTail(int port, int lines) const {
  for (const Node& node : nodes_) {
    if (node.port == port) return LastLines(ReadFile(node.dir + "/redis.log"), lines);
  }
  return "";
}

std::vector<int> RedisCluster::LivePorts() const {
  std::vector<int> ports;
  for (const Node& node : nodes_) {
    if (node.pid > 0) ports.push_back(node.port);
  }
  return ports;
}

RedisCluster::Node* RedisCluster::FindNode(int port) {
  for (Node& node : nodes_) {
    if (node.port == port) return &node;
  }
  return nullptr;
}

std::string RedisCluster::Seed(int port) const { return "127.0.0.1:" + std::to_string(port); }

}  // namespace kvtier::support
