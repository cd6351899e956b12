#include "subscriber/held_directory.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "subscriber/event_index.h"

namespace kvtier::events {
namespace {

// Batches one node's stream applies before the others get their turn.
constexpr int kBatchesPerTurn = 64;
// How long the thread sleeps when no stream had anything.
constexpr auto kIdleWait = std::chrono::milliseconds(5);
// A snapshot's bytes per block are about 20 (docs/OPERATIONS.md); this is far over.
constexpr uint64_t kSnapshotBytesPerBlock = 64;

uint8_t TierBit(Tier tier) { return static_cast<uint8_t>(1u << static_cast<unsigned>(tier)); }

HeldDirectoryOptions WithDefaults(HeldDirectoryOptions options, std::shared_ptr<EventContext> context) {
  if (!options.open) {
    const EventSourceLimits limits{.answer_timeout = options.answer_timeout,
                                   .max_answer_bytes = options.max_blocks * kSnapshotBytesPerBlock,
                                   .disconnect_is_error = true};
    options.open = [limits, context = std::move(context)](
                       const std::string& endpoint,
                       const std::string& replay_endpoint) -> Result<std::unique_ptr<EventStream>> {
      auto source = EventSource::Open(endpoint, replay_endpoint, limits, context);
      if (!source.ok()) return source.status();
      return std::unique_ptr<EventStream>(std::move(*source));
    };
  }
  return options;
}

}  // namespace

// What the thread holds of one followed node.
struct HeldDirectory::Session {
  uint64_t generation = 0;
  std::unique_ptr<EventStream> stream;
  std::unique_ptr<NodeIndex> index;
  std::unique_ptr<IndexRebuilder> rebuilder;
};

// The directory's entries of one node, as IndexRebuilder applies events to
// them; changes of an older generation (the node followed anew) are dropped.
class HeldDirectory::NodeIndex final : public EventIndex {
 public:
  NodeIndex(HeldDirectory& directory, std::string name, uint64_t generation)
      : directory_(directory), name_(std::move(name)), generation_(generation) {}

  void Clear() override {
    HeldSet gone;  // freed outside the lock
    MutexLock lock(directory_.mu_);
    Node* node = Current();
    if (node == nullptr) return;
    directory_.entries_ -= node->held.size();
    gone.swap(node->held);
    node->known = false;  // until what follows is applied whole (Synced)
  }

  Status Stored(Tier tier, const NamespaceFingerprint&, std::span<const BlockKey> keys) override {
    if (tier == Tier::kRemote || tier == Tier::kNone) return Status::Ok();
    MutexLock lock(directory_.mu_);
    Node* node = Current();
    if (node == nullptr) return Status::Ok();
    for (const BlockKey& key : keys) {
      auto [it, added] = node->held.try_emplace(key, 0);
      if (added && directory_.entries_ >= directory_.options_.max_blocks) {
        node->held.erase(it);
        return NoSpace("the directory holds " + std::to_string(directory_.options_.max_blocks) +
                       " blocks of the peers already (peer.events_max_blocks)");
      }
      if (added) ++directory_.entries_;
      it->second |= TierBit(tier);
    }
    return Status::Ok();
  }

  void Removed(Tier tier, const NamespaceFingerprint&, std::span<const BlockKey> keys) override {
    if (tier == Tier::kRemote || tier == Tier::kNone) return;
    MutexLock lock(directory_.mu_);
    Node* node = Current();
    if (node == nullptr) return;
    for (const BlockKey& key : keys) {
      auto it = node->held.find(key);
      if (it == node->held.end()) continue;
      it->second &= static_cast<uint8_t>(~TierBit(tier));
      if (it->second == 0) {
        node->held.erase(it);
        --directory_.entries_;
      }
    }
  }

 private:
  Node* Current() REQUIRES(directory_.mu_) {
    auto it = directory_.nodes_.find(name_);
    return it == directory_.nodes_.end() || it->second.generation != generation_ ? nullptr : &it->second;
  }

  HeldDirectory& directory_;
  const std::string name_;
  const uint64_t generation_;
};

HeldDirectory::HeldDirectory(HeldDirectoryOptions options) : options_(WithDefaults(std::move(options), context_)) {
  thread_ = std::thread([this] { Run(); });
}

HeldDirectory::~HeldDirectory() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    cv_.NotifyAll();
  }
  context_->Shutdown();  // a snapshot or replay waiting for its answer ends now
  thread_.join();
}

void HeldDirectory::Follow(const std::string& name, const std::string& endpoint, const std::string& replay_endpoint) {
  HeldSet gone;  // freed outside the lock
  MutexLock lock(mu_);
  Node& node = nodes_[name];
  if (node.generation != 0 && node.endpoint == endpoint && node.replay_endpoint == replay_endpoint) return;
  entries_ -= node.held.size();
  gone.swap(node.held);
  node.known = false;
  node.endpoint = endpoint;
  node.replay_endpoint = replay_endpoint;
  node.generation = ++next_generation_;  // never reused: a session of an earlier Follow never matches
  changed_ = true;
  cv_.NotifyAll();
}

void HeldDirectory::Unfollow(const std::string& name) {
  HeldSet gone;  // freed outside the lock
  MutexLock lock(mu_);
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return;
  entries_ -= it->second.held.size();
  gone.swap(it->second.held);
  nodes_.erase(it);
  changed_ = true;
}

std::optional<size_t> HeldDirectory::Leading(const std::string& name, std::span<const BlockKey> keys) const {
  MutexLock lock(mu_);
  auto it = nodes_.find(name);
  if (it == nodes_.end() || !it->second.known) return std::nullopt;
  size_t n = 0;
  while (n < keys.size() && it->second.held.contains(keys[n])) ++n;
  return n;
}

void HeldDirectory::VisitCounters(CounterVisitor& v) const {
  MutexLock lock(mu_);
  int64_t known = 0;
  for (const auto& [name, node] : nodes_) known += node.known ? 1 : 0;
  v.VisitGauge("peer_events.followed", static_cast<int64_t>(nodes_.size()));
  v.VisitGauge("peer_events.known", known);
  v.VisitGauge("peer_events.blocks", static_cast<int64_t>(entries_));
  v.Visit("peer_events.syncs", syncs_);
  v.Visit("peer_events.failures", failures_);
  v.Visit("peer_events.overflows", overflows_);
}

void HeldDirectory::Failed(const std::string& name, uint64_t generation, const Status& why) {
  HeldSet gone;  // freed outside the lock
  MutexLock lock(mu_);
  auto it = nodes_.find(name);
  if (it == nodes_.end() || it->second.generation != generation) return;
  Node& node = it->second;
  entries_ -= node.held.size();
  gone.swap(node.held);
  node.known = false;
  ++failures_;
  if (why.code() == StatusCode::kNoSpace) ++overflows_;
  if (!node.logged) {
    node.logged = true;
    spdlog::warn("peer events of {}: {}; it is asked as a member nothing is known of, and followed again every {} ms",
                 name, why.ToString(), options_.retry.count());
  }
}

void HeldDirectory::Synced(const std::string& name, uint64_t generation, bool snapshot) {
  MutexLock lock(mu_);
  auto it = nodes_.find(name);
  if (it == nodes_.end() || it->second.generation != generation) return;
  Node& node = it->second;
  if (snapshot) ++syncs_;
  if (!node.known && node.logged) spdlog::info("peer events of {}: followed again", name);
  node.known = true;
  node.logged = false;
}

void HeldDirectory::Reconcile(Sessions& sessions, RetryTimes& retry_at) {
  struct Want {
    std::string name, endpoint, replay_endpoint;
    uint64_t generation = 0;
  };
  std::unordered_map<std::string, Want> want;
  {
    MutexLock lock(mu_);
    changed_ = false;
    for (const auto& [name, node] : nodes_) want[name] = {name, node.endpoint, node.replay_endpoint, node.generation};
  }
  std::erase_if(sessions, [&](const auto& entry) {
    auto w = want.find(entry.first);
    return w == want.end() || w->second.generation != entry.second->generation;
  });
  std::erase_if(retry_at, [&](const auto& entry) { return !want.contains(entry.first); });
  const auto now = std::chrono::steady_clock::now();
  for (const auto& [name, w] : want) {
    if (sessions.contains(name)) continue;
    if (auto due = retry_at.find(name); due != retry_at.end() && now < due->second) continue;
    // One node per turn: the streams of the others are read between.
    retry_at[name] = now + options_.retry;  // unless it syncs, below
    auto stream = options_.open(w.endpoint, w.replay_endpoint);
    if (!stream.ok()) {
      Failed(name, w.generation, stream.status());
      return;
    }
    auto session = std::make_unique<Session>();
    session->generation = w.generation;
    session->stream = std::move(*stream);
    session->index = std::make_unique<NodeIndex>(*this, name, w.generation);
    session->rebuilder = std::make_unique<IndexRebuilder>(*session->stream, *session->index);
    Status s = session->stream->WaitSubscribed(options_.answer_timeout);
    if (s.ok()) s = session->rebuilder->Resync();
    if (!s.ok()) {
      Failed(name, w.generation, s);
      return;
    }
    Synced(name, w.generation, /*snapshot=*/true);
    retry_at.erase(name);
    sessions.emplace(name, std::move(session));
    return;
  }
}

void HeldDirectory::Run() {
  Sessions sessions;
  RetryTimes retry_at;
  for (;;) {
    bool reconcile = false;
    {
      MutexLock lock(mu_);
      if (stopping_) return;
      reconcile = changed_;
    }
    const auto now = std::chrono::steady_clock::now();
    for (const auto& [name, at] : retry_at) reconcile = reconcile || at <= now;
    if (reconcile) Reconcile(sessions, retry_at);
    bool any = false;
    std::vector<std::string> failed;
    for (auto& [name, session] : sessions) {
      bool applied = false;
      for (int i = 0; i < kBatchesPerTurn; ++i) {
        auto next = session->stream->Next(std::chrono::milliseconds(0));
        Status s = next.status();
        if (s.ok() && !next->has_value()) break;
        if (s.ok()) s = session->rebuilder->OnStream(**next).status();
        if (!s.ok()) {
          Failed(name, session->generation, s);
          failed.push_back(name);
          applied = false;
          break;
        }
        applied = any = true;
      }
      // A batch applied whole (after a rebuild inside it: a snapshot, a clear) leaves the node known.
      if (applied) Synced(name, session->generation, /*snapshot=*/false);
    }
    for (const std::string& name : failed) {
      sessions.erase(name);
      retry_at[name] = std::chrono::steady_clock::now() + options_.retry;
    }
    if (!any) {
      // Nothing came: wait a moment for the streams, or (none open) until a
      // Follow or the next retry.
      auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(kIdleWait);
      if (sessions.empty()) {
        wait = std::chrono::milliseconds(1000);
        for (const auto& [name, at] : retry_at) {
          wait = std::min(wait, std::chrono::ceil<std::chrono::milliseconds>(at - std::chrono::steady_clock::now()));
        }
        wait = std::max(wait, std::chrono::milliseconds(1));
      }
      MutexLock lock(mu_);
      if (!stopping_ && !changed_) cv_.WaitFor(mu_, wait);
    }
  }
}

}  // namespace kvtier::events
