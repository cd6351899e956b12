#include "daemon/engine/adopter.h"

#include <chrono>
#include <utility>

#include "common/checksum.h"
#include "common/logging.h"
#include "daemon/engine/block_index.h"

namespace kvtier {
namespace {

// Warnings naming a corrupt block, at most; the rest are counted.
constexpr int64_t kLoggedCorrupt = 5;
// More layers than any model has: a record saying so is not to be trusted
// with an allocation.
constexpr uint32_t kMaxLayers = 1 << 16;

}  // namespace

Adopter::Adopter(const std::vector<std::unique_ptr<BlockIndex>>& shards, HostTier& host, const Clock& clock,
                 Hooks hooks)
    : shards_(shards), host_(host), clock_(clock), hooks_(std::move(hooks)), blocks_(host_.TakeAdopted()) {
  MutexLock lock(mu_);
  end_ = blocks_.size();
  for (size_t i = 0; i < blocks_.size(); ++i) {
    // A key recorded twice (a journal no daemon wrote): the first is kept.
    if (!waiting_.try_emplace(blocks_[i].record.key, Waiting{blocks_[i].record.ns, i}).second) {
      host_.FreeAdopted(blocks_[i]);
    }
  }
  pending_.store(static_cast<int64_t>(waiting_.size()));
}

Adopter::~Adopter() { Stop(); }

void Adopter::Stop() {
  stopping_.store(true);
  if (thread_.joinable()) thread_.join();
}

void Adopter::Start() {
  if (blocks_.empty() || thread_.joinable()) return;
  thread_ = std::thread([this] { Run(); });
}

void Adopter::FreeLocked(std::unordered_map<BlockKey, Waiting>::iterator it) {
  host_.FreeAdopted(blocks_[it->second.index]);
  waiting_.erase(it);
}

size_t Adopter::Forget(const NamespaceFingerprint& ns, std::span<const BlockKey> keys) {
  if (pending_.load() == 0) return 0;
  MutexLock lock(mu_);
  size_t forgotten = 0;
  for (const BlockKey& key : keys) {
    auto it = waiting_.find(key);
    if (it == waiting_.end() || it->second.ns != ns || it->second.forgotten) continue;
    ++forgotten;
    if (it->second.index >= next_) {
      FreeLocked(it);
    } else {
      it->second.forgotten = true;  // being checked now
    }
  }
  forgotten_.fetch_add(static_cast<int64_t>(forgotten));
  pending_.store(static_cast<int64_t>(waiting_.size()));
  return forgotten;
}

size_t Adopter::ForgetNamespace(const NamespaceFingerprint& ns) {
  if (pending_.load() == 0) return 0;
  std::vector<BlockKey> keys;
  {
    MutexLock lock(mu_);
    for (const auto& [key, w] : waiting_) {
      if (w.ns == ns) keys.push_back(key);
    }
  }
  return Forget(ns, keys);
}

uint64_t Adopter::GiveBack(uint64_t bytes) {
  if (pending_.load() == 0) return 0;
  MutexLock lock(mu_);
  uint64_t freed = 0;
  while (freed < bytes && end_ > next_) {
    const AdoptedBlock& block = blocks_[--end_];
    auto it = waiting_.find(block.record.key);
    if (it == waiting_.end() || it->second.index != end_) continue;  // already given back
    freed += block.extent.length;
    given_back_.fetch_add(1);
    FreeLocked(it);
  }
  pending_.store(static_cast<int64_t>(waiting_.size()));
  return freed;
}

void Adopter::Run() {
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    if (stopping_.load(std::memory_order_relaxed)) return;  // the rest stay in the journal
    size_t i = 0;
    {
      MutexLock lock(mu_);
      if (next_ >= end_) break;
      i = next_++;
      auto it = waiting_.find(blocks_[i].record.key);
      if (it == waiting_.end() || it->second.index != i) continue;  // given back, or a second record of a key
    }
    Adopt(i);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info(
      "host tier: adopted {} kept blocks ({} bytes) in {:.3f} s; {} did not match their checksum, {} were put again, "
      "{} erased and {} given back for room meanwhile",
      blocks_done_.load(), bytes_.load(), seconds, corrupt_.load(), duplicates_.load(), forgotten_.load(),
      given_back_.load());
}

void Adopter::Adopt(size_t i) {
  const AdoptedBlock& block = blocks_[i];
  const JournalRecord& r = block.record;
  // Block i is the thread's (i < next_): only it frees the extent now.
  const std::span<const std::byte> bytes = host_.Bytes(block.extent).first(r.size);
  std::vector<uint64_t> layers;
  uint64_t checksum = 0;
  const bool layered = r.layer_count > 1 && r.layer_count <= kMaxLayers && r.size % r.layer_count == 0;
  if (layered) {
    layers.resize(r.layer_count);
    checksum = ChecksumWithLayers(bytes, layers);
  } else {
    checksum = BlockChecksum(bytes);
  }
  const bool intact = checksum == r.checksum && (r.layer_count <= 1 || layered);
  enum class Outcome { kCommitted, kForgotten, kCorrupt, kDuplicate } outcome = Outcome::kCommitted;
  {
    BlockIndex& shard = ShardOf(shards_, r.key);
    MutexLock lock(shard.mu);
    MutexLock own(mu_);
    auto it = waiting_.find(r.key);
    if (it->second.forgotten) {
      outcome = Outcome::kForgotten;
    } else if (!intact) {
      outcome = Outcome::kCorrupt;
    } else if (!shard.CommitAdopted(block, std::move(layers), hooks_.next_handle(), clock_.NowUs())) {
      outcome = Outcome::kDuplicate;
    }
    waiting_.erase(it);
    pending_.store(static_cast<int64_t>(waiting_.size()));
  }
  switch (outcome) {
    case Outcome::kCommitted:
      blocks_done_.fetch_add(1);
      bytes_.fetch_add(static_cast<int64_t>(r.size));
      return;
    case Outcome::kCorrupt:
      if (hooks_.corrupt) hooks_.corrupt(r.key);
      if (corrupt_.fetch_add(1) < kLoggedCorrupt) {
        spdlog::warn("host tier: kept block {} does not match its checksum; dropped", r.key.ToHex());
      }
      break;
    case Outcome::kDuplicate:
      duplicates_.fetch_add(1);
      break;
    case Outcome::kForgotten:
      break;
  }
  host_.FreeAdopted(block);
}

void Adopter::VisitCounters(CounterVisitor& v) const {
  v.Visit("host.adopt.blocks", blocks_done_.load());
  v.Visit("host.adopt.bytes", bytes_.load());
  v.Visit("host.adopt.corrupt", corrupt_.load());
  v.Visit("host.adopt.duplicates", duplicates_.load());
  v.Visit("host.adopt.forgotten", forgotten_.load());
  v.Visit("host.adopt.given_back", given_back_.load());
  v.VisitGauge("host.adopt.pending", pending_.load());
}

}  // namespace kvtier
