#include "daemon/engine/above_mover.h"

#include <future>
#include <string>
#include <utility>

#include "common/logging.h"

namespace kvtier {
namespace {

// Runs `start` (which takes a ReadDone) and waits for its completion.
template <typename Start>
Result<size_t> ReadAndWait(Start&& start) {
  std::promise<Result<size_t>> done;
  auto future = done.get_future();
  Status started = start([&done](Result<size_t> r) { done.set_value(std::move(r)); });
  if (!started.ok()) return started;
  return future.get();
}

}  // namespace

AboveMover::AboveMover(BlockTier& above, BlockTier& host, const Clock& clock, RetryScheduler& retries, size_t max_jobs,
                       Hooks hooks, const EventTap* events)
    : host_(host),
      clock_(clock),
      retries_(retries),
      hooks_(std::move(hooks)),
      mover_("engine.above_io", 1, 0, max_jobs) {
  source_.measured = std::make_unique<MeasuredTier>(above, events, Tier::kHbm);
  source_.tier = source_.measured.get();
  source_.reported = Tier::kHbm;
}

std::optional<BlockTier::InPlace> AboveMover::Hold(const NamespaceFingerprint& ns, const BlockKey& key,
                                                   uint32_t layer_count, uint64_t payload_bytes) {
  InPlaceHolds* holds = source_.tier->in_place_holds();
  if (holds == nullptr) return std::nullopt;  // clients cannot map the tier
  Result<BlockTier::InPlace> held = holds->HoldInPlace(key);
  if (!held.ok()) return std::nullopt;
  if (held->info.ns != ns) {
    holds->ReleaseInPlace(key, held->offset);
    return std::nullopt;
  }
  {
    MutexLock lock(mu_);
    resident_.Touch(key, clock_.NowUs());
  }
  if (held->info.payload_bytes != payload_bytes || held->info.layer_count != layer_count) {
    holds->ReleaseInPlace(key, held->offset);  // not of the load's layout: it loads through the host tier
    return std::nullopt;
  }
  Bump(in_place_blocks_);
  return *held;
}

void AboveMover::ReleaseHold(const BlockKey& key, uint64_t offset) {
  source_.tier->in_place_holds()->ReleaseInPlace(key, offset);
}

void AboveMover::Offer(const NamespaceFingerprint& ns, const BlockKey& key) {
  {
    MutexLock lock(mu_);
    if (resident_.Contains(key) || !offered_.insert(key).second) return;
  }
  QueueCopyUp(ns, key, CopyUp{});
}

void AboveMover::EndOffer(const BlockKey& key) {
  MutexLock lock(mu_);
  offered_.erase(key);
  cancelled_.erase(key);
}

void AboveMover::QueueCopyUp(const NamespaceFingerprint& ns, const BlockKey& key, CopyUp copy) {
  const bool retrying = copy.bytes != nullptr;
  hooks_.io_started();
  const bool queued = mover_.TrySubmit([this, ns, key, copy] {
    if (!RunCopyUp(ns, key, copy)) EndOffer(key);  // else the write's completion, or its retry, ends the offer
    hooks_.io_finished();
  });
  if (queued) return;
  Bump(retrying ? copy_up_failures_ : offers_dropped_);
  EndOffer(key);
  hooks_.io_finished();
}

bool AboveMover::ReadForCopyUp(const NamespaceFingerprint& ns, const BlockKey& key, CopyUp& first) {
  BlockTier& tier = *source_.tier;
  if (tier.Find(key).has_value()) return false;  // already there (written by an earlier offer)
  std::optional<BlockTier::BlockInfo> info = host_.Find(key);
  if (!info || info->ns != ns || tier.StoredBytes(info->payload_bytes) > tier.capacity_bytes()) {
    Bump(copy_up_skips_);
    return false;
  }
  std::vector<std::byte>& buffer = up_buffer_;
  buffer.resize(info->payload_bytes);
  Result<size_t> read = ReadAndWait(
      [&](BlockTier::ReadDone done) { return host_.Read(key, 0, info->layer_count, buffer, std::move(done)); });
  if (!read.ok() || *read != buffer.size()) {  // left the host tier meanwhile, or did not verify
    Bump(copy_up_skips_);
    return false;
  }
  first.info = *info;
  first.deadline_us = clock_.NowUs() + kBusyWaitUs;
  return true;
}

bool AboveMover::RunCopyUp(const NamespaceFingerprint& ns, const BlockKey& key, CopyUp copy) {
  if (copy.bytes == nullptr && !ReadForCopyUp(ns, key, copy)) return false;
  BlockTier& tier = *source_.tier;
  const std::span<const std::byte> bytes = copy.bytes != nullptr ? *copy.bytes : up_buffer_;
  const BlockTier::BlockInfo& info = copy.info;
  const uint64_t stored = tier.StoredBytes(info.payload_bytes);
  int fragmented = 0;
  for (;;) {
    while (tier.used_bytes() + stored > tier.capacity_bytes()) {
      if (!EvictOne()) break;
    }
    {
      MutexLock lock(mu_);
      if (cancelled_.count(key) != 0) return false;  // erased since it was read
    }
    // Runs on the tier's thread; ends the offer. An Erase that came while
    // the write was in flight cancelled it (or, had it just completed,
    // its block goes here).
    auto written = [this, &tier, ns, key](Status s) {
      bool erased = false;
      {
        MutexLock lock(mu_);
        offered_.erase(key);
        erased = cancelled_.erase(key) != 0;
        if (s.ok() && !erased) resident_.Insert(key, ns, clock_.NowUs());
      }
      if (s.ok() && erased) tier.Erase(key).IgnoreError();
      if (s.ok()) Bump(copies_up_);
      if (!s.ok() && s.code() != StatusCode::kCancelled) Bump(copy_up_failures_);
      hooks_.io_finished();
    };
    hooks_.io_started();  // the write's: the owner waits for its completion
    Status s = tier.Write(ns, key, info.layer_count, bytes, written, info.payload_checksum);
    if (s.ok()) return true;
    hooks_.io_finished();
    if (s.code() == StatusCode::kAlreadyExists) return false;
    if (s.code() == StatusCode::kBusy && clock_.NowUs() < copy.deadline_us) {
      // Queued again a moment later with its own copy of the bytes (the
      // buffer is this thread's, for the next copy up meanwhile).
      if (copy.bytes == nullptr) {
        copy.bytes = std::make_shared<const std::vector<std::byte>>(bytes.begin(), bytes.end());
      }
      hooks_.io_started();  // the retry's, ended by the job
      const bool scheduled = retries_.RunAfter(kBusyPauseUs, [this, ns, key, copy] {
        QueueCopyUp(ns, key, copy);
        hooks_.io_finished();
      });
      if (scheduled) return true;
      hooks_.io_finished();
    }
    if (s.code() == StatusCode::kNoSpace && fragmented++ < kMaxFragmentedEvictions && EvictOne()) continue;
    Bump(copy_up_failures_);
    return false;
  }
}

bool AboveMover::EvictOne() {
  std::optional<ResidentOrder::Victim> victim;
  {
    MutexLock lock(mu_);
    victim = resident_.PopVictim();
  }
  if (!victim) return false;
  const BlockKey key = victim->key;
  const NamespaceFingerprint ns = victim->ns;
  BlockTier& tier = *source_.tier;
  std::optional<BlockTier::BlockInfo> info = tier.Find(key);
  if (!info || info->ns != ns) return true;  // erased meanwhile: its room is back already
  std::optional<BlockTier::BlockInfo> host = host_.Find(key);
  const bool elsewhere = (host && host->ns == ns) || hooks_.held_below(key, ns);
  if (!elsewhere) {
    std::vector<std::byte>& buffer = down_buffer_;
    buffer.resize(info->payload_bytes);
    Result<size_t> read = ReadAndWait(
        [&](BlockTier::ReadDone done) { return tier.Read(key, 0, info->layer_count, buffer, std::move(done)); });
    Status written = read.ok() ? host_.Write(
                                     ns, key, info->layer_count, buffer, [](Status) {}, info->payload_checksum)
                               : read.status();
    if (written.ok() || written.code() == StatusCode::kAlreadyExists) {
      Bump(demotions_to_host_);
    } else {
      Bump(demotion_failures_);  // counted, not logged: evictions come by the thousand
      spdlog::debug("{}: evicted block {} could not be demoted to the host tier: {}", tier.name(), key.ToHex(),
                    written.ToString());
    }
  }
  tier.Erase(key).IgnoreError();  // gone meanwhile: fine
  Bump(evictions_);
  return true;
}

bool AboveMover::Erase(const NamespaceFingerprint& ns, const BlockKey& key, bool moving) {
  BlockTier& tier = *source_.tier;
  bool offered = false;
  {
    // A copy up queued or in flight must not bring it back.
    MutexLock lock(mu_);
    offered = offered_.count(key) != 0;
    if (offered) cancelled_.insert(key);
  }
  std::optional<BlockTier::BlockInfo> info = tier.Find(key);
  const bool erased = (moving || offered || (info && info->ns == ns)) && tier.Erase(key).ok();
  MutexLock lock(mu_);
  resident_.Remove(key, erased ? nullptr : &ns);
  return erased && info.has_value();
}

void AboveMover::VisitCounters(CounterVisitor& v) const {
  const auto load = [](const std::atomic<int64_t>& c) { return c.load(std::memory_order_relaxed); };
  const std::string name = "engine." + std::string(source_.tier->name());
  v.Visit(name + "_copies_up", load(copies_up_));
  v.Visit(name + "_copy_up_skips", load(copy_up_skips_));
  v.Visit(name + "_copy_up_failures", load(copy_up_failures_));
  v.Visit(name + "_offers_dropped", load(offers_dropped_));
  v.Visit(name + "_evictions", load(evictions_));
  v.Visit(name + "_demotions_to_host", load(demotions_to_host_));
  v.Visit(name + "_demotion_failures", load(demotion_failures_));
  v.Visit(name + "_in_place_blocks", load(in_place_blocks_));
  v.Visit(name + "_lookup_hits", load(source_.lookup_hits));
  v.VisitGauge(name + "_read_bytes_per_s", static_cast<int64_t>(source_.read_meter.estimate().bytes_per_s()));
  mover_.VisitCounters(v);
}

}  // namespace kvtier
