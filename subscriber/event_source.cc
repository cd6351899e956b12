#include "subscriber/event_source.h"

#include <atomic>
#include <cstring>
#include <iterator>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/kv_event_forms.h"
#include "common/msgpack.h"

namespace kvtier::events {
namespace {

// Far over any batch the daemon sends (1,024 events of 512 keys).
constexpr int64_t kMaxMessageBytes = int64_t{64} << 20;
// What the SUB socket's monitor reports: the handshake's outcome.
constexpr int kMonitorEvents = ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                               ZMQ_EVENT_DISCONNECTED;
std::atomic<uint64_t> next_monitor{0};

}  // namespace

struct EventContext::Impl {
  zmq::context_t context{1};
};

EventContext::EventContext() : impl_(std::make_unique<Impl>()) {}
EventContext::~EventContext() = default;
std::shared_ptr<EventContext> EventContext::Make() { return std::shared_ptr<EventContext>(new EventContext()); }
void EventContext::Shutdown() { impl_->context.shutdown(); }

struct EventSource::Sockets {
  explicit Sockets(std::shared_ptr<EventContext> c) : context(std::move(c)) {}
  std::shared_ptr<EventContext> context;  // outlives the sockets below
  zmq::socket_t sub{context->impl().context, zmq::socket_type::sub};
  zmq::socket_t monitor{context->impl().context, zmq::socket_type::pair};  // the SUB's handshakes
  std::string replay_endpoint;
  EventSourceLimits limits;
};

EventSource::EventSource(std::unique_ptr<Sockets> sockets) : sockets_(std::move(sockets)) {}
EventSource::~EventSource() = default;

Result<std::unique_ptr<EventSource>> EventSource::Open(const std::string& endpoint, const std::string& replay_endpoint,
                                                       EventSourceLimits limits,
                                                       std::shared_ptr<EventContext> context) {
  try {
    auto sockets = std::make_unique<Sockets>(context ? std::move(context) : EventContext::Make());
    sockets->limits = limits;
    sockets->sub.set(zmq::sockopt::linger, 0);
    sockets->sub.set(zmq::sockopt::ipv6, 1);
    sockets->sub.set(zmq::sockopt::maxmsgsize, kMaxMessageBytes);
    sockets->sub.set(zmq::sockopt::subscribe, "");
    const std::string monitor = "inproc://kvtier-events-monitor-" + std::to_string(next_monitor.fetch_add(1));
    if (zmq_socket_monitor(sockets->sub.handle(), monitor.c_str(), kMonitorEvents) != 0) {
      throw zmq::error_t();
    }
    sockets->monitor.set(zmq::sockopt::linger, 0);
    sockets->monitor.connect(monitor);
    sockets->sub.connect(endpoint);
    sockets->replay_endpoint = replay_endpoint;
    return std::unique_ptr<EventSource>(new EventSource(std::move(sockets)));
  } catch (const zmq::error_t& e) {
    return Unavailable("cannot subscribe to " + endpoint + ": " + e.what());
  }
}

Status EventSource::DrainMonitor(std::chrono::milliseconds wait) {
  try {
    for (;;) {
      zmq::pollitem_t item{static_cast<void*>(sockets_->monitor), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, wait) == 0) return Status::Ok();
      wait = std::chrono::milliseconds(0);
      std::vector<zmq::message_t> frames;
      if (!zmq::recv_multipart(sockets_->monitor, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
        return Status::Ok();
      }
      if (frames.empty() || frames[0].size() < 6) continue;
      uint16_t event = 0;
      std::memcpy(&event, frames[0].data(), sizeof(event));
      if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
        subscribed_ = true;
        continue;
      }
      const std::string where = frames.size() > 1 ? frames[1].to_string() : std::string("the publisher");
      if (event == ZMQ_EVENT_DISCONNECTED) {
        if (!sockets_->limits.disconnect_is_error) continue;
        return Unavailable("the events publisher at " + where + " went away (batches may be lost)");
      }
      return Unavailable("the events publisher at " + where +
                         " refused this subscriber (its events.max_subscribers, or another protocol)");
    }
  } catch (const zmq::error_t& e) {
    return Unavailable(std::string("watching the events subscription: ") + e.what());
  }
}

Status EventSource::WaitSubscribed(std::chrono::milliseconds wait) {
  const auto until = std::chrono::steady_clock::now() + wait;
  while (!subscribed_) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return Unavailable("the events publisher did not take this subscriber within " + std::to_string(wait.count()) +
                         " ms (is its events.endpoint reachable?)");
    }
    if (Status s = DrainMonitor(left); !s.ok()) return s;
  }
  return Status::Ok();
}

Result<std::optional<SeqPayload>> EventSource::Next(std::chrono::milliseconds wait) {
  if (Status s = DrainMonitor(std::chrono::milliseconds(0)); !s.ok()) return s;
  try {
    zmq::pollitem_t item{static_cast<void*>(sockets_->sub), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, wait) == 0) return std::optional<SeqPayload>();
    std::vector<zmq::message_t> frames;
    if (!zmq::recv_multipart(sockets_->sub, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
      return std::optional<SeqPayload>();
    }
    if (frames.size() != 3 || frames[1].size() != 8) {
      return ProtocolError("a published message is not [topic, 8-byte seq, payload] (" + std::to_string(frames.size()) +
                           " frames)");
    }
    return std::optional<SeqPayload>(SeqPayload{SeqFromBytes(frames[1].to_string()), frames[2].to_string()});
  } catch (const zmq::error_t& e) {
    return Unavailable(std::string("reading the events stream: ") + e.what());
  }
}

Result<std::vector<SeqPayload>> EventSource::Replay(uint64_t start) {
  return Request(SeqBytes(static_cast<int64_t>(start)));
}

Result<std::vector<SeqPayload>> EventSource::Snapshot() {
  MsgpackWriter w;
  w.MapHeader(1);
  w.Str("type");
  w.Str("snapshot");
  return Request(w.Take());
}

Result<std::vector<SeqPayload>> EventSource::Request(const std::string& body) {
  try {
    zmq::socket_t dealer(sockets_->context->impl().context, zmq::socket_type::dealer);
    dealer.set(zmq::sockopt::linger, 0);
    dealer.set(zmq::sockopt::ipv6, 1);
    dealer.set(zmq::sockopt::maxmsgsize, kMaxMessageBytes);
    dealer.connect(sockets_->replay_endpoint);
    (void)dealer.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::sndmore);
    (void)dealer.send(zmq::buffer(body), zmq::send_flags::none);
    std::vector<SeqPayload> out;
    uint64_t bytes = 0;
    const EventSourceLimits& limits = sockets_->limits;
    for (;;) {
      zmq::pollitem_t item{static_cast<void*>(dealer), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, limits.answer_timeout) == 0) {
        return Unavailable("no answer from " + sockets_->replay_endpoint + " within " +
                           std::to_string(limits.answer_timeout.count()) +
                           " ms (is kvtierd running, with events enabled?)");
      }
      std::vector<zmq::message_t> frames;
      if (!zmq::recv_multipart(dealer, std::back_inserter(frames))) continue;
      if (frames.size() == 2 && frames[0].size() == 0) {  // ["", {"error": ...}]
        auto error = DecodeMsgpack(frames[1].to_string());
        const MsgpackValue* why = error.ok() ? error->Find("error") : nullptr;
        return ProtocolError("the replay socket refused: " +
                             (why != nullptr && why->str() != nullptr ? *why->str() : std::string("(no reason)")));
      }
      if (frames.size() != 3 || frames[0].size() != 0 || frames[1].size() != 8) {
        return ProtocolError("an answer of the replay socket is not [\"\", 8-byte seq, payload]");
      }
      const int64_t seq = SeqFromBytes(frames[1].to_string());
      if (seq == kEventEndSeq) return out;
      bytes += frames[2].size();
      if (bytes > limits.max_answer_bytes) {
        return NoSpace("an answer of " + sockets_->replay_endpoint + " is over " +
                       std::to_string(limits.max_answer_bytes) + " bytes");
      }
      out.push_back(SeqPayload{seq, frames[2].to_string()});
    }
  } catch (const zmq::error_t& e) {
    return Unavailable("asking " + sockets_->replay_endpoint + ": " + e.what());
  }
}

}  // namespace kvtier::events
