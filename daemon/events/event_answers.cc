#include "daemon/events/event_answers.h"

#include <algorithm>
#include <zmq.hpp>

#include "common/kv_event_forms.h"

namespace kvtier {

EventAnswers::EventAnswers(zmq::socket_t& router, const Kept& kept, Limits limits)
    : router_(router), kept_(kept), limits_(limits) {}

bool EventAnswers::Room(bool snapshot) const {
  if (answers_.size() >= limits_.max_answers) return false;
  if (!snapshot) return true;
  return static_cast<size_t>(std::count_if(answers_.begin(), answers_.end(),
                                           [](const Answer& a) { return a.snapshot; })) < limits_.max_snapshots;
}

void EventAnswers::AddReplay(std::string identity, uint64_t start, uint64_t through) {
  Answer a;
  a.identity = std::move(identity);
  a.cursor = start;
  a.through = through;
  a.progressed = std::chrono::steady_clock::now();
  answers_.push_back(std::move(a));
}

void EventAnswers::AddSnapshot(std::string identity, int64_t seq, std::vector<std::string> payloads) {
  Answer a;
  a.identity = std::move(identity);
  a.snapshot = true;
  a.seq = seq;
  a.payloads = std::move(payloads);
  a.progressed = std::chrono::steady_clock::now();
  answers_.push_back(std::move(a));
}

void EventAnswers::SendOne(const std::string& identity, std::string_view payload) {
  if (Send(identity, "", payload) != Sent::kOk) ++dropped_;
}

EventAnswers::Sent EventAnswers::Send(const std::string& identity, std::string_view seq, std::string_view payload) {
  // ROUTER_MANDATORY: the identity frame is refused (EAGAIN: the peer's
  // queue is full; EHOSTUNREACH: no such peer) or the message goes whole.
  try {
    if (!router_.send(zmq::buffer(identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) return Sent::kFull;
  } catch (const zmq::error_t& e) {
    return e.num() == EHOSTUNREACH ? Sent::kGone : Sent::kFull;
  }
  (void)router_.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  if (!seq.empty()) (void)router_.send(zmq::buffer(seq), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  (void)router_.send(zmq::buffer(payload), zmq::send_flags::dontwait);
  return Sent::kOk;
}

bool EventAnswers::Advance(Answer& a) {
  const auto now = std::chrono::steady_clock::now();
  for (;;) {
    Sent sent;
    bool last = false;
    if (a.snapshot) {
      last = a.cursor == a.payloads.size();
      sent = last ? Send(a.identity, SeqBytes(kEventEndSeq), "")
                  : Send(a.identity, SeqBytes(a.seq), a.payloads[static_cast<size_t>(a.cursor)]);
      if (sent == Sent::kOk && !last) std::string().swap(a.payloads[static_cast<size_t>(a.cursor)]);  // sent: freed
    } else {
      // The first kept batch at or after the cursor (sequence numbers rise).
      auto it = std::lower_bound(kept_.begin(), kept_.end(), a.cursor,
                                 [](const auto& kept, uint64_t seq) { return kept.first < seq; });
      last = it == kept_.end() || it->first > a.through;
      sent = last ? Send(a.identity, SeqBytes(kEventEndSeq), "")
                  : Send(a.identity, SeqBytes(static_cast<int64_t>(it->first)), it->second);
      if (sent == Sent::kOk && !last) a.cursor = it->first + 1;
    }
    if (sent == Sent::kGone) {
      ++dropped_;
      return true;
    }
    if (sent == Sent::kFull) {
      if (now - a.progressed <= limits_.stall_timeout) return false;
      ++dropped_;
      return true;
    }
    a.progressed = now;
    if (a.snapshot && !last) ++a.cursor;
    if (last) return true;
  }
}

bool EventAnswers::Pump() {
  for (auto it = answers_.begin(); it != answers_.end();) {
    it = Advance(*it) ? answers_.erase(it) : it + 1;
  }
  return !answers_.empty();
}

}  // namespace kvtier
