// ClusterClient's nodes (cluster_client.h): the nodes known and which may
// be learned (the networks, kMaxKnownNodes), their pools of connections,
// AUTH on a new connection, and the refusals counted and logged.
#include <algorithm>
#include <optional>

#include <spdlog/spdlog.h>

#include "tiers/remote/cluster_client.h"
#include "tiers/remote/cluster_client_node.h"

namespace kvtier {

Result<size_t> ClusterClient::NodeFor(const std::string& host, int port, bool seed) {
  const std::string address = host + ":" + std::to_string(port);
  {
    ReaderMutexLock lock(mu_);
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i]->address == address) return i;
    }
  }
  WriterMutexLock lock(mu_);
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (nodes_[i]->address == address) return i;
  }
  if (nodes_.size() >= kMaxKnownNodes) {
    return NoSpace("redis node " + address + " not learned: " + std::to_string(kMaxKnownNodes) +
                   " nodes known already");
  }
  auto node = std::make_unique<Node>();
  node->host = host;
  node->port = port;
  node->address = address;
  node->seed = seed;
  nodes_.push_back(std::move(node));
  return nodes_.size() - 1;
}

Result<size_t> ClusterClient::Admit(const std::string& host, int port, const std::string& named_by) {
  const std::string address = host + ":" + std::to_string(port);
  {
    ReaderMutexLock lock(mu_);
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (nodes_[i]->address == address) return i;  // a seed, or admitted before (networks only grow)
    }
  }
  std::optional<bool> inside;
  std::string networks;
  {
    MutexLock lock(networks_mu_);
    inside = networks_.ContainsNumeric(host);
    networks = networks_.ToString();
  }
  if (inside.has_value() && !*inside) {
    Status refused =
        PermissionDenied("redis node " + address + ", named by " + named_by + ", is outside the cluster's networks (" +
                         networks + "; remote.cluster_networks): not connecting");
    CountRefusedNode(refused);
    return refused;
  }
  Result<size_t> node = NodeFor(host, port);
  if (!node.ok()) CountRefusedNode(node.status());
  return node;
}

void ClusterClient::CountRefusedNode(const Status& why) {
  nodes_refused_.fetch_add(1, std::memory_order_relaxed);
  uint64_t suppressed = 0;
  if (!refusal_log_.Allow(suppressed)) return;
  spdlog::warn("remote tier: {}{}", why.message(),
               suppressed == 0 ? std::string() : " (" + std::to_string(suppressed) + " such lines suppressed)");
}

bool ClusterClient::Outside(size_t index) const {
  ReaderMutexLock lock(mu_);
  return nodes_[index]->outside.load(std::memory_order_relaxed);
}

std::vector<std::string> ClusterClient::Nodes() const {
  ReaderMutexLock lock(mu_);
  std::vector<std::string> out;
  for (const auto& n : nodes_) out.push_back(n->address);
  return out;
}

Result<std::unique_ptr<RedisConnection>> ClusterClient::Acquire(size_t index, RedisDeadline deadline) {
  Node* node;
  {
    ReaderMutexLock lock(mu_);
    node = nodes_[index].get();
  }
  {
    MutexLock lock(node->mu);
    if (!node->idle.empty()) {
      auto connection = std::move(node->idle.back());
      node->idle.pop_back();
      return connection;
    }
  }
  if (clock_.NowUs() < node->down_until_us.load(std::memory_order_relaxed)) {
    return Unavailable("redis node " + node->address + " did not answer a moment ago");
  }
  const RedisDeadline connect_by = std::min(deadline, std::chrono::steady_clock::now() + options_.connect_timeout);
  RedisConnection::AddressFilter allow;
  if (!node->seed) {
    allow = [this](const sockaddr* address) {
      MutexLock lock(networks_mu_);
      return networks_.Contains(address);
    };
  }
  auto connection = RedisConnection::Connect(node->host, node->port, connect_by, allow);
  if (connection.ok()) {
    connects_.fetch_add(1, std::memory_order_relaxed);
    node->down_until_us.store(0, std::memory_order_relaxed);
    node->outside.store(false, std::memory_order_relaxed);
    if (node->seed && default_networks_) {
      MutexLock lock(networks_mu_);
      networks_.AddAround((*connection)->peer());
    }
    if (Status s = Authenticate(**connection, deadline); !s.ok()) return s;
  } else if (connection.status().code() == StatusCode::kPermissionDenied) {
    // Refused before dialling: nothing was sent, the password least of all.
    node->outside.store(true, std::memory_order_relaxed);
    std::string networks;
    {
      MutexLock lock(networks_mu_);
      networks = networks_.ToString();
    }
    Status refused = PermissionDenied(connection.status().message() + ": outside the cluster's networks (" + networks +
                                      "; remote.cluster_networks), not connecting");
    CountRefusedNode(refused);
    return refused;
  } else {
    connect_failures_.fetch_add(1, std::memory_order_relaxed);
    const auto skip = std::chrono::duration_cast<std::chrono::microseconds>(options_.node_retry);
    node->down_until_us.store(clock_.NowUs() + static_cast<uint64_t>(skip.count()), std::memory_order_relaxed);
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
    ReaderMutexLock lock(mu_);
    node = nodes_[index].get();
  }
  MutexLock lock(node->mu);
  if (node->idle.size() < options_.idle_connections_per_node) node->idle.push_back(std::move(connection));
}

}  // namespace kvtier
