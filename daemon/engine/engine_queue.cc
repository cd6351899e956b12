// Engine queue hints: the facade over RequestQueue (request_queue.h),
// which hands queued chains to the shards' policies, and the Prefetcher
// (prefetcher.h), which reads their prefixes held below the host tier into
// it (its view of the stack: prefetch_stack.h).
#include <algorithm>

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

}  // namespace kvtier
