#include "daemon/engine/evictor.h"

#include <chrono>
#include <limits>
#include <string>

#include "common/check.h"
#include "daemon/engine/block_index.h"
#include "policy/demotion_target.h"

namespace kvtier {
namespace {

// An allocation gives up after this many evictions without finding room
// (guards against pathological churn; each eviction frees real space).
constexpr int kMaxEvictionsPerAllocation = 1 << 16;
// How long an allocation waits for a growing arena's next step (64 MiB at
// about 4 GiB/s: 16 ms) before it evicts: it may run on a server thread.
constexpr std::chrono::milliseconds kGrowthWait{20};

}  // namespace

Evictor::Evictor(const std::vector<std::unique_ptr<BlockIndex>>& shards, HostTier& host,
                 const std::vector<std::unique_ptr<TierLevel>>& below, const Lineage& lineage, const Clock& clock,
                 uint64_t lookahead_us, EngineCounters& counters, Hooks hooks)
    : shards_(shards),
      host_(host),
      below_(below),
      lineage_(lineage),
      clock_(clock),
      lookahead_us_(lookahead_us),
      counters_(counters),
      hooks_(std::move(hooks)) {}

Result<HostTier::Extent> Evictor::Allocate(uint64_t bytes) {
  const uint64_t evict_at_most = kEvictionBytesFactor * ArenaAllocator::ClassSize(bytes);
  uint64_t evicted_bytes = 0;
  int victims = 0;
  bool awaited_growth = false;
  for (int attempt = 0; attempt < kMaxEvictionsPerAllocation; ++attempt) {
    Result<HostTier::Extent> extent = host_.Allocate(bytes);
    if (extent.ok() || extent.status().code() != StatusCode::kNoSpace) return extent;
    // An arena still being allocated after a start: its next step, once per
    // allocation, before anything is evicted.
    if (!awaited_growth) {
      awaited_growth = true;
      if (host_.AwaitGrowth(kGrowthWait)) continue;
    }
    // Expired operator holds are released before anything is evicted, so
    // they never keep a block from eviction (holder.h).
    hooks_.release_expired_holds();
    if (victims >= kMinVictimsPerAllocation && evicted_bytes >= evict_at_most) {
      Bump(counters_.eviction_bound_hits);
      return NoSpace(extent.status().message() + "; " + std::to_string(victims) + " blocks (" +
                     std::to_string(evicted_bytes) +
                     " bytes) were evicted without freeing a range that fits (the arena is fragmented): "
                     "giving up rather than flushing the host tier");
    }
    uint64_t freed = 0;
    if (!EvictOne(&freed)) {
      if (hooks_.give_back_waiting && hooks_.give_back_waiting(ArenaAllocator::ClassSize(bytes)) > 0) continue;
      Bump(counters_.eviction_failures);
      return NoSpace(extent.status().message() +
                     "; nothing is evictable: every cached block is pinned or being written");
    }
    if (freed > 0) {  // 0: raced with a use, nothing evicted; look again
      ++victims;
      evicted_bytes += freed;
    }
  }
  Bump(counters_.eviction_failures);
  return NoSpace("no room for " + std::to_string(bytes) + " bytes after " + std::to_string(kMaxEvictionsPerAllocation) +
                 " evictions");
}

TierAdmission::Facts Evictor::GatherFacts(const BlockKey& key, uint64_t uses) const {
  TierAdmission::Facts facts;
  facts.uses = uses;
  if (std::optional<Lineage::Info> info = lineage_.Find(key)) {
    if (info->conversation != 0) facts.conversation = lineage_.ConversationState(info->conversation);
    if (info->parent) facts.parent_held = HeldAnywhere(*info->parent);
  }
  return facts;
}

bool Evictor::EvictOne(uint64_t* evicted_bytes) {
  // Find the shard whose policy ranks its victim lowest, one lock at a time.
  size_t best = shards_.size();
  uint64_t best_rank = std::numeric_limits<uint64_t>::max();
  BlockHandle best_handle = 0;
  BlockKey best_key{};
  for (size_t i = 0; i < shards_.size(); ++i) {
    MutexLock lock(shards_[i]->mu);
    auto candidate = shards_[i]->policy->Victim();
    if (candidate && (best == shards_.size() || candidate->rank < best_rank)) {
      best = i;
      best_rank = candidate->rank;
      best_handle = candidate->handle;
      best_key = shards_[i]->committed.at(candidate->handle);
    }
  }
  if (best == shards_.size()) return false;
  // What admission weighs, gathered with no shard lock held: the parent may
  // live in another shard. Uses are filled in under the lock.
  TierAdmission::Facts facts;
  if (!below_.empty()) facts = GatherFacts(best_key, 0);
  BlockIndex& shard = *shards_[best];
  MutexLock lock(shard.mu);
  auto candidate = shard.policy->Victim();
  if (!candidate || candidate->handle != best_handle) return true;  // raced with a pin or a use; the caller retries
  auto key = shard.committed.find(candidate->handle);
  KVTIER_CHECK(key != shard.committed.end(), "policy names an unknown block");
  auto it = shard.index.find(key->second);
  KVTIER_CHECK(it != shard.index.end() && it->second.state() == BlockState::kCommitted, "victim is pinned or missing");
  facts.uses = it->second.hits;
  Bump(counters_.evictions);
  if (it->second.prefetched) Bump(counters_.prefetches_unused);  // read in for a request that never used it
  if (evicted_bytes != nullptr) *evicted_bytes = it->second.extent.length;
  const bool needed = shard.policy->NeededWithin(candidate->handle, clock_.NowUs(), lookahead_us_);
  if (needed) Bump(counters_.needed_evictions);
  // The first tier below that takes it. A block some tier below already
  // holds (promoted from there) costs no write. A block a queued request
  // needs soon goes to the first tier whatever its admission says (its
  // bytes are still charged); any other goes through each tier's admission
  // in turn, and one that none takes is dropped.
  const DemotionTarget choice = ChooseDemotionTarget(
      below_.size(), needed, [&](size_t level) { return below_[level]->tier->Find(it->first).has_value(); },
      [&](size_t level) { return below_[level]->admission->Force(it->second.size); },
      [&](size_t level) { return below_[level]->admission->Admit(it->second.size, facts); });
  if (choice.forced) Bump(counters_.forced_demotions);
  const std::optional<size_t> target = choice.level;
  const bool held_below = choice.held_below;
  if (!target) {
    if (!below_.empty() && !held_below) Bump(counters_.admission_drops);
    shard.RemoveCommitted(it);
    return true;
  }
  // Take it out of the index but keep its bytes until the tier has copied
  // them (Demote copies before it returns), outside the shard lock.
  const BlockKey victim = it->first;
  const BlockEntry entry = shard.BeginDemotion(it, *target);
  lock.Unlock();
  hooks_.demote(*target, entry.ns, victim, entry.extent, entry.size, entry.checksum);
  host_.Free(entry.extent);
  return true;
}

bool Evictor::HeldAnywhere(const BlockKey& key) const {
  {
    BlockIndex& shard = ShardOf(shards_, key);
    MutexLock lock(shard.mu);
    if (shard.index.count(key) > 0 || shard.demoting.count(key) > 0) return true;
  }
  for (const auto& b : below_) {
    if (b->tier->Find(key)) return true;
  }
  return false;
}

}  // namespace kvtier
