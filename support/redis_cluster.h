// RedisCluster: a real Redis Cluster on loopback (Debian's redis-server and
// redis-cli, 7.0 or later), part of kvtier_support: the remote tier's tests
// start one (tests/testing/redis_cluster.h) to find who serves a slot, crash
// masters, wait for failover, and move slots with their keys the way
// `redis-cli --cluster reshard` does, one step at a time; `kvtier bench
// remote` starts one when no --nodes are given.
//
// Every node is a child process of the caller (killed with it, by
// PR_SET_PDEATHSIG, if the caller dies first) with its own directory under
// MakeTempDir() and ports chosen free at start, so clusters running side by
// side never meet. Nothing is persisted (no RDB, no AOF).
//
// The harness talks to the nodes through redis-cli, one process per command,
// each bounded by timeout(1): values pass through argv, so Cli() is for keys
// and small values (under 128 KiB); large values go through the code under
// test. Keys moved by MoveKeys/FinishMove must not contain a newline (they
// are listed through redis-cli's raw output).
//
// Thread-compatible: one thread drives a RedisCluster. Start it
// on a thread that outlives it: a node dies with the thread that forked it.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <sys/types.h>
#include <vector>

#include "kvtier/result.h"

namespace kvtier::support {

// A loopback TCP port nobody listens on now, and whose port + 10000 (a Redis
// Cluster bus port) is free too: a random one of 10000..22767, below Linux's
// ephemeral range, so no outgoing connection takes it meanwhile (another
// process choosing at the same moment still may: retry on EADDRINUSE).
// -1 when none is free.
int FreeRedisPort();

class RedisCluster {
 public:
  struct Options {
    int masters = 3;                               // at least 3 (redis-cli --cluster create refuses fewer)
    int replicas_per_master = 1;                   // 0 or more
    int node_timeout_ms = 1000;                    // cluster-node-timeout: a crashed master fails over in ~2-3 s
    std::string maxmemory = "256mb";               // each node
    std::string maxmemory_policy = "allkeys-lru";  // lossy cache, as the remote tier expects
    // cluster-require-full-coverage: with "no" (what docs/OPERATIONS.md
    // advises for kvtier's cluster) the live masters keep serving their
    // slots while a dead one's fail over; "yes" (Redis' default) answers
    // CLUSTERDOWN everywhere meanwhile.
    bool require_full_coverage = false;
  };

  // Bound on one redis-cli run of Cli() and ClusterCli().
  static constexpr std::chrono::seconds kCliTimeout{30};
  // MIGRATE's own I/O timeout: generous, values of tens of MiB move in one.
  static constexpr std::chrono::milliseconds kMigrateTimeout{60000};
  // Keys per MIGRATE in MoveKeys (bounds the payload of one MIGRATE).
  static constexpr int kMigrateBatchKeys = 16;

  // "" when redis-server, redis-cli (7.0 or later) and timeout(1) are
  // runnable here, else why not (tests skip with it).
  static std::string Unavailable();

  // Starts masters * (1 + replicas_per_master) redis-server processes
  // (cluster-enabled, bound to 127.0.0.1, no persistence, replicas synced
  // without delay, failover allowed however long a replica was cut off,
  // DEBUG allowed from loopback; a node whose port was taken meanwhile is
  // restarted on another), creates the cluster with `redis-cli --cluster
  // create ... --cluster-yes` and waits (at most 30 s) until every node
  // reports cluster_state:ok with all 16384 slots assigned, every node sees
  // the same nodes, roles and slot ranges, and every replica's link to its
  // master is up. About 2.5 s for the default options. Errors:
  // FailedPrecondition when Unavailable() is not empty, InvalidArgument for
  // bad options, IoError when a node does not start (with its log's tail) or
  // redis-cli --cluster create fails (with its output's), TimedOut naming
  // what did not happen (with the log's tail of the node concerned).
  // Nothing is left running on error.
  static Result<std::unique_ptr<RedisCluster>> Start(const Options& options);

  // Stops every node still running (SIGTERM: Redis' own shutdown, nothing to
  // save; SIGKILL after 2 s) and removes the cluster's directory.
  ~RedisCluster();
  RedisCluster(const RedisCluster&) = delete;
  RedisCluster& operator=(const RedisCluster&) = delete;

  // Every node started, dead or alive, in start order: "127.0.0.1:<port>" and
  // the port alone.
  std::vector<std::string> Seeds() const;
  std::vector<int> Ports() const;

  // Runs one command on the node at `port` (redis-cli -p port -e --raw: no
  // redirection followed). Returns the raw output (one line per reply
  // element, the final newline removed), or Unavailable (node unreachable),
  // TimedOut (past `timeout`), IoError (an error reply such as MOVED, ASK or
  // ERR, in the message).
  Result<std::string> Cli(int port, const std::vector<std::string>& args,
                          std::chrono::seconds timeout = kCliTimeout) const;
  // Same, as a cluster client (redis-cli -c: follows MOVED and ASK) entering
  // through the first node that answers PING.
  Result<std::string> ClusterCli(const std::vector<std::string>& args) const;
  // The slot of `key` (CLUSTER KEYSLOT on a live node), or -1 if none answers.
  int SlotOf(const std::string& key) const;

  // The port of the live master serving `slot` now, by its own account
  // (the live node whose CLUSTER NODES shows itself as a master holding
  // `slot`; the highest config epoch if several do); -1 if none.
  int MasterOf(int slot) const;
  // The ports of the live nodes that are masters by their own account now.
  std::vector<int> Masters() const;

  // SIGKILLs the node at `port` (a crash) and reaps it. NotFound if no node
  // of this cluster runs there.
  Status Kill(int port);
  // Every node still running, as Kill.
  Status KillAll();

  // After a master was killed: waits until a live master serves `slot`,
  // every live node reports cluster_state:ok and routes `slot` to it.
  // Returns that master's port; InvalidArgument for a bad slot, TimedOut
  // with what was still missing (and the log's tail of the node concerned).
  Result<int> WaitForSlotServed(int slot, std::chrono::milliseconds timeout);

  // Moving `slot` to the master at `to_port` with its keys, as
  // `redis-cli --cluster reshard` does, in steps a test can interleave with
  // traffic:
  //  BeginMove: CLUSTER SETSLOT IMPORTING on the target, then MIGRATING on
  //    the source; no key moved yet (clients get ASK for keys already moved
  //    or absent on the source). InvalidArgument for a bad slot or a target
  //    that is not a live master other than the source, FailedPrecondition
  //    if `slot` is already being moved, Unavailable if no live master
  //    serves it, Cli's errors.
  //  MoveKeys: MIGRATEs up to `count` keys of `slot` (CLUSTER GETKEYSINSLOT
  //    on the source, kMigrateBatchKeys per MIGRATE, REPLACE). Returns how
  //    many moved, fewer than `count` once the source holds none.
  //    FailedPrecondition without BeginMove.
  //  FinishMove: moves the keys left, then CLUSTER SETSLOT NODE on the
  //    target, the source and every other live master, and waits (at most
  //    5 s) until every live node routes `slot` to the target (replicas learn
  //    it by gossip). FailedPrecondition without BeginMove, TimedOut.
  //  MoveSlot: all three.
  Status BeginMove(int slot, int to_port);
  Result<int> MoveKeys(int slot, int count);
  Status FinishMove(int slot);
  Status MoveSlot(int slot, int to_port);

  // The last `lines` lines of the log of the node at `port` ("" if none),
  // for failure messages.
  std::string LogTail(int port, int lines = 30) const;

 private:
  struct Node {
    std::string dir;  // its nodes.conf and redis.log
    int port = -1;
    pid_t pid = -1;  // -1 once killed and reaped
  };
  struct Move {  // a slot between BeginMove and FinishMove
    int source_port = -1;
    int target_port = -1;
    std::string target_id;
  };

  RedisCluster(const Options& options, std::string dir);
  Status StartNodes();
  Status StartNode(Node& node);
  Status AwaitPing(Node& node);
  Status CreateCluster();
  Status AwaitFormed(std::chrono::milliseconds timeout);
  Status CheckFormed(int* culprit_port);
  Status CheckSlotRouted(int slot, int owner_port, bool require_state_ok, int* culprit_port) const;
  std::vector<int> LivePorts() const;
  Node* FindNode(int port);
  std::string Seed(int port) const;

  Options options_;
  std::string dir_;
  std::vector<Node> nodes_;
  std::map<int, Move> moves_;  // by slot
};

}  // namespace kvtier::support
