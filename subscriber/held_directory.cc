#include "subscriber/held_directory.h"

#include <spdlog/spdlog.h>

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

HeldDirectoryOptions WithDefaults(HeldDirectoryOptions options) {
  if (!options.open) {
    const EventSourceLimits limits{.answer_timeout = options.answer_timeout,
                                   .max_answer_bytes = options.max_blocks * kSnapshotBytesPerBlock};
    options.open = [limits, context = EventContext::Make()](
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
    MutexLock lock(directory_.mu_);
    Node* node = Current();
    if (node == nullptr) return;
    directory_.entries_ -= node->held.size();
    node->held.clear();
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

HeldDirectory::HeldDirectory(HeldDirectoryOptions options) : options_(WithDefaults(std::move(options))) {
  thread_ = std::thread([this] { Run(); });
}

HeldDirectory::~HeldDirectory() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    cv_.NotifyAll();
  }
  thread_.join();
}

void HeldDirectory::Follow(const std::string& name, const std::string& endpoint, const std::string& replay_endpoint) {
  MutexLock lock(mu_);
  Node& node = nodes_[name];
  if (node.generation != 0 && node.endpoint == endpoint && node.replay_endpoint == replay_endpoint) return;
  entries_ -= node.held.size();
  node.held.clear();
  node.known = false;
  node.endpoint = endpoint;
  node.replay_endpoint = replay_endpoint;
  ++node.generation;
  cv_.NotifyAll();
}

void HeldDirectory::Unfollow(const std::string& name) {
  MutexLock lock(mu_);
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return;
  entries_ -= it->second.held.size();
  nodes_.erase(it);
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
  MutexLock lock(mu_);
  auto it = nodes_.find(name);
  if (it == nodes_.end() || it->second.generation != generation) return;
  Node& node = it->second;
  entries_ -= node.held.size();
  node.held.clear();
  node.known = false;
  ++failures_;
  if (why.code() == StatusCode::kNoSpace) ++overflows_;
  spdlog::warn("peer events of {}: {}; its lookups ask it until it is followed again in {} ms", name, why.ToString(),
               options_.retry.count());
}

void HeldDirectory::Reconcile(std::unordered_map<std::string, std::unique_ptr<Session>>& sessions,
                              std::unordered_map<std::string, std::chrono::steady_clock::time_point>& retry_at) {
  struct Want {
    std::string name, endpoint, replay_endpoint;
    uint64_t generation = 0;
  };
  std::vector<Want> want;
  {
    MutexLock lock(mu_);
    for (const auto& [name, node] : nodes_)
      want.push_back({name, node.endpoint, node.replay_endpoint, node.generation});
  }
  std::erase_if(sessions, [&](const auto& entry) {
    for (const Want& w : want) {
      if (w.name == entry.first) return w.generation != entry.second->generation;
    }
    return true;
  });
  std::erase_if(retry_at, [&](const auto& entry) {
    for (const Want& w : want) {
      if (w.name == entry.first) return false;
    }
    return true;
  });
  const auto now = std::chrono::steady_clock::now();
  for (const Want& w : want) {
    if (sessions.contains(w.name)) continue;
    if (auto due = retry_at.find(w.name); due != retry_at.end() && now < due->second) continue;
    retry_at[w.name] = now + options_.retry;  // unless it syncs, below
    auto stream = options_.open(w.endpoint, w.replay_endpoint);
    if (!stream.ok()) {
      Failed(w.name, w.generation, stream.status());
      continue;
    }
    auto session = std::make_unique<Session>();
    session->generation = w.generation;
    session->stream = std::move(*stream);
    session->index = std::make_unique<NodeIndex>(*this, w.name, w.generation);
    session->rebuilder = std::make_unique<IndexRebuilder>(*session->stream, *session->index);
    if (Status s = session->rebuilder->Resync(); !s.ok()) {
      Failed(w.name, w.generation, s);
      continue;
    }
    {
      MutexLock lock(mu_);
      auto it = nodes_.find(w.name);
      if (it == nodes_.end() || it->second.generation != w.generation) continue;
      it->second.known = true;
      ++syncs_;
    }
    retry_at.erase(w.name);
    sessions.emplace(w.name, std::move(session));
  }
}

void HeldDirectory::Run() {
  std::unordered_map<std::string, std::unique_ptr<Session>> sessions;
  std::unordered_map<std::string, std::chrono::steady_clock::time_point> retry_at;
  for (;;) {
    {
      MutexLock lock(mu_);
      if (stopping_) return;
    }
    Reconcile(sessions, retry_at);
    bool any = false;
    std::vector<std::string> failed;
    for (auto& [name, session] : sessions) {
      for (int i = 0; i < kBatchesPerTurn; ++i) {
        auto next = session->stream->Next(std::chrono::milliseconds(0));
        Status s = next.status();
        if (s.ok() && !next->has_value()) break;
        if (s.ok()) s = session->rebuilder->OnStream(**next).status();
        if (!s.ok()) {
          Failed(name, session->generation, s);
          failed.push_back(name);
          break;
        }
        any = true;
      }
    }
    for (const std::string& name : failed) {
      sessions.erase(name);
      retry_at[name] = std::chrono::steady_clock::now() + options_.retry;
    }
    if (!any) {
      // Nothing came: wait a moment for the streams, or (none open) until
      // a Follow or the next retry.
      auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(kIdleWait);
      if (sessions.empty()) wait = std::chrono::milliseconds(1000);
      MutexLock lock(mu_);
      if (!stopping_) cv_.WaitFor(mu_, wait);
    }
  }
}

}  // namespace kvtier::events
