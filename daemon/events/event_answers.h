// EventAnswers: the replay socket's answers in flight, each sent as fast
// as its peer reads it. A replay of thousands of batches or a snapshot of
// millions of blocks is more than ZeroMQ queues for one peer (its
// high-water mark); sent at once, the rest would be dropped silently and
// the end marker with it. Here each answer is a cursor: Pump() sends its
// messages until the peer's queue is full (the ROUTER socket is
// ROUTER_MANDATORY: a full queue refuses the message whole, a gone peer is
// told apart), and goes on at the next Pump. The publisher thread pumps
// between its other work, so no answer ever waits on a peer.
//
// Bounds: at most `max_answers` answers in flight (a request past it gets
// an error: "busy"), of which at most `max_snapshots` snapshots, whose
// encoded contents are the only memory they hold (a replay holds a
// cursor); an answer whose peer reads nothing for `stall_timeout` is
// dropped (its peer times out and asks again).
//
// Thread: the publisher's thread only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace zmq {
class socket_t;
}

namespace kvtier {

class EventAnswers {
 public:
  // The replay buffer, oldest first: (sequence number, payload).
  using Kept = std::deque<std::pair<uint64_t, std::string>>;
  struct Limits {
    size_t max_answers = 16;
    size_t max_snapshots = 2;
    std::chrono::milliseconds stall_timeout{10'000};
  };

  // `router` and `kept` are borrowed and outlive this.
  EventAnswers(zmq::socket_t& router, const Kept& kept, Limits limits);

  // Whether another answer (a snapshot: another snapshot) may start now.
  bool Room(bool snapshot) const;
  // A replay of the kept batches from `start` through `through`, then the end marker.
  void AddReplay(std::string identity, uint64_t start, uint64_t through);
  // A snapshot: `payloads`, each sent with sequence number `seq`, then the end marker.
  void AddSnapshot(std::string identity, int64_t seq, std::vector<std::string> payloads);
  // One message [identity, "", payload] (an estimate, an error), sent
  // now if the peer has room, else dropped (counted).
  void SendOne(const std::string& identity, std::string_view payload);

  // Sends what the peers have room for; true when answers remain.
  bool Pump();
  bool pending() const { return !answers_.empty(); }

  uint64_t dropped() const { return dropped_; }  // answers or messages given up (peer gone, stalled, full)

 private:
  struct Answer {
    std::string identity;
    bool snapshot = false;
    uint64_t cursor = 0;   // replay: the next sequence number; snapshot: the next payload
    uint64_t through = 0;  // replay: the last sequence number it sends
    int64_t seq = 0;       // snapshot: the sequence number of every payload
    std::vector<std::string> payloads;
    std::chrono::steady_clock::time_point progressed;
  };
  enum class Sent { kOk, kFull, kGone };
  Sent Send(const std::string& identity, std::string_view seq, std::string_view payload);
  // Sends what `a` can; true when it is complete or must be dropped.
  bool Advance(Answer& a);

  zmq::socket_t& router_;
  const Kept& kept_;
  const Limits limits_;
  std::deque<Answer> answers_;
  uint64_t dropped_ = 0;
};

}  // namespace kvtier
