#include "tiers/peer/peer_tier.h"

#include <algorithm>
#include <unordered_set>

#include "common/checksum.h"
#include "common/logging.h"

namespace kvtier {

using SteadyClock = std::chrono::steady_clock;

struct PeerTier::Member {
  enum class State { kIdle, kHello, kProof, kReady };
  PeerAddress address;
  std::string identity;   // Identity(address): its name to `holders`
  bool followed = false;  // its events are followed (holders->Follow) for this connection
  ucp_ep_h ep = nullptr;
  State state = State::kIdle;
  uint64_t generation = 0;  // one per connection
  PeerNonce nonce{};
  uint64_t node = 0;
  std::unordered_map<uint32_t, std::pair<PeerRegion, ucp_rkey_h>> regions;
  SteadyClock::time_point next_attempt{};
  std::unordered_set<const ReadOp*> gets;  // in flight, each with its deadline
  // Reads in the order they came, each issued once its block is pinned:
  // a layer-wise load's order (layer 0 of every block first) is kept.
  std::deque<std::shared_ptr<ReadOp>> queued;
  // Blocks read whole since the last tick, told to the peer then (Taken).
  std::unordered_map<NamespaceFingerprint, std::vector<BlockKey>> taken;
  bool self = false;        // this node itself: never connected
  bool logged = false;      // its last failure was logged (once until it connects)
  bool discovered = false;  // from discovery, not `members`: dropped when it stops answering it
  bool retired = false;     // dropped by discovery: closed, not connected again (its slot may be reused)
  int absent = 0;           // discovery's answers in a row without it
};

namespace {

// A member discovery has not answered this many times in a row is dropped:
// a registry lost for a moment (a failover, a flush) is written again by
// every node within one interval, and drops nobody.
constexpr int kAbsentRoundsToDrop = 3;

// An address's identity: its resolved form (a name and its address are one member).
std::string Identity(const PeerAddress& a) { return FormatPeerAddress(reinterpret_cast<const sockaddr*>(&a.addr)); }

// A member's events endpoint ("tcp://HOST:PORT") as this node reaches it:
// a wildcard or loopback host ("*", "0.0.0.0", "[::]", "127.x.y.z",
// "localhost", "[::1]": the same on every node of a shared configuration,
// and never another node's) becomes the member's. Empty for an endpoint
// not on tcp (nothing another node could reach).
std::string EventsEndpointOf(const std::string& identity, const std::string& endpoint) {
  constexpr std::string_view kTcp = "tcp://";
  if (!endpoint.starts_with(kTcp)) return {};
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon < kTcp.size()) return {};
  const std::string host = endpoint.substr(kTcp.size(), colon - kTcp.size());
  const bool local = host == "*" || host == "0.0.0.0" || host == "[::]" || host == "::" || host == "localhost" ||
                     host == "[::1]" || host.starts_with("127.");
  if (!local) return endpoint;
  const size_t member_colon = identity.rfind(':');
  if (member_colon == std::string::npos) return {};
  return std::string(kTcp) + identity.substr(0, member_colon) + endpoint.substr(colon);
}

// The order among members of one class in a probe: the same first key
// asks the same members, different keys spread over them.
uint64_t ProbeRank(const BlockKey& first, const std::string& identity) {
  uint64_t x = std::hash<BlockKey>{}(first) ^ (std::hash<std::string>{}(identity)*0x9e3779b97f4a7c15ull);
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

// A request awaiting its answer.
struct PeerTier::Pending {
  size_t member = 0;
  uint64_t generation = 0;
  PeerMessage expects{};
  SteadyClock::time_point deadline{};
  // kFound: the probe it answers and its keys; kPinned: the key pinned
  // (or watched, `watch`: more layers of a block still being written).
  std::shared_ptr<ProbeWait> probe;
  bool watch = false;
  NamespaceFingerprint ns;
  std::vector<BlockKey> keys;
};

// A block pinned (or being pinned) on its peer for the reads of it.
struct PeerTier::PinState {
  uint64_t id = 0;  // unique per pin: a read names the pin it waits for, not just its key
  NamespaceFingerprint ns;
  BlockKey key;
  size_t member = 0;
  uint64_t generation = 0;
  bool pinned = false;
  bool watching = false;                 // a Watch for more layers is out
  SteadyClock::time_point progressed{};  // when its last layers came (a watch waits `timeout` from here)
  PeerPinned grant;                      // grant.layers_ready < layer_count: still being written on its peer
  uint32_t queued = 0;                   // reads of it in its member's queue
  uint32_t users = 0;                    // gets in flight or being verified
  SteadyClock::time_point idle_since{};
  std::vector<bool> verified;  // per layer: read and verified under this pin
  uint32_t verified_count = 0;
};

struct PeerTier::ReadOp {
  NamespaceFingerprint ns;
  BlockKey key;
  size_t member = 0;
  uint32_t first = 0;
  uint32_t last = 0;
  std::span<std::byte> dst;
  LayerReadDone done;
  SteadyClock::time_point deadline{};
  std::vector<uint64_t> expected;  // the layers' checksums, once pinned
  uint64_t layer_bytes = 0;
  bool issued = false;      // a get is in flight: only its completion ends the read
  uint64_t generation = 0;  // of the connection the get went on
  uint64_t pin = 0;         // PinState::id of the pin it reads under
};

struct PeerTier::ProbeWait {
  Mutex mu;
  CondVar cv;
  size_t remaining GUARDED_BY(mu) = 0;
  NamespaceFingerprint ns;
  std::vector<BlockKey> keys;
};

PeerTier::PeerTier(const PeerTierOptions& options) : options_(options) {}

Result<std::unique_ptr<PeerTier>> PeerTier::Open(const PeerTierOptions& options) {
  if (options.secret.empty()) return InvalidArgument("peer tier: no cluster secret");
  std::unique_ptr<PeerTier> tier(new PeerTier(options));
  for (const std::string& member : options.members) {
    auto address = ParsePeerAddress(member);
    if (!address.ok()) return InvalidArgument("peer.members: " + address.status().message());
    tier->addresses_.push_back(*address);
  }
  auto node = UcxNode::Start({.name = "peer-rd"});
  if (!node.ok()) return node.status();
  tier->node_ = std::move(*node);
  tier->completions_ = std::make_unique<WorkerPool>(1);
  PeerTier* t = tier.get();
  Status started = Status::Ok();
  t->node_->Run([&] {
    started = t->node_->OnAm(kPeerAnswerAm, [t](ucp_ep_h from, std::span<const std::byte> m) { t->OnAnswer(from, m); });
    for (const PeerAddress& a : t->addresses_) {
      auto m = std::make_unique<Member>();
      m->address = a;
      m->identity = Identity(a);
      t->members_.push_back(std::move(m));
    }
    t->members_now_.store(static_cast<int64_t>(t->members_.size()), std::memory_order_relaxed);
    t->node_->SetTick([t] { t->Tick(); });
    t->node_->SetOnStop([t] {
      for (auto& m : t->members_) t->SendTaken(*m);
      t->ReleaseIdle(/*all=*/true);
      for (size_t i = 0; i < t->members_.size(); ++i) {
        if (t->members_[i]->ep != nullptr) t->Fail(i, "stopping", /*stalled=*/false);
      }
    });
  });
  if (!started.ok()) return Status(started.code(), "peer tier: " + started.message());
  if (options.discover) t->discover_thread_ = std::thread([t] { t->DiscoverLoop(); });
  return tier;
}

PeerTier::~PeerTier() {
  if (discover_thread_.joinable()) {
    {
      MutexLock lock(discover_mu_);
      closing_ = true;
      discover_cv_.NotifyAll();
    }
    discover_thread_.join();
    if (options_.leave) options_.leave();
  }
  if (node_ != nullptr) node_->Stop();  // fails what is in flight, closes every endpoint
  completions_.reset();                 // runs the completions queued (a Read from one is Cancelled)
  node_.reset();
  completions_.reset();  // runs the completions queued
}

// ---- Known blocks (any thread) ----

std::optional<PeerTier::Known> PeerTier::Lookup(const BlockKey& key) const {
  MutexLock lock(known_mu_);
  auto it = known_.find(key);
  if (it == known_.end() || SteadyClock::now() - it->second.learned > options_.known_for) return std::nullopt;
  return it->second;
}

std::optional<BlockTier::BlockInfo> PeerTier::Find(const BlockKey& key) const {
  auto known = Lookup(key);
  if (!known) return std::nullopt;
  return known->info;
}

void PeerTier::Learn(size_t member, uint64_t generation, const NamespaceFingerprint& ns, std::span<const BlockKey> keys,
                     const std::vector<PeerHeld>& held) {
  const auto now = SteadyClock::now();
  MutexLock lock(known_mu_);
  for (size_t i = 0; i < keys.size() && i < held.size(); ++i) {
    if (!held[i].held || held[i].layer_count == 0 || held[i].payload_bytes % held[i].layer_count != 0) continue;
    probe_hits_.fetch_add(1, std::memory_order_relaxed);
    auto [it, added] = known_.try_emplace(keys[i]);
    if (!added && it->second.member != member && now - it->second.learned <= options_.known_for) continue;
    it->second =
        Known{member, generation, {ns, held[i].payload_bytes, held[i].layer_count, held[i].payload_checksum}, now};
    if (added) known_order_.push_back(keys[i]);
  }
  while (known_.size() > options_.max_known && !known_order_.empty()) {
    known_.erase(known_order_.front());
    known_order_.pop_front();
  }
  // known_order_ keeps keys forgotten meanwhile; trim them when it outgrows the map.
  if (known_order_.size() > 2 * known_.size() + 1024) {
    std::deque<BlockKey> kept;
    for (const BlockKey& k : known_order_) {
      if (known_.contains(k)) kept.push_back(k);
    }
    known_order_.swap(kept);
  }
}

void PeerTier::ForgetMember(size_t member) {
  MutexLock lock(known_mu_);
  std::erase_if(known_, [member](const auto& entry) { return entry.second.member == member; });
}

void PeerTier::Forget(const BlockKey& key) {
  MutexLock lock(known_mu_);
  known_.erase(key);
}

Status PeerTier::Erase(const BlockKey& key) {
  Forget(key);  // an erase here must not be read from a peer again; the peer's copy is the peer's
  return NotFound("peer tier: stores nothing of this node's");
}

Status PeerTier::Write(const NamespaceFingerprint&, const BlockKey&, uint32_t, std::span<const std::byte>, WriteDone,
                       std::optional<uint64_t>) {
  return Status(StatusCode::kUnimplemented, "the peer tier is read-only: peers keep their own blocks");
}

// ---- Probes ----

void PeerTier::Probe(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  if (keys.empty() || members_now_.load(std::memory_order_relaxed) == 0) return;
  auto wait = std::make_shared<ProbeWait>();
  wait->ns = ns;
  wait->keys.assign(keys.begin(), keys.begin() + std::min<size_t>(keys.size(), kMaxPeerQueryKeys));
  {
    MutexLock lock(wait->mu);
    wait->remaining = 1;  // QueryMembers sets the real count
  }
  probes_.fetch_add(1, std::memory_order_relaxed);
  probed_keys_.fetch_add(static_cast<int64_t>(wait->keys.size()), std::memory_order_relaxed);
  if (!node_->Post([this, wait] { QueryMembers(wait); })) return;
  const auto deadline = SteadyClock::now() + options_.probe_timeout;
  MutexLock lock(wait->mu);
  while (wait->remaining > 0) {
    if (!wait->cv.WaitUntil(wait->mu, deadline)) break;
  }
}

std::vector<size_t> PeerTier::ProbeOrder(std::span<const BlockKey> keys) const {
  struct Candidate {
    size_t member = 0;
    int rank_class = 0;  // 0: holds some of the keys; 1: nothing known; 2: known not to hold the first
    size_t leading = 0;
    uint64_t rank = 0;
  };
  std::vector<Candidate> candidates;
  bool one_holds_all = false;
  for (size_t i = 0; i < members_.size(); ++i) {
    const Member& m = *members_[i];
    if (m.state != Member::State::kReady) continue;
    Candidate c{i, 1, 0, ProbeRank(keys.front(), m.identity)};
    if (m.followed) {
      if (auto leading = options_.holders->Leading(m.identity, keys)) {
        c.leading = *leading;
        c.rank_class = *leading > 0 ? 0 : 2;
        one_holds_all = one_holds_all || *leading == keys.size();
      }
    }
    candidates.push_back(c);
  }
  if (one_holds_all) std::erase_if(candidates, [](const Candidate& c) { return c.rank_class != 0; });
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    if (a.rank_class != b.rank_class) return a.rank_class < b.rank_class;
    if (a.leading != b.leading) return a.leading > b.leading;
    return a.rank < b.rank;
  });
  std::vector<size_t> order;
  for (size_t i = 0; i < candidates.size() && i < std::max<size_t>(options_.probe_fanout, 1); ++i) {
    order.push_back(candidates[i].member);
  }
  return order;
}

void PeerTier::QueryMembers(std::shared_ptr<ProbeWait> wait) {
  size_t asked = 0;
  const auto deadline = SteadyClock::now() + options_.timeout;
  for (size_t i : ProbeOrder(wait->keys)) {
    Member& m = *members_[i];
    const uint64_t request = Expect(i, PeerMessage::kFound, deadline);
    pending_[request].probe = wait;
    Send(m, request, EncodePeer(request, PeerQuery{wait->ns, wait->keys}));
    ++asked;
  }
  probe_asks_.fetch_add(static_cast<int64_t>(asked), std::memory_order_relaxed);
  MutexLock lock(wait->mu);
  wait->remaining = asked;
  if (asked == 0) wait->cv.NotifyAll();
}

// ---- Reads ----

Status PeerTier::Read(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
                      ReadDone done) {
  return ReadWithLayerChecksums(key, first_layer, last_layer, dst, [done = std::move(done)](Result<LayerRead> read) {
    if (!read.ok()) return done(read.status());
    done(read->bytes);
  });
}

Status PeerTier::ReadWithLayerChecksums(const BlockKey& key, uint32_t first_layer, uint32_t last_layer,
                                        std::span<std::byte> dst, LayerReadDone done) {
  auto known = Lookup(key);
  if (!known) return NotFound("peer tier: no peer is known to hold the block");
  const BlockInfo& info = known->info;
  if (first_layer == 0 && last_layer == 0) last_layer = info.layer_count;
  if (first_layer >= last_layer || last_layer > info.layer_count) {
    return InvalidArgument("peer tier: layers [" + std::to_string(first_layer) + ", " + std::to_string(last_layer) +
                           ") of a block of " + std::to_string(info.layer_count));
  }
  auto op = std::make_shared<ReadOp>();
  op->ns = info.ns;
  op->key = key;
  op->member = known->member;
  op->first = first_layer;
  op->last = last_layer;
  op->layer_bytes = info.payload_bytes / info.layer_count;
  if (dst.size() < op->layer_bytes * (last_layer - first_layer)) return InvalidArgument("peer tier: buffer too small");
  op->dst = dst.first(op->layer_bytes * (last_layer - first_layer));
  op->done = std::move(done);
  op->deadline = SteadyClock::now() + options_.timeout;
  reads_.fetch_add(1, std::memory_order_relaxed);
  if (!node_->Post([this, op] { StartRead(op); })) return Status(StatusCode::kCancelled, "peer tier: stopping");
  return Status::Ok();
}

void PeerTier::StartRead(std::shared_ptr<ReadOp> op) {
  Member& m = *members_[op->member];
  if (m.state != Member::State::kReady) return Finish(op, IoError("peer tier: its peer is not connected"));
  auto it = pins_.find(op->key);
  if (it != pins_.end() && (it->second->member != op->member || it->second->generation != m.generation)) {
    return Finish(op, IoError("peer tier: pinned on another connection"));
  }
  if (it == pins_.end()) {
    auto pin = std::make_unique<PinState>();
    pin->id = ++next_pin_;
    pin->ns = op->ns;
    pin->key = op->key;
    pin->member = op->member;
    pin->generation = m.generation;
    it = pins_.emplace(op->key, std::move(pin)).first;
    const uint64_t request = Expect(op->member, PeerMessage::kPinned, SteadyClock::now() + options_.timeout, {op->key});
    pins_made_.fetch_add(1, std::memory_order_relaxed);
    Send(m, request, EncodePeer(request, PeerPin{op->ns, op->key}));
  }
  ++it->second->queued;
  op->pin = it->second->id;
  m.queued.push_back(std::move(op));
  IssueQueued(it->second->member);
}

void PeerTier::IssueQueued(size_t member) {
  Member& m = *members_[member];
  while (!m.queued.empty()) {
    auto it = pins_.find(m.queued.front()->key);
    // The pin this read waited for is gone (failed, or its block forgotten): the read fails.
    const bool its_pin = it != pins_.end() && it->second->id == m.queued.front()->pin;
    if (its_pin && !it->second->pinned) return;  // the head waits for its pin; the rest behind it
    if (its_pin && m.queued.front()->last > it->second->grant.layers_ready) {
      // Its layers are still being written on the peer: watch for them.
      if (!it->second->watching) Watch(*it->second);
      return;
    }
    std::shared_ptr<ReadOp> op = std::move(m.queued.front());
    m.queued.pop_front();
    if (!its_pin) {
      Finish(op, IoError("peer tier: the block's pin failed"));
      continue;
    }
    --it->second->queued;
    IssueGet(*it->second, std::move(op));
  }
}

void PeerTier::Pinned(const BlockKey& key, Result<PeerPinned> pinned) {
  auto it = pins_.find(key);
  if (it == pins_.end()) return;
  PinState& pin = *it->second;
  const size_t member = pin.member;
  Status failed = Status::Ok();
  if (!pinned.ok()) {
    failed = pinned.status();
  } else if (pinned->code != StatusCode::kOk) {
    failed =
        IoError("peer tier: the peer did not pin the block (" + std::to_string(static_cast<int>(pinned->code)) + ")");
  } else if (auto known = Lookup(key); known && (pinned->payload_bytes != known->info.payload_bytes ||
                                                 pinned->layer_count != known->info.layer_count)) {
    failed = IoError("peer tier: the peer pinned a block of another shape than it reported");
  } else if (!members_[member]->regions.contains(pinned->region) ||
             pinned->offset > members_[member]->regions[pinned->region].first.bytes ||
             pinned->payload_bytes > members_[member]->regions[pinned->region].first.bytes - pinned->offset) {
    failed = IoError("peer tier: the peer pinned the block outside its regions");
  }
  if (!failed.ok()) {
    if (pinned.ok() && pinned->code == StatusCode::kOk && pinned->lease != 0) {
      Send(*members_[member], NextRequest(), EncodePeer(0, PeerRelease{{pinned->lease}}));
    }
    if (!pinned.ok() || pinned->code != StatusCode::kBusy) Forget(key);
    pins_.erase(it);  // its queued reads fail as they reach the head
    IssueQueued(member);
    return;
  }
  pin.pinned = true;
  pin.grant = std::move(*pinned);
  pin.idle_since = SteadyClock::now();
  pin.progressed = pin.idle_since;
  IssueQueued(member);
}

void PeerTier::Watch(PinState& pin) {
  Member& m = *members_[pin.member];
  const uint64_t request =
      Expect(pin.member, PeerMessage::kPinned, std::max(pin.progressed, SteadyClock::now()) + options_.timeout,
             {pin.key}, /*watch=*/true);
  pin.watching = true;
  watches_.fetch_add(1, std::memory_order_relaxed);
  Send(m, request,
       // The peer answers by twice the timeout at the latest, so its watch ends after ours.
       EncodePeer(request, PeerWatch{pin.ns, pin.key, pin.grant.layers_ready,
                                     static_cast<uint32_t>(2 * options_.timeout.count())}));
}

void PeerTier::Watched(const BlockKey& key, Result<PeerPinned> update) {
  auto it = pins_.find(key);
  if (it == pins_.end()) return;
  PinState& pin = *it->second;
  const size_t member = pin.member;
  pin.watching = false;
  const bool same_block = update.ok() && update->code == StatusCode::kOk &&
                          update->payload_bytes == pin.grant.payload_bytes &&
                          update->layer_count == pin.grant.layer_count && update->offset == pin.grant.offset &&
                          update->region == pin.grant.region && update->layers_ready >= pin.grant.layers_ready;
  if (!same_block) {
    if (update.ok() && update->code == StatusCode::kOk && update->lease != 0) {
      Send(*members_[member], NextRequest(), EncodePeer(0, PeerRelease{{update->lease}}));
    }
    Forget(key);
    pins_.erase(it);  // its queued reads fail as they reach the head
    return IssueQueued(member);
  }
  const uint64_t old_lease = pin.grant.lease;
  if (update->layers_ready > pin.grant.layers_ready) pin.progressed = SteadyClock::now();
  pin.grant = std::move(*update);
  if (pin.grant.lease == 0) pin.grant.lease = old_lease;
  IssueQueued(member);
}

void PeerTier::IssueGet(PinState& pin, std::shared_ptr<ReadOp> op) {
  Member& m = *members_[pin.member];
  // The grant's shape decides, not the probe's: a read that does not fit it fails.
  if (pin.grant.layer_count == 0 || op->last > pin.grant.layer_count || op->last > pin.grant.layers_ready ||
      pin.grant.payload_bytes / pin.grant.layer_count != op->layer_bytes) {
    return Finish(op, IoError("peer tier: the read does not fit the block its peer pinned"));
  }
  const auto& region = m.regions[pin.grant.region];
  op->expected.assign(pin.grant.layer_checksums.begin() + op->first, pin.grant.layer_checksums.begin() + op->last);
  const uint64_t remote = region.first.base + pin.grant.offset + op->first * op->layer_bytes;
  struct GetContext {
    PeerTier* tier;
    std::shared_ptr<ReadOp> op;
  };
  auto* context = new GetContext{this, op};
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = [](void* request, ucs_status_t status, void* user_data) {
    std::unique_ptr<GetContext> c(static_cast<GetContext*>(user_data));
    c->tier->GetDone(std::move(c->op), status);
    ucp_request_free(request);
  };
  param.user_data = context;
  ++pin.users;
  m.gets.insert(op.get());
  op->issued = true;
  op->generation = pin.generation;
  op->deadline = SteadyClock::now() + options_.timeout;
  ucs_status_ptr_t r = ucp_get_nbx(m.ep, op->dst.data(), op->dst.size(), remote, region.second, &param);
  if (r == nullptr || UCS_PTR_IS_ERR(r)) {
    std::unique_ptr<GetContext> c(context);
    GetDone(std::move(c->op), r == nullptr ? UCS_OK : UCS_PTR_STATUS(r));
  }
}

void PeerTier::GetDone(std::shared_ptr<ReadOp> op, ucs_status_t status) {
  Member& m = *members_[op->member];
  m.gets.erase(op.get());
  if (status != UCS_OK) {
    Verified(op->key, op->pin, op->first, op->first);  // the pin's use ends, nothing verified
    return Finish(op, IoError(std::string("peer tier: get from ") + m.address.text + ": " + ucs_status_string(status)));
  }
  // Verify off the UCX thread: one pass over the bytes. The pin stays in
  // use until the outcome is back on the node thread (Verified).
  completions_->Post([this, op] {
    LayerRead read;
    read.bytes = op->dst.size();
    for (uint32_t i = 0; i < op->last - op->first; ++i) {
      const uint64_t sum = BlockChecksum(op->dst.subspan(i * op->layer_bytes, op->layer_bytes));
      if (sum != op->expected[i]) {
        corrupt_.fetch_add(1, std::memory_order_relaxed);
        read_failures_.fetch_add(1, std::memory_order_relaxed);
        Forget(op->key);
        node_->Post([this, key = op->key, pin = op->pin, first = op->first] { Verified(key, pin, first, first); });
        return op->done(IoError("peer tier: layer " + std::to_string(op->first + i) +
                                " does not match the checksum its peer recorded"));
      }
      read.layer_checksums.push_back(sum);
    }
    read_bytes_.fetch_add(static_cast<int64_t>(read.bytes), std::memory_order_relaxed);
    node_->Post(
        [this, key = op->key, pin = op->pin, first = op->first, last = op->last] { Verified(key, pin, first, last); });
    op->done(std::move(read));
  });
}

void PeerTier::Verified(const BlockKey& key, uint64_t pin_id, uint32_t first, uint32_t last) {
  auto it = pins_.find(key);
  if (it == pins_.end() || it->second->id != pin_id) return;
  PinState& pin = *it->second;
  if (pin.users > 0 && --pin.users == 0) pin.idle_since = SteadyClock::now();
  const uint32_t layers = pin.grant.layer_count;
  if (layers == 0 || pin.verified_count == layers) return;
  pin.verified.resize(layers);
  for (uint32_t l = first; l < last && l < layers; ++l) {
    if (!pin.verified[l]) {
      pin.verified[l] = true;
      ++pin.verified_count;
    }
  }
  if (pin.verified_count == layers) members_[pin.member]->taken[pin.ns].push_back(key);
}

void PeerTier::SendTaken(Member& m) {
  if (m.taken.empty()) return;
  if (m.state == Member::State::kReady) {
    for (auto& [ns, keys] : m.taken) {
      for (size_t at = 0; at < keys.size(); at += kMaxPeerQueryKeys) {
        const size_t n = std::min<size_t>(kMaxPeerQueryKeys, keys.size() - at);
        taken_sent_.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
        Send(m, NextRequest(), EncodePeer(0, PeerTaken{ns, {keys.begin() + at, keys.begin() + at + n}}));
      }
    }
  }
  m.taken.clear();
}

void PeerTier::Finish(std::shared_ptr<ReadOp> op, Result<LayerRead> result) {
  if (!result.ok()) read_failures_.fetch_add(1, std::memory_order_relaxed);
  completions_->Post([op, result = std::move(result)]() mutable { op->done(std::move(result)); });
}

void PeerTier::ReleaseIdle(bool all) {
  const auto now = SteadyClock::now();
  std::unordered_map<size_t, std::vector<uint64_t>> leases;
  for (auto it = pins_.begin(); it != pins_.end();) {
    PinState& pin = *it->second;
    if (pin.pinned && pin.users == 0 && pin.queued == 0 && !pin.watching &&
        (all || now - pin.idle_since >= options_.linger)) {
      if (members_[pin.member]->generation == pin.generation && pin.grant.lease != 0) {
        leases[pin.member].push_back(pin.grant.lease);
      }
      it = pins_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& [member, list] : leases) {
    Member& m = *members_[member];
    if (m.state == Member::State::kReady) Send(m, NextRequest(), EncodePeer(0, PeerRelease{std::move(list)}));
  }
}

// ---- Connections ----

uint64_t PeerTier::Expect(size_t member, PeerMessage expects, SteadyClock::time_point deadline,
                          std::vector<BlockKey> keys, bool watch) {
  const uint64_t request = NextRequest();
  Pending p;
  p.member = member;
  p.generation = members_[member]->generation;
  p.expects = expects;
  p.deadline = deadline;
  p.keys = std::move(keys);
  p.watch = watch;
  pending_.emplace(request, std::move(p));
  return request;
}

void PeerTier::Send(Member& m, uint64_t, std::vector<std::byte> message) {
  node_->SendAm(m.ep, kPeerRequestAm, std::move(message), /*reply=*/true);
}

void PeerTier::Tick() {
  const auto now = SteadyClock::now();
  for (size_t i = 0; i < members_.size(); ++i) {
    Member& m = *members_[i];
    if (!m.self && !m.retired && m.ep == nullptr && now >= m.next_attempt) Connect(i);
  }
  // A watch past its deadline: that block's layers did not come (its
  // writer stalls, not the peer): its reads fail.
  std::vector<BlockKey> unwatched;
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second.watch && now >= it->second.deadline) {
      if (members_[it->second.member]->generation == it->second.generation) unwatched.push_back(it->second.keys[0]);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  for (const BlockKey& key : unwatched) {
    watch_timeouts_.fetch_add(1, std::memory_order_relaxed);
    Watched(key, IoError("peer tier: no more layers of the block within peer.timeout_ms"));
  }
  // A request or a get past its deadline: that peer stalls.
  std::vector<size_t> stalled;
  for (const auto& [request, p] : pending_) {
    if (!p.watch && now >= p.deadline && members_[p.member]->generation == p.generation) stalled.push_back(p.member);
  }
  for (size_t i = 0; i < members_.size(); ++i) {
    for (const ReadOp* op : members_[i]->gets) {
      if (now >= op->deadline) {
        stalled.push_back(i);
        break;
      }
    }
  }
  std::sort(stalled.begin(), stalled.end());
  stalled.erase(std::unique(stalled.begin(), stalled.end()), stalled.end());
  for (size_t i : stalled) {
    if (members_[i]->ep != nullptr) Fail(i, "no answer within peer.timeout_ms", /*stalled=*/true);
  }
  // Requests of connections that are gone.
  for (auto it = pending_.begin(); it != pending_.end();) {
    // (A watch past its deadline is the first loop's, next tick: it fails its block's reads.)
    if (members_[it->second.member]->generation != it->second.generation ||
        (!it->second.watch && now >= it->second.deadline)) {
      Pending p = std::move(it->second);
      it = pending_.erase(it);
      if (p.probe) {
        MutexLock lock(p.probe->mu);
        if (p.probe->remaining > 0 && --p.probe->remaining == 0) p.probe->cv.NotifyAll();
      }
    } else {
      ++it;
    }
  }
  ReleaseIdle(/*all=*/false);
  for (auto& m : members_) SendTaken(*m);
}

void PeerTier::Connect(size_t i) {
  Member& m = *members_[i];
  auto nonce = FreshNonce();
  if (!nonce.ok()) return;
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&m.address.addr);
  params.sockaddr.addrlen = m.address.length;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = [](void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* t = static_cast<PeerTier*>(arg);
    for (size_t j = 0; j < t->members_.size(); ++j) {
      if (t->members_[j]->ep == ep) {
        t->Fail(j, std::string("connection failed: ") + ucs_status_string(status), /*stalled=*/false);
      }
    }
  };
  params.err_handler.arg = this;
  m.next_attempt = SteadyClock::now() + options_.retry;
  if (ucs_status_t s = ucp_ep_create(node_->worker(), &params, &m.ep); s != UCS_OK) {
    m.ep = nullptr;
    if (!m.logged) spdlog::warn("peer {}: cannot connect: {}", m.address.text, ucs_status_string(s));
    m.logged = true;
    return;
  }
  ++m.generation;
  m.nonce = *nonce;
  m.state = Member::State::kHello;
  const uint64_t request = Expect(i, PeerMessage::kChallenge, SteadyClock::now() + options_.timeout);
  Send(m, request, EncodePeer(request, PeerHello{options_.node_id, m.nonce}));
}

void PeerTier::Fail(size_t i, const std::string& why, bool stalled) {
  Member& m = *members_[i];
  if (m.ep == nullptr) return;
  if (stalled) stalls_.fetch_add(1, std::memory_order_relaxed);
  if (m.state == Member::State::kReady) {
    disconnects_.fetch_add(1, std::memory_order_relaxed);
    connected_.fetch_sub(1, std::memory_order_relaxed);
    // A retired member (dropped by discovery) is never tried again.
    const std::string then = m.retired ? "" : ", retrying in " + std::to_string(options_.retry.count()) + " ms";
    spdlog::warn("peer {}: {}; its blocks are forgotten{}", m.address.text, why, then);
  } else if (!m.logged && !m.retired) {
    spdlog::warn("peer {}: {}; retrying every {} ms", m.address.text, why, options_.retry.count());
  }
  m.logged = true;
  if (m.followed) {
    options_.holders->Unfollow(m.identity);
    m.followed = false;
  }
  const ucp_ep_h ep = m.ep;
  m.ep = nullptr;
  m.state = Member::State::kIdle;
  ++m.generation;  // answers of the old connection are ignored
  m.next_attempt = SteadyClock::now() + options_.retry;
  ForgetMember(i);
  // Reads waiting for a pin of this peer fail now; those with a get in
  // flight fail when UCX ends the get (closing below).
  std::erase_if(pins_, [i](const auto& entry) { return entry.second->member == i; });
  for (auto& op : m.queued) Finish(op, IoError("peer tier: " + m.address.text + ": " + why));
  m.queued.clear();
  m.taken.clear();  // never told: the peer keeps those blocks
  m.gets.clear();   // UCX ends them as the endpoint closes; they no longer count towards a stall
  // A forced close ends the gets in flight (their callbacks run, with an
  // error) before the keys they used go.
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t closing = ucp_ep_close_nbx(ep, &param);
  if (closing != nullptr && !UCS_PTR_IS_ERR(closing)) ucp_request_free(closing);
  for (auto& [id, region] : m.regions) ucp_rkey_destroy(region.second);
  m.regions.clear();
}

void PeerTier::OnAnswer(ucp_ep_h from, std::span<const std::byte> message) {
  auto envelope = OpenPeer(message);
  if (!envelope.ok()) return;  // nothing to match it to
  auto it = pending_.find(envelope->request);
  if (it == pending_.end()) return;  // past its deadline, or of a connection gone
  // Only the member it was asked of answers it (another one's answer does not consume it).
  if (from == nullptr || from != members_[it->second.member]->ep) return;
  Pending p = std::move(it->second);
  pending_.erase(it);
  Member& m = *members_[p.member];
  if (m.generation != p.generation) return;
  auto done_probe = [&] {
    if (!p.probe) return;
    MutexLock lock(p.probe->mu);
    if (p.probe->remaining > 0 && --p.probe->remaining == 0) p.probe->cv.NotifyAll();
  };
  if (envelope->type == PeerMessage::kRefused) {
    auto refused = DecodeRefused(envelope->body);
    const std::string why = refused.ok() ? refused->message : "refused";
    if (m.state != Member::State::kReady) refused_.fetch_add(1, std::memory_order_relaxed);
    if (p.expects == PeerMessage::kPinned && !p.keys.empty()) {
      if (p.watch) {
        Watched(p.keys[0], IoError("peer refused: " + why));
      } else {
        Pinned(p.keys[0], IoError("peer refused: " + why));
      }
    }
    done_probe();
    Fail(p.member, "refused: " + why, /*stalled=*/false);
    return;
  }
  if (envelope->type != p.expects) {
    done_probe();
    Fail(p.member, "answered out of turn", /*stalled=*/false);
    return;
  }
  switch (envelope->type) {
    case PeerMessage::kChallenge:
    case PeerMessage::kWelcome:
      return OnHandshake(m, *envelope);
    case PeerMessage::kFound: {
      auto found = DecodeFound(envelope->body);
      if (found.ok()) Learn(p.member, p.generation, p.probe->ns, p.probe->keys, found->keys);
      done_probe();
      return;
    }
    case PeerMessage::kPinned: {
      auto pinned = DecodePinned(envelope->body);
      Result<PeerPinned> answer =
          pinned.ok() ? Result<PeerPinned>(std::move(*pinned)) : Result<PeerPinned>(pinned.status());
      if (p.watch) return Watched(p.keys[0], std::move(answer));
      Pinned(p.keys[0], std::move(answer));
      return;
    }
    default:
      return;
  }
}

void PeerTier::OnHandshake(Member& m, const PeerEnvelope& e) {
  const size_t index = static_cast<size_t>(
      std::find_if(members_.begin(), members_.end(), [&](const auto& p) { return p.get() == &m; }) - members_.begin());
  const auto secret = std::as_bytes(std::span(options_.secret));
  if (e.type == PeerMessage::kChallenge && m.state == Member::State::kHello) {
    auto challenge = DecodeChallenge(e.body);
    if (!challenge.ok()) return Fail(index, challenge.status().message(), false);
    if (challenge->node == options_.node_id) {
      m.self = true;  // this node's own server: never again
      members_now_.fetch_sub(1, std::memory_order_relaxed);
      return Fail(index, "this node itself", false);
    }
    if (!SameProof(challenge->proof, ServerProof(secret, m.nonce, challenge->nonce))) {
      refused_.fetch_add(1, std::memory_order_relaxed);
      return Fail(index, "it does not prove the cluster secret (remote.key_file differs?)", false);
    }
    m.node = challenge->node;
    m.state = Member::State::kProof;
    const uint64_t request = Expect(index, PeerMessage::kWelcome, SteadyClock::now() + options_.timeout);
    Send(m, request, EncodePeer(request, ReaderProof(secret, challenge->nonce, m.nonce)));
    return;
  }
  if (e.type == PeerMessage::kWelcome && m.state == Member::State::kProof) {
    auto welcome = DecodeWelcome(e.body);
    if (!welcome.ok()) return Fail(index, welcome.status().message(), false);
    for (PeerRegion& region : welcome->regions) {
      ucp_rkey_h rkey = nullptr;
      if (ucs_status_t s = ucp_ep_rkey_unpack(m.ep, region.rkey.data(), &rkey); s != UCS_OK) {
        return Fail(index, std::string("its region key does not unpack: ") + ucs_status_string(s), false);
      }
      const uint32_t id = region.id;
      m.regions[id] = {std::move(region), rkey};
    }
    m.state = Member::State::kReady;
    m.logged = false;
    const std::string events = EventsEndpointOf(m.identity, welcome->events_endpoint);
    const std::string replay = EventsEndpointOf(m.identity, welcome->events_replay_endpoint);
    if (options_.holders && !events.empty() && !replay.empty()) {
      options_.holders->Follow(m.identity, events, replay);
      m.followed = true;
    }
    connected_.fetch_add(1, std::memory_order_relaxed);
    spdlog::info("peer {}: connected ({} regions)", m.address.text, m.regions.size());
  }
}

void PeerTier::VisitCounters(CounterVisitor& v) const {
  v.VisitGauge("peer.connected", connected_.load(std::memory_order_relaxed));
  v.Visit("peer.probes", probes_.load(std::memory_order_relaxed));
  v.Visit("peer.probe_asks", probe_asks_.load(std::memory_order_relaxed));
  v.Visit("peer.probed_keys", probed_keys_.load(std::memory_order_relaxed));
  v.Visit("peer.probe_hits", probe_hits_.load(std::memory_order_relaxed));
  v.Visit("peer.reads", reads_.load(std::memory_order_relaxed));
  v.Visit("peer.read_bytes", read_bytes_.load(std::memory_order_relaxed));
  v.Visit("peer.read_failures", read_failures_.load(std::memory_order_relaxed));
  v.Visit("peer.corrupt", corrupt_.load(std::memory_order_relaxed));
  v.Visit("peer.pins", pins_made_.load(std::memory_order_relaxed));
  v.Visit("peer.stalls", stalls_.load(std::memory_order_relaxed));
  v.Visit("peer.disconnects", disconnects_.load(std::memory_order_relaxed));
  v.Visit("peer.refused", refused_.load(std::memory_order_relaxed));
  v.Visit("peer.watches", watches_.load(std::memory_order_relaxed));
  v.Visit("peer.watch_timeouts", watch_timeouts_.load(std::memory_order_relaxed));
  v.Visit("peer.taken", taken_sent_.load(std::memory_order_relaxed));
  v.VisitGauge("peer.members", members_now_.load(std::memory_order_relaxed));
  v.Visit("peer.discoveries", discoveries_.load(std::memory_order_relaxed));
  v.Visit("peer.discovery_failures", discovery_failures_.load(std::memory_order_relaxed));
  if (options_.holders) options_.holders->VisitCounters(v);
}

// ---- Discovery ----

void PeerTier::DiscoverLoop() {
  bool failing = false;
  std::unordered_set<std::string> logged_bad;  // addresses that did not parse, each logged once
  for (;;) {
    auto found = options_.discover();
    if (found.ok()) {
      discoveries_.fetch_add(1, std::memory_order_relaxed);
      if (failing) spdlog::info("peer tier: discovery answers again");
      failing = false;
      // Resolved here, not on the node thread (a name's lookup may block).
      std::vector<PeerAddress> addresses;
      for (const std::string& text : *found) {
        auto address = ParsePeerAddress(text);
        if (address.ok()) {
          addresses.push_back(std::move(*address));
        } else if (!logged_bad.contains(text) && logged_bad.size() < 64) {
          logged_bad.insert(text);
          spdlog::warn("peer tier: discovery named {}, which is no peer address: {}", text, address.status().message());
        }
      }
      node_->Post([this, list = std::move(addresses)] { Discovered(list); });
    } else {
      discovery_failures_.fetch_add(1, std::memory_order_relaxed);
      if (!failing) {
        spdlog::warn("peer tier: discovery failed ({}); the members known stay, asking again every {} ms",
                     found.status().ToString(), options_.discover_interval.count());
      }
      failing = true;
    }
    MutexLock lock(discover_mu_);
    const auto until = SteadyClock::now() + options_.discover_interval;
    while (!closing_ && discover_cv_.WaitUntil(discover_mu_, until)) {
    }
    if (closing_) return;
  }
}

void PeerTier::Discovered(const std::vector<PeerAddress>& found) {
  std::unordered_map<std::string, PeerAddress> wanted;
  for (const PeerAddress& address : found) wanted.emplace(Identity(address), address);
  std::vector<size_t> free_slots;
  for (size_t i = 0; i < members_.size(); ++i) {
    Member& m = *members_[i];
    // A configured member, or one known already, is not added twice.
    const bool still = !m.retired && wanted.erase(Identity(m.address)) > 0;
    if (!m.discovered) continue;
    if (m.retired) {
      free_slots.push_back(i);
    } else if (still) {
      m.absent = 0;
    } else if (++m.absent >= kAbsentRoundsToDrop) {
      m.retired = true;  // before Fail: never retried
      Fail(i, "no longer in the cluster's registry", /*stalled=*/false);
      ForgetMember(i);
      spdlog::info("peer {}: dropped (no longer in the cluster's registry)", m.address.text);
    }
  }
  for (auto& [identity, address] : wanted) {
    size_t slot = members_.size();
    if (!free_slots.empty()) {
      // A dropped member's slot: its generation goes on, so nothing of the old connection matches the new one.
      slot = free_slots.back();
      free_slots.pop_back();
      const uint64_t generation = members_[slot]->generation + 1;
      members_[slot] = std::make_unique<Member>();
      members_[slot]->generation = generation;
    } else if (members_.size() < kMaxPeerMembers) {
      members_.push_back(std::make_unique<Member>());
    } else {
      spdlog::warn("peer tier: {} members known, the most it keeps; {} and others are left out", kMaxPeerMembers,
                   address.text);
      break;
    }
    Member& m = *members_[slot];
    m.address = std::move(address);
    m.identity = identity;
    m.discovered = true;
    spdlog::info("peer {}: discovered", m.address.text);
  }
  int64_t now = 0;
  for (const auto& m : members_) now += (m->retired || m->self) ? 0 : 1;
  members_now_.store(now, std::memory_order_relaxed);
}

void PeerTier::CheckHealth(HealthFindings& out) const {
  const int64_t members = members_now_.load(std::memory_order_relaxed);
  if (members > 0 && connected_.load(std::memory_order_relaxed) == 0 && refused_.load() > 0) {
    out.AddWarning("peer: no peer connected, and some refused this node's proof of the cluster secret");
  }
}

}  // namespace kvtier
