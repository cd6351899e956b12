// The parts' hooks into the engine: what the prefetcher (its view of the
// stack, prefetch_stack.h), the demoter, the above mover, the promoter,
// the pinner, the layer streamer, the locator, the writer, the loader, the
// stack report, the corruption check and the host tier's BlockTier face
// may ask of it (each part's header says what each hook must do). Built
// once, at construction or in Create; each hook calls back into this
// Engine, which outlives the parts (they are destroyed first).
#include "daemon/engine/engine.h"

#include "daemon/engine/block_index.h"
#include "daemon/engine/prefetch_stack.h"

namespace kvtier {

Prefetcher::Stack Engine::PrefetchHooks() {
  return MakePrefetchStack({shards_, below_, *promoter_, [this] { prefetcher_->ReadStarted(); }});
}

Demoter::Hooks Engine::DemoterHooks() {
  Demoter::Hooks hooks;
  hooks.io_started = [this] { IoStarted(); };
  hooks.io_finished = [this] { IoFinished(); };
  hooks.erased = [this](const BlockKey& key) { return DemotionErased(key); };
  hooks.finished = [this](const BlockKey& key, const Status& written) { FinishDemotion(key, written); };
  hooks.facts = [this](const BlockKey& key, uint64_t uses) { return evictor_->GatherFacts(key, uses); };
  return hooks;
}

AboveMover::Hooks Engine::AboveHooks() {
  AboveMover::Hooks hooks;
  hooks.io_started = [this] { IoStarted(); };
  hooks.io_finished = [this] { IoFinished(); };
  hooks.held_below = [this](const BlockKey& key, const NamespaceFingerprint& ns) {
    return FindBelow(key, ns).has_value();
  };
  return hooks;
}

Promoter::Hooks Engine::PromoterHooks() {
  Promoter::Hooks hooks;
  hooks.io_started = [this] { IoStarted(); };
  hooks.io_finished = [this] { IoFinished(); };
  hooks.allocate = [this](uint64_t bytes) { return evictor_->Allocate(bytes); };
  hooks.source = [this](size_t level) -> TierLevel& { return SourceAt(level); };
  hooks.find_below = [this](const BlockKey& key, const NamespaceFingerprint& ns) { return FindBelow(key, ns); };
  hooks.pin = [this](BlockIndex& shard, ConnectionId connection, const BlockKey& key, uint64_t now_us,
                     bool with_layers) {
    shard.mu.AssertHeld();  // the promoter calls it under the shard's lock
    return pinner_->PinLocked(shard, connection, key, now_us, with_layers);
  };
  hooks.layer_count = [this](const NamespaceFingerprint& ns, uint64_t size) {
    return namespaces_.LayoutOf(ns, size).layer_count;
  };
  hooks.next_handle = [this] { return next_handle_.fetch_add(1, std::memory_order_relaxed); };
  // The last read of a prefetch plan landed: plan again with the measured
  // bandwidth and whatever changed meanwhile. Not after a failure, which a
  // new plan could only repeat (and a synchronous one would recurse).
  hooks.prefetch_read_ended = [this](bool landed) {
    if (prefetcher_->ReadLanded() && landed) SchedulePrefetch();
  };
  return hooks;
}

Pinner::Hooks Engine::PinnerHooks() {
  Pinner::Hooks hooks;
  hooks.find_outside = [this](const BlockKey& key, const NamespaceFingerprint& ns) { return FindOutside(key, ns); };
  hooks.layer_count = [this](const NamespaceFingerprint& ns, uint64_t size) {
    return namespaces_.LayoutOf(ns, size).layer_count;
  };
  if (probing_) {
    hooks.probe = [this](const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
      for (const auto& b : below_) {
        if (Prober* prober = b->tier->prober()) prober->Probe(ns, keys);
      }
    };
  }
  hooks.note_prefetch_use = [this] { prefetcher_->NoteUse(); };
  hooks.uses_noted = [this] {
    if (prefetcher_->TakeUse()) SchedulePrefetch();
  };
  return hooks;
}

LayerStreamer::Hooks Engine::StreamerHooks() {
  LayerStreamer::Hooks hooks;
  hooks.io_started = [this] { IoStarted(); };
  hooks.io_finished = [this] { IoFinished(); };
  hooks.allocate = [this](uint64_t bytes) { return evictor_->Allocate(bytes); };
  hooks.source = [this](size_t level) -> TierLevel& { return SourceAt(level); };
  hooks.find_below = [this](const BlockKey& key, const NamespaceFingerprint& ns) { return FindBelow(key, ns); };
  return hooks;
}

Locator::Hooks Engine::LocatorHooks() {
  Locator::Hooks hooks;
  hooks.above = [this]() -> TierLevel* { return above_ != nullptr ? &above_->source() : nullptr; };
  hooks.find_below = [this](const BlockKey& key, const NamespaceFingerprint& ns) { return FindBelow(key, ns); };
  return hooks;
}

Writer::Hooks Engine::WriterHooks() {
  Writer::Hooks hooks;
  hooks.allocate = [this](uint64_t bytes) { return evictor_->Allocate(bytes); };
  hooks.layer_count = [this](const NamespaceFingerprint& ns, uint64_t size) {
    return namespaces_.LayoutOf(ns, size).layer_count;
  };
  hooks.next_handle = [this] { return next_handle_.fetch_add(1, std::memory_order_relaxed); };
  return hooks;
}

Adopter::Hooks Engine::AdopterHooks() {
  return {[this] { return next_handle_.fetch_add(1, std::memory_order_relaxed); },
          [this](const BlockKey& key) { host_quarantine_.Add(key); }};
}

Loader::Hooks Engine::LoaderHooks() {
  Loader::Hooks hooks;
  hooks.allocate = [this](uint64_t bytes) { return evictor_->Allocate(bytes); };
  hooks.layout = [this](const NamespaceFingerprint& ns) { return namespaces_.Layout(ns); };
  hooks.claim = [this](const std::shared_ptr<PinBatch>& batch, const NamespaceFingerprint& ns,
                       std::span<const BlockKey> keys) {
    pinner_->ProbeUnknown(ns, keys);
    return pinner_->ClaimPins(batch, ns, keys, LayerSpan{});
  };
  hooks.reported = [this](size_t level) { return SourceAt(level).reported; };
  hooks.promote = [this](const BlockKey& key, const Located& from) { promoter_->Promote(key, from); };
  hooks.stream = [this](const std::shared_ptr<LoadRecord>& load, std::span<const PinClaim> claims) {
    streamer_->Start(load, claims);
  };
  hooks.release = [this](ConnectionId connection, std::span<const LeaseId> leases) {
    pinner_->Release(connection, leases);
  };
  hooks.pinned = [this] {
    if (prefetcher_->TakeUse()) SchedulePrefetch();
  };
  hooks.late = [this](const NamespaceFingerprint& ns, std::span<const BlockKey> keys, double budget_us) {
    return estimator_.Late(ns, keys, budget_us, clock_.NowUs());
  };
  if (above_ != nullptr) {
    AboveMover* above = above_.get();
    hooks.hold_above = [above](const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layer_count,
                               uint64_t payload_bytes) { return above->Hold(ns, key, layer_count, payload_bytes); };
    hooks.release_above = [above](const BlockKey& key, uint64_t offset) { above->ReleaseHold(key, offset); };
    hooks.offer_above = [above](const NamespaceFingerprint& ns, const BlockKey& key) { above->Offer(ns, key); };
  }
  return hooks;
}

StackReport::Hooks Engine::ReportHooks() {
  StackReport::Hooks hooks;
  hooks.layer_read_pool_bytes = [this] { return static_cast<int64_t>(promoter_->transient_bytes()); };
  hooks.holds_in_force = [this] { return holder_->InForce(); };
  hooks.loads_open = [this] { return loader_->OpenCount(); };
  hooks.visit_movers = [this](CounterVisitor& v) {
    demoter_->VisitCounters(v);
    reader_->VisitCounters(v);
    retries_->VisitCounters(v);
    host_io_->VisitCounters(v);
  };
  return hooks;
}

CorruptionCheck::Hooks Engine::CorruptionHooks() {
  CorruptionCheck::Hooks hooks;
  hooks.io_started = [this] { IoStarted(); };
  hooks.io_finished = [this] { IoFinished(); };
  hooks.pin = [this](BlockIndex& shard, const BlockKey& key, uint64_t now_us) {
    shard.mu.AssertHeld();  // the check calls it under the shard's lock
    return pinner_->PinLocked(shard, kHostTierConnection, key, now_us, /*with_layers=*/true);
  };
  hooks.release = [this](LeaseId lease) { pinner_->Release(kHostTierConnection, {&lease, 1}); };
  hooks.corrupt = [this](const BlockKey& key) { host_quarantine_.Add(key); };
  return hooks;
}

HostBlockTier::Hooks Engine::HostTierHooks() {
  HostBlockTier::Hooks hooks;
  hooks.io_started = [this] { IoStarted(); };
  hooks.io_finished = [this] { IoFinished(); };
  hooks.layer_count = [this](const NamespaceFingerprint& ns, uint64_t size) {
    return namespaces_.LayoutOf(ns, size).layer_count;
  };
  hooks.corrupt = [this](const BlockKey& key) { host_quarantine_.Add(key); };
  return hooks;
}

}  // namespace kvtier
