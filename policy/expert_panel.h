// ExpertPanel: an eviction order that follows whichever classic policy
// would be hitting most on the workload seen lately. QueueAwarePolicy uses
// it for the blocks no hint says anything about (docs/POLICIES.md).
//
// Experts: LRU, LRU-2 and ARC (eviction_policy.h): recency, frequency and
// an adaptive mix.
//   - The leader alone has a real instance: it tracks the blocks the
//     caller tracks; the caller pins in it the blocks it orders itself
//     (Hold/Release), so its Victim() names the next block of the panel's
//     order. When another expert takes the lead, its real instance is
//     built from what the caller knows of each block (Rebuild: the last
//     two uses, the key, whether held), at the caller's next Victim(); one
//     instance instead of three is most of the panel's memory and time.
//   - Each expert has a shadow instance that simulates a cache of its own
//     on the stream of referenced keys (Reference) and says, for each,
//     whether it hit.
// S3-FIFO is not an expert: its shadow's key hits overstate its prefix
// hits (on multi-round QA at 50 blocks it hits 10% more keys than LRU's
// shadow, and 1.4% fewer prefix tokens in replay), so following it costs
// hits. FIFO never leads LRU by a margin worth a switch.
//
// Shadows have the capacity the caller runs at: the most blocks it tracked
// (NoteCapacity) during the last epoch, or more as soon as it tracks more,
// so a shadow never holds more keys than the caller holds blocks. Above
// kMaxShadowBlocks, the shadows see a fixed share of the keys, chosen by
// key hash (spatial sampling as in SHARDS, Waldspurger et al., FAST 2015),
// with the capacity scaled by that share, so their cost stays bounded at
// any cache size.
//
// The leader starts as LRU. For each other expert the panel tallies the
// sampled references it hit and the leader missed (wins) and the reverse
// (losses), decayed by kDecay each epoch (twice the shadow capacity in
// sampled references, at least kMinEpoch). At an epoch's end, after
// kWarmEpochs, the expert with the largest lead (wins - losses) becomes
// the leader if that lead is at least kMinLead and over two standard
// deviations of the disagreements (McNemar's test: 2 sqrt(wins + losses));
// the tallies then start over against the new leader.
//
// Costs: each call is one call on the real instance, and a sampled
// reference one on each shadow (3); see eviction_policy.h for theirs. A
// rebuild is O(n log n) for n blocks (their uses sorted by order), once
// per change of leader, which needs at least kWarmEpochs epochs first and
// one epoch between changes; the caller holds its lock meanwhile (measured
// ad hoc: about 20 ms at 10^5 blocks, 0.2 s at 10^6, on the 2-core CI
// machine).
// Not thread-safe, like every policy.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvtier/block_key.h"
#include "policy/eviction_policy.h"

namespace kvtier {

class ExpertPanel {
 public:
  static constexpr size_t kExperts = 3;
  static constexpr size_t kMaxShadowBlocks = 16384;
  static constexpr uint64_t kMinEpoch = 256;
  static constexpr double kDecay = 0.75;      // a tally's weight after one more epoch
  static constexpr double kMinLead = 8;       // hits: a smaller lead never changes the leader
  static constexpr uint64_t kWarmEpochs = 4;  // epochs before the leader may change

  // The uses of one block that the real instance saw, in the order the
  // panel saw them (insertions, accesses, releases). The caller keeps one
  // beside each block and passes it to each call that is a use, so that a
  // new leader's instance can be built from them (Rebuild).
  struct Uses {
    uint64_t last_us = 0;
    uint64_t last_order = 0;  // the panel's count of uses at this one (from 1)
    uint64_t previous_us = 0;
    uint64_t previous_order = 0;  // 0: used once
  };
  // One block the caller tracks, for Rebuild.
  struct BlockRecord {
    BlockHandle handle = 0;
    const BlockKey* key = nullptr;  // null: inserted without a key
    Uses uses;
    bool held = false;  // Hold without Release
  };

  ExpertPanel();

  // The real instance: the same contract as EvictionPolicy's calls of the
  // same names. `key` null: a block no reference names.
  // Each of Insert, Access and Release is a use, noted in `uses`.
  void Insert(BlockHandle h, const BlockKey* key, uint64_t now_us, Uses& uses);
  void Access(BlockHandle h, uint64_t now_us, Uses& uses);
  // `h` leaves the panel's order until Release (which counts as a use at
  // `now_us`). Holds do not nest.
  void Hold(BlockHandle h);
  void Release(BlockHandle h, uint64_t now_us, Uses& uses);
  void Remove(BlockHandle h);
  // The real instance's victim among the blocks not held: the leader's,
  // or, while rebuild_wanted(), that of the expert last built.
  std::optional<EvictionCandidate> Victim() const;

  // A new leader waits for its real instance: the caller passes Rebuild a
  // record of every block it tracks in the panel before it asks Victim().
  bool rebuild_wanted() const { return real_expert_ != leader_; }
  // Replaces the real instance with one of the leader's, fed `blocks`' last
  // two uses in the order they came (each block inserted at the first,
  // accessed at the second), then holding the held ones; an adaptive
  // expert (ARC) takes the target its shadow learned (learned_share). What
  // else the old one knew (earlier uses, LRU-2's history of removed keys,
  // ARC's ghosts) is not carried over.
  void Rebuild(std::span<const BlockRecord> blocks);

  // A read or a write of `key` by a request: the shadows' input.
  void Reference(const BlockKey& key, uint64_t now_us);
  // The caller tracks `blocks` blocks: the capacity, in blocks, that the
  // shadows simulate (scaled by the sampled share) is the most noted since
  // the last epoch began, and grows at once when a note exceeds it. The
  // caller notes its size at each insertion and each Victim().
  void NoteCapacity(size_t blocks);

  size_t leader() const { return leader_; }
  std::string_view expert_name(size_t i) const;
  // Keys expert i's shadow holds now.
  size_t shadow_blocks(size_t i) const { return experts_[i].shadow_blocks; }
  // What expert i's shadow has learned (EvictionPolicy::learned_share).
  std::optional<double> shadow_learned_share(size_t i) const { return experts_[i].shadow->learned_share(); }

 private:
  struct Expert {
    std::unique_ptr<EvictionPolicy> shadow;
    size_t shadow_blocks = 0;  // keys its shadow holds
    // Against the current leader, decayed by kDecay each epoch: the
    // sampled references this shadow hit and the leader's missed (wins),
    // and the reverse (losses).
    double wins = 0;
    double losses = 0;
  };
  bool Sampled(const BlockKey& key) const;
  void NoteUse(Uses& uses, uint64_t now_us);
  // A key some shadow holds, or that is being referenced: one slot, shared
  // by the shadows, whose index is the key's handle in each of them.
  struct ShadowSlot {
    BlockKey key;
    uint8_t holders = 0;  // bit i: expert i's shadow holds the key
  };
  // Whether expert i's shadow hit slot `s`; on a miss it makes room and
  // inserts the key.
  bool ShadowReference(size_t i, uint32_t s, uint64_t now_us);
  // Expert i's shadow dropped slot `s`: freed when no shadow holds it.
  void ShadowDropped(size_t i, uint32_t s);
  void SetCapacity(size_t blocks);
  void EndEpoch();

  std::array<Expert, kExperts> experts_;
  std::unique_ptr<EvictionPolicy> real_;  // tracks the caller's blocks in the order of expert real_expert_
  size_t real_expert_ = 0;
  uint64_t uses_ = 0;  // uses noted so far: the order of the next is uses_ + 1
  std::vector<ShadowSlot> slots_;
  std::vector<uint32_t> free_slots_;
  std::unordered_map<BlockKey, uint32_t> slot_of_;  // the keys of slots_ in use
  size_t leader_ = 0;                               // experts_[0] is LRU
  size_t capacity_ = 0;                             // the caller's, in blocks
  size_t shadow_capacity_ = 0;                      // capacity_ scaled by the sampled share; 0 before any note
  uint64_t sample_threshold_ = 0;                   // a key is sampled when its mixed hash is below; 0: all keys
  uint64_t epoch_refs_ = 0;
  uint64_t epochs_ = 0;
  size_t epoch_capacity_ = 0;  // the most blocks tracked at a NoteCapacity this epoch
};

}  // namespace kvtier
