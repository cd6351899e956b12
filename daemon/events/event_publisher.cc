#include "daemon/events/event_publisher.h"

#include <chrono>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/logging.h"
#include "daemon/events/peer_cap.h"

namespace kvtier {
namespace {

constexpr int kMaxRequestBytes = 1 << 20;  // a replay socket peer sending more is disconnected
constexpr int kMaxRequestsPerRound = 16;   // between two drains of the journal

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

struct EventPublisher::Sockets {
  zmq::context_t context{1};
  std::unique_ptr<PeerCap> cap;  // closed after the sockets it watches, before the context
  zmq::socket_t pub{context, zmq::socket_type::pub};
  std::optional<zmq::socket_t> replay;
};

Result<std::unique_ptr<EventPublisher>> EventPublisher::Start(const EventPublisherOptions& options,
                                                              EventJournal& journal, Source source) {
  if (options.endpoint.empty()) return InvalidArgument("events: no endpoint");
  if (options.max_batch_events == 0 || options.buffer_batches == 0 || options.send_hwm <= 0) {
    return InvalidArgument("events: max_batch_events, buffer_batches and send_hwm must be positive");
  }
  auto sockets = std::make_unique<Sockets>();
  std::string binding = options.endpoint;
  try {
    if (options.max_subscribers > 0) {
      sockets->cap = std::make_unique<PeerCap>(sockets->context, options.max_subscribers);
      sockets->cap->Cover(sockets->pub, "pub");
    }
    sockets->pub.set(zmq::sockopt::sndhwm, options.send_hwm);
    sockets->pub.set(zmq::sockopt::linger, 0);
    sockets->pub.set(zmq::sockopt::maxmsgsize, int64_t{kMaxRequestBytes});
    sockets->pub.bind(options.endpoint);
    if (!options.replay_endpoint.empty()) {
      binding = options.replay_endpoint;
      sockets->replay.emplace(sockets->context, zmq::socket_type::router);
      sockets->replay->set(zmq::sockopt::sndhwm, options.send_hwm);
      sockets->replay->set(zmq::sockopt::linger, 0);
      sockets->replay->set(zmq::sockopt::maxmsgsize, int64_t{kMaxRequestBytes});
      sockets->replay->set(zmq::sockopt::router_mandatory, 1);  // a full peer refuses, never drops (EventAnswers)
      if (sockets->cap) sockets->cap->Cover(*sockets->replay, "replay");
      sockets->replay->bind(options.replay_endpoint);
    }
  } catch (const zmq::error_t& e) {
    if (e.num() == EINVAL || e.num() == EPROTONOSUPPORT) {
      return InvalidArgument("events: bad endpoint " + binding + ": " + e.what());
    }
    return IoError("events: cannot bind " + binding + ": " + e.what());
  }
  std::unique_ptr<EventPublisher> p(new EventPublisher(options, journal, std::move(source), std::move(sockets)));
  p->thread_ = std::thread([raw = p.get()] { raw->Run(); });
  return p;
}

EventPublisher::EventPublisher(const EventPublisherOptions& options, EventJournal& journal, Source source,
                               std::unique_ptr<Sockets> sockets)
    : options_(options), journal_(journal), source_(std::move(source)), sockets_(std::move(sockets)) {
  if (sockets_->replay) {
    answers_ = std::make_unique<EventAnswers>(*sockets_->replay, kept_, EventAnswers::Limits{});
  }
}

EventPublisher::~EventPublisher() {
  stop_.store(true, std::memory_order_release);
  if (thread_.joinable()) thread_.join();
}

void EventPublisher::Run() {
  try {
    PublishContents(/*cleared_first=*/true);
    while (!stop_.load(std::memory_order_acquire)) {
      if (sockets_->replay) {
        // Answers waiting for their peers to read: look again soon.
        const uint32_t wait_ms = answers_->pending() ? 1 : std::max<uint32_t>(1, options_.flush_us / 1000);
        zmq::pollitem_t item{static_cast<void*>(*sockets_->replay), 0, ZMQ_POLLIN, 0};
        zmq::poll(&item, 1, std::chrono::milliseconds(wait_ms));
        if (item.revents & ZMQ_POLLIN) ServeRequests();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(options_.flush_us));
      }
      if (sockets_->cap) {
        sockets_->cap->Serve();
        refused_peers_.store(sockets_->cap->refused(), std::memory_order_relaxed);
        peers_.store(sockets_->cap->peers(), std::memory_order_relaxed);
      }
      PublishJournal();
      if (answers_) {
        answers_->Pump();
        answers_dropped_.store(answers_->dropped(), std::memory_order_relaxed);
      }
    }
    PublishJournal();
  } catch (const zmq::error_t& e) {
    // Only a broken context gets here; the daemon serves on without events.
    spdlog::error("events: publisher stopped: {}", e.what());
  }
}

void EventPublisher::PublishJournal() {
  for (;;) {
    EventJournal::Taken taken = journal_.Take(options_.max_batch_events);
    if (!taken.events.empty()) Publish(taken.events);
    if (taken.dropped_after > 0) {
      next_seq_.fetch_add(1, std::memory_order_acq_rel);  // the gap a subscriber sees
      dropped_batches_.fetch_add(1, std::memory_order_relaxed);
    }
    if (taken.events.size() < options_.max_batch_events) return;
  }
}

void EventPublisher::PublishContents(bool cleared_first) {
  std::vector<BlockEvent> batch;
  if (cleared_first) batch.push_back(BlockEvent{BlockEventKind::kCleared});
  if (source_.contents) {
    source_.contents([&](Tier tier, const BlockKey& key, const BlockTier::BlockInfo& info) {
      batch.push_back(BlockEvent{BlockEventKind::kStored, tier, info.ns, key, std::nullopt});
      if (batch.size() == options_.max_batch_events) Publish(batch), batch.clear();
    });
  }
  if (!batch.empty()) Publish(batch);
}

void EventPublisher::Publish(std::span<const BlockEvent> events) {
  std::string payload = EncodeEventBatch(NowSeconds(), events, options_.format, source_.namespace_info);
  const uint64_t seq = next_seq_.fetch_add(1, std::memory_order_acq_rel);
  const std::string seq_bytes = SeqBytes(static_cast<int64_t>(seq));
  zmq::socket_t& pub = sockets_->pub;
  // PUB never blocks: at a subscriber's high-water mark it drops for that one.
  (void)pub.send(zmq::buffer(options_.topic), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  (void)pub.send(zmq::buffer(seq_bytes), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  (void)pub.send(zmq::buffer(payload), zmq::send_flags::dontwait);
  batches_.fetch_add(1, std::memory_order_relaxed);
  kept_bytes_ += payload.size();
  kept_.emplace_back(seq, std::move(payload));
  while (kept_.size() > options_.buffer_batches || (kept_bytes_ > options_.buffer_bytes && kept_.size() > 1)) {
    kept_bytes_ -= kept_.front().second.size();
    kept_.pop_front();
  }
  kept_bytes_gauge_.store(static_cast<int64_t>(kept_bytes_), std::memory_order_relaxed);
}

void EventPublisher::Reply(const std::string& identity, std::string_view payload) {
  answers_->SendOne(identity, payload);
}

void EventPublisher::ServeRequests() {
  for (int i = 0; i < kMaxRequestsPerRound; ++i) {
    std::vector<zmq::message_t> frames;
    if (!zmq::recv_multipart(*sockets_->replay, std::back_inserter(frames), zmq::recv_flags::dontwait)) return;
    if (frames.size() != 3 || frames[1].size() != 0) {
      bad_requests_.fetch_add(1, std::memory_order_relaxed);
      if (!frames.empty()) Reply(frames[0].to_string(), EncodeEventError("a request is [identity, \"\", body]"));
      continue;
    }
    const std::string identity = frames[0].to_string();
    const std::string body = frames[2].to_string();
    if (body.size() == 8) {
      Replay(identity, static_cast<uint64_t>(SeqFromBytes(body)));
      continue;
    }
    Result<MsgpackValue> request = DecodeMsgpack(body);
    const MsgpackValue* type = request.ok() ? request->Find("type") : nullptr;
    const std::string* name = type != nullptr ? type->str() : nullptr;
    if (name != nullptr && *name == "snapshot") {
      Snapshot(identity);
    } else if (name != nullptr && *name == "estimate" && source_.estimate) {
      estimates_.fetch_add(1, std::memory_order_relaxed);
      Reply(identity, source_.estimate(*request));
    } else {
      bad_requests_.fetch_add(1, std::memory_order_relaxed);
      Reply(identity, EncodeEventError(
                          !request.ok() ? request.status().message()
                                        : "unknown request: send 8 bytes (a sequence number to replay from), or a map "
                                          "with \"type\": \"snapshot\" or \"estimate\""));
    }
  }
}

// Another answer past the bounds (EventAnswers::Limits): an error, ask again.
bool EventPublisher::Busy(const std::string& identity, bool snapshot) {
  if (answers_->Room(snapshot)) return false;
  busy_.fetch_add(1, std::memory_order_relaxed);
  Reply(identity, EncodeEventError(snapshot ? "busy: too many snapshots in flight; ask again"
                                            : "busy: too many answers in flight; ask again"));
  return true;
}

void EventPublisher::Replay(const std::string& identity, uint64_t start) {
  replays_.fetch_add(1, std::memory_order_relaxed);
  if (Busy(identity, /*snapshot=*/false)) return;
  if (!kept_.empty() && start < kept_.front().first) replay_misses_.fetch_add(1, std::memory_order_relaxed);
  const uint64_t next = next_seq_.load(std::memory_order_acquire);
  answers_->AddReplay(identity, start, next > 0 ? next - 1 : 0);  // through what is published now
}

void EventPublisher::Snapshot(const std::string& identity) {
  snapshots_.fetch_add(1, std::memory_order_relaxed);
  if (Busy(identity, /*snapshot=*/true)) return;
  PublishJournal();  // every change queued before the walk is in a batch up to `last`
  const auto last = static_cast<int64_t>(next_seq_.load(std::memory_order_acquire)) - 1;
  std::vector<std::string> payloads;
  std::vector<BlockEvent> batch;
  auto encode = [&] {
    payloads.push_back(EncodeEventBatch(NowSeconds(), batch, options_.format, source_.namespace_info));
    batch.clear();
  };
  if (source_.contents) {
    source_.contents([&](Tier tier, const BlockKey& key, const BlockTier::BlockInfo& info) {
      batch.push_back(BlockEvent{BlockEventKind::kStored, tier, info.ns, key, std::nullopt});
      if (batch.size() == options_.max_batch_events) encode();
    });
  }
  if (!batch.empty() || payloads.empty()) encode();  // at least one batch: it says where the stream goes on
  answers_->AddSnapshot(identity, last, std::move(payloads));
}

void EventPublisher::VisitCounters(CounterVisitor& v) const {
  v.Visit("events.emitted", static_cast<int64_t>(journal_.emitted()));
  v.Visit("events.dropped_events", static_cast<int64_t>(journal_.dropped()));
  v.Visit("events.dropped_batches", dropped_batches_.load(std::memory_order_relaxed));
  v.Visit("events.batches", batches_.load(std::memory_order_relaxed));
  v.Visit("events.replays", replays_.load(std::memory_order_relaxed));
  v.Visit("events.replay_misses", replay_misses_.load(std::memory_order_relaxed));
  v.Visit("events.snapshots", snapshots_.load(std::memory_order_relaxed));
  v.Visit("events.estimates", estimates_.load(std::memory_order_relaxed));
  v.Visit("events.bad_requests", bad_requests_.load(std::memory_order_relaxed));
  v.Visit("events.busy_refusals", busy_.load(std::memory_order_relaxed));
  v.Visit("events.refused_peers", static_cast<int64_t>(refused_peers_.load(std::memory_order_relaxed)));
  v.VisitGauge("events.peers", static_cast<int64_t>(peers_.load(std::memory_order_relaxed)));
  v.Visit("events.answers_dropped", static_cast<int64_t>(answers_dropped_.load(std::memory_order_relaxed)));
  v.VisitGauge("events.queued", static_cast<int64_t>(journal_.queued()));
  v.VisitGauge("events.replay_buffer_bytes", kept_bytes_gauge_.load(std::memory_order_relaxed));
}

}  // namespace kvtier
