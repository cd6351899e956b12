#include "tiers/remote/cluster_client.h"

#include <netdb.h>

#include <algorithm>
#include <charconv>
#include <optional>
#include <unordered_map>

#include <spdlog/spdlog.h>

#include "tiers/remote/slot_map.h"

namespace kvtier {
namespace {

constexpr uint64_t kTryAgainPauseUs = 10'000;

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
  bool seed = false;                                   // configured: allowed wherever it is
  std::atomic<bool> outside{false};                    // its addresses were refused lately
  Mutex mu;
  std::vector<std::unique_ptr<RedisConnection>> idle GUARDED_BY(mu);
  std::atomic<int64_t> down_until_ns{0};               // steady clock; 0: up
};

Result<std::unique_ptr<ClusterClient>> ClusterClient::Create(const ClusterOptions& options, const Clock& clock) {
  if (options.seeds.empty()) return InvalidArgument("remote tier: no cluster node given (remote.nodes)");
  auto networks = ClusterNetworks::Parse(options.networks);
  if (!networks.ok()) return InvalidArgument("cluster networks: " + networks.status().message());
  std::unique_ptr<ClusterClient> client(new ClusterClient(options, clock));
  {
    MutexLock lock(client->networks_mu_);  // no other thread has `client` yet
    client->networks_ = std::move(*networks);
  }
  for (const std::string& seed : options.seeds) {
    auto address = ParseRedisAddress(seed);
    if (!address.ok()) return InvalidArgument("remote.nodes: " + address.status().message());
    if (auto added = client->NodeFor(address->first, address->second, /*seed=*/true); !added.ok()) {
      return InvalidArgument("remote.nodes: " + added.status().message());
    }
    if (!client->default_networks_) continue;
    // A numeric seed's network is known now; a name's once it is connected.
    addrinfo hints{};
    hints.ai_flags = AI_NUMERICHOST;
    addrinfo* found = nullptr;
    if (::getaddrinfo(address->first.c_str(), nullptr, &hints, &found) == 0) {
      {
        MutexLock lock(client->networks_mu_);
        client->networks_.AddAround(found->ai_addr);
      }
      ::freeaddrinfo(found);
    }
  }
  return client;
}

ClusterClient::ClusterClient(const ClusterOptions& options, const Clock& clock)
    : options_(options), clock_(clock), default_networks_(options.networks.empty()) {
  slot_owner_.fill(-1);
}

ClusterClient::~ClusterClient() = default;

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
    Status refused = PermissionDenied("redis node " + address + ", named by " + named_by +
                                      ", is outside the cluster's networks (" + networks +
                                      "; remote.cluster_networks): not connecting");
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

void ClusterClient::CountRefusedMap(const Status& why) {
  maps_refused_.fetch_add(1, std::memory_order_relaxed);
  uint64_t suppressed = 0;
  if (!refusal_log_.Allow(suppressed)) return;
  spdlog::warn("remote tier: {}; the previous map keeps routing{}", why.message(),
               suppressed == 0 ? std::string() : " (" + std::to_string(suppressed) + " such lines suppressed)");
}

bool ClusterClient::Outside(size_t index) const {
  ReaderMutexLock lock(mu_);
  return nodes_[index]->outside.load(std::memory_order_relaxed);
}

size_t ClusterClient::NodeForSlot(uint16_t slot) {
  ReaderMutexLock lock(mu_);
  const int32_t owner = slot_owner_[slot];
  return owner >= 0 ? static_cast<size_t>(owner) : 0;
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
  const int64_t now_ns = std::chrono::steady_clock::now().time_since_epoch().count();
  if (now_ns < node->down_until_ns.load(std::memory_order_relaxed)) {
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
    node->down_until_ns.store(0, std::memory_order_relaxed);
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
    Status refused = PermissionDenied(connection.status().message() + ": outside the cluster's networks (" +
                                      networks + "; remote.cluster_networks), not connecting");
    CountRefusedNode(refused);
    return refused;
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
    ReaderMutexLock lock(mu_);
    node = nodes_[index].get();
  }
  MutexLock lock(node->mu);
  if (node->idle.size() < options_.idle_connections_per_node) node->idle.push_back(std::move(connection));
}

int64_t ClusterClient::NowNs() { return std::chrono::steady_clock::now().time_since_epoch().count(); }

Status ClusterClient::Refresh(RedisDeadline deadline) { return RefreshAfter(NowNs(), deadline); }

Status ClusterClient::RefreshAfter(int64_t since_ns, RedisDeadline deadline) {
  MutexLock one(refresh_mu_);
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
    ReaderMutexLock lock(mu_);
    count = nodes_.size();
  }
  Status last = Unavailable("no cluster node answered");
  for (size_t i = 0; i < count; ++i) {
    if (std::chrono::steady_clock::now() >= deadline) break;
    Status read = RefreshFrom(i, deadline);
    if (read.ok()) {
      refreshes_.fetch_add(1, std::memory_order_relaxed);
      reachable_.store(true, std::memory_order_relaxed);
      return read;
    }
    if (Outside(i)) continue;  // refused without connecting: no answer either way
    last = read;
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
  // Only the reply's head: its ranges are read one at a time, each
  // within bounds, so an announced size costs nothing until it arrives.
  Result<RespReply> head = sent.ok() ? (*connection)->ReadReplyHead(deadline) : Result<RespReply>(sent);
  std::string asked_address;
  {
    ReaderMutexLock lock(mu_);
    asked_address = nodes_[index]->address;
  }
  if (!head.ok()) {
    if (head.status().code() == StatusCode::kProtocolError) {
      CountRefusedMap(
          ProtocolError("CLUSTER SLOTS reply of " + asked_address + " refused: " + head.status().message()));
    }
    return head.status();
  }
  if (head->is_error()) {
    Release(index, std::move(*connection));
    if (StartsWith(head->text, "NOAUTH") || StartsWith(head->text, "WRONGPASS")) {
      return PermissionDenied("redis node " + asked_address + " wants a password: " + head->text);
    }
    if (head->text.find("cluster support disabled") == std::string::npos) {
      return Unavailable("CLUSTER SLOTS answered: " + head->text);
    }
    WriterMutexLock lock(mu_);
    slot_owner_.fill(static_cast<int32_t>(index));  // a plain Redis: it holds every key
    return Status::Ok();
  }
  if (head->type != RespReply::Type::kArray) {
    Release(index, std::move(*connection));
    Status refused =
        ProtocolError("CLUSTER SLOTS reply of " + asked_address + " refused: neither an array nor an error");
    CountRefusedMap(refused);
    return refused;
  }
  Status read = ReadSlotRanges(**connection, head->integer, index, deadline);
  // A map refused part way leaves the rest of it unread: the connection
  // is dropped, not pooled.
  if (read.ok()) Release(index, std::move(*connection));
  return read;
}

Status ClusterClient::ReadSlotRanges(RedisConnection& connection, int64_t count, size_t index,
                                     RedisDeadline deadline) {
  std::string asked_host, asked_address;
  {
    ReaderMutexLock lock(mu_);
    asked_host = nodes_[index]->host;
    asked_address = nodes_[index]->address;
  }
  auto refuse = [&](const Status& why) {
    Status refused = ProtocolError("CLUSTER SLOTS reply of " + asked_address + " refused: " + why.message());
    CountRefusedMap(refused);
    return refused;
  };
  if (Status s = SlotMapBuilder::CheckRangeCount(count); !s.ok()) return refuse(s);
  SlotMapBuilder map(asked_host);
  for (int64_t i = 0; i < count; ++i) {
    Result<RespReply> range = connection.ReadReply(deadline, SlotMapBuilder::kRangeLimits);
    if (!range.ok()) return range.status().code() == StatusCode::kProtocolError ? refuse(range.status())
                                                                                : range.status();
    if (Status s = map.Add(*range); !s.ok()) return refuse(s);
  }
  // Whole and well formed: the nodes it names are learned (those the
  // networks allow), and it replaces the map.
  std::vector<int32_t> learned(map.nodes().size(), -1);
  for (size_t n = 0; n < map.nodes().size(); ++n) {
    const SlotMapBuilder::Node& node = map.nodes()[n];
    auto admitted = Admit(node.host, node.port, "the cluster map of " + asked_address);
    if (admitted.ok()) learned[n] = static_cast<int32_t>(*admitted);
  }
  std::array<int32_t, kClusterSlots> owners;
  owners.fill(-1);
  for (const SlotMapBuilder::Range& range : map.ranges()) {
    std::fill(owners.begin() + range.first, owners.begin() + range.last + 1, learned[range.master]);
  }
  WriterMutexLock lock(mu_);
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
    ReaderMutexLock lock(mu_);
    const std::string& host = nodes_[from]->host;
    endpoint = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + endpoint;
  }
  auto address = ParseRedisAddress(endpoint);
  if (!address.ok() || address->first.size() > SlotMapBuilder::kMaxHostBytes) {
    return ProtocolError("malformed redirect '" + error.substr(0, 64 + SlotMapBuilder::kMaxHostBytes) + "'");
  }
  *slot = static_cast<uint16_t>(number);
  std::string from_address;
  {
    ReaderMutexLock lock(mu_);
    from_address = nodes_[from]->address;
  }
  return Admit(address->first, address->second, "a redirect from " + from_address);
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
        WriterMutexLock lock(mu_);
        slot_owner_[redirected_slot] = static_cast<int32_t>(*target);
      }
      node = *target;
      asking = !moved;
      last = Unavailable("redirected: " + error);
      continue;
    }
    if (StartsWith(error, "TRYAGAIN")) {
      try_again_.fetch_add(1, std::memory_order_relaxed);
      SleepUntilUs(clock_, clock_.NowUs() + kTryAgainPauseUs);
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
  v.Visit("remote.cluster.maps_refused", maps_refused_.load(std::memory_order_relaxed));
  v.Visit("remote.cluster.nodes_refused", nodes_refused_.load(std::memory_order_relaxed));
  ReaderMutexLock lock(mu_);
  v.VisitGauge("remote.cluster.nodes", static_cast<int64_t>(nodes_.size()));
}

}  // namespace kvtier
