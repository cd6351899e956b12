// PeerServer: serves this node's memory to the readers of other nodes
// (their PeerTier) over UCX: it listens on `[peer] listen`, proves and
// checks the cluster secret (peer_protocol.h), registers the source's
// regions with UCX once and hands each authenticated reader their remote
// keys, then answers queries (which keys it holds) and pins (where a
// block's bytes lie, their layers' checksums, a lease) and ends leases.
// The reader gets the bytes itself, one-sided.
//
// Bounds: at most `max_readers` readers connected (one more is refused;
// one that has not proved the secret 10 s after connecting is closed), each holding at most `max_pins_per_reader`
// leases (a Pin past that is Busy). A reader that goes away (its endpoint fails or closes) has its leases ended
// (PeerSource::EndReader), as does one that sends a malformed message or fails the handshake (closed at once).
//
// Trust: a reader that proves the secret may query and pin any namespace
// this node's source holds, and get any byte of the registered regions
// (UCX's remote keys grant the region, not a block): the peer network is
// the cluster's own (docs/OPERATIONS.md, "Peer tier").
//
// A block still being written (fewer layers ready than it has) is answered
// as it is; a Watch waits on the server until more layers are ready
// (PeerSource::SetPublishedListener) and answers then, counted among the
// reader's pins for `max_pins_per_reader`. A reader's Taken goes to the
// source (PeerSource::Taken: a handed-off block may leave this node).
//
// Thread-safety: Start and the destructor on one thread; address() and
// VisitCounters from any thread. Everything else runs on the server's own
// UcxNode thread. `source` is borrowed and outlives the server.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <unordered_map>
#include <memory>
#include <string>
#include <vector>

#include "common/counters.h"
#include "common/mutex.h"
#include "kvtier/result.h"
#include "tiers/peer/peer_source.h"
#include "tiers/peer/ucx_node.h"

namespace kvtier {

struct PeerServerOptions {
  std::string listen;  // "host:port"; port 0 takes a free one (tests)
  std::string secret;  // the cluster secret's bytes
  uint32_t max_readers = 64;
  uint32_t max_pins_per_reader = 4096;
  uint64_t node_id = 0;  // this node's id (0: a fresh one), in its Challenge: a reader of this node skips it
  // Where this node's KV events reach peers ("tcp://host:port", both or
  // neither), told to each reader in its Welcome; empty: none.
  std::string events_endpoint;
  std::string events_replay_endpoint;
};

class PeerServer {
 public:
  static Result<std::unique_ptr<PeerServer>> Start(const PeerServerOptions& options, PeerSource& source);
  ~PeerServer();
  PeerServer(const PeerServer&) = delete;
  PeerServer& operator=(const PeerServer&) = delete;

  // The bound address, "host:port" (the port chosen when listen asked for 0).
  const std::string& address() const { return address_; }
  uint64_t node_id() const { return options_.node_id; }
  // peer_server.*: readers (gauge), refused, queries, pins, pin_misses, releases, protocol_errors, watches,
  // taken (blocks readers said they hold whole), freed (of those, handed-off blocks that left at once).
  void VisitCounters(CounterVisitor& v) const;

 private:
  struct Reader;
  PeerServer(const PeerServerOptions& options, PeerSource& source);
  // Node thread, each of them.
  void Accept(ucp_conn_request_h request);
  void OnRequest(ucp_ep_h ep, std::span<const std::byte> message);
  void Handshake(Reader& r, const PeerEnvelope& e);
  void Answer(Reader& r, const PeerEnvelope& e);
  void Refuse(ucp_ep_h ep, uint64_t request, StatusCode code, const std::string& message);
  // Closes `ep` and ends its reader's leases.
  void Drop(ucp_ep_h ep, bool force);
  void Pinned(uint64_t reader_id, uint64_t request, PeerPinned pinned);
  Reader* ReaderById(uint64_t id);
  // A watch: answered now when more than `have` layers are ready (or the
  // block is gone), else kept in watches_ until the source says more are.
  struct Watch {
    uint64_t reader = 0;
    uint64_t request = 0;
    NamespaceFingerprint ns;
    uint32_t have = 0;
    std::chrono::steady_clock::time_point deadline{};  // answered as it is then, at the latest
  };
  // Answers the watches past their deadline (the node's tick).
  void ExpireWatches();
  // Closes readers that have not finished the handshake in time (the node's tick).
  void DropSlowHandshakes();
  void CheckWatch(const BlockKey& key, Watch w);
  void Watched(const BlockKey& key, Watch w, PeerPinned pinned);
  void LayersPublished(const BlockKey& key);

  PeerServerOptions options_;
  PeerSource& source_;
  std::string address_;
  std::unique_ptr<UcxNode> node_;
  ucp_listener_h listener_ = nullptr;                         // node thread
  std::vector<ucp_mem_h> registered_;                         // node thread
  PeerWelcome welcome_;                                       // the regions and their packed keys
  std::map<ucp_ep_h, std::unique_ptr<Reader>> readers_;       // node thread
  std::unordered_map<BlockKey, std::vector<Watch>> watches_;  // node thread
  // What the source's listener reaches: cleared by the destructor, so a
  // call under way then finds no server.
  struct Gate {
    Mutex mu;
    PeerServer* server GUARDED_BY(mu) = nullptr;
  };
  std::shared_ptr<Gate> gate_ = std::make_shared<Gate>();
  uint64_t next_reader_ = 0;  // node thread

  std::atomic<int64_t> reader_count_{0}, refused_{0}, queries_{0}, pins_{0}, pin_misses_{0}, releases_{0},
      protocol_errors_{0}, watches_made_{0}, taken_{0}, freed_{0};
};

}  // namespace kvtier
