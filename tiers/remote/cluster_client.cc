// ClusterClient (cluster_client.h): creation, commands routed by slot with
// their redirects and retries, pipelines, counters. The node pool and its
// admission are in cluster_client_nodes.cc, the slot map in
// cluster_client_map.cc.
#include "tiers/remote/cluster_client.h"

#include <netdb.h>

#include <unordered_map>

#include "tiers/remote/cluster_client_node.h"

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
  return Status(
      last.code() == StatusCode::kOk ? StatusCode::kUnavailable : last.code(),
      "remote command gave up after " + std::to_string(options_.max_attempts) + " attempts: " + last.message());
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
    results[i] = Run(
        keys[i],
        [&](RedisConnection& c) -> Result<RespReply> {
          append(i, c);
          if (Status s = c.Flush(deadline); !s.ok()) return s;
          return read(i, c);
        },
        deadline);
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
