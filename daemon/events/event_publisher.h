// EventPublisher: the KV-events endpoint of one engine. A thread of its
// own takes the engine's block events from an EventJournal, groups them
// into batches (event_encoding.h) and publishes each on a ZeroMQ PUB
// socket as vLLM's publisher does: three frames, the topic, the batch's
// sequence number (8 bytes, big-endian, from 0 at each start) and the
// msgpack payload. It keeps the last batches (at most `buffer_batches`
// and `buffer_bytes`) for replay.
//
// The ROUTER socket (`replay_endpoint`) answers, each request a message
// [identity, "", body], paced by its peer's reading (EventAnswers: nothing
// of an answer is dropped because it is long; past the bounds on answers in
// flight a request gets {"error": "busy: ..."}):
//   body of 8 bytes, a sequence number N (vLLM's replay): every kept batch
//     from N on, [identity, "", seq, payload] each, then the end marker
//     [identity, "", -1 (8 bytes), ""]. Batches no longer kept are simply
//     absent (the first one sent says where the replay starts).
//   msgpack {"type": "snapshot"}: the current contents of every tier as
//     BlockStored batches, each [identity, "", S, payload] where S is the
//     sequence number of the last batch published before the walk, then the
//     end marker. A late joiner applies the snapshot, then the stream from
//     S + 1 (replaying S + 1 up to what it received since subscribing):
//     every change a batch up to S carries is in the walk, every later one
//     comes after it.
//   msgpack {"type": "estimate", ...}: Source::estimate's answer, one
//     message [identity, "", answer].
//   anything else: [identity, "", msgpack {"error": "..."}].
//
// At start it publishes AllBlocksCleared, then what the tiers hold (the
// NVMe tier's recovered blocks, ...) as BlockStored, so that a subscriber
// that saw another run of the daemon forgets it; the sequence numbers
// restart at 0 then, which is how a subscriber tells a restart.
//
// Never in the way: the engine only appends to the journal (bounded; an
// event that finds it full is dropped and the batch sequence skips a
// number, counted in events.dropped_batches, so a subscriber sees the gap
// and asks for a snapshot). PUB never blocks: a subscriber whose queue
// holds `send_hwm` batches loses what follows (it sees the gap and
// replays). Memory: the journal's bound, the replay buffer's, and per
// subscriber at most send_hwm batches of at most max_batch_events events,
// for at most max_subscribers subscribers (PeerCap: one more is refused
// at its handshake) and as many requesters.
//
// Thread-safe: Start and the destructor on one thread; VisitCounters on any.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/counters.h"
#include "common/msgpack.h"
#include "daemon/events/event_answers.h"
#include "daemon/events/event_encoding.h"
#include "daemon/events/event_journal.h"
#include "kvtier/result.h"
#include "tiers/tier.h"

namespace kvtier {

struct EventPublisherOptions {
  std::string endpoint;         // PUB, bound: "ipc:///run/kvtier/events.sock", "tcp://127.0.0.1:5557"
  std::string replay_endpoint;  // ROUTER, bound; empty: none
  std::string topic;            // the first frame of every batch ("" like vLLM's default)
  EventFormat format = EventFormat::kMap;
  size_t buffer_batches = 10'000;
  uint64_t buffer_bytes = uint64_t{64} << 20;
  size_t max_batch_events = 1024;
  int send_hwm = 1000;  // batches queued per subscriber
  // Peers of each socket at most (PeerCap); 0: no cap.
  uint32_t max_subscribers = 8;
  uint32_t flush_us = 2000;  // the longest an event waits in the journal while the thread is idle
};

class EventPublisher {
 public:
  struct Source {
    // Visits every block every tier holds now (Engine::ForEachHeldBlock).
    using BlockVisitor = std::function<void(Tier tier, const BlockKey& key, const BlockTier::BlockInfo& info)>;
    std::function<void(const BlockVisitor&)> contents;
    NamespaceInfoOf namespace_info;
    // Answers an estimate request (a decoded msgpack map) with a msgpack
    // payload; empty: estimates are refused as unsupported.
    std::function<std::string(const MsgpackValue& request)> estimate;
  };

  // Binds the sockets (InvalidArgument for a bad endpoint, IoError when it
  // cannot bind) and starts the thread. `journal` is borrowed and outlives
  // the publisher.
  static Result<std::unique_ptr<EventPublisher>> Start(const EventPublisherOptions& options, EventJournal& journal,
                                                       Source source);
  ~EventPublisher();  // publishes what the journal holds, stops the thread, closes the sockets
  EventPublisher(const EventPublisher&) = delete;
  EventPublisher& operator=(const EventPublisher&) = delete;

  // events.* counters and gauges (docs/OPERATIONS.md).
  void VisitCounters(CounterVisitor& v) const;
  // The sequence number the next batch gets (tests).
  uint64_t next_seq() const { return next_seq_.load(std::memory_order_acquire); }

 private:
  struct Sockets;
  EventPublisher(const EventPublisherOptions& options, EventJournal& journal, Source source,
                 std::unique_ptr<Sockets> sockets);
  void Run();
  void PublishJournal();
  void PublishContents(bool cleared_first);
  void Publish(std::span<const BlockEvent> events);
  void ServeRequests();
  void Replay(const std::string& identity, uint64_t start);
  void Snapshot(const std::string& identity);
  void Reply(const std::string& identity, std::string_view payload);
  bool Busy(const std::string& identity, bool snapshot);

  const EventPublisherOptions options_;
  EventJournal& journal_;
  const Source source_;
  std::unique_ptr<Sockets> sockets_;                   // used by the thread only once it runs
  std::deque<std::pair<uint64_t, std::string>> kept_;  // the thread's: the replay buffer
  uint64_t kept_bytes_ = 0;
  std::atomic<uint64_t> next_seq_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> batches_{0}, dropped_batches_{0}, replays_{0}, replay_misses_{0}, snapshots_{0}, estimates_{0},
      bad_requests_{0}, kept_bytes_gauge_{0};
  std::atomic<int64_t> busy_{0};
  std::atomic<uint64_t> answers_dropped_{0}, refused_peers_{0}, peers_{0};
  std::unique_ptr<EventAnswers> answers_;  // the thread's: with a replay socket
  std::thread thread_;
};

}  // namespace kvtier
