// The tier above the host (the HBM tier): what goes up, what loads hold
// there in place, and what its evictions demote into the host tier.
//
// - Up: a block a load into GPU memory found (a hit: reuse evidence) is
//   offered once it is loaded (OfferAbove); the copy runs on above_io_
//   (one thread): read from the host tier through its BlockTier face
//   (verified), room made, written above (the tier stages it; its write
//   completes on the tier's thread and enters its eviction order). A block that left
//   the host tier meanwhile is skipped. A write the tier refuses as Busy
//   is queued on above_io_ again a moment later (the engine's retry
//   scheduler), with the bytes read, until a deadline.
// - In place: AboveHold holds a block where it is for a load (the client
//   copies device to device); a held range outlives an eviction or an
//   Erase until the load ends (InPlaceHolds::HoldInPlace).
// - Down: EvictAboveOne takes the block its order (ResidentOrder, an LRU
//   policy from policy/) ranks first; unless the
//   host tier or a tier below holds it, it is read back and written into
//   the host tier (whose own eviction demotes further as usual), then
//   erased above.
// The mover's jobs and the writes up count as I/O in flight (WaitForIdle
// waits for them).
#include <future>

#include "common/logging.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/block_index.h"
#include "daemon/engine/host_block_tier.h"

namespace kvtier {
namespace {

// A write the tier above refuses as Busy (staging or copy fences in use)
// is retried this long, a pause apart on the engine's clock, before the
// copy up is given up.
constexpr uint64_t kBusyWaitUs = 2'000'000;
constexpr uint64_t kBusyPauseUs = 1'000;
// Evictions one copy up may cause when the tier answers NoSpace with
// bytes free (a fragmented pool), before it gives up.
constexpr int kMaxFragmentedEvictions = 8;

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

std::optional<BlockTier::InPlace> Engine::AboveHold(const NamespaceFingerprint& ns, const BlockKey& key) {
  InPlaceHolds* holds = above_->source.tier->in_place_holds();
  if (holds == nullptr) return std::nullopt;  // clients cannot map the tier
  Result<BlockTier::InPlace> held = holds->HoldInPlace(key);
  if (!held.ok()) return std::nullopt;
  if (held->info.ns != ns) {
    holds->ReleaseInPlace(key, held->offset);
    return std::nullopt;
  }
  TouchAbove(key);
  return *held;
}

void Engine::TouchAbove(const BlockKey& key) {
  MutexLock lock(above_->mu);
  above_->resident.Touch(key, clock_.NowUs());
}

void Engine::OfferAbove(const NamespaceFingerprint& ns, const BlockKey& key) {
  if (above_ == nullptr) return;
  {
    MutexLock lock(above_->mu);
    if (above_->resident.Contains(key) || !above_->offered.insert(key).second) return;
  }
  QueueCopyUp(ns, key, CopyUpRetry{});
}

void Engine::QueueCopyUp(const NamespaceFingerprint& ns, const BlockKey& key, CopyUpRetry retry) {
  const bool retrying = retry.bytes != nullptr;
  IoStarted();
  const bool queued = above_io_->TrySubmit([this, ns, key, retry] {
    if (!CopyUp(ns, key, retry)) {  // else the write's completion, or its retry, ends the offer
      MutexLock lock(above_->mu);
      above_->offered.erase(key);
      above_->cancelled.erase(key);
    }
    IoFinished();
  });
  if (queued) return;
  Bump(retrying ? above_->copy_up_failures : above_->offers_dropped);
  {
    MutexLock lock(above_->mu);
    above_->offered.erase(key);
    above_->cancelled.erase(key);
  }
  IoFinished();
}

bool Engine::ReadForCopyUp(const NamespaceFingerprint& ns, const BlockKey& key, CopyUpRetry& first) {
  BlockTier& tier = *above_->source.tier;
  if (tier.Find(key).has_value()) return false;  // already there (written by an earlier offer)
  std::optional<BlockTier::BlockInfo> info = host_block_tier_->Find(key);
  if (!info || info->ns != ns || tier.StoredBytes(info->payload_bytes) > tier.capacity_bytes()) {
    Bump(above_->copy_up_skips);
    return false;
  }
  std::vector<std::byte>& buffer = above_->up_buffer;
  buffer.resize(info->payload_bytes);
  Result<size_t> read = ReadAndWait([&](BlockTier::ReadDone done) {
    return host_block_tier_->Read(key, 0, info->layer_count, buffer, std::move(done));
  });
  if (!read.ok() || *read != buffer.size()) {  // left the host tier meanwhile, or did not verify
    Bump(above_->copy_up_skips);
    return false;
  }
  first.info = *info;
  first.deadline_us = clock_.NowUs() + kBusyWaitUs;
  return true;
}

bool Engine::CopyUp(const NamespaceFingerprint& ns, const BlockKey& key, CopyUpRetry retry) {
  if (retry.bytes == nullptr && !ReadForCopyUp(ns, key, retry)) return false;
  BlockTier& tier = *above_->source.tier;
  const std::span<const std::byte> bytes = retry.bytes != nullptr ? *retry.bytes : above_->up_buffer;
  const BlockTier::BlockInfo& info = retry.info;
  const uint64_t stored = tier.StoredBytes(info.payload_bytes);
  int fragmented = 0;
  for (;;) {
    while (tier.used_bytes() + stored > tier.capacity_bytes()) {
      if (!EvictAboveOne()) break;
    }
    {
      MutexLock lock(above_->mu);
      if (above_->cancelled.count(key) != 0) return false;  // erased since it was read
    }
    // Runs on the tier's thread; ends the offer. An Erase that came while
    // the write was in flight cancelled it (or, had it just completed,
    // its block goes here).
    auto written = [this, &tier, ns, key](Status s) {
      bool erased = false;
      {
        MutexLock lock(above_->mu);
        above_->offered.erase(key);
        erased = above_->cancelled.erase(key) != 0;
        if (s.ok() && !erased) above_->resident.Insert(key, ns, clock_.NowUs());
      }
      if (s.ok() && erased) tier.Erase(key).IgnoreError();
      if (s.ok()) Bump(above_->copies_up);
      if (!s.ok() && s.code() != StatusCode::kCancelled) Bump(above_->copy_up_failures);
      IoFinished();
    };
    IoStarted();  // the write's: WaitForIdle and ~Engine wait for its completion
    Status s = tier.Write(ns, key, info.layer_count, bytes, written, info.payload_checksum);
    if (s.ok()) return true;
    IoFinished();
    if (s.code() == StatusCode::kAlreadyExists) return false;
    if (s.code() == StatusCode::kBusy && clock_.NowUs() < retry.deadline_us) {
      // Queued again a moment later with its own copy of the bytes (the
      // buffer is this thread's, for the next copy up meanwhile).
      if (retry.bytes == nullptr) {
        retry.bytes = std::make_shared<const std::vector<std::byte>>(bytes.begin(), bytes.end());
      }
      IoStarted();  // the retry's, ended by the job
      const bool scheduled = retries_->RunAfter(kBusyPauseUs, [this, ns, key, retry] {
        QueueCopyUp(ns, key, retry);
        IoFinished();
      });
      if (scheduled) return true;
      IoFinished();
    }
    if (s.code() == StatusCode::kNoSpace && fragmented++ < kMaxFragmentedEvictions && EvictAboveOne()) continue;
    Bump(above_->copy_up_failures);
    return false;
  }
}

bool Engine::EvictAboveOne() {
  std::optional<ResidentOrder::Victim> victim;
  {
    MutexLock lock(above_->mu);
    victim = above_->resident.PopVictim();
  }
  if (!victim) return false;
  const BlockKey key = victim->key;
  const NamespaceFingerprint ns = victim->ns;
  BlockTier& tier = *above_->source.tier;
  std::optional<BlockTier::BlockInfo> info = tier.Find(key);
  if (!info || info->ns != ns) return true;  // erased meanwhile: its room is back already
  std::optional<BlockTier::BlockInfo> host = host_block_tier_->Find(key);
  const bool elsewhere = (host && host->ns == ns) || FindBelow(key, ns).has_value();
  if (!elsewhere) {
    std::vector<std::byte>& buffer = above_->down_buffer;
    buffer.resize(info->payload_bytes);
    Result<size_t> read = ReadAndWait([&](BlockTier::ReadDone done) {
      return tier.Read(key, 0, info->layer_count, buffer, std::move(done));
    });
    Status written = read.ok() ? host_block_tier_->Write(ns, key, info->layer_count, buffer, [](Status) {},
                                                         info->payload_checksum)
                               : read.status();
    if (written.ok() || written.code() == StatusCode::kAlreadyExists) {
      Bump(above_->demotions_to_host);
    } else {
      Bump(above_->demotion_failures);  // counted, not logged: evictions come by the thousand
      spdlog::debug("{}: evicted block {} could not be demoted to the host tier: {}", tier.name(), key.ToHex(),
                    written.ToString());
    }
  }
  tier.Erase(key).IgnoreError();  // gone meanwhile: fine
  Bump(above_->evictions);
  return true;
}

bool Engine::EraseAbove(const NamespaceFingerprint& ns, const BlockKey& key, bool moving) {
  BlockTier& tier = *above_->source.tier;
  bool offered = false;
  {
    // A copy up queued or in flight must not bring it back.
    MutexLock lock(above_->mu);
    offered = above_->offered.count(key) != 0;
    if (offered) above_->cancelled.insert(key);
  }
  std::optional<BlockTier::BlockInfo> info = tier.Find(key);
  const bool erased = (moving || offered || (info && info->ns == ns)) && tier.Erase(key).ok();
  MutexLock lock(above_->mu);
  above_->resident.Remove(key, erased ? nullptr : &ns);
  return erased && info.has_value();
}

}  // namespace kvtier
