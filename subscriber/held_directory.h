// HeldDirectory: which blocks other kvtierd nodes hold, from their KV
// events, so that the peer tier asks the nodes that hold a prefix instead
// of all of them (daemon/setup/peer_setup.h wires it to PeerTier).
//
// Each followed node (a name, and its events' stream and replay
// endpoints) is subscribed on the directory's thread as any indexer does
// (IndexRebuilder: a snapshot, then the stream after it, gaps replayed)
// into a set of the keys its tiers hold: any tier but the remote one
// (which every node shares, so it says nothing of the node).
//
// A node is *known* from its snapshot applied whole (asked once the
// node's publisher took the subscription, so no batch after it is missed)
// until an error: no answer, a subscription the publisher refused (its
// events.max_subscribers), a publisher that went away (it may come back
// as another run of the daemon), a gap its replay buffer no longer has, a batch
// that does not decode, the bound below. An error drops its keys, makes it
// unknown (logged once until it is known again) and subscribes it again
// `retry` later. While its contents are rebuilt (a snapshot after the node
// restarted, AllBlocksCleared) it is unknown too. Leading answers only for known nodes:
// for others the caller knows nothing (nullopt) and asks them as before.
// What a known node holds is as of its last batch applied (a few ms
// behind the node; a block it evicted since is asked for and missed, as a
// stale probe answer is).
//
// Bound: at most `max_blocks` (node, key) entries over all nodes; a
// stored event past it makes that node unknown (a partial set would say
// "not held" of blocks it holds) until `retry` (counted in overflows). A
// snapshot larger than `max_blocks` * 64 bytes is refused the same way.
// Memory: about 64 bytes per entry, plus one snapshot being applied.
//
// Thread-safety: every method may be called from any thread; none waits
// for the network (large sets are freed outside the lock). The directory's
// thread does the subscribing, requests and applying; it opens at most one
// node per turn, so a node that does not answer delays the others' streams
// by at most `answer_timeout` at a time. The destructor ends any wait at
// once (EventContext::Shutdown).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>

#include "common/counters.h"
#include "common/mutex.h"
#include "kvtier/block_key.h"
#include "subscriber/event_source.h"

namespace kvtier::events {

struct HeldDirectoryOptions {
  size_t max_blocks = size_t{1} << 20;
  std::chrono::milliseconds retry{5000};
  std::chrono::milliseconds answer_timeout{10000};  // a snapshot's or replay's silence at most
  // Opens a node's events (default: EventSource::Open over one shared
  // ZeroMQ context); a test gives its fake.
  std::function<Result<std::unique_ptr<EventStream>>(const std::string& endpoint, const std::string& replay_endpoint)>
      open;
};

class HeldDirectory {
 public:
  explicit HeldDirectory(HeldDirectoryOptions options);
  ~HeldDirectory();  // stops the thread
  HeldDirectory(const HeldDirectory&) = delete;
  HeldDirectory& operator=(const HeldDirectory&) = delete;

  // Follows node `name` at these endpoints (again, from a snapshot, when
  // they changed); Unfollow forgets it and what it held.
  void Follow(const std::string& name, const std::string& endpoint, const std::string& replay_endpoint) EXCLUDES(mu_);
  void Unfollow(const std::string& name) EXCLUDES(mu_);

  // How many of `keys`, from the first, node `name` holds; nullopt when it
  // is not known (not followed, not synced yet, or after an error).
  std::optional<size_t> Leading(const std::string& name, std::span<const BlockKey> keys) const EXCLUDES(mu_);

  // peer_events.*: followed and known (gauges: nodes), blocks (gauge:
  // entries held), syncs (snapshots applied), failures (errors that made a
  // node unknown), overflows (of those, the bound).
  void VisitCounters(CounterVisitor& v) const EXCLUDES(mu_);

 private:
  using HeldSet = std::unordered_map<BlockKey, uint8_t>;  // key -> bit per tier (1 << Tier)
  struct Node {
    std::string endpoint, replay_endpoint;
    uint64_t generation = 0;  // of the Follow that set the endpoints: unique over the directory's life
    bool known = false;       // synced, no error or rebuild since
    bool logged = false;      // its failure was logged (once until it is known again)
    HeldSet held;
  };
  struct Session;
  class NodeIndex;

  void Run() EXCLUDES(mu_);
  using Sessions = std::unordered_map<std::string, std::unique_ptr<Session>>;
  using RetryTimes = std::unordered_map<std::string, std::chrono::steady_clock::time_point>;
  // Matches the thread's sessions to the followed nodes; opens at most one that is due.
  void Reconcile(Sessions& sessions, RetryTimes& retry_at) EXCLUDES(mu_);
  // The session of `name` failed: its node forgets and is unknown.
  void Failed(const std::string& name, uint64_t generation, const Status& why) EXCLUDES(mu_);
  // The session of `name` applied a snapshot or a batch whole: its node is known.
  void Synced(const std::string& name, uint64_t generation, bool snapshot) EXCLUDES(mu_);

  std::shared_ptr<EventContext> context_ = EventContext::Make();  // the default `open`'s sockets
  const HeldDirectoryOptions options_;
  mutable Mutex mu_;
  CondVar cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  bool changed_ GUARDED_BY(mu_) = false;  // a Follow or Unfollow the thread has not matched yet
  uint64_t next_generation_ GUARDED_BY(mu_) = 0;
  std::unordered_map<std::string, Node> nodes_ GUARDED_BY(mu_);
  size_t entries_ GUARDED_BY(mu_) = 0;
  int64_t syncs_ GUARDED_BY(mu_) = 0;
  int64_t failures_ GUARDED_BY(mu_) = 0;
  int64_t overflows_ GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace kvtier::events
