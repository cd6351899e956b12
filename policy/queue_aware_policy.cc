#include "policy/queue_aware_policy.h"

#include <algorithm>
#include <limits>

namespace kvtier {

QueueAwarePolicy::Order QueueAwarePolicy::OrderOf(const Block& b, BlockHandle h) const {
  Order o;
  o.handle = h;
  o.shallow = std::numeric_limits<uint32_t>::max() - b.depth;
  if (b.key) {
    auto uses = next_uses_.find(*b.key);
    if (uses != next_uses_.end() && !uses->second.starts.empty()) {
      o.group = 1;
      o.time = std::numeric_limits<uint64_t>::max() - *uses->second.starts.begin();
      return o;
    }
  }
  o.open = b.closed ? 0 : 1;
  o.uses = b.uses;
  o.time = b.last_use_us;
  return o;
}

uint64_t QueueAwarePolicy::Rank(const Order& o) {
  constexpr uint64_t kTimeMask = (uint64_t{1} << 54) - 1;
  return uint64_t{o.group} << 63 | uint64_t{o.open} << 62 | uint64_t{std::min<uint32_t>(o.uses, 255)} << 54 |
         (o.time & kTimeMask);
}

void QueueAwarePolicy::Refile(BlockHandle h, Block& b) {
  if (b.pinned) return;
  const Order moved = OrderOf(b, h);
  if (moved == b.order) return;
  // Re-key the set's own node: no allocation.
  auto node = order_.extract(b.order);
  node.value() = moved;
  b.order = moved;
  order_.insert(std::move(node));
}

void QueueAwarePolicy::RefileKey(const BlockKey& key) {
  auto h = by_key_.find(key);
  if (h == by_key_.end()) return;
  Refile(h->second, blocks_.at(h->second));
}

void QueueAwarePolicy::OnInsert(BlockHandle h, uint64_t now_us) {
  Block& b = blocks_[h];
  b.last_use_us = now_us;
  b.order = OrderOf(b, h);
  order_.insert(b.order);
}

void QueueAwarePolicy::OnInsertKeyed(BlockHandle h, const BlockKey& key, uint32_t depth, uint64_t session,
                                     uint64_t now_us) {
  Block& b = blocks_[h];
  b.key = key;
  b.depth = depth;
  b.session = session;
  b.last_use_us = now_us;
  by_key_[key] = h;
  if (session != 0) sessions_[session].insert(h);
  b.order = OrderOf(b, h);
  order_.insert(b.order);
}

void QueueAwarePolicy::OnInsertKeyed(BlockHandle h, const BlockKey& key, uint64_t now_us) {
  auto uses = next_uses_.find(key);
  if (uses == next_uses_.end()) return OnInsertKeyed(h, key, 0, 0, now_us);
  OnInsertKeyed(h, key, uses->second.depth, uses->second.session, now_us);
}

void QueueAwarePolicy::OnAccess(BlockHandle h, uint64_t now_us) {
  auto it = blocks_.find(h);
  if (it == blocks_.end()) return;
  ++it->second.uses;
  it->second.last_use_us = now_us;
  Refile(h, it->second);
}

void QueueAwarePolicy::OnPin(BlockHandle h) {
  auto it = blocks_.find(h);
  if (it == blocks_.end() || it->second.pinned) return;
  order_.erase(it->second.order);
  it->second.pinned = true;
}

void QueueAwarePolicy::OnUnpin(BlockHandle h, uint64_t now_us) {
  auto it = blocks_.find(h);
  if (it == blocks_.end() || !it->second.pinned) return;
  it->second.pinned = false;
  it->second.last_use_us = now_us;
  it->second.order = OrderOf(it->second, h);
  order_.insert(it->second.order);
}

void QueueAwarePolicy::OnRemove(BlockHandle h) {
  auto it = blocks_.find(h);
  if (it == blocks_.end()) return;
  const Block& b = it->second;
  if (!b.pinned) order_.erase(b.order);
  if (b.key) {
    auto k = by_key_.find(*b.key);
    if (k != by_key_.end() && k->second == h) by_key_.erase(k);
  }
  if (b.session != 0) {
    auto s = sessions_.find(b.session);
    if (s != sessions_.end()) {
      s->second.erase(h);
      if (s->second.empty()) sessions_.erase(s);
    }
  }
  blocks_.erase(it);
}

std::optional<EvictionCandidate> QueueAwarePolicy::Victim() const {
  if (order_.empty()) return std::nullopt;
  return EvictionCandidate{order_.begin()->handle, Rank(*order_.begin())};
}

void QueueAwarePolicy::OnEnqueue(uint64_t request, std::span<const QueuedBlock> blocks, uint64_t expected_start_us,
                                 uint64_t session) {
  Dequeue(request);
  Request& r = requests_[request];
  r.start_us = expected_start_us;
  r.keys.reserve(blocks.size());
  for (const QueuedBlock& qb : blocks) {
    r.keys.push_back(qb.key);
    KeyUses& uses = next_uses_[qb.key];
    uses.starts.insert(expected_start_us);
    uses.depth = qb.depth;
    if (session != 0) uses.session = session;
    auto h = by_key_.find(qb.key);
    if (h == by_key_.end()) continue;
    Block& b = blocks_.at(h->second);
    b.depth = qb.depth;
    if (b.session == 0 && session != 0) {
      b.session = session;
      sessions_[session].insert(h->second);
    }
    Refile(h->second, b);
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
  const Request r = std::move(it->second);
  requests_.erase(it);
  for (const BlockKey& key : r.keys) {
    auto uses = next_uses_.find(key);
    if (uses == next_uses_.end()) continue;
    auto one = uses->second.starts.find(r.start_us);
    if (one != uses->second.starts.end()) uses->second.starts.erase(one);
    if (uses->second.starts.empty()) next_uses_.erase(uses);
    RefileKey(key);
  }
}

void QueueAwarePolicy::SetSessionClosed(uint64_t session, bool closed) {
  auto s = sessions_.find(session);
  if (s == sessions_.end()) return;
  for (BlockHandle h : s->second) {
    Block& b = blocks_.at(h);
    b.closed = closed;
    Refile(h, b);
  }
}

std::optional<uint64_t> QueueAwarePolicy::NextUse(BlockHandle h) const {
  auto it = blocks_.find(h);
  if (it == blocks_.end() || !it->second.key) return std::nullopt;
  auto uses = next_uses_.find(*it->second.key);
  if (uses == next_uses_.end() || uses->second.starts.empty()) return std::nullopt;
  return *uses->second.starts.begin();
}

bool QueueAwarePolicy::NeededWithin(BlockHandle h, uint64_t now_us, uint64_t window_us) const {
  const std::optional<uint64_t> next = NextUse(h);
  return next && *next < now_us + window_us;
}

std::unique_ptr<QueueAwarePolicy> MakeQueueAwarePolicy() { return std::make_unique<QueueAwarePolicy>(); }

}  // namespace kvtier
