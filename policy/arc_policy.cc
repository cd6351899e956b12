// ARC (Megiddo and Modha, FAST 2003). T1 holds blocks used once since they
// entered, T2 blocks used again; both are LRU lists. B1 and B2 remember the
// keys of blocks removed from T1 and T2. The capacity c is the number of
// tracked blocks (size()); p in [0, c] is T1's target size.
//
// A use (an access or the end of a pin) moves a block to T2's MRU end. A
// block inserted while its key is in B1 raises p by max(|B2| / |B1|, 1) and
// one in B2 lowers it by max(|B1| / |B2|, 1) (clamped to [0, c]); either
// goes to T2's MRU end, others to T1's. Then ARC's case IV trims the ghosts:
// B1's LRU keys while |T1| + |B1| > c, B2's while the four lists hold more
// than 2c, so |B1| + |B2| <= c in a full cache.
//
// REPLACE: the victim is T1's LRU block when |T1| > p, or |T1| = p and the
// last insertion was a B2 hit; otherwise T2's LRU block (the other list
// when the chosen one has only pinned blocks). |T1| and |T2| count pinned
// blocks. The choice is a pure function of the state, so Victim() changes
// nothing; OnRemove moves the block's key to B1 or B2. The engine makes
// room before it inserts, so a ghost hit adapts p after the eviction it
// caused, where the paper adapts before; the effect lags by one eviction.
// Plain OnInsert keeps no ghost (handles may be reused).
//
// Every operation O(1): lists and hash maps; pinned blocks are parked in a
// side list and return to T2's MRU end on unpin.
#include <algorithm>
#include <list>
#include <unordered_map>

#include "policy/eviction_policy.h"

namespace kvtier {
namespace {

constexpr uint64_t kT2Band = uint64_t{1} << 63;
constexpr uint64_t kTimeMask = kT2Band - 1;

class ArcPolicy final : public EvictionPolicy {
 public:
  void OnInsert(BlockHandle h, uint64_t now_us) override { Insert(h, nullptr, now_us); }
  void OnInsertKeyed(BlockHandle h, const BlockKey& key, uint64_t now_us) override { Insert(h, &key, now_us); }

  void OnAccess(BlockHandle h, uint64_t now_us) override {
    auto it = blocks_.find(h);
    if (it == blocks_.end()) return;
    Block& b = it->second;
    if (!b.pinned) Lru(b.in_t2).erase(b.node);
    Use(b, now_us);
    if (!b.pinned) b.node = t2_.insert(t2_.end(), h);
  }

  void OnPin(BlockHandle h) override {
    auto it = blocks_.find(h);
    if (it == blocks_.end() || it->second.pinned) return;
    Block& b = it->second;
    parked_.splice(parked_.end(), Lru(b.in_t2), b.node);
    b.pinned = true;
  }

  void OnUnpin(BlockHandle h, uint64_t now_us) override {
    auto it = blocks_.find(h);
    if (it == blocks_.end() || !it->second.pinned) return;
    Block& b = it->second;
    Use(b, now_us);
    t2_.splice(t2_.end(), parked_, b.node);
    b.pinned = false;
  }

  void OnRemove(BlockHandle h) override {
    auto it = blocks_.find(h);
    if (it == blocks_.end()) return;
    Block& b = it->second;
    (b.pinned ? parked_ : Lru(b.in_t2)).erase(b.node);
    (b.in_t2 ? t2_count_ : t1_count_)--;
    if (b.has_key) AddGhost(b.key, b.in_t2);
    const size_t c = blocks_.size();  // before this removal: room is made for a block about to come
    blocks_.erase(it);
    TrimGhosts(c);
  }

  std::optional<EvictionCandidate> Victim() const override {
    const bool t1_first = t1_count_ > p_ || (t1_count_ == p_ && t1_count_ > 0 && last_hit_in_b2_);
    const std::list<BlockHandle>* lists[2] = {&t1_, &t2_};
    if (!t1_first) std::swap(lists[0], lists[1]);
    for (const auto* l : lists) {
      if (l->empty()) continue;
      const Block& b = blocks_.at(l->front());
      return EvictionCandidate{l->front(), (b.in_t2 ? kT2Band : 0) | (b.entered_us & kTimeMask)};
    }
    return std::nullopt;
  }

  size_t size() const override { return blocks_.size(); }
  std::string_view name() const override { return "arc"; }

  // T1's target as a share of the tracked blocks.
  std::optional<double> learned_share() const override {
    // p is capped at c on insertion, so removals can leave it above.
    return blocks_.empty() ? 0.0 : std::min(1.0, static_cast<double>(p_) / static_cast<double>(blocks_.size()));
  }
  void SetLearnedShare(double share) override {
    const double c = static_cast<double>(blocks_.size());
    p_ = share > 0 ? static_cast<size_t>(std::min(share, 1.0) * c) : 0;  // NaN: 0
  }

 private:
  struct Block {
    uint64_t entered_us = 0;  // when it last became MRU of its list
    bool in_t2 = false;
    bool pinned = false;  // node in parked_
    bool has_key = false;
    BlockKey key;
    std::list<BlockHandle>::iterator node;
  };
  struct Ghost {
    bool in_b2;
    std::list<BlockKey>::iterator node;
  };

  std::list<BlockHandle>& Lru(bool t2) { return t2 ? t2_ : t1_; }

  void Use(Block& b, uint64_t now_us) {
    if (!b.in_t2) {
      --t1_count_;
      ++t2_count_;
      b.in_t2 = true;
    }
    b.entered_us = now_us;
  }

  void Insert(BlockHandle h, const BlockKey* key, uint64_t now_us) {
    Block& b = blocks_[h];
    b = Block{};
    b.entered_us = now_us;
    const size_t c = blocks_.size();
    last_hit_in_b2_ = false;
    if (key != nullptr) {
      b.has_key = true;
      b.key = *key;
      auto g = ghosts_.find(*key);
      if (g != ghosts_.end()) {
        const size_t b1 = b1_.size(), b2 = b2_.size();
        if (g->second.in_b2) {
          const size_t delta = std::max<size_t>(b1 / b2, 1);
          p_ = p_ > delta ? p_ - delta : 0;
          last_hit_in_b2_ = true;
        } else {
          p_ = std::min(c, p_ + std::max<size_t>(b2 / b1, 1));
        }
        (g->second.in_b2 ? b2_ : b1_).erase(g->second.node);
        ghosts_.erase(g);
        b.in_t2 = true;
      }
    }
    (b.in_t2 ? t2_count_ : t1_count_)++;
    b.node = Lru(b.in_t2).insert(Lru(b.in_t2).end(), h);
    p_ = std::min(p_, c);
    TrimGhosts(c);
  }

  void AddGhost(const BlockKey& key, bool in_b2) {
    auto [it, fresh] = ghosts_.try_emplace(key);
    if (!fresh) (it->second.in_b2 ? b2_ : b1_).erase(it->second.node);
    std::list<BlockKey>& l = in_b2 ? b2_ : b1_;
    it->second = {in_b2, l.insert(l.end(), key)};
  }

  void DropOldestGhost(std::list<BlockKey>& l) {
    ghosts_.erase(l.front());
    l.pop_front();
  }

  // ARC's case IV with capacity c: |T1| + |B1| <= c, and all four <= 2c.
  void TrimGhosts(size_t c) {
    while (!b1_.empty() && t1_count_ + b1_.size() > c) DropOldestGhost(b1_);
    while (t1_count_ + t2_count_ + b1_.size() + b2_.size() > 2 * c) {
      DropOldestGhost(b2_.empty() ? b1_ : b2_);
    }
  }

  std::unordered_map<BlockHandle, Block> blocks_;
  std::list<BlockHandle> t1_, t2_;      // unpinned; front = LRU
  std::list<BlockHandle> parked_;       // pinned, of either list
  size_t t1_count_ = 0, t2_count_ = 0;  // pinned ones included
  std::list<BlockKey> b1_, b2_;         // front = LRU
  std::unordered_map<BlockKey, Ghost> ghosts_;
  size_t p_ = 0;
  bool last_hit_in_b2_ = false;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeArcPolicy() { return std::make_unique<ArcPolicy>(); }

}  // namespace kvtier
