// A StressWorker's writes (stress_workload.h): PutBatch, Reserve then
// Commit or Abort, and layer-wise saves; the values written are the ones
// every read is checked against (stress_values.h).
#include <cstring>

#include "common/checksum.h"
#include "tools/stress/stress_ops.h"
#include "tools/stress/stress_workload.h"

namespace kvtier::tools {

using stress_ops::Clock;
using stress_ops::IsRefusal;
using stress_ops::NsSince;

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
    return Violate(OpKind::kPut, pick, keys[0],
                   "PutBatch answered " + std::to_string(statuses.size()) + " statuses for " +
                       std::to_string(keys.size()) + " keys");
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
    return Violate(
        OpKind::kReserve, pick, pick.keys[0],
        "Reserve answered " + std::to_string(blocks.size()) + " blocks for " + std::to_string(pick.keys.size()));
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
    return Violate(
        OpKind::kReserve, pick, pick.keys[0],
        "Commit answered " + std::to_string(committed.size()) + " statuses for " + std::to_string(blocks.size()));
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
          Violate(OpKind::kSave, pick, pick.keys[i],
                  "LayerSpan of an Ok block is " + std::to_string(dst.size()) + " bytes, not a layer");
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
    return Violate(OpKind::kSave, pick, pick.keys[0],
                   "FinishSave answered " + std::to_string(finished->size()) + " statuses for " +
                       std::to_string(pick.keys.size()));
  }
  for (size_t i = 0; i < finished->size(); ++i) {
    Count(OpKind::kSave, save->status(i).ok() ? (*finished)[i] : save->status(i));
  }
}

}  // namespace kvtier::tools
