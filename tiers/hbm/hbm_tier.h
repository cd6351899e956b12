// HbmTier: blocks in spare GPU memory the daemon owns (docs/INTERNALS.md, "The GPU parts"),
// over an HbmDevice (cuda_hbm_device.h on a GPU; a host-memory double
// in tests). Built only with CUDA (KVTIER_HAVE_CUDA).
//
// The tier implements BlockTier (tiers/tier.h) with its InPlaceHolds
// capability; what follows adds to that contract.
// - Write copies the payload into pinned staging before it returns (each
//   layer checksummed as it is copied; the payload checksum is a second
//   pass over the staged copy, unless the block is one layer), enqueues
//   one host-to-device copy on the device's stream and returns; the
//   completion thread waits for that copy's fence and makes the block
//   readable. Find does not see a block until then.
// - Read copies layers [first, last) device-to-host: straight into `dst`
//   when it is pinned host memory (a registered arena), else through
//   staging. The completion thread verifies the bytes it returns against
//   the per-layer checksums recorded at write (the payload checksum for a
//   whole-block read); a mismatch drops the block (Corruption).
// - Every copy is enqueued under the tier's mutex, so the stream's order
//   is the index's order: a device range freed by Erase (or by a dropped
//   block) is reused only by copies enqueued after the last copy that used
//   it, and a read never sees a later block's bytes.
// - Full is NoSpace: the tier does not evict on its own (the engine
//   erases or demotes), so SetEvictionSink is ignored. Busy when the
//   staging share (3/4 each for writes and reads) or the copy fences are
//   used up; nothing of a refused call is visible.
// - In-place holds: the daemon hands clients the offset of a held block
//   in the device pool it exports over CUDA IPC (CudaHbmDevice::pool()),
//   and clients copy from there themselves. HoldInPlace answers a stored
//   block's device offset and info (not a read: no read or hit is
//   counted); until the matching ReleaseInPlace the tier does not free
//   that range, so no later copy is enqueued into it and its bytes stay
//   as they are. Erasing or dropping a held block (a corrupt read) frees
//   its key at once (Find misses; a new Write of the key gets another
//   range) but keeps the range, still in used_bytes, until its last
//   release. Holds nest and are matched by device offset as well as key,
//   so releasing an old range never touches a re-written block. A release
//   that matches no hold is a caller bug: ignored and counted
//   (hbm.bad_in_place_releases). The destructor frees held ranges with
//   the device.
//
// Thread-safe. Completions run exactly once, never inline, on the tier's
// one completion thread, in submission order. The destructor runs the
// completions of everything in flight.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/worker_pool.h"
#include "gpu/range_allocator.h"
#include "tiers/hbm/hbm_device.h"
#include "tiers/tier.h"

namespace kvtier {

class HbmTier final : public BlockTier, public InPlaceHolds {
 public:
  // Takes the device. A block larger than 3/4 of the device's staging can
  // never be written (InvalidArgument). Errors: InvalidArgument (no device,
  // no staging).
  static Result<std::unique_ptr<HbmTier>> Create(std::unique_ptr<HbmDevice> device);
  ~HbmTier() override;

  std::string_view name() const override { return "hbm"; }
  bool asynchronous() const override { return true; }
  uint64_t capacity_bytes() const override { return device_->capacity_bytes(); }
  uint64_t used_bytes() const override;
  // The device range: the payload rounded up to 256 bytes.
  uint64_t StoredBytes(uint64_t payload_bytes) const override;

  std::optional<BlockInfo> Find(const BlockKey& key) const override;
  void ForEachBlock(const BlockVisitor& visit) const override;
  Status Write(const NamespaceFingerprint& ns, const BlockKey& key, uint32_t layer_count,
               std::span<const std::byte> payload, WriteDone done,
               std::optional<uint64_t> payload_checksum = std::nullopt) override;
  Status Read(const BlockKey& key, uint32_t first_layer, uint32_t last_layer, std::span<std::byte> dst,
              ReadDone done) override;
  Status Erase(const BlockKey& key) override;
  // NotFound unless `key` is stored (readable now).
  InPlaceHolds* in_place_holds() override { return this; }
  Result<InPlace> HoldInPlace(const BlockKey& key) override;
  void ReleaseInPlace(const BlockKey& key, uint64_t offset) override;
  WriteTotals write_totals() const override;
  // hbm.* counters.
  void VisitCounters(CounterVisitor& visitor) const override;

  HbmDevice& device() { return *device_; }

 private:
  // A block: being written (its copy in flight; invisible) or stored.
  struct Entry {
    enum class State { kWriting, kStored };
    State state = State::kWriting;
    uint64_t generation = 0;  // tells a re-written key from the one an op started on
    BlockInfo info;
    uint64_t device_offset = 0;
    uint64_t device_length = 0;
    std::vector<uint64_t> layer_checksums;
    int64_t hits = 0;
    uint32_t holds = 0;  // in-place holds of device_offset; only while stored
  };
  // The range of an erased or dropped block that is still held in place:
  // allocated and in used_bytes_ until its last release.
  struct DroppedHold {
    BlockKey key;
    uint64_t device_length = 0;
    uint32_t holds = 0;
  };
  struct WriteOp;
  struct ReadOp;

  explicit HbmTier(std::unique_ptr<HbmDevice> device);
  // Write's steps: take staging and a device range and enter the block as
  // being written (under mu_); give them back (mu_ held); enqueue the copy
  // from staging unless an Erase came first.
  Status Reserve(const BlockInfo& info, WriteOp& op);
  void Unreserve(const WriteOp& op) REQUIRES(mu_);
  Status Submit(const std::shared_ptr<WriteOp>& op, std::span<const std::byte> stage, uint64_t checksum,
                std::vector<uint64_t> layer_checksums);
  void FinishWrite(const std::shared_ptr<WriteOp>& op, Status copied);
  void FinishRead(const std::shared_ptr<ReadOp>& op, Status copied);
  // Forgets `key` if it is still generation `generation`; under mu_. A
  // held range moves to dropped_holds_ instead of being freed.
  void DropLocked(const BlockKey& key, uint64_t generation) REQUIRES(mu_);
  // Gives a range back to the device and uncharges it; under mu_.
  void FreeRangeLocked(uint64_t device_offset, uint64_t device_length) REQUIRES(mu_);

  std::unique_ptr<HbmDevice> device_;
  const uint64_t staging_share_bytes_;  // each of writes and reads may use this much

  mutable Mutex mu_;
  std::unordered_map<BlockKey, Entry> entries_ GUARDED_BY(mu_);
  gpu::RangeAllocator staging_ GUARDED_BY(mu_);
  uint64_t staging_write_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t staging_read_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t used_bytes_ GUARDED_BY(mu_) = 0;  // device ranges held
  uint64_t next_generation_ GUARDED_BY(mu_) = 0;
  // Held ranges of erased or dropped blocks, by device offset.
  std::unordered_map<uint64_t, DroppedHold> dropped_holds_ GUARDED_BY(mu_);
  struct Counters {
    int64_t writes = 0, write_rejections = 0, write_failures = 0, write_checksum_mismatches = 0;
    int64_t cancelled_writes = 0, reads = 0, read_failures = 0, corrupt_reads = 0, direct_reads = 0;
    int64_t erases = 0, busy = 0, no_space = 0;
    int64_t in_place_holds = 0, bad_in_place_releases = 0;
    uint64_t device_bytes = 0;
  } counters_ GUARDED_BY(mu_);

  WorkerPool completions_{1};  // declared last: drained first, while the rest still exists
};

}  // namespace kvtier
