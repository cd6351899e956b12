#include "policy/queue_aware_policy.h"

#include <algorithm>
#include <limits>

namespace kvtier {
namespace {

constexpr uint32_t Shallow(uint32_t depth) { return std::numeric_limits<uint32_t>::max() - depth; }
constexpr uint64_t kLowBits = (uint64_t{1} << 62) - 1;

uint64_t Rank(uint64_t group, uint64_t order) { return group << 62 | (order & kLowBits); }

// An expert's rank in 62 bits: its band (bit 63) moves to bit 61; the time
// below keeps its 61 low bits (microseconds: 73,000 years).
uint64_t PanelOrder(uint64_t expert_rank) {
  constexpr uint64_t kBand = uint64_t{1} << 63;
  constexpr uint64_t kTime = (uint64_t{1} << 61) - 1;
  return ((expert_rank & kBand) >> 2) | (expert_rank & kTime);
}

}  // namespace

QueueAwarePolicy::Group QueueAwarePolicy::GroupOf(const Block& b) const {
  if (b.pinned) return Group::kPinned;
  if (Needed(b)) return Group::kNeeded;
  return b.closed ? Group::kClosed : Group::kPanel;
}

void QueueAwarePolicy::Starts::Insert(uint64_t start_us) {
  if (list_ == nullptr) list_ = std::make_unique<std::vector<uint64_t>>();
  list_->insert(std::upper_bound(list_->begin(), list_->end(), start_us), start_us);
}

bool QueueAwarePolicy::Starts::Erase(uint64_t start_us) {
  if (list_ == nullptr) return false;
  auto one = std::lower_bound(list_->begin(), list_->end(), start_us);
  if (one == list_->end() || *one != start_us) return false;
  list_->erase(one);
  if (list_->empty()) list_.reset();
  return true;
}

QueueAwarePolicy::TreeOrder QueueAwarePolicy::NeededOrderOf(const Block& b) const {
  return TreeOrder{~b.key->second.starts.front(), Shallow(b.depth), b.handle};
}

void QueueAwarePolicy::Refile(Block& b, uint64_t use_us) {
  const Group to = GroupOf(b);
  if (to == b.group && (to != Group::kNeeded || *b.tree_at == NeededOrderOf(b))) return;
  if (b.group == Group::kClosed) closed_.erase(b.tree_at);
  if (b.group == Group::kNeeded) needed_.erase(b.tree_at);
  switch (to) {
    case Group::kPanel:  // a return: a use (see the header)
      if (b.held) {
        panel_.Release(b.handle, use_us, b.panel_uses);
      } else {
        panel_.Access(b.handle, use_us, b.panel_uses);
      }
      b.held = false;
      break;
    case Group::kClosed:
      b.tree_at = closed_.insert(TreeOrder{b.time, Shallow(b.depth), b.handle}).first;
      break;
    case Group::kNeeded:
      b.tree_at = needed_.insert(NeededOrderOf(b)).first;
      break;
    case Group::kPinned:  // the engine reads it: out of every order at once
      if (!b.held) panel_.Hold(b.handle);
      b.held = true;
      break;
  }
  b.group = to;
}

void QueueAwarePolicy::Use(Block& b, uint64_t now_us) {
  latest_us_ = std::max(latest_us_, now_us);
  b.time = now_us;
  if (b.key != nullptr) panel_.Reference(b.key->first, now_us);
}

void QueueAwarePolicy::LinkSession(Block& b, uint64_t session) {
  b.session = session;
  if (session == 0) return;
  Block*& head = sessions_[session];
  b.session_prev = nullptr;
  b.session_next = head;
  if (head != nullptr) head->session_prev = &b;
  head = &b;
}

void QueueAwarePolicy::UnlinkSession(Block& b) {
  if (b.session == 0) return;
  if (b.session_next != nullptr) b.session_next->session_prev = b.session_prev;
  if (b.session_prev != nullptr) {
    b.session_prev->session_next = b.session_next;
  } else if (b.session_next != nullptr) {
    sessions_[b.session] = b.session_next;
  } else {
    sessions_.erase(b.session);
  }
  b.session_prev = b.session_next = nullptr;
  b.session = 0;
}

void QueueAwarePolicy::JoinSession(Block& b, uint64_t session) {
  KeyEntry& entry = b.key->second;
  if (session == 0 || b.session == session) return;
  if (b.session == 0 && !entry.shared) return LinkSession(b, session);
  UnlinkSession(b);  // a second conversation: shared from now on
  entry.shared = true;
  b.closed = false;
}

void QueueAwarePolicy::OnInsert(BlockHandle h, uint64_t now_us) {
  OnRemove(h);  // precondition broken: start over rather than corrupt the order
  Block& b = blocks_[h];
  b.handle = h;
  b.time = now_us;
  latest_us_ = std::max(latest_us_, now_us);
  panel_.Insert(h, nullptr, now_us, b.panel_uses);
  panel_.NoteCapacity(blocks_.size());
}

void QueueAwarePolicy::OnInsertKeyed(BlockHandle h, const BlockKey& key, uint32_t depth, uint64_t session,
                                     uint64_t now_us) {
  OnRemove(h);
  KeyNode& node = *keys_.try_emplace(key).first;
  Block& b = blocks_[h];
  b.handle = h;
  if (Block* other = node.second.block; other != nullptr) {  // a second copy: the latest holds the key
    other->key = nullptr;
    Refile(*other, latest_us_);
  }
  node.second.block = &b;
  b.key = &node;
  b.depth = depth;
  LinkSession(b, node.second.shared ? 0 : session);
  panel_.Insert(h, &key, now_us, b.panel_uses);
  panel_.NoteCapacity(blocks_.size());
  Use(b, now_us);
  Refile(b, now_us);
}

void QueueAwarePolicy::OnInsertKeyed(BlockHandle h, const BlockKey& key, uint64_t now_us) {
  auto entry = keys_.find(key);
  if (entry == keys_.end() || entry->second.starts.empty()) return OnInsertKeyed(h, key, 0, 0, now_us);
  OnInsertKeyed(h, key, entry->second.depth, entry->second.session, now_us);
}

void QueueAwarePolicy::OnAccess(BlockHandle h, uint64_t now_us) {
  auto it = blocks_.find(h);
  if (it == blocks_.end()) return;
  Block& b = it->second;
  Use(b, now_us);
  if (!b.held) panel_.Access(h, now_us, b.panel_uses);
  if (b.group == Group::kClosed) {
    closed_.erase(b.tree_at);
    b.tree_at = closed_.insert(TreeOrder{b.time, Shallow(b.depth), b.handle}).first;
  }
}

void QueueAwarePolicy::OnPin(BlockHandle h) {
  auto it = blocks_.find(h);
  if (it == blocks_.end() || it->second.pinned) return;
  it->second.pinned = true;
  Refile(it->second, latest_us_);
}

void QueueAwarePolicy::OnUnpin(BlockHandle h, uint64_t now_us) {
  auto it = blocks_.find(h);
  if (it == blocks_.end() || !it->second.pinned) return;
  Block& b = it->second;
  b.pinned = false;
  Use(b, now_us);  // a pin is a read
  Refile(b, now_us);
}

void QueueAwarePolicy::OnRemove(BlockHandle h) {
  auto it = blocks_.find(h);
  if (it == blocks_.end()) return;
  Block& b = it->second;
  if (b.group == Group::kClosed) closed_.erase(b.tree_at);
  if (b.group == Group::kNeeded) needed_.erase(b.tree_at);
  panel_.Remove(h);
  UnlinkSession(b);
  if (b.key != nullptr) {
    KeyEntry& entry = b.key->second;
    entry.block = nullptr;
    if (entry.starts.empty()) {
      const BlockKey key = b.key->first;  // not a reference into the node erased
      keys_.erase(key);
    }
  }
  blocks_.erase(it);
}

void QueueAwarePolicy::RebuildPanelIfWanted() const {
  if (!panel_.rebuild_wanted()) return;
  std::vector<ExpertPanel::BlockRecord> records;
  records.reserve(blocks_.size());
  for (const auto& [handle, b] : blocks_) {
    records.push_back(
        ExpertPanel::BlockRecord{handle, b.key != nullptr ? &b.key->first : nullptr, b.panel_uses, b.held});
  }
  panel_.Rebuild(records);
}

std::optional<EvictionCandidate> QueueAwarePolicy::Victim() const {
  panel_.NoteCapacity(blocks_.size());
  RebuildPanelIfWanted();
  if (!closed_.empty()) return EvictionCandidate{closed_.begin()->handle, Rank(0, closed_.begin()->order)};
  // Blocks that left the panel's group for the trees stay in its real
  // instance until it names them: held then, once.
  while (auto v = panel_.Victim()) {
    const Block& b = blocks_.at(v->handle);
    if (b.group == Group::kPanel) return EvictionCandidate{v->handle, Rank(1, PanelOrder(v->rank))};
    panel_.Hold(b.handle);
    b.held = true;
  }
  if (!needed_.empty()) return EvictionCandidate{needed_.begin()->handle, Rank(2, needed_.begin()->order)};
  return std::nullopt;
}

void QueueAwarePolicy::AddStart(const QueuedBlock& qb, uint64_t start_us, uint64_t session) {
  KeyNode& node = *keys_.try_emplace(qb.key).first;
  KeyEntry& entry = node.second;
  entry.starts.Insert(start_us);
  entry.depth = qb.depth;
  if (session != 0) {
    if (entry.session != 0 && entry.session != session) entry.shared = true;
    entry.session = session;
  }
  Block* b = entry.block;
  if (b == nullptr) return;
  const bool reorder = b->group == Group::kNeeded && b->depth != qb.depth;  // its tree key changes
  if (reorder) needed_.erase(b->tree_at);
  b->depth = qb.depth;
  if (reorder) b->tree_at = needed_.insert(NeededOrderOf(*b)).first;
  JoinSession(*b, session);
  Refile(*b, latest_us_);
}

void QueueAwarePolicy::RemoveStart(const BlockKey& key, uint64_t start_us) {
  auto node = keys_.find(key);
  if (node == keys_.end()) return;
  KeyEntry& entry = node->second;
  if (!entry.starts.Erase(start_us)) return;
  if (entry.block != nullptr) {
    Refile(*entry.block, latest_us_);
  } else if (entry.starts.empty()) {
    keys_.erase(node);
  }
}

void QueueAwarePolicy::OnEnqueue(uint64_t request, std::span<const QueuedBlock> blocks, uint64_t expected_start_us,
                                 uint64_t session) {
  // The new starts go in before the replaced request's go out, so a key
  // both name never leaves the needed group.
  std::optional<Request> replaced;
  if (auto it = requests_.find(request); it != requests_.end()) {
    replaced = std::move(it->second);
    requests_.erase(it);
  }
  Request& r = requests_[request];
  r.start_us = expected_start_us;
  r.keys.reserve(blocks.size());
  for (const QueuedBlock& qb : blocks) {
    r.keys.push_back(qb.key);
    AddStart(qb, expected_start_us, session);
  }
  if (replaced) {
    for (const BlockKey& key : replaced->keys) RemoveStart(key, replaced->start_us);
  }
}

void QueueAwarePolicy::Enqueue(uint64_t request, std::span<const BlockKey> chain, uint64_t expected_start_us) {
  std::vector<QueuedBlock> blocks(chain.size());
  for (size_t i = 0; i < chain.size(); ++i) blocks[i] = QueuedBlock{chain[i], static_cast<uint32_t>(i)};
  OnEnqueue(request, blocks, expected_start_us, 0);
}

void QueueAwarePolicy::Dequeue(uint64_t request) {
  auto it = requests_.find(request);
  if (it == requests_.end()) return;
  Request r = std::move(it->second);
  requests_.erase(it);
  for (const BlockKey& key : r.keys) RemoveStart(key, r.start_us);
}

void QueueAwarePolicy::SetSessionClosed(uint64_t session, bool closed) {
  if (session == 0) return;
  auto s = sessions_.find(session);
  if (s == sessions_.end()) return;
  for (Block* b = s->second; b != nullptr; b = b->session_next) {
    b->closed = closed;
    Refile(*b, latest_us_);
  }
}

std::optional<uint64_t> QueueAwarePolicy::NextUse(BlockHandle h) const {
  auto it = blocks_.find(h);
  if (it == blocks_.end() || !Needed(it->second)) return std::nullopt;
  return it->second.key->second.starts.front();
}

bool QueueAwarePolicy::NeededWithin(BlockHandle h, uint64_t now_us, uint64_t window_us) const {
  const std::optional<uint64_t> next = NextUse(h);
  return next && *next < now_us + window_us;
}

std::unique_ptr<QueueAwarePolicy> MakeQueueAwarePolicy() { return std::make_unique<QueueAwarePolicy>(); }

}  // namespace kvtier
