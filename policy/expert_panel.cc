#include "policy/expert_panel.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <tuple>

namespace kvtier {
namespace {

constexpr std::string_view kExpertNames[ExpertPanel::kExperts] = {"lru", "lru2", "arc"};
constexpr uint64_t kSampleSpace = uint64_t{1} << 32;  // sampling compares the top 32 bits of a mixed hash

uint64_t Mix(uint64_t x) {  // splitmix64's finaliser: spreads every bit of the key's hash
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

ExpertPanel::ExpertPanel() : real_(MakeEvictionPolicy(kExpertNames[0])) {
  for (size_t i = 0; i < kExperts; ++i) experts_[i].shadow = MakeEvictionPolicy(kExpertNames[i]);
}

std::string_view ExpertPanel::expert_name(size_t i) const { return kExpertNames[i]; }

void ExpertPanel::NoteUse(Uses& uses, uint64_t now_us) {
  uses.previous_us = uses.last_us;
  uses.previous_order = uses.last_order;
  uses.last_us = now_us;
  uses.last_order = ++uses_;
}

void ExpertPanel::Insert(BlockHandle h, const BlockKey* key, uint64_t now_us, Uses& uses) {
  uses = Uses{};
  NoteUse(uses, now_us);
  if (key != nullptr) {
    real_->OnInsertKeyed(h, *key, now_us);
  } else {
    real_->OnInsert(h, now_us);
  }
}

void ExpertPanel::Access(BlockHandle h, uint64_t now_us, Uses& uses) {
  NoteUse(uses, now_us);
  real_->OnAccess(h, now_us);
}

void ExpertPanel::Hold(BlockHandle h) { real_->OnPin(h); }

void ExpertPanel::Release(BlockHandle h, uint64_t now_us, Uses& uses) {
  NoteUse(uses, now_us);
  real_->OnUnpin(h, now_us);
}

void ExpertPanel::Remove(BlockHandle h) { real_->OnRemove(h); }

std::optional<EvictionCandidate> ExpertPanel::Victim() const { return real_->Victim(); }

void ExpertPanel::Rebuild(std::span<const BlockRecord> blocks) {
  // Every block's last two uses in the order they came, the first of each
  // an insertion: times alone would not do, as many uses share one time
  // (a request's chain) and the order among them is the classics' order.
  struct Use {
    uint64_t order = 0;
    uint64_t time_us = 0;
    size_t block = 0;
    bool first = false;
  };
  std::vector<Use> uses;
  uses.reserve(2 * blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    const Uses& u = blocks[i].uses;
    const bool twice = u.previous_order != 0;
    if (twice) uses.push_back(Use{u.previous_order, u.previous_us, i, true});
    uses.push_back(Use{u.last_order, u.last_us, i, !twice});
  }
  std::sort(uses.begin(), uses.end(), [](const Use& x, const Use& y) { return x.order < y.order; });
  real_ = MakeEvictionPolicy(kExpertNames[leader_]);
  real_expert_ = leader_;
  for (const Use& u : uses) {
    const BlockRecord& b = blocks[u.block];
    if (!u.first) {
      real_->OnAccess(b.handle, u.time_us);
    } else if (b.key != nullptr) {
      real_->OnInsertKeyed(b.handle, *b.key, u.time_us);
    } else {
      real_->OnInsert(b.handle, u.time_us);
    }
  }
  // An adaptive expert starts from what its shadow learned (ARC's target
  // share): its own history is what the records leave out.
  if (std::optional<double> share = experts_[leader_].shadow->learned_share()) real_->SetLearnedShare(*share);
  for (const BlockRecord& b : blocks) {
    if (b.held) real_->OnPin(b.handle);
  }
}

void ExpertPanel::NoteCapacity(size_t blocks) {
  epoch_capacity_ = std::max(epoch_capacity_, blocks);
  if (blocks > capacity_) SetCapacity(blocks);  // growth counts at once, a shrink at the epoch's end
}

void ExpertPanel::SetCapacity(size_t blocks) {
  if (blocks == 0) return;
  capacity_ = blocks;
  if (blocks <= kMaxShadowBlocks) {
    sample_threshold_ = 0;
    shadow_capacity_ = blocks;
  } else {
    sample_threshold_ = kSampleSpace * kMaxShadowBlocks / blocks;
    shadow_capacity_ = kMaxShadowBlocks;
  }
}

bool ExpertPanel::Sampled(const BlockKey& key) const {
  return sample_threshold_ == 0 || (Mix(std::hash<BlockKey>{}(key)) >> 32) < sample_threshold_;
}

void ExpertPanel::Reference(const BlockKey& key, uint64_t now_us) {
  if (!Sampled(key)) return;
  auto [it, fresh] = slot_of_.try_emplace(key, 0);
  if (fresh) {
    if (free_slots_.empty()) {
      it->second = static_cast<uint32_t>(slots_.size());
      slots_.push_back(ShadowSlot{key, 0});
    } else {
      it->second = free_slots_.back();
      free_slots_.pop_back();
      slots_[it->second] = ShadowSlot{key, 0};
    }
  }
  const uint32_t s = it->second;  // `it` may not survive the shadows' evictions
  std::array<bool, kExperts> hit{};
  for (size_t i = 0; i < kExperts; ++i) hit[i] = ShadowReference(i, s, now_us);
  for (size_t i = 0; i < kExperts; ++i) {
    if (hit[i] != hit[leader_]) (hit[i] ? experts_[i].wins : experts_[i].losses) += 1;
  }
  const uint64_t epoch = std::max<uint64_t>(kMinEpoch, 2 * uint64_t{shadow_capacity_});
  if (++epoch_refs_ >= epoch) EndEpoch();
}

bool ExpertPanel::ShadowReference(size_t i, uint32_t s, uint64_t now_us) {
  Expert& e = experts_[i];
  const uint8_t bit = static_cast<uint8_t>(1u << i);
  if ((slots_[s].holders & bit) != 0) {
    e.shadow->OnAccess(s, now_us);
    return true;
  }
  // A miss: the key comes in, after the shadow's victims make room (never
  // slot s: this shadow does not hold it).
  while (shadow_capacity_ != 0 && e.shadow_blocks >= shadow_capacity_) {
    const std::optional<EvictionCandidate> victim = e.shadow->Victim();
    if (!victim) break;
    e.shadow->OnRemove(victim->handle);
    ShadowDropped(i, static_cast<uint32_t>(victim->handle));
  }
  slots_[s].holders |= bit;
  ++e.shadow_blocks;
  e.shadow->OnInsertKeyed(s, slots_[s].key, now_us);
  return false;
}

void ExpertPanel::ShadowDropped(size_t i, uint32_t s) {
  --experts_[i].shadow_blocks;
  ShadowSlot& slot = slots_[s];
  slot.holders &= static_cast<uint8_t>(~(1u << i));
  if (slot.holders != 0) return;
  slot_of_.erase(slot.key);
  free_slots_.push_back(s);
}

void ExpertPanel::EndEpoch() {
  epoch_refs_ = 0;
  SetCapacity(epoch_capacity_);
  epoch_capacity_ = 0;
  // McNemar's test on the references where an expert and the leader
  // disagree: a lead inside two standard deviations is noise, and
  // following noise costs hits. Nor is a lead of a few hits worth a
  // switch, nor the first epochs', when a cold cache's misses dominate.
  size_t best = leader_;
  double best_lead = 0;
  const bool warm = ++epochs_ > kWarmEpochs;
  for (size_t i = 0; warm && i < kExperts; ++i) {
    const Expert& e = experts_[i];
    const double lead = e.wins - e.losses;
    if (i != leader_ && lead >= kMinLead && lead > 2 * std::sqrt(e.wins + e.losses) && lead > best_lead) {
      best = i;
      best_lead = lead;
    }
  }
  for (Expert& e : experts_) {
    e.wins = best == leader_ ? e.wins * kDecay : 0;  // a new leader: the tally starts over against it
    e.losses = best == leader_ ? e.losses * kDecay : 0;
  }
  leader_ = best;
}

}  // namespace kvtier
