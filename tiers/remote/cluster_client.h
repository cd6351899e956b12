// ClusterClient: commands on keys, sent to the Redis Cluster master that
// owns each key's slot (hash_slot.h), over pooled RedisConnections.
//
// Routing: a slot map (slot -> node) read with CLUSTER SLOTS from the
// first node that answers (the configured seeds, then every node learned).
//   MOVED slot addr   the slot lives elsewhere now: the map's entry is
//                     corrected and the command goes there (counted)
//   ASK slot addr     the slot is being migrated and this key already left:
//                     the command goes there once, after ASKING; the map
//                     is unchanged
//   TRYAGAIN          a multi-key operation mid-migration: retried shortly
//                     (a pause on the injected clock)
//   CLUSTERDOWN       Unavailable
// A node that does not answer (refused, reset, closed) is skipped for
// `node_retry` (on the injected clock), and makes the client
// read the map again from another node (after a failover a replica owns
// the slot) and retry, until `max_redirects` attempts or the deadline.
// A server without cluster support ("cluster support disabled") is one
// node owning every slot, so a plain Redis works as well.
//
// A node's word is checked, not trusted (docs/OPERATIONS.md, "Remote
// tier"): a map is read range by range within SlotMapBuilder's bounds
// (slot_map.h) and taken whole or not at all: one too big or malformed is
// a ProtocolError, counted (`maps_refused`), logged (rate-limited), and
// the previous map keeps routing. A node that only a map or a redirect
// names, not the seeds, is connected to only at an address inside
// `networks`: one outside is refused before anything is sent to it (no
// AUTH, no password), counted (`nodes_refused`), logged (rate-limited);
// a map entry naming it is left out (its slots go to a seed, which
// redirects), a command redirected to it fails with PermissionDenied. At
// most kMaxKnownNodes nodes are ever learned; past that new ones are
// refused the same way (NoSpace).
//
// Errors: PermissionDenied (a node refused AUTH, or wants a password and
// none is configured; a redirect to a node outside `networks`), NoSpace
// (a redirect to a new node past kMaxKnownNodes), Unavailable (no node
// reachable, cluster down), TimedOut (the deadline passed: the issue's
// DeadlineExceeded), ProtocolError (a malformed reply, redirect or map);
// a Redis error reply other than the routing ones comes back as a kError
// reply.
//
// Thread-safe: any thread may run commands; each takes a connection of
// its own from the node's pool for the duration.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/counters.h"
#include "common/log_rate_limiter.h"
#include "common/mutex.h"
#include "kvtier/result.h"
#include "tiers/remote/cluster_networks.h"
#include "tiers/remote/hash_slot.h"
#include "tiers/remote/redis_connection.h"

namespace kvtier {

struct ClusterOptions {
  std::vector<std::string> seeds;  // "host:port" of some nodes (one is enough)
  // Where the nodes that only another node names may be: networks as
  // ClusterNetworks::Parse takes them ("10.0.0.0/8", "fd00::/64"). Empty:
  // the /24 (IPv4) or /64 (IPv6) of each seed's address (a seed given by
  // name: of the address it resolved to when connected). The seeds
  // themselves are always allowed.
  std::vector<std::string> networks;
  std::chrono::milliseconds connect_timeout{250};
  size_t idle_connections_per_node = 16;  // kept open between commands
  int max_attempts = 6;                   // redirects and retries of one command
  // After a node refused or did not answer a connect, it is skipped (a
  // command for it fails at once with Unavailable) for this long, so a
  // dead node costs each command nothing once it is known dead.
  std::chrono::milliseconds node_retry{500};
  // AUTH on every new connection when `password` is not empty (with
  // `username` too when that is not empty: Redis 6 ACL users).
  std::string username;
  std::string password;
};

class ClusterClient {
 public:
  // Nodes ever learned (seeds included), at most.
  static constexpr size_t kMaxKnownNodes = 4096;

  // Checks the seed addresses and networks; connects to nothing yet (the
  // first command or Refresh does). InvalidArgument for an empty list, a
  // bad address or a bad network. `clock` (the pauses before retries) is
  // borrowed and must outlive the client.
  static Result<std::unique_ptr<ClusterClient>> Create(const ClusterOptions& options, const Clock& clock);
  ~ClusterClient();

  // Reads the slot map again from the first node that answers.
  Status Refresh(RedisDeadline deadline);

  // One command on `key`: `run` appends it to the connection, flushes and
  // reads its reply (it may be called again on another node after a
  // redirect, so it must not consume anything of its own on the way).
  using Command = std::function<Result<RespReply>(RedisConnection& connection)>;
  Result<RespReply> Run(std::string_view key, const Command& run, RedisDeadline deadline);

  // One command per key, pipelined: the keys of one node go out in one
  // flush and their replies are read in order. `append(i, c)` appends key
  // i's command, `read(i, c)` reads its reply; a key redirected on the way
  // is run again alone (Run). One result per key, in order.
  using Append = std::function<void(size_t index, RedisConnection& connection)>;
  using Read = std::function<Result<RespReply>(size_t index, RedisConnection& connection)>;
  std::vector<Result<RespReply>> RunPipelined(std::span<const std::string> keys, const Append& append, const Read& read,
                                              RedisDeadline deadline);

  // Whether some node answered lately: the last map refresh, or a command
  // since, succeeded. False once a refresh found no node answering (the
  // whole cluster down, or this host cut off), as opposed to one node
  // failing, which only its keys feel.
  bool reachable() const { return reachable_.load(std::memory_order_relaxed); }

  // The node addresses known now, masters and replicas alike.
  std::vector<std::string> Nodes() const;

  // remote.cluster.*: redirects, refreshes, connections, refusals.
  void VisitCounters(CounterVisitor& v) const;

 private:
  struct Node;
  ClusterClient(const ClusterOptions& options, const Clock& clock);

  // The node index for host:port, added if new (NoSpace past
  // kMaxKnownNodes). `seed`: a configured node, connected to wherever it is.
  Result<size_t> NodeFor(const std::string& host, int port, bool seed = false);
  // NodeFor for a node that `named_by` (a map, a redirect) names: refused
  // (PermissionDenied, counted and logged) when its numeric address lies
  // outside the networks; a name is checked when connecting.
  Result<size_t> Admit(const std::string& host, int port, const std::string& named_by);
  // Counts and logs (rate-limited) a node or map refused.
  void CountRefusedNode(const Status& why);
  void CountRefusedMap(const Status& why);
  bool Outside(size_t node) const;
  // The node owning `slot`, or any known node while the map has none.
  size_t NodeForSlot(uint16_t slot);
  Result<std::unique_ptr<RedisConnection>> Acquire(size_t node, RedisDeadline deadline);
  // AUTH on a new connection, when a password is configured.
  Status Authenticate(RedisConnection& connection, RedisDeadline deadline);
  void Release(size_t node, std::unique_ptr<RedisConnection> connection);
  // Refresh for a caller that saw a node fail at `since_ns` (steady
  // clock): a read begun since answers for it too, so commands failing
  // together (a master died) cause one read, not one each.
  Status RefreshAfter(int64_t since_ns, RedisDeadline deadline);
  // The first node's map that answers, into the map; reachable_ follows.
  Status ReadMap(RedisDeadline deadline);
  static int64_t NowNs();
  // Reads CLUSTER SLOTS from `node` into the map.
  Status RefreshFrom(size_t node, RedisDeadline deadline);
  // The rest of a CLUSTER SLOTS reply that announced `count` ranges, into
  // the map (replacing it) once all of it is read and checked.
  Status ReadSlotRanges(RedisConnection& connection, int64_t count, size_t node, RedisDeadline deadline);
  // A routing error reply's target ("MOVED 3999 127.0.0.1:6381"), sent by
  // node `from` (whose host an empty one, "MOVED 3999 :6381", stands for).
  // ProtocolError when it is not one.
  Result<size_t> RedirectTarget(const std::string& error, size_t from, uint16_t* slot);

  const ClusterOptions options_;
  const Clock& clock_;
  mutable SharedMutex mu_;
  std::vector<std::unique_ptr<Node>> nodes_ GUARDED_BY(mu_);         // append only
  std::array<int32_t, kClusterSlots> slot_owner_ GUARDED_BY(mu_){};  // -1: unknown
  Mutex refresh_mu_ ACQUIRED_BEFORE(mu_);                            // one refresh at a time
  int64_t last_refresh_start_ns_ GUARDED_BY(refresh_mu_) = 0;
  Status last_refresh_status_ GUARDED_BY(refresh_mu_);  // that read's outcome
  std::atomic<bool> reachable_{true};
  const bool default_networks_;  // options_.networks empty: the seeds' networks
  mutable Mutex networks_mu_;
  ClusterNetworks networks_ GUARDED_BY(networks_mu_);
  LogRateLimiter refusal_log_{5, std::chrono::seconds(10)};

  std::atomic<int64_t> moved_{0}, asked_{0}, try_again_{0}, refreshes_{0}, refresh_failures_{0};
  std::atomic<int64_t> connects_{0}, connect_failures_{0}, retries_{0};
  std::atomic<int64_t> maps_refused_{0}, nodes_refused_{0};
};

}  // namespace kvtier
