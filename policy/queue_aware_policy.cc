#include "policy/queue_aware_policy.h"

#include <algorithm>
#include <bit>
#include <limits>

namespace kvtier {
namespace {

constexpr uint32_t Shallow(uint32_t depth) { return std::numeric_limits<uint32_t>::max() - depth; }

// Inserts `value` into `set`, reusing a node from `spare` when there is one.
template <class Set>
typename Set::iterator Emplace(Set& set, std::vector<typename Set::node_type>& spare,
                               const typename Set::value_type& value) {
  if (spare.empty()) return set.insert(value).first;
  typename Set::node_type node = std::move(spare.back());
  spare.pop_back();
  node.value() = value;
  return set.insert(std::move(node)).position;
}

}  // namespace

uint64_t QueueAwarePolicy::Rank(uint64_t group, uint64_t open, uint32_t uses, uint64_t time) {
  constexpr uint64_t kTimeMask = (uint64_t{1} << 54) - 1;
  return group << 63 | open << 62 | uint64_t{std::min<uint32_t>(uses, kUseBuckets - 1)} << 54 | (time & kTimeMask);
}

QueueAwarePolicy::NeededOrder QueueAwarePolicy::NeededOrderOf(const Block& b) const {
  return NeededOrder{~b.key->second.starts.front(), Shallow(b.depth), b.handle};
}

void QueueAwarePolicy::Touch(Block& b, uint64_t time_us) {
  b.time = time_us;
  b.seq = ++seq_;
  latest_us_ = std::max(latest_us_, time_us);
}

void QueueAwarePolicy::File(Block& b) {
  if (Needed(b)) {
    b.needed_at = Emplace(needed_, spare_needed_, NeededOrderOf(b));
    b.place = Place::kNeeded;
  } else if (b.closed) {
    b.closed_at = Emplace(closed_, spare_closed_, ClosedOrder{Bucket(b), b.time, Shallow(b.depth), b.seq, b.handle});
    b.place = Place::kClosed;
  } else {
    Link(lists_[Bucket(b)], b);
    b.place = Place::kOpen;
  }
}

void QueueAwarePolicy::Unfile(Block& b) {
  switch (b.place) {
    case Place::kNone:
      return;
    case Place::kOpen:
      Unlink(lists_[Bucket(b)], b);
      break;
    case Place::kClosed:
      spare_closed_.push_back(closed_.extract(b.closed_at));
      break;
    case Place::kNeeded:
      spare_needed_.push_back(needed_.extract(b.needed_at));
      break;
  }
  b.place = Place::kNone;
}

void QueueAwarePolicy::IndexRun(List& list) {
  if (list.run_known) return;
  list.run_last.clear();
  Block* b = list.tail;
  for (;; b = b->prev) {
    list.run_last.try_emplace(b->depth, b);  // walking back: the first seen is the last
    if (b->prev == nullptr || b->prev->time != b->time) break;
  }
  list.run_first = b;
  list.run_known = true;
}

void QueueAwarePolicy::Link(List& list, Block& b) {
  // Insert after `after` (null: at the head). A block usually lands at the
  // tail; at the tail's time it lands after the run's blocks at least as
  // deep; at an older time it walks back.
  Block* after = list.tail;
  bool in_run = false;
  if (after != nullptr && after->time == b.time) {
    IndexRun(list);
    auto deeper = list.run_last.lower_bound(b.depth);  // the shallowest group at least as deep
    after = deeper != list.run_last.end() ? deeper->second : list.run_first->prev;
    in_run = true;
  } else if (after != nullptr && after->time > b.time) {
    while (after != nullptr && (after->time > b.time || (after->time == b.time && after->depth < b.depth))) {
      after = after->prev;
    }
  } else {
    list.run_known = false;  // a new run begins with b
  }
  Block* before = after != nullptr ? after->next : list.head;
  b.prev = after;
  b.next = before;
  (after != nullptr ? after->next : list.head) = &b;
  (before != nullptr ? before->prev : list.tail) = &b;
  if (in_run) {
    list.run_last[b.depth] = &b;
    if (before == list.run_first) list.run_first = &b;
  }
  const uint32_t bucket = static_cast<uint32_t>(&list - lists_.data());
  nonempty_[bucket / 64] |= uint64_t{1} << (bucket % 64);
}

void QueueAwarePolicy::Unlink(List& list, Block& b) {
  if (list.run_known && b.time == list.tail->time) {  // b is in the indexed run
    auto last = list.run_last.find(b.depth);
    if (last->second == &b) {
      if (b.prev != nullptr && b.prev->time == b.time && b.prev->depth == b.depth) {
        last->second = b.prev;
      } else {
        list.run_last.erase(last);
      }
    }
    if (list.run_first == &b) list.run_first = b.next;
    if (list.run_first == nullptr) list.run_known = false;  // the run is gone: the next one is not indexed
  }
  (b.prev != nullptr ? b.prev->next : list.head) = b.next;
  (b.next != nullptr ? b.next->prev : list.tail) = b.prev;
  b.prev = b.next = nullptr;
  if (list.head == nullptr) {
    const uint32_t bucket = static_cast<uint32_t>(&list - lists_.data());
    nonempty_[bucket / 64] &= ~(uint64_t{1} << (bucket % 64));
  }
}

void QueueAwarePolicy::Refile(Block& b) {
  if (b.pinned) return;
  const bool needed = Needed(b);
  if (b.place == Place::kNeeded) {
    if (needed && *b.needed_at == NeededOrderOf(b)) return;
    Unfile(b);
    if (!needed) Touch(b, latest_us_);
    File(b);
  } else if (needed) {
    Unfile(b);
    File(b);
  }
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

void QueueAwarePolicy::OnInsert(BlockHandle h, uint64_t now_us) {
  OnRemove(h);  // precondition broken: start over rather than corrupt the order
  Block& b = blocks_[h];
  b.handle = h;
  Touch(b, now_us);
  File(b);
}

void QueueAwarePolicy::OnInsertKeyed(BlockHandle h, const BlockKey& key, uint32_t depth, uint64_t session,
                                     uint64_t now_us) {
  OnRemove(h);
  Block& b = blocks_[h];
  b.handle = h;
  KeyNode& node = *keys_.try_emplace(key).first;
  if (Block* other = node.second.block; other != nullptr) {  // a second copy: the latest holds the key
    Unfile(*other);
    other->key = nullptr;
    if (!other->pinned) File(*other);
  }
  node.second.block = &b;
  b.key = &node;
  b.depth = depth;
  LinkSession(b, session);
  Touch(b, now_us);
  File(b);
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
  Unfile(b);
  ++b.uses;
  Touch(b, now_us);
  if (!b.pinned) File(b);
}

void QueueAwarePolicy::OnPin(BlockHandle h) {
  auto it = blocks_.find(h);
  if (it == blocks_.end() || it->second.pinned) return;
  Unfile(it->second);
  it->second.pinned = true;
}

void QueueAwarePolicy::OnUnpin(BlockHandle h, uint64_t now_us) {
  auto it = blocks_.find(h);
  if (it == blocks_.end() || !it->second.pinned) return;
  it->second.pinned = false;
  ++it->second.uses;  // a pin is a read: it counts toward the use count too
  Touch(it->second, now_us);
  File(it->second);
}

void QueueAwarePolicy::OnRemove(BlockHandle h) {
  auto it = blocks_.find(h);
  if (it == blocks_.end()) return;
  Block& b = it->second;
  Unfile(b);
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

std::optional<EvictionCandidate> QueueAwarePolicy::Victim() const {
  if (!closed_.empty()) {
    const ClosedOrder& o = *closed_.begin();
    return EvictionCandidate{o.handle, Rank(0, 0, o.uses, o.time)};
  }
  for (size_t word = 0; word < nonempty_.size(); ++word) {
    if (nonempty_[word] == 0) continue;
    const Block& b = *lists_[word * 64 + std::countr_zero(nonempty_[word])].head;
    return EvictionCandidate{b.handle, Rank(0, 1, b.uses, b.time)};
  }
  if (!needed_.empty()) return EvictionCandidate{needed_.begin()->handle, Rank(1, 0, 0, needed_.begin()->later)};
  return std::nullopt;
}

void QueueAwarePolicy::AddStart(const QueuedBlock& qb, uint64_t start_us, uint64_t session) {
  KeyNode& node = *keys_.try_emplace(qb.key).first;
  KeyEntry& entry = node.second;
  entry.starts.insert(std::upper_bound(entry.starts.begin(), entry.starts.end(), start_us), start_us);
  entry.depth = qb.depth;
  if (session != 0) entry.session = session;
  Block* b = entry.block;
  if (b == nullptr) return;
  if (b->depth != qb.depth && b->place == Place::kNeeded) Unfile(*b);  // its tree key changes
  b->depth = qb.depth;
  if (b->session == 0 && session != 0) LinkSession(*b, session);
  if (b->place == Place::kNone && !b->pinned) {
    File(*b);
  } else {
    Refile(*b);
  }
}

void QueueAwarePolicy::RemoveStart(const BlockKey& key, uint64_t start_us) {
  auto node = keys_.find(key);
  if (node == keys_.end()) return;
  KeyEntry& entry = node->second;
  auto one = std::lower_bound(entry.starts.begin(), entry.starts.end(), start_us);
  if (one == entry.starts.end() || *one != start_us) return;
  entry.starts.erase(one);
  if (entry.block != nullptr) {
    Refile(*entry.block);
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
    if (b->closed == closed) continue;
    const bool unneeded = b->place == Place::kOpen || b->place == Place::kClosed;
    if (unneeded) Unfile(*b);
    b->closed = closed;
    if (!closed) Touch(*b, latest_us_);  // reopening counts as a use (see the header)
    if (unneeded) File(*b);
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
