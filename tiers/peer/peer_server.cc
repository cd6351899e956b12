#include "tiers/peer/peer_server.h"

#include <set>

#include "common/logging.h"
#include "tiers/peer/peer_address.h"

namespace kvtier {
namespace {

// A watch waits at most this long on the server, whatever the reader asked.
constexpr uint32_t kMaxWatchMs = 600000;
// A reader that has not proved the secret this long after it connected is closed (it holds a reader slot).
constexpr std::chrono::seconds kHandshakeTimeout{10};

}  // namespace

struct PeerServer::Reader {
  uint64_t id = 0;
  ucp_ep_h ep = nullptr;
  bool hello = false;
  bool authenticated = false;
  PeerNonce reader_nonce{};
  PeerNonce server_nonce{};
  std::set<uint64_t> leases;
  uint32_t pins_in_flight = 0;
  uint32_t watches = 0;  // waiting in watches_ or for the source's answer
  std::chrono::steady_clock::time_point accepted = std::chrono::steady_clock::now();
};

PeerServer::PeerServer(const PeerServerOptions& options, PeerSource& source) : options_(options), source_(source) {}

Result<std::unique_ptr<PeerServer>> PeerServer::Start(const PeerServerOptions& options, PeerSource& source) {
  if (options.secret.empty()) return InvalidArgument("peer server: no cluster secret");
  auto listen = ParsePeerAddress(options.listen, /*any_port=*/true);
  if (!listen.ok()) return listen.status();
  std::unique_ptr<PeerServer> server(new PeerServer(options, source));
  if (server->options_.node_id == 0) server->options_.node_id = FreshNodeId();
  auto node = UcxNode::Start({.name = "peer-srv"});
  if (!node.ok()) return node.status();
  server->node_ = std::move(*node);
  PeerServer* s = server.get();
  Status started = Status::Ok();
  s->node_->Run([&] {
    // First: a start that fails half-way (the address taken) undoes what it did when the node stops, so UCX
    // never finds a region still registered at its cleanup.
    s->node_->SetOnStop([s] {
      if (s->listener_ != nullptr) ucp_listener_destroy(s->listener_);
      s->listener_ = nullptr;
      while (!s->readers_.empty()) s->Drop(s->readers_.begin()->first, /*force=*/true);
      for (ucp_mem_h memh : s->registered_) ucp_mem_unmap(s->node_->context(), memh);
      s->registered_.clear();
    });
    if (Status am =
            s->node_->OnAm(kPeerRequestAm, [s](ucp_ep_h ep, std::span<const std::byte> m) { s->OnRequest(ep, m); });
        !am.ok()) {
      started = am;
      return;
    }
    for (const PeerSource::Region& region : source.Regions()) {
      ucp_mem_map_params_t map{};
      map.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
      map.address = region.base;
      map.length = region.bytes;
      ucp_mem_h memh = nullptr;
      if (ucs_status_t st = ucp_mem_map(s->node_->context(), &map, &memh); st != UCS_OK) {
        started = UcxError("registering region " + std::to_string(region.id), st);
        return;
      }
      s->registered_.push_back(memh);
      void* packed = nullptr;
      size_t packed_bytes = 0;
      if (ucs_status_t st = ucp_rkey_pack(s->node_->context(), memh, &packed, &packed_bytes); st != UCS_OK) {
        started = UcxError("packing the key of region " + std::to_string(region.id), st);
        return;
      }
      s->welcome_.regions.push_back(PeerRegion{region.id, reinterpret_cast<uint64_t>(region.base), region.bytes,
                                               std::string(static_cast<const char*>(packed), packed_bytes)});
      ucp_rkey_buffer_release(packed);
    }
    if (!options.events_endpoint.empty() && !options.events_replay_endpoint.empty()) {
      s->welcome_.events_endpoint = options.events_endpoint;
      s->welcome_.events_replay_endpoint = options.events_replay_endpoint;
    }
    ucp_listener_params_t params{};
    params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&listen->addr);
    params.sockaddr.addrlen = listen->length;
    params.conn_handler.cb = [](ucp_conn_request_h request, void* arg) {
      static_cast<PeerServer*>(arg)->Accept(request);
    };
    params.conn_handler.arg = s;
    if (ucs_status_t st = ucp_listener_create(s->node_->worker(), &params, &s->listener_); st != UCS_OK) {
      started = UcxError("listening on " + options.listen, st);
      return;
    }
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    if (ucs_status_t st = ucp_listener_query(s->listener_, &attr); st != UCS_OK) {
      started = UcxError("querying the listener", st);
      return;
    }
    s->address_ = FormatPeerAddress(reinterpret_cast<const sockaddr*>(&attr.sockaddr));
    {
      MutexLock lock(s->gate_->mu);
      s->gate_->server = s;
    }
    source.SetPublishedListener([gate = s->gate_](const BlockKey& key) {
      MutexLock lock(gate->mu);
      if (gate->server == nullptr) return;
      PeerServer* server = gate->server;
      server->node_->Post([server, key] { server->LayersPublished(key); });
    });
    s->node_->SetTick([s] {
      if (!s->watches_.empty()) s->ExpireWatches();
      s->DropSlowHandshakes();
    });
  });
  if (!started.ok()) return Status(started.code(), "peer server: " + started.message());
  return server;
}

PeerServer::~PeerServer() {
  {
    MutexLock lock(gate_->mu);
    gate_->server = nullptr;  // a listener call under way now reaches nothing
  }
  source_.SetPublishedListener({});
  if (node_ != nullptr) node_->Stop();  // runs on_stop: readers dropped, their leases ended
}

void PeerServer::Accept(ucp_conn_request_h request) {
  if (readers_.size() >= options_.max_readers) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("peer server: refusing a reader: {} already connected (peer max_readers)", readers_.size());
    ucp_listener_reject(listener_, request);
    return;
  }
  ucp_ep_params_t params{};
  params.field_mask =
      UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.conn_request = request;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = [](void* arg, ucp_ep_h ep, ucs_status_t) {
    static_cast<PeerServer*>(arg)->Drop(ep, /*force=*/true);
  };
  params.err_handler.arg = this;
  ucp_ep_h ep = nullptr;
  if (ucs_status_t st = ucp_ep_create(node_->worker(), &params, &ep); st != UCS_OK) {
    spdlog::warn("peer server: accepting a reader: {}", ucs_status_string(st));
    return;
  }
  auto reader = std::make_unique<Reader>();
  reader->id = (uint64_t{1} << 62) | ++next_reader_;
  reader->ep = ep;
  readers_[ep] = std::move(reader);
  reader_count_.store(static_cast<int64_t>(readers_.size()), std::memory_order_relaxed);
}

void PeerServer::Drop(ucp_ep_h ep, bool force) {
  auto it = readers_.find(ep);
  if (it == readers_.end()) return;
  std::unique_ptr<Reader> reader = std::move(it->second);
  readers_.erase(it);
  reader_count_.store(static_cast<int64_t>(readers_.size()), std::memory_order_relaxed);
  source_.EndReader(reader->id);
  const uint64_t id = reader->id;
  for (auto it = watches_.begin(); it != watches_.end();) {
    std::erase_if(it->second, [id](const Watch& w) { return w.reader == id; });
    it = it->second.empty() ? watches_.erase(it) : std::next(it);
  }
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t closing = ucp_ep_close_nbx(ep, &param);
  if (closing != nullptr && !UCS_PTR_IS_ERR(closing)) ucp_request_free(closing);  // UCX finishes it
}

void PeerServer::Refuse(ucp_ep_h ep, uint64_t request, StatusCode code, const std::string& message) {
  node_->SendAm(ep, kPeerAnswerAm, EncodePeer(request, PeerRefused{code, message}), /*reply=*/true);
}

void PeerServer::OnRequest(ucp_ep_h ep, std::span<const std::byte> message) {
  auto it = ep == nullptr ? readers_.end() : readers_.find(ep);
  if (it == readers_.end()) return;  // no endpoint to answer on, or closed meanwhile
  Reader& reader = *it->second;
  auto envelope = OpenPeer(message);
  if (!envelope.ok()) {
    protocol_errors_.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("peer server: {}; closing that reader", envelope.status().message());
    Refuse(ep, 0, StatusCode::kProtocolError, envelope.status().message());
    Drop(ep, /*force=*/false);
    return;
  }
  if (!reader.authenticated) return Handshake(reader, *envelope);
  Answer(reader, *envelope);
}

void PeerServer::Handshake(Reader& r, const PeerEnvelope& e) {
  const ucp_ep_h ep = r.ep;
  auto fail = [&](StatusCode code, const std::string& why) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("peer server: refusing a reader: {}", why);
    Refuse(ep, e.request, code, why);
    Drop(ep, /*force=*/false);
  };
  if (e.type == PeerMessage::kHello && !r.hello) {
    auto hello = DecodeHello(e.body);
    if (!hello.ok()) return fail(StatusCode::kProtocolError, hello.status().message());
    auto nonce = FreshNonce();
    if (!nonce.ok()) return fail(StatusCode::kUnavailable, nonce.status().message());
    r.hello = true;
    r.reader_nonce = hello->nonce;
    r.server_nonce = *nonce;
    const auto secret = std::as_bytes(std::span(options_.secret));
    PeerChallenge challenge{options_.node_id, r.server_nonce, ServerProof(secret, r.reader_nonce, r.server_nonce)};
    node_->SendAm(ep, kPeerAnswerAm, EncodePeer(e.request, challenge), true);
    return;
  }
  if (e.type == PeerMessage::kProof && r.hello) {
    auto proof = DecodeProof(e.body);
    if (!proof.ok()) return fail(StatusCode::kProtocolError, proof.status().message());
    const auto secret = std::as_bytes(std::span(options_.secret));
    if (!SameProof(*proof, ReaderProof(secret, r.server_nonce, r.reader_nonce))) {
      return fail(StatusCode::kPermissionDenied, "its proof of the cluster secret does not verify");
    }
    r.authenticated = true;
    node_->SendAm(ep, kPeerAnswerAm, EncodePeer(e.request, welcome_), /*reply=*/true);
    return;
  }
  fail(StatusCode::kPermissionDenied, "a request before the handshake");
}

void PeerServer::Answer(Reader& r, const PeerEnvelope& e) {
  const ucp_ep_h ep = r.ep;
  auto malformed = [&](const Status& why) {
    protocol_errors_.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("peer server: {}; closing that reader", why.message());
    Refuse(ep, e.request, StatusCode::kProtocolError, why.message());
    Drop(ep, /*force=*/false);
  };
  switch (e.type) {
    case PeerMessage::kQuery: {
      auto query = DecodeQuery(e.body);
      if (!query.ok()) return malformed(query.status());
      queries_.fetch_add(1, std::memory_order_relaxed);
      PeerFound found{source_.Find(query->ns, query->keys)};
      found.keys.resize(query->keys.size());
      node_->SendAm(ep, kPeerAnswerAm, EncodePeer(e.request, found), /*reply=*/true);
      return;
    }
    case PeerMessage::kPin: {
      auto pin = DecodePin(e.body);
      if (!pin.ok()) return malformed(pin.status());
      pins_.fetch_add(1, std::memory_order_relaxed);
      if (r.leases.size() + r.pins_in_flight + r.watches >= options_.max_pins_per_reader) {
        PeerPinned busy;
        busy.code = StatusCode::kBusy;
        node_->SendAm(ep, kPeerAnswerAm, EncodePeer(e.request, busy), /*reply=*/true);
        return;
      }
      ++r.pins_in_flight;
      const uint64_t reader = r.id;
      const uint64_t request = e.request;
      // The answer may come on another thread (a block read from NVMe), even after this server is gone: it
      // reaches the server through the gate only.
      source_.Pin(reader, pin->ns, pin->key, [gate = gate_, reader, request](PeerPinned pinned) {
        MutexLock lock(gate->mu);
        PeerServer* s = gate->server;
        if (s == nullptr) return;  // gone; the reader's connection ended with it
        if (s->node_->OnNodeThread()) return s->Pinned(reader, request, std::move(pinned));
        const uint64_t lease = pinned.lease;
        const bool ok = pinned.code == StatusCode::kOk && lease != 0;
        if (!s->node_->Post([s, reader, request, pinned = std::move(pinned)]() mutable {
              s->Pinned(reader, request, std::move(pinned));
            }) &&
            ok) {
          s->source_.Release(reader, std::span(&lease, 1));  // stopping: nobody will get it
        }
      });
      return;
    }
    case PeerMessage::kWatch: {
      auto watch = DecodeWatch(e.body);
      if (!watch.ok()) return malformed(watch.status());
      watches_made_.fetch_add(1, std::memory_order_relaxed);
      if (r.leases.size() + r.pins_in_flight + r.watches >= options_.max_pins_per_reader) {
        PeerPinned busy;
        busy.code = StatusCode::kBusy;
        node_->SendAm(ep, kPeerAnswerAm, EncodePeer(e.request, busy), /*reply=*/true);
        return;
      }
      ++r.watches;
      const auto wait = std::chrono::milliseconds(std::min<uint32_t>(watch->wait_ms, kMaxWatchMs));
      CheckWatch(watch->key, Watch{r.id, e.request, watch->ns, watch->have, std::chrono::steady_clock::now() + wait});
      return;
    }
    case PeerMessage::kRelease: {
      auto release = DecodeRelease(e.body);
      if (!release.ok()) return malformed(release.status());
      std::vector<uint64_t> held;
      for (uint64_t lease : release->leases) {
        if (r.leases.erase(lease) > 0) held.push_back(lease);
      }
      releases_.fetch_add(static_cast<int64_t>(held.size()), std::memory_order_relaxed);
      if (!held.empty()) source_.Release(r.id, held);
      return;
    }
    case PeerMessage::kTaken: {
      auto taken = DecodeTaken(e.body);
      if (!taken.ok()) return malformed(taken.status());
      taken_.fetch_add(static_cast<int64_t>(taken->keys.size()), std::memory_order_relaxed);
      freed_.fetch_add(static_cast<int64_t>(source_.Taken(r.id, taken->ns, taken->keys)), std::memory_order_relaxed);
      return;
    }
    default:
      return malformed(
          InvalidArgument("peer message of type " + std::to_string(static_cast<int>(e.type)) + " after the handshake"));
  }
}

void PeerServer::Pinned(uint64_t reader_id, uint64_t request, PeerPinned pinned) {
  Reader* reader = ReaderById(reader_id);
  if (reader == nullptr) {
    // It went away meanwhile (EndReader ran before this lease was granted).
    if (pinned.code == StatusCode::kOk && pinned.lease != 0) source_.Release(reader_id, std::span(&pinned.lease, 1));
    return;
  }
  --reader->pins_in_flight;
  if (pinned.code != StatusCode::kOk) {
    pin_misses_.fetch_add(1, std::memory_order_relaxed);
  } else if (pinned.lease != 0) {
    reader->leases.insert(pinned.lease);  // a block still being written has none
  }
  node_->SendAm(reader->ep, kPeerAnswerAm, EncodePeer(request, pinned), /*reply=*/true);
}

PeerServer::Reader* PeerServer::ReaderById(uint64_t id) {
  for (auto& [ep, r] : readers_) {
    if (r->id == id) return r.get();
  }
  return nullptr;
}

void PeerServer::CheckWatch(const BlockKey& key, Watch w) {
  source_.Pin(w.reader, w.ns, key, [gate = gate_, key, w](PeerPinned pinned) {
    MutexLock lock(gate->mu);
    PeerServer* s = gate->server;
    if (s == nullptr) return;
    if (s->node_->OnNodeThread()) return s->Watched(key, w, std::move(pinned));
    const uint64_t lease = pinned.lease;
    if (!s->node_->Post([s, key, w, pinned = std::move(pinned)]() mutable { s->Watched(key, w, std::move(pinned)); }) &&
        lease != 0) {
      s->source_.Release(w.reader, std::span(&lease, 1));
    }
  });
}

void PeerServer::Watched(const BlockKey& key, Watch w, PeerPinned pinned) {
  Reader* reader = ReaderById(w.reader);
  if (reader == nullptr) {
    if (pinned.code == StatusCode::kOk && pinned.lease != 0) source_.Release(w.reader, std::span(&pinned.lease, 1));
    return;
  }
  if (pinned.code == StatusCode::kOk && pinned.layers_ready <= w.have && pinned.layers_ready < pinned.layer_count &&
      std::chrono::steady_clock::now() < w.deadline) {
    // Not yet (a block still being written has no lease to hold meanwhile): LayersPublished checks again, or
    // ExpireWatches answers it.
    watches_[key].push_back(w);
    return;
  }
  --reader->watches;
  if (pinned.code == StatusCode::kOk && pinned.lease != 0) reader->leases.insert(pinned.lease);
  node_->SendAm(reader->ep, kPeerAnswerAm, EncodePeer(w.request, pinned), /*reply=*/true);
}

void PeerServer::DropSlowHandshakes() {
  const auto now = std::chrono::steady_clock::now();
  std::vector<ucp_ep_h> slow;
  for (const auto& [ep, r] : readers_) {
    if (!r->authenticated && now - r->accepted > kHandshakeTimeout) slow.push_back(ep);
  }
  for (ucp_ep_h ep : slow) {
    refused_.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("peer server: closing a reader that did not finish its handshake within {} s",
                 std::chrono::duration_cast<std::chrono::seconds>(kHandshakeTimeout).count());
    Drop(ep, /*force=*/true);
  }
}

void PeerServer::ExpireWatches() {
  const auto now = std::chrono::steady_clock::now();
  std::vector<std::pair<BlockKey, Watch>> due;
  for (auto it = watches_.begin(); it != watches_.end();) {
    auto& list = it->second;
    for (auto w = list.begin(); w != list.end();) {
      if (now >= w->deadline) {
        due.emplace_back(it->first, *w);
        w = list.erase(w);
      } else {
        ++w;
      }
    }
    it = list.empty() ? watches_.erase(it) : std::next(it);
  }
  for (auto& [key, w] : due) CheckWatch(key, w);  // answered as it is now
}

void PeerServer::LayersPublished(const BlockKey& key) {
  auto it = watches_.find(key);
  if (it == watches_.end()) return;
  std::vector<Watch> waiting = std::move(it->second);
  watches_.erase(it);
  for (const Watch& w : waiting) CheckWatch(key, w);
}

void PeerServer::VisitCounters(CounterVisitor& v) const {
  v.VisitGauge("peer_server.readers", reader_count_.load(std::memory_order_relaxed));
  v.Visit("peer_server.refused", refused_.load(std::memory_order_relaxed));
  v.Visit("peer_server.queries", queries_.load(std::memory_order_relaxed));
  v.Visit("peer_server.pins", pins_.load(std::memory_order_relaxed));
  v.Visit("peer_server.pin_misses", pin_misses_.load(std::memory_order_relaxed));
  v.Visit("peer_server.releases", releases_.load(std::memory_order_relaxed));
  v.Visit("peer_server.protocol_errors", protocol_errors_.load(std::memory_order_relaxed));
  v.Visit("peer_server.watches", watches_made_.load(std::memory_order_relaxed));
  v.Visit("peer_server.taken", taken_.load(std::memory_order_relaxed));
  v.Visit("peer_server.freed", freed_.load(std::memory_order_relaxed));
}

}  // namespace kvtier
