// PeerTier: the blocks other nodes' kvtierd hold in memory, as a tier of
// this node's stack (below the local tiers): a lookup the local tiers miss
// asks the peers (Prober::Probe, a bounded wait); a block a peer holds is
// then found here (Find) and read (Read) by pinning it on that peer and
// getting its layers one-sided with UCX straight into the caller's
// buffer, each layer verified against the checksum the peer recorded
// before the read completes. The engine promotes what it reads, as from
// any tier below.
//
// Read-only: Write is Unimplemented (no admission ever sends a block here,
// daemon/setup/tier_stack.cc), ForEachBlock lists nothing (the blocks are
// the peers'; they report them), Erase forgets what a probe learned and is
// NotFound (nothing of this node's was there).
//
// Connections: one endpoint per member (`members`, "host:port" of their
// PeerServer), opened at start and again `retry` after a failure, each
// proving and checking the cluster secret (peer_protocol.h) before any
// request. A member whose id is this node's (the same list on every node)
// is skipped.
//
// Discovery: with `discover` set, a thread of the tier's calls it every
// `discover_interval` (the daemon's is MemberRegistry's Refresh, through
// the remote tier's Redis); the addresses it answers are members besides
// `members`, connected like them (an address is one member whatever name
// it is given: members are told apart by the address a name resolves to,
// resolved on the discovery thread), and one it leaves out of 3 answers in
// a row is closed and dropped (its reads fail as if it had gone). A failed
// call changes nothing (logged, peer.discovery_failures). At most
// kMaxPeerMembers members are known at once (a dropped one's slot is
// reused); an address past that is left out (logged).
// `leave` is called once when the tier closes.
//
// Probes: a lookup's probe asks at most `probe_fanout` connected members:
// first those `holders` (the members' KV events) say hold the most of its
// keys from the first (only those when one holds them all), then the
// members nothing is known of, then those known not to hold the first key
// (a block still being written on its node, a prefill hand-off, is not in
// its events yet); within each, in an order drawn from the first key and
// the member (the same prefix asks the same members). Without holders
// every member is unknown: the first probe_fanout in that order.
//
// Faults: a peer that does not answer a request, or finish a get, within
// `timeout` counts as stalled; one whose endpoint fails counts as gone.
// Either way its endpoint is closed at once (UCX then ends the gets in
// flight with an error, so no byte lands after), every read of it fails
// (IoError: the engine's load marks the block failed and the engine
// recomputes), what it was known to hold is forgotten, and it is tried
// again `retry` later. Its pins end with the connection on its side.
//
// Pins: a block is pinned once on its peer for all the reads of it that
// overlap (a layer-wise load reads each layer separately), and released in
// one batched message `linger` after its last read. Reads of one peer are
// issued in the order they came, each once its block is pinned, so a
// layer-wise load's order (layer 0 of every block first) holds on the wire.
//
// A block still being written on its peer (a prefill node's layer-wise
// save that publishes its layers, LayerSave::PublishToPeers) is found and
// pinned like any other, with fewer layers ready: reads of ready layers go
// at once, a read of a later layer waits, in order, while the tier watches
// the block for more (one Watch at a time per block, answered by the peer
// when its writer publishes more). A block whose layers stop coming for
// `timeout` fails its reads alone (the peer is not closed for it).
//
// Taken: once every layer of a block was read and verified under one pin,
// the block's peer is told (a Taken message, batched each tick): a block
// its writer handed off (LayerSave::PublishToPeers(true)) then leaves the
// peer. A connection that fails first tells nothing: the peer keeps it.
//
// Outcomes: a read that fails once started fails with IoError, whatever
// the cause (the peer no longer holds the block, a layer that does not
// verify, a stall, a peer gone): the block was never this node's, so
// nothing of this node's is dropped, and KV events publish nothing of the
// peer tier (peers publish their own).
//
// Thread-safety: BlockTier's. UCX runs on the tier's own UcxNode thread;
// reads complete on a completion thread of the tier's (verifying a layer
// costs a pass over it, kept off the UCX thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/worker_pool.h"
#include "tiers/peer/peer_address.h"
#include "tiers/peer/peer_holders.h"
#include "tiers/peer/peer_protocol.h"
#include "tiers/peer/ucx_node.h"
#include "tiers/tier.h"

namespace kvtier {

struct PeerTierOptions {
  std::vector<std::string> members;  // "host:port" of each peer's PeerServer
  std::string secret;                // the cluster secret's bytes
  uint64_t node_id = 0;              // this node's id (its PeerServer's): a member with it is skipped
  std::chrono::milliseconds probe_timeout{20};
  std::chrono::milliseconds timeout{2000};
  std::chrono::milliseconds retry{1000};
  std::chrono::milliseconds linger{200};
  std::chrono::milliseconds known_for{10000};  // how long a probe's answer counts
  size_t max_known = size_t{1} << 18;          // blocks remembered as held by a peer
  // Discovery (above): the other members' addresses now; empty: none.
  std::function<Result<std::vector<std::string>>()> discover;
  std::function<void()> leave;
  std::chrono::milliseconds discover_interval{2000};
  // Members one probe asks at most (above), and what their events say
  // they hold (null: nothing; followed for members whose Welcome names
  // their events' endpoints).
  size_t probe_fanout = 16;
  std::shared_ptr<PeerHolders> holders;
};

inline constexpr size_t kMaxPeerMembers = 1024;

class PeerTier final : public BlockTier, public Prober {
 public:
  // InvalidArgument for a bad member address or no secret; Unavailable
  // when UCX does not start. Members that do not answer yet are tried in
  // the background.
  static Result<std::unique_ptr<PeerTier>> Open(const PeerTierOptions& options);
  ~PeerTier() override;

  std::string_view name() const override { return "peer"; }
  bool asynchronous() const override { return true; }
  uint64_t capacity_bytes() const override { return 0; }
  uint64_t used_bytes() const override { return 0; }
  std::optional<BlockInfo> Find(const BlockKey& key) const override EXCLUDES(known_mu_);
  Status Write(const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layer_count,
               std::span<const std::byte> payload, WriteDone done,
               std::optional<uint64_t> payload_checksum = std::nullopt) override;
  Status Read(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
              ReadDone done) override;
  bool keeps_layer_checksums() const override { return true; }
  Status ReadWithLayerChecksums(const BlockKey& key, uint32_t first_layer, uint32_t last_layer,
                                std::span<std::byte> dst, LayerReadDone done) override;
  void ForEachBlock(const BlockVisitor& visit) const override {}
  Status Erase(const BlockKey& key) override EXCLUDES(known_mu_);
  WriteTotals write_totals() const override { return {}; }
  Prober* prober() override { return this; }
  // peer.*: connected (gauge), probes, probe_asks (members asked), probed_keys, probe_hits, reads,
  // read_bytes, read_failures, corrupt, pins, stalls, disconnects, refused,
  // watches, watch_timeouts, taken (blocks told to their peer as read whole);
  // members (gauge: configured and discovered now), discoveries,
  // discovery_failures.
  void VisitCounters(CounterVisitor& v) const override;
  void CheckHealth(HealthFindings& out) const override;

  void Probe(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) override;

  // How many members have passed the handshake now.
  size_t connected() const { return static_cast<size_t>(connected_.load(std::memory_order_relaxed)); }

 private:
  struct Member;
  struct Pending;
  struct PinState;
  struct ReadOp;
  struct ProbeWait;
  struct Known {
    size_t member = 0;
    uint64_t generation = 0;
    BlockInfo info;
    std::chrono::steady_clock::time_point learned;
  };
  explicit PeerTier(const PeerTierOptions& options);

  // Node thread, each of them.
  void Tick();
  void Connect(size_t m);
  // An answer that came on endpoint `from` (its sender's reply endpoint).
  void OnAnswer(ucp_ep_h from, std::span<const std::byte> message);
  void OnHandshake(Member& m, const PeerEnvelope& e);
  void Fail(size_t m, const std::string& why, bool stalled);
  void Send(Member& m, uint64_t request, std::vector<std::byte> message);
  uint64_t NextRequest() { return ++next_request_; }
  // A request to `member` (its current connection) whose answer of type
  // `expects` is due by `deadline`: its id, recorded in pending_.
  uint64_t Expect(size_t member, PeerMessage expects, std::chrono::steady_clock::time_point deadline,
                  std::vector<BlockKey> keys = {}, bool watch = false);
  void StartRead(std::shared_ptr<ReadOp> op);
  void IssueQueued(size_t member);
  void Pinned(const BlockKey& key, Result<PeerPinned> pinned);
  // A block still being written on its peer: asks for more layers, and
  // takes the answer (or fails the block's reads).
  void Watch(PinState& pin);
  void Watched(const BlockKey& key, Result<PeerPinned> update);
  void IssueGet(PinState& pin, std::shared_ptr<ReadOp> op);
  void GetDone(std::shared_ptr<ReadOp> op, ucs_status_t status);
  void Finish(std::shared_ptr<ReadOp> op, Result<LayerRead> result);
  // A get under pin `pin_id` ended, layers [first, last) of `key` verified
  // (none when it failed): the pin's use ends; once every layer of the
  // block was verified, it is queued for its peer's Taken.
  void Verified(const BlockKey& key, uint64_t pin_id, uint32_t first, uint32_t last);
  // Tells `m` which blocks were read whole since the last time (Taken).
  void SendTaken(Member& m);
  void ReleaseIdle(bool all);
  // The ready members a probe of `keys` asks, in order (Probes, above).
  std::vector<size_t> ProbeOrder(std::span<const BlockKey> keys) const;
  void QueryMembers(std::shared_ptr<ProbeWait> wait);
  // Node thread: `found` (discovery's answer) becomes the discovered members.
  void Discovered(const std::vector<PeerAddress>& found);
  // Its own thread: calls options_.discover every discover_interval until closing.
  void DiscoverLoop();

  void Learn(size_t member, uint64_t generation, const NamespaceFingerprint& ns, std::span<const BlockKey> keys,
             const std::vector<PeerHeld>& held) EXCLUDES(known_mu_);
  void ForgetMember(size_t member) EXCLUDES(known_mu_);
  void Forget(const BlockKey& key) EXCLUDES(known_mu_);
  std::optional<Known> Lookup(const BlockKey& key) const EXCLUDES(known_mu_);

  PeerTierOptions options_;
  std::vector<PeerAddress> addresses_;
  std::unique_ptr<UcxNode> node_;
  std::unique_ptr<WorkerPool> completions_;  // verifies layers and runs `done`

  // Node thread.
  std::vector<std::unique_ptr<Member>> members_;
  std::unordered_map<uint64_t, Pending> pending_;  // by request id
  std::unordered_map<BlockKey, std::unique_ptr<PinState>> pins_;
  uint64_t next_request_ = 0;
  uint64_t next_pin_ = 0;

  mutable Mutex known_mu_;
  std::unordered_map<BlockKey, Known> known_ GUARDED_BY(known_mu_);
  std::deque<BlockKey> known_order_ GUARDED_BY(known_mu_);  // oldest first, for the bound

  // Discovery's thread, and how it is told to stop.
  Mutex discover_mu_;
  CondVar discover_cv_;
  bool closing_ GUARDED_BY(discover_mu_) = false;
  std::thread discover_thread_;

  std::atomic<int64_t> members_now_{0}, discoveries_{0}, discovery_failures_{0};
  std::atomic<int64_t> connected_{0}, probes_{0}, probe_asks_{0}, probed_keys_{0}, probe_hits_{0}, reads_{0},
      read_bytes_{0}, read_failures_{0}, corrupt_{0}, pins_made_{0}, stalls_{0}, disconnects_{0}, refused_{0},
      watches_{0}, watch_timeouts_{0}, taken_sent_{0};
};

}  // namespace kvtier
