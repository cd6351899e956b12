#include "policy/expert_panel.h"

#include <algorithm>
#include <cmath>
#include <functional>

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

ExpertPanel::ExpertPanel() {
  for (size_t i = 0; i < kExperts; ++i) {
    experts_[i].real = MakeEvictionPolicy(kExpertNames[i]);
    experts_[i].shadow = MakeEvictionPolicy(kExpertNames[i]);
  }
}

void ExpertPanel::Insert(BlockHandle h, const BlockKey* key, uint64_t now_us) {
  for (Expert& e : experts_) {
    if (key != nullptr) {
      e.real->OnInsertKeyed(h, *key, now_us);
    } else {
      e.real->OnInsert(h, now_us);
    }
  }
}

void ExpertPanel::Access(BlockHandle h, uint64_t now_us) {
  for (Expert& e : experts_) e.real->OnAccess(h, now_us);
}

void ExpertPanel::Hold(BlockHandle h) {
  for (Expert& e : experts_) e.real->OnPin(h);
}

void ExpertPanel::Release(BlockHandle h, uint64_t now_us) {
  for (Expert& e : experts_) e.real->OnUnpin(h, now_us);
}

void ExpertPanel::Remove(BlockHandle h) {
  for (Expert& e : experts_) e.real->OnRemove(h);
}

std::optional<EvictionCandidate> ExpertPanel::Victim() const { return experts_[leader_].real->Victim(); }

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
