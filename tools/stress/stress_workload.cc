#include "tools/stress/stress_workload.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "common/checksum.h"

namespace kvtier::tools {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t NsSince(Clock::time_point t0) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
}

bool IsRefusal(StatusCode code) {
  return code == StatusCode::kNoSpace || code == StatusCode::kBusy || code == StatusCode::kAlreadyExists;
}

std::discrete_distribution<size_t> KindDistribution(const WorkloadMix& mix) {
  return std::discrete_distribution<size_t>(mix.weights.begin(), mix.weights.end());
}

}  // namespace

Result<WorkloadMix> ParseMix(std::string_view text) {
  WorkloadMix mix;
  while (!text.empty()) {
    const size_t comma = text.find(',');
    const std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) return InvalidArgument("--mix: '" + std::string(item) + "' is not kind=weight");
    auto kind = ParseOpKind(item.substr(0, eq));
    if (!kind) return InvalidArgument("--mix: unknown kind '" + std::string(item.substr(0, eq)) + "'");
    const std::string number(item.substr(eq + 1));
    char* end = nullptr;
    const unsigned long w = std::strtoul(number.c_str(), &end, 10);
    if (number.empty() || *end != '\0' || w > 1000000) {
      return InvalidArgument("--mix: bad weight '" + number + "'");
    }
    mix.weights[static_cast<size_t>(*kind)] = static_cast<uint32_t>(w);
  }
  uint64_t total = 0;
  for (uint32_t w : mix.weights) total += w;
  if (total == 0) return InvalidArgument("--mix: every weight is 0");
  return mix;
}

std::string MixToString(const WorkloadMix& mix) {
  std::string out;
  for (size_t i = 0; i < kOpKinds; ++i) {
    if (!out.empty()) out += ',';
    out += std::string(OpKindName(static_cast<OpKind>(i))) + "=" + std::to_string(mix.weights[i]);
  }
  return out;
}

StressWorker::StressWorker(const KeySpace& space, Client& client, const WorkloadMix& mix, uint64_t seed,
                           uint32_t index, const std::atomic<bool>& stop, const std::atomic<bool>& killed)
    : space_(space),
      client_(client),
      stop_(stop),
      killed_(killed),
      kinds_(KindDistribution(mix)),
      rng_(seed ^ (0x9e3779b97f4a7c15ull * (index + 1))),
      index_(index) {
  uint64_t largest = 0;
  size_t chain_blocks = 0;
  for (const auto& ns : space_.namespaces()) {
    largest = std::max(largest, ns.shape.block_bytes());
    for (const auto& chain : ns.chains) chain_blocks = std::max(chain_blocks, chain.size());
  }
  buffer_bytes_ = largest + 4096;
  buffers_.assign(chain_blocks, std::vector<std::byte>(buffer_bytes_));
}

void StressWorker::Run() {
  while (!stop_.load(std::memory_order_relaxed)) {
    RunOne(static_cast<OpKind>(kinds_(rng_)));
  }
}

void StressWorker::RunOne(OpKind kind) {
  const uint64_t errors_before = tally_.errors_total() + tally_.after_kill;
  switch (kind) {
    case OpKind::kPut: Put(); break;
    case OpKind::kReserve: Reserve(); break;
    case OpKind::kSave: Save(); break;
    case OpKind::kGet: Get(); break;
    case OpKind::kPin: PinViews(); break;
    case OpKind::kLookup: Lookup(); break;
    case OpKind::kErase: {
      const Pick pick = PickPrefix();
      const size_t from = rng_() % pick.keys.size();
      EraseKeys(pick, pick.chain.subspan(from, pick.keys.size() - from));
      break;
    }
    case OpKind::kLoad: Load(); break;
    case OpKind::kLayers: GetLayers(); break;
    case OpKind::kHint: Hint(); break;
  }
  // A daemon that is gone fails every call at once: do not spin on it.
  if (tally_.errors_total() + tally_.after_kill != errors_before) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

StressWorker::Pick StressWorker::PickPrefix() {
  Pick pick;
  pick.ns = static_cast<NamespaceId>(rng_() % space_.namespaces().size());
  pick.space = &space_.namespaces()[pick.ns];
  // Chain c with probability ~ the square of a uniform draw: low chains hot.
  const double u = std::uniform_real_distribution<double>(0, 1)(rng_);
  const size_t chains = pick.space->chains.size();
  const size_t c = std::min(chains - 1, static_cast<size_t>(u * u * static_cast<double>(chains)));
  pick.chain = pick.space->chains[c];
  pick.keys = pick.chain.first(1 + rng_() % pick.chain.size());
  return pick;
}

std::span<std::byte> StressWorker::Buffer(size_t i, uint64_t bytes) {
  return std::span<std::byte>(buffers_[i]).first(std::min(bytes, buffer_bytes_));
}

void StressWorker::Error(OpKind kind, const Status& status) {
  if (killed_.load(std::memory_order_relaxed)) {
    ++tally_.after_kill;
    return;
  }
  tally_.AddError(kind, status);
}

void StressWorker::Count(OpKind kind, const Status& status) {
  KindTally& t = tally_.of(kind);
  if (status.ok()) {
    ++t.ok;
  } else if (status.code() == StatusCode::kNotFound) {
    ++t.misses;
  } else if (IsRefusal(status.code())) {
    ++t.refused;
  } else {
    Error(kind, status);
  }
}

void StressWorker::Violate(OpKind kind, const Pick& pick, const BlockKey& key, std::string what) {
  tally_.AddViolation(kind, pick.space->descriptor.model_id, key, std::move(what));
}

void StressWorker::CheckRead(OpKind kind, const Pick& pick, const BlockKey& key, uint32_t first, uint32_t last,
                             std::span<const std::byte> got) {
  const ValueCheck check = CheckLayers(pick.space->shape, key, first, last, got);
  if (check.ok()) {
    ++tally_.of(kind).ok;
  } else {
    Violate(kind, pick, key, std::string(MismatchName(check.mismatch)) + ": " + check.detail);
  }
}

void StressWorker::Put() {
  Pick pick = PickPrefix();
  ChainLinks links{.chain = true};
  size_t from = 0;
  if (rng_() % 4 == 0) {  // the part after a cached prefix, as after a prefill
    from = rng_() % pick.keys.size();
    if (from > 0) links.parent = pick.keys[from - 1];
  }
  const auto keys = pick.keys.subspan(from);
  const uint64_t bytes = pick.space->shape.block_bytes();
  std::vector<std::span<const std::byte>> data;
  for (size_t i = 0; i < keys.size(); ++i) {
    FillBlock(pick.space->shape, keys[i], Buffer(i, bytes));
    data.push_back(Buffer(i, bytes));
  }
  const auto t0 = Clock::now();
  const std::vector<Status> statuses = client_.PutBatch(pick.ns, keys, data, links);
  KindTally& t = tally_.of(OpKind::kPut);
  t.latency.Add(NsSince(t0));
  ++t.ops;
  t.blocks += keys.size();
  if (statuses.size() != keys.size()) {
    return Violate(OpKind::kPut, pick, keys[0], "PutBatch answered " + std::to_string(statuses.size()) +
                                                    " statuses for " + std::to_string(keys.size()) + " keys");
  }
  for (const Status& s : statuses) Count(OpKind::kPut, s);
}

void StressWorker::Reserve() {
  const Pick pick = PickPrefix();
  const uint64_t bytes = pick.space->shape.block_bytes();
  const std::vector<uint64_t> sizes(pick.keys.size(), bytes);
  KindTally& t = tally_.of(OpKind::kReserve);
  ++t.ops;
  t.blocks += pick.keys.size();
  const auto t0 = Clock::now();
  auto reservation = client_.Reserve(pick.ns, pick.keys, sizes, ChainLinks{.chain = true});
  if (!reservation.ok()) {
    t.latency.Add(NsSince(t0));
    if (IsRefusal(reservation.status().code())) {
      t.refused += pick.keys.size();
    } else {
      Error(OpKind::kReserve, reservation.status());
    }
    return;
  }
  auto& blocks = reservation->blocks();
  if (blocks.size() != pick.keys.size()) {
    t.latency.Add(NsSince(t0));
    return Violate(OpKind::kReserve, pick, pick.keys[0], "Reserve answered " + std::to_string(blocks.size()) +
                                                             " blocks for " + std::to_string(pick.keys.size()));
  }
  std::vector<bool> written(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    WritableBlock& b = blocks[i];
    if (!b.status.ok()) {
      Count(OpKind::kReserve, b.status);
      continue;
    }
    if (b.key != pick.keys[i] || b.data.size() != bytes) {
      Violate(OpKind::kReserve, pick, pick.keys[i],
              "Reserve handed out " + std::to_string(b.data.size()) + " bytes for key " + b.key.ToHex());
      continue;
    }
    FillBlock(pick.space->shape, b.key, b.data);
    if (rng_() % 2 == 0) b.checksum = BlockChecksum(b.data);
    written[i] = true;
  }
  if (rng_() % 10 == 0) {
    const Status aborted = reservation->Abort();
    t.latency.Add(NsSince(t0));
    if (!aborted.ok()) Error(OpKind::kReserve, aborted);
    return;
  }
  const std::vector<Status> committed = reservation->Commit();
  t.latency.Add(NsSince(t0));
  if (committed.size() != blocks.size()) {
    return Violate(OpKind::kReserve, pick, pick.keys[0], "Commit answered " + std::to_string(committed.size()) +
                                                             " statuses for " + std::to_string(blocks.size()));
  }
  for (size_t i = 0; i < committed.size(); ++i) {
    if (written[i]) Count(OpKind::kReserve, committed[i]);
  }
}

void StressWorker::Save() {
  const Pick pick = PickPrefix();
  const ValueShape& shape = pick.space->shape;
  KindTally& t = tally_.of(OpKind::kSave);
  ++t.ops;
  t.blocks += pick.keys.size();
  for (size_t i = 0; i < pick.keys.size(); ++i) FillBlock(shape, pick.keys[i], Buffer(i, shape.block_bytes()));
  const auto t0 = Clock::now();
  auto save = client_.BeginSave(pick.ns, pick.keys, ChainLinks{.chain = true});
  if (!save.ok()) {
    t.latency.Add(NsSince(t0));
    if (IsRefusal(save.status().code())) {
      t.refused += pick.keys.size();
    } else {
      Error(OpKind::kSave, save.status());
    }
    return;
  }
  if (save->size() != pick.keys.size() || save->layer_count() != shape.layer_count ||
      save->layer_bytes() != shape.layer_bytes) {
    t.latency.Add(NsSince(t0));
    return Violate(OpKind::kSave, pick, pick.keys[0], "BeginSave's geometry does not match the namespace");
  }
  const uint32_t abort_at = rng_() % 20 == 0 ? static_cast<uint32_t>(rng_() % shape.layer_count) : shape.layer_count;
  for (uint32_t l = 0; l < shape.layer_count; ++l) {
    if (l == abort_at) {
      const Status aborted = save->Abort();
      t.latency.Add(NsSince(t0));
      if (!aborted.ok()) Error(OpKind::kSave, aborted);
      return;
    }
    Status s;
    if (rng_() % 2 == 0) {
      std::vector<std::span<const std::byte>> src;
      for (size_t i = 0; i < pick.keys.size(); ++i) {
        src.push_back(Buffer(i, shape.block_bytes()).subspan(uint64_t{l} * shape.layer_bytes, shape.layer_bytes));
      }
      s = save->SaveLayer(l, src);
    } else {
      for (size_t i = 0; i < pick.keys.size(); ++i) {
        const std::span<std::byte> dst = save->LayerSpan(i, l);
        if (!save->status(i).ok()) continue;
        if (dst.size() != shape.layer_bytes) {
          Violate(OpKind::kSave, pick, pick.keys[i], "LayerSpan of an Ok block is " + std::to_string(dst.size()) +
                                                         " bytes, not a layer");
          continue;
        }
        std::memcpy(dst.data(), Buffer(i, shape.block_bytes()).data() + uint64_t{l} * shape.layer_bytes, dst.size());
      }
      s = save->LayerWritten(l);
    }
    if (!s.ok()) {
      t.latency.Add(NsSince(t0));
      return Error(OpKind::kSave, s);
    }
  }
  auto finished = save->FinishSave();
  t.latency.Add(NsSince(t0));
  if (!finished.ok()) return Error(OpKind::kSave, finished.status());
  if (finished->size() != pick.keys.size()) {
    return Violate(OpKind::kSave, pick, pick.keys[0], "FinishSave answered " + std::to_string(finished->size()) +
                                                          " statuses for " + std::to_string(pick.keys.size()));
  }
  for (size_t i = 0; i < finished->size(); ++i) {
    Count(OpKind::kSave, save->status(i).ok() ? (*finished)[i] : save->status(i));
  }
}

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
    return Violate(OpKind::kGet, pick, pick.keys[0], "GetBatch answered " + std::to_string(results.size()) +
                                                         " results for " + std::to_string(pick.keys.size()));
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
    return Violate(OpKind::kPin, pick, pick.keys[0], "Pin answered " + std::to_string(views.size()) +
                                                         " views for " + std::to_string(pick.keys.size()));
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

void StressWorker::EraseKeys(const Pick& pick, std::span<const BlockKey> keys) {
  KindTally& t = tally_.of(OpKind::kErase);
  ++t.ops;
  t.blocks += keys.size();
  if (record_erases_) {
    for (const BlockKey& k : keys) tally_.erased.emplace_back(pick.ns, k);
  }
  const auto t0 = Clock::now();
  auto erased = client_.Erase(pick.ns, keys);
  t.latency.Add(NsSince(t0));
  if (!erased.ok()) return Error(OpKind::kErase, erased.status());
  if (*erased > keys.size()) {
    return Violate(OpKind::kErase, pick, keys[0], "Erase of " + std::to_string(keys.size()) + " keys erased " +
                                                      std::to_string(*erased));
  }
  t.ok += *erased;
  t.misses += keys.size() - *erased;
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
    return Violate(OpKind::kLayers, pick, pick.keys[0], "GetLayers answered " + std::to_string(results.size()) +
                                                            " results for " + std::to_string(pick.keys.size()));
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

void StressWorker::Hint() {
  const Pick pick = PickPrefix();
  KindTally& t = tally_.of(OpKind::kHint);
  ++t.ops;
  const uint64_t sessions = 1 + uint64_t{index_} * 16;  // this client's four conversations
  const uint64_t r = rng_() % 10;
  const auto t0 = Clock::now();
  Status s;
  if (r < 6 && queued_.size() < 32) {
    const uint64_t request = next_request_++;
    const uint64_t session = rng_() % 3 == 0 ? 0 : sessions + rng_() % 4;
    t.blocks += pick.keys.size();
    s = client_.Enqueue(request, pick.ns, pick.keys, Clock::now() + std::chrono::milliseconds(rng_() % 50), session);
    if (s.ok()) queued_.push_back(request);
  } else if (r < 9 && !queued_.empty()) {
    const uint64_t request = queued_.front();
    queued_.pop_front();
    s = rng_() % 2 == 0 ? client_.Started(request) : client_.Finished(request);
  } else {
    const uint64_t session = sessions + rng_() % 4;
    s = rng_() % 2 == 0 ? client_.OpenSession(session) : client_.CloseSession(session);
  }
  t.latency.Add(NsSince(t0));
  Count(OpKind::kHint, s);
}

Result<std::unique_ptr<StressLoad>> StressLoad::Connect(const std::string& socket_path, const KeySpace& space,
                                                        uint32_t clients, bool reconnect) {
  std::unique_ptr<StressLoad> load(new StressLoad(space));
  for (uint32_t i = 0; i < clients; ++i) {
    ClientOptions options;
    options.socket_path = socket_path;
    options.client_name = "kvtier-stress-" + std::to_string(i);
    options.namespaces = space.Descriptors();
    options.use_directory = i % 2 == 0;
    options.reconnect = reconnect;
    auto client = Client::Connect(options);
    if (!client.ok()) return client.status();
    load->clients_.push_back(std::move(*client));
  }
  return load;
}

StressLoad::~StressLoad() {
  StressTally ignored;
  Stop(ignored);
}

void StressLoad::Start(const WorkloadMix& mix, uint64_t seed, bool record_erases) {
  stop_ = false;
  for (uint32_t i = 0; i < clients_.size(); ++i) {
    workers_.push_back(std::make_unique<StressWorker>(space_, *clients_[i], mix, seed, i, stop_, killed_));
    if (record_erases) workers_.back()->RecordErases();
  }
  for (auto& worker : workers_) threads_.emplace_back([w = worker.get()] { w->Run(); });
}

void StressLoad::Stop(StressTally& into) {
  stop_ = true;
  for (auto& t : threads_) t.join();
  threads_.clear();
  for (const auto& w : workers_) into.Merge(w->tally());
  workers_.clear();
}

}  // namespace kvtier::tools
