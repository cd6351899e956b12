// FaultInjectingDevice: wraps a BlockDevice and makes some of its I/Os go
// wrong in the ways real drives and file systems do, at seeded random
// rates, so tests can check that no fault ever turns into a wrong byte.
//
//   eio          the I/O fails with IoError (a write may have written a
//                prefix first, as a failing drive may)
//   no_space     a write fails with NoSpace (ENOSPC of a full file system)
//   short_read   a read reports fewer bytes than asked
//   short_write  a write writes a prefix and reports that count
//   torn_write   a write writes a prefix but reports complete success
//                (a lying medium; only checksums can catch it)
//   corrupt_read a read succeeds with one byte flipped (bit rot)
//   delay        the completion comes `delay` later
//   fail_after   every I/O after the first N fails with IoError
//
// And latches the test holds: while HoldWrites() (HoldReads()) is in
// force, writes (reads) are not issued; ReleaseWrites() (ReleaseReads())
// issues them, in order (a stalled drive).
//
// Thread-safe; options may change while I/O runs (e.g. to heal a device).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <functional>
#include <random>
#include <vector>

#include "tiers/nvme/block_device.h"

namespace kvtier::testing {

struct FaultOptions {
  uint64_t seed = 1;
  double eio_rate = 0;
  double no_space_rate = 0;
  double short_read_rate = 0;
  double short_write_rate = 0;
  double torn_write_rate = 0;
  double corrupt_read_rate = 0;
  double delay_rate = 0;
  std::chrono::microseconds delay{0};
  int64_t fail_after = -1;  // < 0: never
};

class FaultInjectingDevice final : public BlockDevice {
 public:
  // `inner` is borrowed and must outlive this wrapper.
  FaultInjectingDevice(BlockDevice& inner, const FaultOptions& options);

  uint64_t capacity_bytes() const override { return inner_.capacity_bytes(); }
  uint32_t alignment_bytes() const override { return inner_.alignment_bytes(); }
  std::string_view kind() const override { return "faulty"; }

  void Read(uint64_t offset, std::span<std::byte> dst, IoDone done) override;
  void Write(uint64_t offset, std::span<const std::byte> src, IoDone done) override;
  void Flush(IoDone done) override;
  Status RegisterBuffers(std::span<const std::span<std::byte>> buffers) override {
    return inner_.RegisterBuffers(buffers);
  }
  // The inner device's counters plus faults.injected_* per kind.
  void VisitCounters(CounterVisitor& visitor) const override;

  void SetOptions(const FaultOptions& options);
  // Writes from now on wait (not issued, not completed) until ReleaseWrites,
  // which issues every held write in arrival order and stops holding.
  void HoldWrites();
  void ReleaseWrites();
  // Writes waiting on the latch now.
  size_t held_writes() const;
  // The same for reads.
  void HoldReads();
  void ReleaseReads();
  size_t held_reads() const;
  // Faults injected so far, all kinds together.
  int64_t injected() const;

 private:
  enum Fault { kNone, kEio, kShortRead, kShortWrite, kTornWrite, kCorruptRead, kNoSpace, kFaultKinds };
  struct Decision {
    Fault fault = kNone;
    bool delayed = false;
    size_t prefix = 0;   // aligned bytes kept by short and torn transfers
    size_t flip_at = 0;  // byte flipped by corrupt_read
  };
  Decision Decide(bool is_read, size_t length);
  IoDone Delayed(bool delayed, IoDone done) const;

  BlockDevice& inner_;
  mutable std::mutex mu_;
  FaultOptions options_;  // guarded by mu_
  std::mt19937_64 rng_;   // guarded by mu_
  int64_t ops_ = 0;       // guarded by mu_
  std::atomic<int64_t> injected_[kFaultKinds] = {};
  // A latch: while `holding`, I/Os are parked in `held` (as calls to make).
  struct Latch {
    bool holding = false;
    std::vector<std::function<void()>> held;
  };
  void Hold(Latch& latch);
  void Release(Latch& latch);
  size_t Held(const Latch& latch) const;
  // Parks `io` if `latch` is holding; false (do it now) otherwise.
  bool Park(Latch& latch, std::function<void()> io);
  Latch write_latch_;  // guarded by mu_
  Latch read_latch_;   // guarded by mu_
};

}  // namespace kvtier::testing
