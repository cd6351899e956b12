// LayersBench's prefixes (bench_layers_trials.h): put under fresh keys,
// pushed out to the NVMe tier with filler blocks when the trial reads from
// there, and waited on until nothing moves between tiers.
#include <algorithm>
#include <string>
#include <thread>

#include "tools/bench/bench_layers_trials.h"

namespace kvtier::tools::layers_bench {
namespace {

constexpr size_t kFillerBatch = 4;  // filler blocks per PutBatch while pushing a prefix out
constexpr auto kSettleTimeout = std::chrono::seconds(60);

}  // namespace

Status FirstError(const std::vector<Status>& statuses, const char* what) {
  for (size_t i = 0; i < statuses.size(); ++i) {
    if (!statuses[i].ok()) {
      return Status(statuses[i].code(),
                    std::string(what) + " block " + std::to_string(i) + ": " + statuses[i].ToString());
    }
  }
  return Status::Ok();
}

Status LayersBench::PutPrefix(const std::vector<BlockKey>& keys) {
  std::vector<std::span<const std::byte>> data;
  for (size_t i = 0; i < keys.size(); ++i) data.push_back(Block(i));
  return FirstError(client_.PutBatch(0, keys, data, ChainLinks{true, std::nullopt}), "PutBatch of the prefix:");
}

Status LayersBench::Erase(const std::vector<BlockKey>& keys) {
  if (keys.empty()) return Status::Ok();
  auto erased = client_.Erase(0, keys);
  return erased.ok() ? Status::Ok() : erased.status();
}

// Until no block is being promoted or demoted (an NVMe write of an evicted
// block would share the disk with the reads being timed).
Status LayersBench::WaitQuiet() {
  const auto deadline = Clock::now() + kSettleTimeout;
  for (;;) {
    auto stats = client_.Stats();
    if (!stats.ok()) return stats.status();
    int64_t moving = 0;
    for (const Counter& c : *stats) {
      if (c.name == "engine.demoting_blocks" || c.name == "engine.promoting_blocks") moving += c.value;
    }
    if (moving == 0) return Status::Ok();
    if (Clock::now() >= deadline) return TimedOut("blocks were still moving between tiers after 60 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// The NVMe device's read counters (0 without an NVMe tier).
Result<LayersBench::DeviceReads> LayersBench::ReadCounters() {
  auto stats = client_.Stats();
  if (!stats.ok()) return stats.status();
  DeviceReads out;
  for (const Counter& c : *stats) {
    if (c.name == "nvme.device.reads") out.reads = double(c.value);
    if (c.name == "nvme.device.read_bytes") out.bytes = double(c.value);
  }
  return out;
}

// Until Lookup places every prefix block in the NVMe tier (a block being
// demoted already counts; WaitQuiet waits for its write).
Status LayersBench::WaitInNvme(const std::vector<BlockKey>& prefix) {
  const auto deadline = Clock::now() + kSettleTimeout;
  for (;;) {
    auto look = client_.Lookup(0, prefix);
    if (!look.ok()) return look.status();
    if (look->prefix_blocks < prefix.size()) {
      return NotFound("prefix block " + std::to_string(look->prefix_blocks) +
                      " was evicted without reaching the NVMe tier (dropped)");
    }
    if (std::all_of(look->tiers.begin(), look->tiers.end(), [](Tier t) { return t == Tier::kNvme; })) {
      return Status::Ok();
    }
    if (Clock::now() >= deadline) return TimedOut("the prefix did not reach the NVMe tier within 60 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Puts filler blocks (fresh keys) until no prefix block is left in the host
// tier, waits for the prefix's NVMe writes, then erases the filler.
Status LayersBench::PushToNvme(const std::vector<BlockKey>& prefix) {
  const uint64_t cap = 3 * (report_.arena_bytes / report_.block_bytes) + prefix.size();
  std::vector<BlockKey> filler;
  Status s = Status::Ok();
  for (;;) {
    auto look = client_.Lookup(0, prefix);
    if (!look.ok()) {
      s = look.status();
      break;
    }
    if (std::none_of(look->tiers.begin(), look->tiers.end(), [](Tier t) { return t == Tier::kHost; })) break;
    if (filler.size() >= cap) {
      s = Unavailable("after " + std::to_string(filler.size()) + " filler blocks part of the prefix is still in " +
                      "the host tier");
      break;
    }
    std::vector<BlockKey> batch = NewKeys(kFillerBatch);
    std::vector<std::span<const std::byte>> data(batch.size(), std::span<const std::byte>(filler_));
    filler.insert(filler.end(), batch.begin(), batch.end());
    s = FirstError(client_.PutBatch(0, batch, data), "PutBatch of filler:");
    if (!s.ok()) break;
  }
  if (s.ok()) s = WaitInNvme(prefix);
  Status erased = Erase(filler);
  if (s.ok()) s = erased;
  if (s.ok()) s = WaitQuiet();
  return s;
}

// Fresh keys holding the prefix in `tier` alone, nothing moving. A prefix
// block dropped on its way to NVMe (the demotion buffer overflowed) costs
// a retry with new keys, at most twice.
Result<std::vector<BlockKey>> LayersBench::PreparePrefix(Tier tier) {
  for (int attempt = 0;; ++attempt) {
    std::vector<BlockKey> keys = NewKeys(o_.blocks);
    Status s = PutPrefix(keys);
    if (s.ok()) s = tier == Tier::kNvme ? PushToNvme(keys) : WaitQuiet();
    if (s.ok()) return keys;
    Erase(keys).IgnoreError();  // the error below is the one to report
    if (tier != Tier::kNvme || s.code() != StatusCode::kNotFound || attempt == 2) return s;
    ++report_.setup_retries;
  }
}

}  // namespace kvtier::tools::layers_bench
