// Engine queue hints: the facade over RequestQueue (request_queue.h),
// which hands queued chains to the shards' policies, and the Prefetcher
// (prefetcher.h), which reads their prefixes held below the host tier into
// it; plus the prefetcher's hooks into the stack.
#include <algorithm>

#include "daemon/engine/block_index.h"
#include "daemon/engine/engine.h"

namespace kvtier {

Status Engine::Enqueue(ConnectionId connection, const NamespaceFingerprint& ns, uint64_t request,
                       std::span<const BlockKey> chain, uint64_t start_in_us, uint64_t conversation) {
  // Clamped: a far-off (or wrapped-around) start would overflow the clock.
  start_in_us = std::min(start_in_us, kMaxStartInUs);
  if (Status s = queue_.Add(connection, ns, request, chain, clock_.NowUs() + start_in_us, conversation); !s.ok()) {
    return s;
  }
  lineage_.Record(chain, conversation);
  Bump(counters_.enqueues);
  SchedulePrefetch();
  return Status::Ok();
}

Status Engine::Dequeue(ConnectionId connection, uint64_t request) {
  if (Status s = queue_.Remove(connection, request); !s.ok()) return s;
  Bump(counters_.dequeues);
  // Blocks prefetched for it that it used no longer hold the budget: the
  // next requests may have it.
  SchedulePrefetch();
  return Status::Ok();
}

void Engine::ConversationHint(uint64_t conversation, bool open) {
  lineage_.SetConversation(conversation, open);
  queue_.SetConversation(conversation, open);
}

void Engine::SchedulePrefetch() {
  if (!prefetcher_->enabled() || !prefetcher_->TryScheduling()) return;
  IoStarted();  // the plan's, so WaitForIdle covers it
  const bool queued = reader_->TrySubmit([this] {
    // Cleared first: a change from here on schedules the next plan.
    prefetcher_->Scheduled();
    prefetcher_->Run();
    IoFinished();
  });
  if (!queued) {
    prefetcher_->Scheduled();
    Bump(counters_.prefetch_plans_busy);
    IoFinished();
  }
}

size_t Engine::Prefetch() { return prefetcher_->Run(); }

Prefetcher::Stack Engine::PrefetchStack() {
  Prefetcher::Stack stack;
  // In DRAM (or on its way), below (the first tier below is the planner's
  // nvme channel, any lower one its remote channel), or nowhere.
  stack.place = [this](const NamespaceFingerprint& ns, const BlockKey& key) {
    PrefetchBlock b{key, 0, BlockPlace::kNowhere};
    {
      BlockIndex& shard = ShardFor(key);
      MutexLock lock(shard.mu);
      auto it = shard.index.find(key);
      if (it != shard.index.end() && it->second.ns == ns && (it->second.cached() || it->second.promoting())) {
        b.place = BlockPlace::kHost;
        return b;
      }
    }
    if (std::optional<Located> below = FindBelow(key, ns)) {
      b.place = BlockPlace::kBelow;
      b.level = static_cast<uint32_t>(below->level);
      b.bytes = below->info.payload_bytes;
    }
    return b;
  };
  stack.read_bandwidths = [this] {
    std::vector<BandwidthEstimate> bandwidths;  // one read channel per tier below
    for (const auto& b : below_) bandwidths.push_back(b->read_meter.estimate());
    return bandwidths;
  };
  stack.unused_prefetched_bytes = [this] {
    uint64_t bytes = 0;
    for (auto& shard : shards_) {
      MutexLock lock(shard->mu);
      bytes += shard->prefetched_bytes;
    }
    return bytes;
  };
  stack.start_read = [this](const NamespaceFingerprint& ns, const BlockKey& key) -> std::optional<uint64_t> {
    std::optional<Located> below = FindBelow(key, ns);
    if (!below) return std::nullopt;  // evicted meanwhile
    {
      // Claim the key as a Pin's promotion does: pins wait for this read.
      BlockIndex& shard = ShardFor(key);
      MutexLock lock(shard.mu);
      if (shard.index.count(key) != 0) return std::nullopt;  // cached or being written meanwhile
      shard.BeginPromotion(key, ns, below->info.payload_bytes, /*prefetched=*/true);
    }
    prefetcher_->ReadStarted();
    promoter_->Promote(key, *below);
    return below->info.payload_bytes;
  };
  return stack;
}

}  // namespace kvtier
