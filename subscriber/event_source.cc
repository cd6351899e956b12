#include "subscriber/event_source.h"

#include <iterator>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/kv_event_forms.h"
#include "common/msgpack.h"

namespace kvtier::events {
namespace {

// Far over any batch the daemon sends (1,024 events of 512 keys).
constexpr int64_t kMaxMessageBytes = int64_t{64} << 20;

}  // namespace

struct EventContext::Impl {
  zmq::context_t context{1};
};

EventContext::EventContext() : impl_(std::make_unique<Impl>()) {}
EventContext::~EventContext() = default;
std::shared_ptr<EventContext> EventContext::Make() { return std::shared_ptr<EventContext>(new EventContext()); }

struct EventSource::Sockets {
  explicit Sockets(std::shared_ptr<EventContext> c) : context(std::move(c)) {}
  std::shared_ptr<EventContext> context;  // outlives the sockets below
  zmq::socket_t sub{context->impl().context, zmq::socket_type::sub};
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
    sockets->sub.set(zmq::sockopt::maxmsgsize, kMaxMessageBytes);
    sockets->sub.set(zmq::sockopt::subscribe, "");
    sockets->sub.connect(endpoint);
    sockets->replay_endpoint = replay_endpoint;
    return std::unique_ptr<EventSource>(new EventSource(std::move(sockets)));
  } catch (const zmq::error_t& e) {
    return Unavailable("cannot subscribe to " + endpoint + ": " + e.what());
  }
}

Result<std::optional<SeqPayload>> EventSource::Next(std::chrono::milliseconds wait) {
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
