#include "tiers/remote/cluster_client.h"

#include <algorithm>
#include <charconv>
#include <thread>
#include <unordered_map>

namespace kvtier {
namespace {

constexpr auto kTryAgainPause = std::chrono::milliseconds(10);

bool StartsWith(std::string_view text, std::string_view prefix) { return text.substr(0, prefix.size()) == prefix; }

// Whether a failed command may be tried again on a (maybe other) node.
bool NodeFailure(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kIoError ||
         s.code() == StatusCode::kProtocolError;
}

}  // namespace

struct ClusterClient::Node {
  std::string host;
  int port = 0;
  std::string address;
  std::mutex mu;
  std::vector<std::unique_ptr<RedisConnection>> idle;  // guarded by mu
  std::atomic<int64_t> down_until_ns{0};               // steady clock; 0: up
};

Result<std::unique_ptr<ClusterClient>> ClusterClient::Create(const ClusterOptions& options) {
  if (options.seeds.empty()) return InvalidArgument("remote tier: no cluster node given (remote.nodes)");
  std::unique_ptr<ClusterClient> client(new ClusterClient(options));
  for (const std::string& seed : options.seeds) {
    auto address = ParseRedisAddress(seed);
    if (!address.ok()) return InvalidArgument("remote.nodes: " + address.status().message());
    client->NodeFor(address->first, address->second);
  }
  return client;
}

ClusterClient::ClusterClient(const ClusterOptions& options) : options_(options) { slot_owner_.fill(-1); }

ClusterClient::~ClusterClient() = default;

size_t ClusterClient::NodeFor(const std::string& host, int port) {
  const std::string address = host + ":" + std::to_string(port);
  {
    std::shared_lock lock(mu_);
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i]->address == address) return i;
    }
  }
  std::unique_lock lock(mu_);
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i]->address == address) return i;
  }
  auto node = std::make_unique<Node>();
  node->host = host;
  node->port = port;
  node->address = address;
  nodes_.push_back(std::move(node));
  return nodes_.size() - 1;
}

size_t ClusterClient::NodeForSlot(uint16_t slot) {
  std::shared_lock lock(mu_);
  const int32_t owner = slot_owner_[slot];
  return owner >= 0 ? static_cast<size_t>(owner) : 0;
}

std::vector<std::string> ClusterClient::Nodes() const {
  std::shared_lock lock(mu_);
  std::vector<std::string> out;
  for (const auto& n : nodes_) out.push_back(n->address);
  return out;
}

Result<std::unique_ptr<RedisConnection>> ClusterClient::Acquire(size_t index, RedisDeadline deadline) {
  Node* node;
  {
    std::shared_lock lock(mu_);
    node = nodes_[index].get();
  }
  {
    std::lock_guard lock(node->mu);
    if (!node->idle.empty()) {
      auto connection = std::move(node->idle.back());
      node->idle.pop_back();
      return connection;
    }
  }
  const int64_t now_ns = std::chrono::steady_clock::now().time_since_epoch().count();
  if (now_ns < node->down_until_ns.load(std::memory_order_relaxed)) {
    return Unavailable("redis node " + node->address + " did not answer a moment ago");
  }
  const RedisDeadline connect_by = std::min(deadline, std::chrono::steady_clock::now() + options_.connect_timeout);
  auto connection = RedisConnection::Connect(node->host, node->port, connect_by);
  if (connection.ok()) {
    connects_.fetch_add(1, std::memory_order_relaxed);
    node->down_until_ns.store(0, std::memory_order_relaxed);
    if (Status s = Authenticate(**connection, deadline); !s.ok()) return s;
  } else {
    connect_failures_.fetch_add(1, std::memory_order_relaxed);
    node->down_until_ns.store(
        (std::chrono::steady_clock::now() + options_.node_retry).time_since_epoch().count(),
        std::memory_order_relaxed);
    // A connect that timed out says the node is unreachable, not that
    // the caller's whole deadline passed (unless it did).
    if (connection.status().code() == StatusCode::kTimedOut && std::chrono::steady_clock::now() < deadline) {
      return Unavailable(connection.status().message());
    }
  }
  return connection;
}

Status ClusterClient::Authenticate(RedisConnection& connection, RedisDeadline deadline) {
  if (options_.password.empty()) return Status::Ok();
  if (options_.username.empty()) {
    const RespArg args[] = {{"AUTH"}, {options_.password}};
    connection.Append(args);
  } else {
    const RespArg args[] = {{"AUTH"}, {options_.username}, {options_.password}};
    connection.Append(args);
  }
  if (Status s = connection.Flush(deadline); !s.ok()) return s;
  Result<RespReply> reply = connection.ReadReply(deadline);
  if (!reply.ok()) return reply.status();
  if (reply->is_error()) {
    // The reply names no secret; the password is never quoted.
    return PermissionDenied("redis node " + connection.address() + " refused AUTH: " + reply->text);
  }
  return Status::Ok();
}

void ClusterClient::Release(size_t index, std::unique_ptr<RedisConnection> connection) {
  if (connection == nullptr || connection->broken()) return;
  Node* node;
  {
    std::shared_lock lock(mu_);
    node = nodes_[index].get();
  }
  std::lock_guard lock(node->mu);
  if (node->idle.size() < options_.idle_connections_per_node) node->idle.push_back(std::move(connection));
}

int64_t ClusterClient::NowNs() { return std::chrono::steady_clock::now().time_since_epoch().count(); }

Status ClusterClient::Refresh(RedisDeadline deadline) { return RefreshAfter(NowNs(), deadline); }

Status ClusterClient::RefreshAfter(int64_t since_ns, RedisDeadline deadline) {
  std::lock_guard one(refresh_mu_);
  // Many commands failing at once (a master died) would each read the map:
  // a read begun after a caller saw its failure answers for it too.
  if (last_refresh_start_ns_ >= since_ns) return last_refresh_status_;
  last_refresh_start_ns_ = NowNs();
  last_refresh_status_ = ReadMap(deadline);
  return last_refresh_status_;
}

Status ClusterClient::ReadMap(RedisDeadline deadline) {
  size_t count;
  {
    std::shared_lock lock(mu_);
    count = nodes_.size();
  }
  Status last = Unavailable("no cluster node answered");
  for (size_t i = 0; i < count; ++i) {
    if (std::chrono::steady_clock::now() >= deadline) break;
    last = RefreshFrom(i, deadline);
    if (last.ok()) {
      refreshes_.fetch_add(1, std::memory_order_relaxed);
      reachable_.store(true, std::memory_order_relaxed);
      return last;
    }
  }
  refresh_failures_.fetch_add(1, std::memory_order_relaxed);
  if (last.code() == StatusCode::kUnavailable) reachable_.store(false, std::memory_order_relaxed);
  return Status(last.code(), "reading the cluster's slot map: " + last.message());
}

Status ClusterClient::RefreshFrom(size_t index, RedisDeadline deadline) {
  auto connection = Acquire(index, deadline);
  if (!connection.ok()) return connection.status();
  const RespArg args[] = {{"CLUSTER"}, {"SLOTS"}};
  (*connection)->Append(args);
  Status sent = (*connection)->Flush(deadline);
  Result<RespReply> reply = sent.ok() ? (*connection)->ReadReply(deadline) : Result<RespReply>(sent);
  std::string asked_host, asked_address;
  {
    std::shared_lock lock(mu_);
    asked_host = nodes_[index]->host;
    asked_address = nodes_[index]->address;
  }
  Release(index, std::move(*connection));
  if (!reply.ok()) return reply.status();
  std::array<int32_t, kClusterSlots> owners;
  owners.fill(-1);
  if (reply->is_error()) {
    if (StartsWith(reply->text, "NOAUTH") || StartsWith(reply->text, "WRONGPASS")) {
      return PermissionDenied("redis node " + asked_address + " wants a password: " + reply->text);
    }
    if (reply->text.find("cluster support disabled") == std::string::npos) {
      return Unavailable("CLUSTER SLOTS answered: " + reply->text);
    }
    owners.fill(static_cast<int32_t>(index));  // a plain Redis: it holds every key
  } else if (reply->type == RespReply::Type::kArray) {
    for (const RespReply& range : reply->elements) {
      if (range.type != RespReply::Type::kArray || range.elements.size() < 3) continue;
      const RespReply& master = range.elements[2];
      if (master.type != RespReply::Type::kArray || master.elements.size() < 2) continue;
      const int64_t first = range.elements[0].integer, last = range.elements[1].integer;
      if (first < 0 || last >= kClusterSlots || first > last) continue;
      std::string host = master.elements[0].text;
      if (host.empty() || host == "?") host = asked_host;  // the node's preferred endpoint is unknown
      const size_t owner = NodeFor(host, static_cast<int>(master.elements[1].integer));
      std::fill(owners.begin() + first, owners.begin() + last + 1, static_cast<int32_t>(owner));
      // Replicas are learned too: after a failover one of them is whom to ask.
      for (size_t r = 3; r < range.elements.size(); ++r) {
        const RespReply& replica = range.elements[r];
        if (replica.type != RespReply::Type::kArray || replica.elements.size() < 2) continue;
        std::string replica_host = replica.elements[0].text;
        if (replica_host.empty() || replica_host == "?") replica_host = asked_host;
        NodeFor(replica_host, static_cast<int>(replica.elements[1].integer));
      }
    }
  } else {
    return ProtocolError("CLUSTER SLOTS answered neither an array nor an error");
  }
  std::unique_lock lock(mu_);
  slot_owner_ = owners;
  return Status::Ok();
}

Result<size_t> ClusterClient::RedirectTarget(const std::string& error, size_t from, uint16_t* slot) {
  // "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381"; an empty host
  // ("MOVED 3999 :6381", Redis 7's unknown endpoint) means the host of the
  // node that answered, on that port.
  const size_t first = error.find(' ');
  const size_t second = first == std::string::npos ? std::string::npos : error.find(' ', first + 1);
  if (second == std::string::npos) return ProtocolError("malformed redirect '" + error + "'");
  unsigned long number = 0;
  const char* slot_begin = error.data() + first + 1;
  const char* slot_end = error.data() + second;
  auto [slot_parsed, slot_ec] = std::from_chars(slot_begin, slot_end, number);
  if (slot_ec != std::errc() || slot_parsed != slot_end || number >= kClusterSlots) {
    return ProtocolError("malformed redirect '" + error + "'");
  }
  std::string endpoint = error.substr(second + 1);
  if (!endpoint.empty() && endpoint.front() == ':') {
    std::shared_lock lock(mu_);
    const std::string& host = nodes_[from]->host;
    endpoint = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + endpoint;
  }
  auto address = ParseRedisAddress(endpoint);
  if (!address.ok()) return ProtocolError("malformed redirect '" + error + "'");
  *slot = static_cast<uint16_t>(number);
  return NodeFor(address->first, address->second);
}

Result<RespReply> ClusterClient::Run(std::string_view key, const Command& run, RedisDeadline deadline) {
  const uint16_t slot = HashSlot(key);
  size_t node = NodeForSlot(slot);
  bool asking = false;
  Status last = Unavailable("no attempt made");
  for (int attempt = 0; attempt < options_.max_attempts; ++attempt) {
    if (attempt > 0) retries_.fetch_add(1, std::memory_order_relaxed);
    if (std::chrono::steady_clock::now() >= deadline) return TimedOut("remote command timed out: " + last.message());
    auto connection = Acquire(node, deadline);
    Result<RespReply> reply = connection.ok() ? Result<RespReply>(RespReply{}) : Result<RespReply>(connection.status());
    if (connection.ok()) {
      if (asking) {
        const RespArg args[] = {{"ASKING"}};
        (*connection)->Append(args);
        Status sent = (*connection)->Flush(deadline);
        Result<RespReply> ok = sent.ok() ? (*connection)->ReadReply(deadline) : Result<RespReply>(sent);
        reply = ok.ok() ? run(**connection) : ok;
      } else {
        reply = run(**connection);
      }
      Release(node, std::move(*connection));
    }
    if (!reply.ok()) {
      if (!NodeFailure(reply.status())) return reply.status();
      // The node is gone or broke the stream: the slot may have moved to a
      // replica. Read the map again (from any node) and retry.
      last = reply.status();
      const int64_t failed_at = NowNs();
      if (RefreshAfter(failed_at, deadline).ok()) node = NodeForSlot(slot);
      asking = false;
      continue;
    }
    // Read first: a store on every command would bounce the line between threads.
    if (!reachable_.load(std::memory_order_relaxed)) reachable_.store(true, std::memory_order_relaxed);
    if (!reply->is_error()) return reply;
    const std::string& error = reply->text;
    if (StartsWith(error, "MOVED ") || StartsWith(error, "ASK ")) {
      const bool moved = error[0] == 'M';
      uint16_t redirected_slot = slot;
      auto target = RedirectTarget(error, node, &redirected_slot);
      if (!target.ok()) return target.status();
      (moved ? moved_ : asked_).fetch_add(1, std::memory_order_relaxed);
      if (moved) {
        std::unique_lock lock(mu_);
        slot_owner_[redirected_slot] = static_cast<int32_t>(*target);
      }
      node = *target;
      asking = !moved;
      last = Unavailable("redirected: " + error);
      continue;
    }
    if (StartsWith(error, "TRYAGAIN")) {
      try_again_.fetch_add(1, std::memory_order_relaxed);
      std::this_thread::sleep_for(kTryAgainPause);
      last = Unavailable(error);
      continue;
    }
    if (StartsWith(error, "CLUSTERDOWN") || StartsWith(error, "LOADING") || StartsWith(error, "MASTERDOWN")) {
      return Unavailable("redis cluster: " + error);
    }
    return reply;  // an error reply of the command itself
  }
  return Status(last.code() == StatusCode::kOk ? StatusCode::kUnavailable : last.code(),
                "remote command gave up after " + std::to_string(options_.max_attempts) + " attempts: " +
                    last.message());
}

std::vector<Result<RespReply>> ClusterClient::RunPipelined(std::span<const std::string> keys, const Append& append,
                                                           const Read& read, RedisDeadline deadline) {
  std::vector<Result<RespReply>> results(keys.size(), Result<RespReply>(Unavailable("not run")));
  std::unordered_map<size_t, std::vector<size_t>> by_node;
  for (size_t i = 0; i < keys.size(); ++i) by_node[NodeForSlot(HashSlot(keys[i]))].push_back(i);
  std::vector<size_t> again;  // redirected or failed: run alone
  // Every node's commands go out before any reply is read: one round trip
  // for all of them, not one per node.
  struct Sent {
    size_t node;
    const std::vector<size_t>* indexes;
    std::unique_ptr<RedisConnection> connection;
    Status status;
  };
  std::vector<Sent> sent;
  for (const auto& [node, indexes] : by_node) {
    auto connection = Acquire(node, deadline);
    if (!connection.ok()) {
      again.insert(again.end(), indexes.begin(), indexes.end());
      continue;
    }
    for (size_t i : indexes) append(i, **connection);
    Status flushed = (*connection)->Flush(deadline);
    sent.push_back(Sent{node, &indexes, std::move(*connection), flushed});
  }
  for (Sent& s : sent) {
    for (size_t i : *s.indexes) {
      results[i] = s.status.ok() ? read(i, *s.connection) : Result<RespReply>(s.status);
      if (!results[i].ok() && results[i].status().code() == StatusCode::kTimedOut) continue;
      if (!results[i].ok() || (results[i]->is_error() && !StartsWith(results[i]->text, "ERR"))) again.push_back(i);
    }
    Release(s.node, std::move(s.connection));
  }
  for (size_t i : again) {
    results[i] = Run(keys[i], [&](RedisConnection& c) -> Result<RespReply> {
      append(i, c);
      if (Status s = c.Flush(deadline); !s.ok()) return s;
      return read(i, c);
    }, deadline);
  }
  return results;
}

void ClusterClient::VisitCounters(CounterVisitor& v) const {
  v.Visit("remote.cluster.moved", moved_.load(std::memory_order_relaxed));
  v.Visit("remote.cluster.asked", asked_.load(std::memory_order_relaxed));
  v.Visit("remote.cluster.try_again", try_again_.load(std::memory_order_relaxed));
  v.Visit("remote.cluster.retries", retries_.load(std::memory_order_relaxed));
  v.Visit("remote.cluster.map_refreshes", refreshes_.load(std::memory_order_relaxed));
  v.Visit("remote.cluster.map_refresh_failures", refresh_failures_.load(std::memory_order_relaxed));
  v.Visit("remote.cluster.connects", connects_.load(std::memory_order_relaxed));
  v.Visit("remote.cluster.connect_failures", connect_failures_.load(std::memory_order_relaxed));
  std::shared_lock lock(mu_);
  v.VisitGauge("remote.cluster.nodes", static_cast<int64_t>(nodes_.size()));
}

}  // namespace kvtier
