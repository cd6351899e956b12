// The daemon's KV events sockets as `kvtier events` reads them
// (docs/OPERATIONS.md, "KV events"): a SUB socket on the stream and a
// DEALER per request to the replay socket (a replay from a sequence
// number, or a snapshot), each answered by [seq, payload] frames up to the
// end marker (seq -1).
//
// Errors are Status values (Unavailable: no answer within the timeout;
// NoSpace: an answer past its bound); ZeroMQ's exceptions stay
// inside. Not thread-safe: one thread uses it. Sources that share an
// EventContext share its ZeroMQ I/O thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvtier/result.h"

namespace kvtier::events {

// One published batch: its sequence number and msgpack payload.
struct SeqPayload {
  int64_t seq = 0;
  std::string payload;
};

// What the replay socket answers (EventSource's; a test's fake).
class EventRequests {
 public:
  virtual ~EventRequests() = default;
  // The batches from `start` on that the replay buffer keeps.
  virtual Result<std::vector<SeqPayload>> Replay(uint64_t start) = 0;
  // The current contents (every batch carries the same seq S: the last
  // batch of the stream the contents include).
  virtual Result<std::vector<SeqPayload>> Snapshot() = 0;
};

// The stream and the requests of one daemon's events (EventSource's; a test's fake).
class EventStream : public EventRequests {
 public:
  // The next batch of the stream, waiting at most `wait`; nullopt if none
  // came. A message that is not [topic, 8-byte seq, payload] is an error.
  // A refusal of the SUB socket by the publisher (its events.max_subscribers
  // cap: libzmq does not reconnect it) is an error here too.
  virtual Result<std::optional<SeqPayload>> Next(std::chrono::milliseconds wait) = 0;
  // Ok once the SUB socket's handshake with the publisher succeeded, so
  // that a snapshot asked after it is followed by every batch after its S;
  // Unavailable when the publisher refused it or nothing came within `wait`.
  virtual Status WaitSubscribed(std::chrono::milliseconds wait) { return Status::Ok(); }
};

// A ZeroMQ context (one I/O thread) sources may share.
class EventContext {
 public:
  static std::shared_ptr<EventContext> Make();
  ~EventContext();
  // Ends every wait of its sockets at once (they fail with Unavailable);
  // for a thread that must stop while a source waits for an answer.
  void Shutdown();
  struct Impl;
  Impl& impl() { return *impl_; }

 private:
  EventContext();
  std::unique_ptr<Impl> impl_;
};

struct EventSourceLimits {
  std::chrono::milliseconds answer_timeout{10000};  // the replay socket's silence at most, per message
  uint64_t max_answer_bytes = UINT64_MAX;           // one replay's or snapshot's payloads at most
  // Next fails once the SUB socket lost its publisher (it went away or
  // restarted: batches may be lost, and a restarted daemon's numbers need
  // not go back), for a reader that then takes a new snapshot; else libzmq
  // reconnects quietly (`kvtier events` tells a restart by its numbers).
  bool disconnect_is_error = false;
};

class EventSource final : public EventStream {
 public:
  // Subscribes to every topic on `endpoint`; requests go to `replay_endpoint`.
  // Null `context`: one of its own.
  static Result<std::unique_ptr<EventSource>> Open(const std::string& endpoint, const std::string& replay_endpoint,
                                                   EventSourceLimits limits = {},
                                                   std::shared_ptr<EventContext> context = nullptr);
  ~EventSource() override;
  EventSource(const EventSource&) = delete;
  EventSource& operator=(const EventSource&) = delete;

  Result<std::optional<SeqPayload>> Next(std::chrono::milliseconds wait) override;
  Status WaitSubscribed(std::chrono::milliseconds wait) override;
  Result<std::vector<SeqPayload>> Replay(uint64_t start) override;
  Result<std::vector<SeqPayload>> Snapshot() override;

 private:
  struct Sockets;
  explicit EventSource(std::unique_ptr<Sockets> sockets);
  Result<std::vector<SeqPayload>> Request(const std::string& body);
  // Reads the SUB socket's monitor: a refused handshake is an error;
  // `subscribed_` notes a successful one.
  Status DrainMonitor(std::chrono::milliseconds wait);
  bool subscribed_ = false;
  std::unique_ptr<Sockets> sockets_;
};

}  // namespace kvtier::events
