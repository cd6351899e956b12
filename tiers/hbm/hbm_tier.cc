#include "tiers/hbm/hbm_tier.h"

#include <cstring>
#include <string>

#include "common/check.h"
#include "common/checksum.h"

namespace kvtier {
namespace {

constexpr uint64_t kDeviceAlignmentBytes = gpu::RangeAllocator::kDefaultAlignmentBytes;

// Checksums of the bytes of `layers` (whole layers of `layer_bytes`) against
// `expected` (one per layer), or against `payload_checksum` when `whole`.
Status Verify(std::span<const std::byte> layers, uint64_t layer_bytes, bool whole, uint64_t payload_checksum,
              const std::vector<uint64_t>& expected, uint32_t first_layer) {
  if (whole) {
    if (BlockChecksum(layers) != payload_checksum) return Corruption("hbm block payload checksum mismatch");
    return Status::Ok();
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    if (BlockChecksum(layers.subspan(i * layer_bytes, layer_bytes)) != expected[i]) {
      return Corruption("hbm block layer " + std::to_string(first_layer + i) + " checksum mismatch");
    }
  }
  return Status::Ok();
}

// Copies `src` into `dst` layer by layer and checks each copy as above.
Status CopyAndVerify(std::span<std::byte> dst, std::span<const std::byte> src, uint64_t layer_bytes, bool whole,
                     uint64_t payload_checksum, const std::vector<uint64_t>& expected, uint32_t first_layer) {
  if (whole) {
    if (CopyWithChecksum(dst, src) != payload_checksum) return Corruption("hbm block payload checksum mismatch");
    return Status::Ok();
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    const uint64_t at = i * layer_bytes;
    if (CopyWithChecksum(dst.subspan(at, layer_bytes), src.subspan(at, layer_bytes)) != expected[i]) {
      return Corruption("hbm block layer " + std::to_string(first_layer + i) + " checksum mismatch");
    }
  }
  return Status::Ok();
}

}  // namespace

struct HbmTier::WriteOp {
  BlockKey key;
  uint64_t generation = 0;
  uint64_t staging_offset = 0;
  uint64_t staging_length = 0;
  uint32_t fence = 0;
  WriteDone done;
};

struct HbmTier::ReadOp {
  BlockKey key;
  uint64_t generation = 0;
  bool direct = false;  // copied straight into dst (pinned)
  uint64_t staging_offset = 0;
  uint64_t staging_length = 0;
  uint32_t fence = 0;
  std::span<std::byte> dst;
  uint64_t bytes = 0;
  uint64_t layer_bytes = 0;
  uint32_t first_layer = 0;
  bool whole = false;
  uint64_t payload_checksum = 0;
  std::vector<uint64_t> layer_checksums;  // of [first, last) when not whole
  ReadDone done;
};

Result<std::unique_ptr<HbmTier>> HbmTier::Create(std::unique_ptr<HbmDevice> device) {
  if (device == nullptr) return InvalidArgument("the HBM tier needs a device");
  if (device->staging().size() < kDeviceAlignmentBytes) return InvalidArgument("the HBM device has no staging");
  return std::unique_ptr<HbmTier>(new HbmTier(std::move(device)));
}

HbmTier::HbmTier(std::unique_ptr<HbmDevice> device)
    : device_(std::move(device)),
      staging_share_bytes_(device_->staging().size() / 4 * 3),
      staging_(device_->staging().size(), kDeviceAlignmentBytes) {}

HbmTier::~HbmTier() = default;  // completions_ goes first and runs what is queued

uint64_t HbmTier::used_bytes() const {
  MutexLock lock(mu_);
  return used_bytes_;
}

uint64_t HbmTier::StoredBytes(uint64_t payload_bytes) const {
  return (payload_bytes + kDeviceAlignmentBytes - 1) & ~(kDeviceAlignmentBytes - 1);
}

std::optional<BlockTier::BlockInfo> HbmTier::Find(const BlockKey& key) const {
  MutexLock lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.state != Entry::State::kStored) return std::nullopt;
  return it->second.info;
}

void HbmTier::ForEachBlock(const BlockVisitor& visit) const {
  MutexLock lock(mu_);
  for (const auto& [key, e] : entries_) {
    if (e.state == Entry::State::kStored) visit(key, e.info);
  }
}

Status HbmTier::Write(const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layer_count,
                      std::span<const std::byte> payload, WriteDone done, std::optional<uint64_t> payload_checksum) {
  if (payload.empty() || layer_count == 0 || payload.size() % layer_count != 0) {
    return InvalidArgument("an hbm block needs a non-empty payload of equal layers");
  }
  if (payload.size() > staging_share_bytes_ || payload.size() > device_->capacity_bytes()) {
    return InvalidArgument("a block of " + std::to_string(payload.size()) + " bytes is larger than the hbm tier takes");
  }
  auto op = std::make_shared<WriteOp>();
  op->key = key;
  op->done = std::move(done);
  if (Status s = Reserve(BlockInfo{ns, payload.size(), layer_count, 0}, *op); !s.ok()) return s;

  // Copy into staging, checksumming each layer as it goes; outside mu_.
  const std::span<std::byte> stage = device_->staging().subspan(op->staging_offset, payload.size());
  const uint64_t layer_bytes = payload.size() / layer_count;
  std::vector<uint64_t> layer_checksums(layer_count);
  for (uint32_t i = 0; i < layer_count; ++i) {
    const uint64_t at = i * layer_bytes;
    layer_checksums[i] = CopyWithChecksum(stage.subspan(at, layer_bytes), payload.subspan(at, layer_bytes));
  }
  const uint64_t checksum = layer_count == 1 ? layer_checksums[0] : BlockChecksum(stage);
  if (payload_checksum && *payload_checksum != checksum) {
    MutexLock lock(mu_);
    ++counters_.write_checksum_mismatches;
    Unreserve(*op);
    return Corruption("hbm write: the payload does not match the checksum the caller expects");
  }
  return Submit(op, stage, checksum, std::move(layer_checksums));
}

Status HbmTier::Reserve(const BlockInfo& info, WriteOp& op) {
  Entry entry;
  entry.info = info;
  MutexLock lock(mu_);
  if (entries_.count(op.key) != 0) {
    ++counters_.write_rejections;
    return AlreadyExists("block is stored or being written in the hbm tier");
  }
  Result<uint64_t> staged = staging_.Allocate(info.payload_bytes);
  if (!staged.ok() || staging_write_bytes_ + staging_.LengthAt(*staged) > staging_share_bytes_) {
    if (staged.ok()) staging_.Free(*staged).IgnoreError();  // just taken: cannot fail
    ++counters_.busy;
    return Busy("hbm staging is full for writes");
  }
  Result<uint64_t> device_offset = device_->AllocateDevice(info.payload_bytes, &entry.device_length);
  if (!device_offset.ok()) {
    staging_.Free(*staged).IgnoreError();  // just taken: cannot fail
    ++counters_.no_space;
    return device_offset.status();
  }
  op.staging_offset = *staged;
  op.staging_length = staging_.LengthAt(*staged);
  staging_write_bytes_ += op.staging_length;
  entry.device_offset = *device_offset;
  entry.generation = op.generation = ++next_generation_;
  used_bytes_ += entry.device_length;
  entries_.emplace(op.key, std::move(entry));
  return Status::Ok();
}

void HbmTier::Unreserve(const WriteOp& op) {
  staging_.Free(op.staging_offset).IgnoreError();  // ours: cannot fail
  staging_write_bytes_ -= op.staging_length;
  DropLocked(op.key, op.generation);  // a no-op when Erase came first
}

Status HbmTier::Submit(const std::shared_ptr<WriteOp>& op, std::span<const std::byte> stage, uint64_t checksum,
                       std::vector<uint64_t> layer_checksums) {
  MutexLock lock(mu_);
  auto it = entries_.find(op->key);
  if (it == entries_.end() || it->second.generation != op->generation) {
    // Erased before its copy was enqueued: accepted, and cancelled.
    Unreserve(*op);
    ++counters_.cancelled_writes;
    completions_.Post([op] { op->done(Cancelled("block was erased while being written")); });
    return Status::Ok();
  }
  Result<uint32_t> fence = device_->CopyToDevice(it->second.device_offset, stage.data(), stage.size());
  if (!fence.ok()) {  // nothing was enqueued: undo
    ++(fence.status().code() == StatusCode::kBusy ? counters_.busy : counters_.write_failures);
    Unreserve(*op);
    return fence.status();
  }
  op->fence = *fence;
  it->second.info.payload_checksum = checksum;
  it->second.layer_checksums = std::move(layer_checksums);
  counters_.device_bytes += it->second.device_length;
  completions_.Post([this, op] { FinishWrite(op, device_->Wait(op->fence)); });
  return Status::Ok();
}

void HbmTier::FinishWrite(const std::shared_ptr<WriteOp>& op, Status copied) {
  Status outcome;
  {
    MutexLock lock(mu_);
    staging_.Free(op->staging_offset).IgnoreError();  // ours: cannot fail
    staging_write_bytes_ -= op->staging_length;
    auto it = entries_.find(op->key);
    if (it == entries_.end() || it->second.generation != op->generation) {
      ++counters_.cancelled_writes;
      outcome = Cancelled("block was erased while being written");
    } else if (!copied.ok()) {
      ++counters_.write_failures;
      DropLocked(op->key, op->generation);
      outcome = copied;
    } else {
      it->second.state = Entry::State::kStored;
      ++counters_.writes;
    }
  }
  op->done(outcome);
}

Status HbmTier::Read(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
                     ReadDone done) {
  const bool pinned = !dst.empty() && device_->IsPinnedHost(dst.data());  // a CUDA call: outside mu_
  auto op = std::make_shared<ReadOp>();
  op->key = key;
  op->dst = dst;
  op->first_layer = first_layer;
  op->done = std::move(done);
  MutexLock lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.state != Entry::State::kStored) return NotFound("not in the hbm tier");
  const Entry& entry = it->second;
  if (first_layer >= last_layer || last_layer > entry.info.layer_count) {
    return InvalidArgument("layer range [" + std::to_string(first_layer) + ", " + std::to_string(last_layer) +
                           ") of a block of " + std::to_string(entry.info.layer_count) + " layers");
  }
  op->layer_bytes = entry.info.payload_bytes / entry.info.layer_count;
  op->bytes = (last_layer - first_layer) * op->layer_bytes;
  if (dst.size() < op->bytes) return InvalidArgument("destination smaller than the layers read");
  op->generation = entry.generation;
  op->whole = first_layer == 0 && last_layer == entry.info.layer_count;
  op->payload_checksum = entry.info.payload_checksum;
  if (!op->whole) {
    op->layer_checksums.assign(entry.layer_checksums.begin() + first_layer, entry.layer_checksums.begin() + last_layer);
  }
  op->direct = pinned;
  std::byte* target = dst.data();
  if (!op->direct) {
    Result<uint64_t> staged = staging_.Allocate(op->bytes);
    if (!staged.ok() || staging_read_bytes_ + staging_.LengthAt(*staged) > staging_share_bytes_) {
      if (staged.ok()) staging_.Free(*staged).IgnoreError();  // just taken: cannot fail
      ++counters_.busy;
      return Busy("hbm staging is full for reads");
    }
    op->staging_offset = *staged;
    op->staging_length = staging_.LengthAt(*staged);
    staging_read_bytes_ += op->staging_length;
    target = device_->staging().data() + op->staging_offset;
  }
  Result<uint32_t> fence = device_->CopyToHost(target, entry.device_offset + first_layer * op->layer_bytes, op->bytes);
  if (!fence.ok()) {
    if (!op->direct) {
      staging_.Free(op->staging_offset).IgnoreError();  // ours: cannot fail
      staging_read_bytes_ -= op->staging_length;
    }
    ++(fence.status().code() == StatusCode::kBusy ? counters_.busy : counters_.read_failures);
    return fence.status();
  }
  op->fence = *fence;
  completions_.Post([this, op] { FinishRead(op, device_->Wait(op->fence)); });
  return Status::Ok();
}

void HbmTier::FinishRead(const std::shared_ptr<ReadOp>& op, Status copied) {
  Status outcome = copied;
  if (outcome.ok()) {  // outside mu_: the staging range and dst are this op's alone
    const std::span<std::byte> dst = op->dst.first(op->bytes);
    if (op->direct) {
      outcome = Verify(dst, op->layer_bytes, op->whole, op->payload_checksum, op->layer_checksums, op->first_layer);
    } else {
      const auto stage = device_->staging().subspan(op->staging_offset, op->bytes);
      outcome = CopyAndVerify(dst, stage, op->layer_bytes, op->whole, op->payload_checksum, op->layer_checksums,
                              op->first_layer);
    }
  }
  {
    MutexLock lock(mu_);
    if (!op->direct) {
      staging_.Free(op->staging_offset).IgnoreError();  // ours: cannot fail
      staging_read_bytes_ -= op->staging_length;
    }
    if (outcome.ok()) {
      ++counters_.reads;
      if (op->direct) ++counters_.direct_reads;
      auto it = entries_.find(op->key);
      if (it != entries_.end() && it->second.generation == op->generation) ++it->second.hits;
    } else {
      ++(outcome.code() == StatusCode::kCorruption ? counters_.corrupt_reads : counters_.read_failures);
      if (outcome.code() == StatusCode::kCorruption) DropLocked(op->key, op->generation);
    }
  }
  if (outcome.ok()) {
    op->done(size_t{op->bytes});
  } else {
    op->done(outcome);
  }
}

Status HbmTier::Erase(const BlockKey& key) {
  MutexLock lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) return NotFound("not in the hbm tier");
  ++counters_.erases;
  DropLocked(key, it->second.generation);
  return Status::Ok();
}

void HbmTier::DropLocked(const BlockKey& key, uint64_t generation) {
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.generation != generation) return;
  const Entry& entry = it->second;
  if (entry.holds > 0) {  // the key goes now, the range at its last release
    const bool fresh =
        dropped_holds_.emplace(entry.device_offset, DroppedHold{key, entry.device_length, entry.holds}).second;
    KVTIER_CHECK(fresh, "an hbm device range held twice");  // held ranges are never handed out again
  } else {
    // Safe at once even with a copy of it in flight: every later copy that
    // may reuse the range is enqueued after it (see the header).
    FreeRangeLocked(entry.device_offset, entry.device_length);
  }
  entries_.erase(it);
}

void HbmTier::FreeRangeLocked(uint64_t device_offset, uint64_t device_length) {
  device_->FreeDevice(device_offset);
  used_bytes_ -= device_length;
}

Result<BlockTier::InPlace> HbmTier::HoldInPlace(const BlockKey& key) {
  MutexLock lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.state != Entry::State::kStored) return NotFound("not in the hbm tier");
  ++it->second.holds;
  ++counters_.in_place_holds;
  return InPlace{it->second.device_offset, it->second.info};
}

void HbmTier::ReleaseInPlace(const BlockKey& key, uint64_t offset) {
  MutexLock lock(mu_);
  // A held range is never freed, so at most one of the two matches: the
  // block still stored there, or the range it left behind.
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.device_offset == offset && it->second.holds > 0) {
    --it->second.holds;
    return;
  }
  auto dropped = dropped_holds_.find(offset);
  if (dropped == dropped_holds_.end() || dropped->second.key != key) {
    ++counters_.bad_in_place_releases;  // a caller bug: nothing of ours to release
    return;
  }
  if (--dropped->second.holds == 0) {
    FreeRangeLocked(offset, dropped->second.device_length);
    dropped_holds_.erase(dropped);
  }
}

BlockTier::WriteTotals HbmTier::write_totals() const {
  MutexLock lock(mu_);
  return WriteTotals{counters_.device_bytes, 0};
}

void HbmTier::VisitCounters(CounterVisitor& v) const {
  MutexLock lock(mu_);
  int64_t blocks = 0, held_blocks = static_cast<int64_t>(dropped_holds_.size());
  for (const auto& [key, entry] : entries_) {
    blocks += entry.state == Entry::State::kStored ? 1 : 0;
    held_blocks += entry.holds > 0 ? 1 : 0;
  }
  v.VisitGauge("hbm.blocks", blocks);
  v.VisitGauge("hbm.writing_blocks", static_cast<int64_t>(entries_.size()) - blocks);
  v.VisitGauge("hbm.used_bytes", static_cast<int64_t>(used_bytes_));
  v.VisitGauge("hbm.capacity_bytes", static_cast<int64_t>(device_->capacity_bytes()));
  v.VisitGauge("hbm.staging_write_bytes", static_cast<int64_t>(staging_write_bytes_));
  v.VisitGauge("hbm.staging_read_bytes", static_cast<int64_t>(staging_read_bytes_));
  v.Visit("hbm.writes", counters_.writes);
  v.Visit("hbm.write_rejections", counters_.write_rejections);
  v.Visit("hbm.write_failures", counters_.write_failures);
  v.Visit("hbm.write_checksum_mismatches", counters_.write_checksum_mismatches);
  v.Visit("hbm.cancelled_writes", counters_.cancelled_writes);
  v.Visit("hbm.reads", counters_.reads);
  v.Visit("hbm.direct_reads", counters_.direct_reads);
  v.Visit("hbm.read_failures", counters_.read_failures);
  v.Visit("hbm.corrupt_reads", counters_.corrupt_reads);
  v.Visit("hbm.erases", counters_.erases);
  v.Visit("tier.evictions{tier=\"hbm\",reason=\"corrupt\"}", counters_.corrupt_reads);
  v.Visit("tier.evictions{tier=\"hbm\",reason=\"erased\"}", counters_.erases);
  v.Visit("hbm.busy", counters_.busy);
  v.Visit("hbm.no_space", counters_.no_space);
  v.VisitGauge("hbm.held_blocks", held_blocks);
  v.Visit("hbm.in_place_holds", counters_.in_place_holds);
  v.Visit("hbm.bad_in_place_releases", counters_.bad_in_place_releases);
  v.Visit("hbm.device_bytes_written", static_cast<int64_t>(counters_.device_bytes));
}

}  // namespace kvtier
