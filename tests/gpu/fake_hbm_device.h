// FakeHbmDevice: an HbmDevice in host memory, so the HBM tier's logic runs
// (and is tested) without a GPU. "Device" memory is a host vector; copies
// run in submission order, at once, or when Release() is called after
// Hold() (a stalled stream, to test work in flight). Tests only.
//
// Thread-safe.
#pragma once

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <span>
#include <vector>

#include "common/check.h"
#include "gpu/range_allocator.h"
#include "tiers/hbm/hbm_device.h"

namespace kvtier::testing {

class FakeHbmDevice final : public HbmDevice {
 public:
  FakeHbmDevice(uint64_t capacity_bytes, uint64_t staging_bytes, uint32_t fences = 64)
      : memory_(capacity_bytes), staging_(staging_bytes), allocator_(capacity_bytes), max_fences_(fences) {}

  uint64_t capacity_bytes() const override { return allocator_.capacity_bytes(); }
  Result<uint64_t> AllocateDevice(uint64_t bytes, uint64_t* length_out) override {
    std::lock_guard lock(mu_);
    Result<uint64_t> offset = allocator_.Allocate(bytes);
    if (offset.ok()) *length_out = allocator_.LengthAt(*offset);
    return offset;
  }
  void FreeDevice(uint64_t offset) override {
    std::lock_guard lock(mu_);
    KVTIER_CHECK(allocator_.Free(offset).ok(), "wild device free");
  }
  std::span<std::byte> staging() override { return staging_; }
  bool IsPinnedHost(const void* host) const override {
    std::lock_guard lock(mu_);
    const auto* p = static_cast<const std::byte*>(host);
    return !pinned_.empty() && p >= pinned_.data() && p < pinned_.data() + pinned_.size();
  }
  Result<uint32_t> CopyToDevice(uint64_t device_offset, const std::byte* host, uint64_t bytes) override {
    return Submit(memory_.data() + device_offset, host, bytes);
  }
  Result<uint32_t> CopyToHost(std::byte* host, uint64_t device_offset, uint64_t bytes) override {
    return Submit(host, memory_.data() + device_offset, bytes);
  }
  Status Wait(uint32_t fence) override {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return done_ >= fence; });
    --in_flight_;
    if (fail_copies_) return IoError("fake device: copy failed");
    return Status::Ok();
  }

  // Stalls the stream: copies queue until Release().
  void Hold() {
    std::lock_guard lock(mu_);
    held_ = true;
  }
  void Release() {
    std::lock_guard lock(mu_);
    held_ = false;
    RunLocked();
  }
  // Host memory the tier should treat as pinned (a registered arena).
  void MarkPinned(std::span<std::byte> host) {
    std::lock_guard lock(mu_);
    pinned_ = host;
  }
  // Every later Wait reports a device fault.
  void FailCopies() {
    std::lock_guard lock(mu_);
    fail_copies_ = true;
  }
  // The "device" bytes, to corrupt a stored block.
  std::span<std::byte> memory() { return memory_; }
  uint64_t live_ranges() const {
    std::lock_guard lock(mu_);
    return allocator_.live_ranges();
  }

 private:
  struct Copy {
    std::byte* dst;
    const std::byte* src;
    uint64_t bytes;
  };
  Result<uint32_t> Submit(std::byte* dst, const std::byte* src, uint64_t bytes) {
    std::lock_guard lock(mu_);
    if (in_flight_ >= max_fences_) return Busy("fake device: all fences in flight");
    ++in_flight_;
    queue_.push_back({dst, src, bytes});
    const auto fence = static_cast<uint32_t>(++submitted_);
    if (!held_) RunLocked();
    return fence;
  }
  void RunLocked() {
    for (const Copy& c : queue_) std::memcpy(c.dst, c.src, c.bytes);
    done_ += queue_.size();
    queue_.clear();
    cv_.notify_all();
  }

  std::vector<std::byte> memory_;
  std::vector<std::byte> staging_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  gpu::RangeAllocator allocator_;  // guarded by mu_
  std::deque<Copy> queue_;         // guarded by mu_
  uint64_t submitted_ = 0, done_ = 0;
  uint32_t in_flight_ = 0;
  const uint32_t max_fences_;
  bool held_ = false, fail_copies_ = false;
  std::span<std::byte> pinned_;
};

}  // namespace kvtier::testing
