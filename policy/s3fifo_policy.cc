// S3-FIFO (Yang et al., SOSP 2023): a small FIFO queue S for new blocks,
// a main FIFO queue M, and a ghost queue G of keys recently evicted from S.
// Each block counts its uses up to 3 (an access or the end of a pin; the
// insertion is not one). The capacity c is the number of tracked blocks
// (size()): S's share is 10% of c, M's and G's 90%.
//
// Choosing a victim: while S holds at least 10% of c (pinned blocks count)
// and has an unpinned block, S's oldest unpinned block is looked at: used
// twice or more, it moves to M's tail with its count reset; else it is the
// victim (and its key goes to G when removed). Otherwise M's oldest
// unpinned block is looked at: used, it goes back to M's tail with one use
// less; else it is the victim. This moving happens inside Victim() on
// mutable state (logically const: it changes no victim order the paper
// does not), so Victim() twice in a row names the same block. A block
// inserted while its key is in G goes to M's tail; else to S's tail.
//
// Layout: S and M are ordered maps keyed by a sequence number taken when the
// block entered its queue, so a pinned block, taken out while pinned,
// returns to its place (O(log n)); appends use the end hint (amortised
// O(1)). G is a list of keys with a hash map, trimmed to 90% of c oldest
// first. Every move in Victim() is paid for by an earlier use, so Victim()
// is amortised O(1) plus the O(log n) of the map operations.
#include <list>
#include <map>
#include <unordered_map>

#include "policy/eviction_policy.h"

namespace kvtier {
namespace {

constexpr uint64_t kMainBand = uint64_t{1} << 63;
constexpr uint64_t kTimeMask = kMainBand - 1;
constexpr uint8_t kMaxUses = 3;
constexpr uint8_t kUsesToMain = 2;

class S3FifoPolicy final : public EvictionPolicy {
 public:
  void OnInsert(BlockHandle h, uint64_t now_us) override { Insert(h, nullptr, now_us); }
  void OnInsertKeyed(BlockHandle h, const BlockKey& key, uint64_t now_us) override { Insert(h, &key, now_us); }

  void OnAccess(BlockHandle h, uint64_t now_us) override {
    Touch(now_us);
    auto it = blocks_.find(h);
    if (it == blocks_.end()) return;
    if (it->second.uses < kMaxUses) ++it->second.uses;
  }

  void OnPin(BlockHandle h) override {
    auto it = blocks_.find(h);
    if (it == blocks_.end() || it->second.pinned) return;
    Queue(it->second).erase(it->second.seq);
    it->second.pinned = true;
  }

  void OnUnpin(BlockHandle h, uint64_t now_us) override {
    Touch(now_us);
    auto it = blocks_.find(h);
    if (it == blocks_.end() || !it->second.pinned) return;
    Block& b = it->second;
    b.pinned = false;
    if (b.uses < kMaxUses) ++b.uses;
    Queue(b).emplace(b.seq, h);
  }

  void OnRemove(BlockHandle h) override {
    auto it = blocks_.find(h);
    if (it == blocks_.end()) return;
    Block& b = it->second;
    if (!b.pinned) Queue(b).erase(b.seq);
    if (!b.in_main) {
      --small_count_;
      if (b.has_key) Ghost(b.key);
    }
    blocks_.erase(it);
    TrimGhosts();
  }

  std::optional<EvictionCandidate> Victim() const override {
    for (;;) {
      const bool from_small = !small_.empty() && (main_.empty() || 10 * small_count_ >= blocks_.size());
      if (from_small) {
        auto head = small_.begin();
        Block& b = blocks_.at(head->second);
        if (b.uses < kUsesToMain) return EvictionCandidate{head->second, b.entered_us & kTimeMask};
        // Used twice: promoted to M's tail, its count reset.
        const BlockHandle h = head->second;
        small_.erase(head);
        --small_count_;
        b.in_main = true;
        b.uses = 0;
        Append(main_, h, b);
        continue;
      }
      if (main_.empty()) return std::nullopt;
      auto head = main_.begin();
      Block& b = blocks_.at(head->second);
      if (b.uses == 0) return EvictionCandidate{head->second, kMainBand | (b.entered_us & kTimeMask)};
      // Used: another round in M with one use less.
      const BlockHandle h = head->second;
      main_.erase(head);
      --b.uses;
      Append(main_, h, b);
    }
  }

  size_t size() const override { return blocks_.size(); }
  std::string_view name() const override { return "s3fifo"; }

 private:
  struct Block {
    uint64_t seq = 0;         // its key in its queue
    uint64_t entered_us = 0;  // when it entered its queue
    uint8_t uses = 0;
    bool in_main = false;
    bool pinned = false;  // not in its queue's map
    bool has_key = false;
    BlockKey key;
  };
  using Fifo = std::map<uint64_t, BlockHandle>;

  Fifo& Queue(const Block& b) const { return b.in_main ? main_ : small_; }

  // Enters `b` at the tail of `q` at the latest time seen.
  void Append(Fifo& q, BlockHandle h, Block& b) const {
    b.seq = ++seq_;
    b.entered_us = now_us_;
    q.emplace_hint(q.end(), b.seq, h);
  }

  void Touch(uint64_t now_us) { now_us_ = std::max(now_us_, now_us); }

  void Insert(BlockHandle h, const BlockKey* key, uint64_t now_us) {
    Touch(now_us);
    Block& b = blocks_[h];
    b = Block{};
    if (key != nullptr) {
      b.has_key = true;
      b.key = *key;
      auto g = ghosts_.find(*key);
      if (g != ghosts_.end()) {
        b.in_main = true;
        ghost_order_.erase(g->second);
        ghosts_.erase(g);
      }
    }
    if (!b.in_main) ++small_count_;
    b.seq = ++seq_;
    b.entered_us = now_us;
    Queue(b).emplace_hint(Queue(b).end(), b.seq, h);
    TrimGhosts();
  }

  void Ghost(const BlockKey& key) {
    auto [it, fresh] = ghosts_.try_emplace(key);
    if (!fresh) ghost_order_.erase(it->second);
    it->second = ghost_order_.insert(ghost_order_.end(), key);
  }

  void TrimGhosts() {
    const size_t bound = blocks_.size() - blocks_.size() / 10;
    while (ghosts_.size() > bound) {
      ghosts_.erase(ghost_order_.front());
      ghost_order_.pop_front();
    }
  }

  mutable std::unordered_map<BlockHandle, Block> blocks_;
  mutable Fifo small_;              // unpinned blocks of S, begin = oldest
  mutable Fifo main_;               // unpinned blocks of M, begin = oldest
  mutable size_t small_count_ = 0;  // blocks of S, pinned ones included
  std::unordered_map<BlockKey, std::list<BlockKey>::iterator> ghosts_;
  std::list<BlockKey> ghost_order_;  // front = evicted first
  mutable uint64_t seq_ = 0;
  uint64_t now_us_ = 0;  // the latest time given
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeS3FifoPolicy() { return std::make_unique<S3FifoPolicy>(); }

}  // namespace kvtier
