// A StressWorker's reads (stress_workload.h): Get and GetBatch, pins,
// lookups, layer-wise loads (copying or zero-copy) and layer-range gets,
// each block read checked against the value it must be.
#include "tools/stress/stress_ops.h"
#include "tools/stress/stress_workload.h"

namespace kvtier::tools {

using stress_ops::Clock;
using stress_ops::IsRefusal;
using stress_ops::NsSince;

void StressWorker::Get() {
  const Pick pick = PickPrefix();
  const uint64_t bytes = pick.space->shape.block_bytes();
  const uint64_t room = bytes + (rng_() % 4 == 0 ? 4096 : 0);  // a larger buffer still gets the block's length
  KindTally& t = tally_.of(OpKind::kGet);
  ++t.ops;
  t.blocks += pick.keys.size();
  auto check = [&](size_t i, const Result<size_t>& got) {
    if (!got.ok()) return Count(OpKind::kGet, got.status());
    if (*got != bytes) {
      return Violate(OpKind::kGet, pick, pick.keys[i],
                     "wrong_length: Get returned " + std::to_string(*got) + " bytes, want " + std::to_string(bytes));
    }
    CheckRead(OpKind::kGet, pick, pick.keys[i], 0, pick.space->shape.layer_count, Buffer(i, bytes));
  };
  if (pick.keys.size() == 1 || rng_() % 3 == 0) {
    for (size_t i = 0; i < pick.keys.size(); ++i) {
      const auto t0 = Clock::now();
      const Result<size_t> got = client_.Get(pick.ns, pick.keys[i], Buffer(i, room));
      t.latency.Add(NsSince(t0));
      check(i, got);
    }
    t.ops += pick.keys.size() - 1;
    return;
  }
  std::vector<std::span<std::byte>> dst;
  for (size_t i = 0; i < pick.keys.size(); ++i) dst.push_back(Buffer(i, room));
  const auto t0 = Clock::now();
  const auto results = client_.GetBatch(pick.ns, pick.keys, dst);
  t.latency.Add(NsSince(t0));
  if (results.size() != pick.keys.size()) {
    return Violate(
        OpKind::kGet, pick, pick.keys[0],
        "GetBatch answered " + std::to_string(results.size()) + " results for " + std::to_string(pick.keys.size()));
  }
  for (size_t i = 0; i < results.size(); ++i) check(i, results[i]);
}

void StressWorker::PinViews() {
  const Pick pick = PickPrefix();
  const ValueShape& shape = pick.space->shape;
  KindTally& t = tally_.of(OpKind::kPin);
  ++t.ops;
  t.blocks += pick.keys.size();
  const auto t0 = Clock::now();
  std::vector<Result<BlockView>> views = client_.Pin(pick.ns, pick.keys);
  if (views.size() != pick.keys.size()) {
    t.latency.Add(NsSince(t0));
    return Violate(OpKind::kPin, pick, pick.keys[0],
                   "Pin answered " + std::to_string(views.size()) + " views for " + std::to_string(pick.keys.size()));
  }
  auto check_views = [&](bool count) {
    for (size_t i = 0; i < views.size(); ++i) {
      if (!views[i].ok()) {
        if (count) Count(OpKind::kPin, views[i].status());
        continue;
      }
      const BlockView& view = *views[i];
      if (view.key() != pick.keys[i]) {
        Violate(OpKind::kPin, pick, pick.keys[i], "other_key: the view is of key " + view.key().ToHex());
        continue;
      }
      const ValueCheck c = CheckBlock(shape, pick.keys[i], view.data());
      if (!c.ok()) {
        Violate(OpKind::kPin, pick, pick.keys[i],
                std::string(count ? "" : "after an erase of the pinned block: ") +
                    std::string(MismatchName(c.mismatch)) + ": " + c.detail);
      } else if (count) {
        ++t.ok;
      }
    }
  };
  check_views(true);
  // Erasing a pinned block hides it at once, but its bytes stay until the
  // last lease goes.
  if (rng_() % 10 == 0) {
    EraseKeys(pick, pick.keys);
    check_views(false);
  }
  const bool release = rng_() % 2 == 0;
  for (auto& view : views) {
    if (!view.ok()) continue;
    if (release) {
      const Status s = view->Release();
      if (!s.ok()) Error(OpKind::kPin, s);
    } else {
      *view = BlockView();  // released with the next request
    }
  }
  t.latency.Add(NsSince(t0));
}

void StressWorker::Lookup() {
  const Pick pick = PickPrefix();
  KindTally& t = tally_.of(OpKind::kLookup);
  ++t.ops;
  t.blocks += pick.keys.size();
  const auto t0 = Clock::now();
  auto found = client_.Lookup(pick.ns, pick.keys);
  t.latency.Add(NsSince(t0));
  if (!found.ok()) return Error(OpKind::kLookup, found.status());
  if (found->prefix_blocks > pick.keys.size() || found->tiers.size() != found->prefix_blocks) {
    return Violate(OpKind::kLookup, pick, pick.keys[0],
                   "Lookup of " + std::to_string(pick.keys.size()) + " keys: prefix " +
                       std::to_string(found->prefix_blocks) + " with " + std::to_string(found->tiers.size()) +
                       " tiers");
  }
  for (size_t i = 0; i < found->tiers.size(); ++i) {
    const Tier tier = found->tiers[i];
    if (tier == Tier::kNone || static_cast<size_t>(tier) >= tally_.lookup_tiers.size()) {
      return Violate(OpKind::kLookup, pick, pick.keys[i],
                     "Lookup reports a hit in tier " + std::to_string(static_cast<int>(tier)));
    }
    ++tally_.lookup_tiers[static_cast<size_t>(tier)];
  }
  t.ok += found->prefix_blocks;
  t.misses += pick.keys.size() - found->prefix_blocks;
}

void StressWorker::Load() {
  const Pick pick = PickPrefix();
  const ValueShape& shape = pick.space->shape;
  KindTally& t = tally_.of(OpKind::kLoad);
  ++t.ops;
  t.blocks += pick.keys.size();
  const bool copy = rng_() % 5 < 2;  // into buffers; else zero-copy from the arena
  LoadOptions options;
  std::vector<std::span<std::byte>> dst;
  if (copy) {
    for (size_t i = 0; i < pick.keys.size(); ++i) dst.push_back(Buffer(i, shape.block_bytes()));
    options.dst = dst;
  }
  if (rng_() % 5 == 0) options.compute_us_per_layer = 20;  // with a preload plan
  const auto t0 = Clock::now();
  auto load = client_.BeginLoad(pick.ns, pick.keys, std::move(options));
  if (!load.ok()) {
    t.latency.Add(NsSince(t0));
    if (IsRefusal(load.status().code())) {
      t.refused += pick.keys.size();
    } else {
      Error(OpKind::kLoad, load.status());
    }
    return;
  }
  if (load->size() != pick.keys.size() || load->layer_count() != shape.layer_count ||
      load->layer_bytes() != shape.layer_bytes) {
    t.latency.Add(NsSince(t0));
    Violate(OpKind::kLoad, pick, pick.keys[0], "BeginLoad's geometry does not match the namespace");
    return load->End().IgnoreError();  // the violation is what counts
  }
  // Zero-copy: each layer is read once it is in place; a mismatch counts
  // only if its block is still Ok at the end (a failed block's bytes,
  // even its earlier layers, are not to be used).
  std::vector<ValueCheck> checks(pick.keys.size());
  for (uint32_t l = 0; l < shape.layer_count; ++l) {
    const Status w = load->WaitLayer(l);
    if (!w.ok()) {
      t.latency.Add(NsSince(t0));
      Error(OpKind::kLoad, w);
      return load->End().IgnoreError();  // the wait's error is what counts
    }
    if (copy) continue;
    for (size_t i = 0; i < pick.keys.size(); ++i) {
      if (!load->status(i).ok() || !checks[i].ok()) continue;
      auto span = load->TryLayerSpan(i, l);
      if (span.ok()) {
        checks[i] = CheckLayers(shape, pick.keys[i], l, l + 1, *span);
      } else if (span.status().code() != StatusCode::kNotFound) {  // NotFound: failed meanwhile
        checks[i] = {Mismatch::kLength, "TryLayerSpan of a ready layer: " + span.status().ToString()};
      }
    }
  }
  LoadCheck(pick, *load, copy, dst, checks);
  const Status ended = load->End();
  t.latency.Add(NsSince(t0));
  if (!ended.ok()) Error(OpKind::kLoad, ended);
}

void StressWorker::LoadCheck(const Pick& pick, LayerLoad& load, bool copy, std::span<const std::span<std::byte>> dst,
                             const std::vector<ValueCheck>& zero_copy_checks) {
  if (!load.done()) {
    Violate(OpKind::kLoad, pick, pick.keys[0], "WaitAll returned with a block neither loaded nor failed");
  }
  for (size_t i = 0; i < pick.keys.size(); ++i) {
    const Status s = load.status(i);
    if (!s.ok()) {
      Count(OpKind::kLoad, s);
    } else if (copy) {
      CheckRead(OpKind::kLoad, pick, pick.keys[i], 0, pick.space->shape.layer_count, dst[i]);
    } else if (!zero_copy_checks[i].ok()) {
      Violate(OpKind::kLoad, pick, pick.keys[i],
              std::string(MismatchName(zero_copy_checks[i].mismatch)) + ": " + zero_copy_checks[i].detail);
    } else {
      ++tally_.of(OpKind::kLoad).ok;
    }
  }
}

void StressWorker::GetLayers() {
  const Pick pick = PickPrefix();
  const ValueShape& shape = pick.space->shape;
  const uint32_t first = static_cast<uint32_t>(rng_() % shape.layer_count);
  const uint32_t last = first + 1 + static_cast<uint32_t>(rng_() % (shape.layer_count - first));
  const uint64_t bytes = uint64_t{last - first} * shape.layer_bytes;
  KindTally& t = tally_.of(OpKind::kLayers);
  ++t.ops;
  t.blocks += pick.keys.size();
  std::vector<std::span<std::byte>> dst;
  for (size_t i = 0; i < pick.keys.size(); ++i) dst.push_back(Buffer(i, bytes));
  const auto t0 = Clock::now();
  const auto results = client_.GetLayers(pick.ns, pick.keys, first, last, dst);
  t.latency.Add(NsSince(t0));
  if (results.size() != pick.keys.size()) {
    return Violate(
        OpKind::kLayers, pick, pick.keys[0],
        "GetLayers answered " + std::to_string(results.size()) + " results for " + std::to_string(pick.keys.size()));
  }
  for (size_t i = 0; i < results.size(); ++i) {
    if (!results[i].ok()) {
      Count(OpKind::kLayers, results[i].status());
    } else if (*results[i] != bytes) {
      Violate(OpKind::kLayers, pick, pick.keys[i],
              "wrong_length: GetLayers [" + std::to_string(first) + ", " + std::to_string(last) + ") returned " +
                  std::to_string(*results[i]) + " bytes, want " + std::to_string(bytes));
    } else {
      CheckRead(OpKind::kLayers, pick, pick.keys[i], first, last, dst[i]);
    }
  }
}

}  // namespace kvtier::tools
