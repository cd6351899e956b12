// UringWorker: one io_uring and the thread that drives it; the building
// block of UringDevice (which owns one per I/O thread). Internal to
// tiers/nvme.
//
// Submissions from any thread go into a mutex-guarded queue; the thread is
// woken through an eventfd whose read is always armed in the ring, so it
// sleeps in a single io_uring_enter waiting for either an I/O completion or
// new work. At most queue_depth I/Os are in flight; the rest wait in two
// lanes, each in order: reads go first (a prefetch or a pin should not wait
// behind demotion writes), while writes and flushes, which keep their
// relative order, hold a quarter of the depth (at least one slot from depth
// 2) whenever they wait, so they never starve.
//
// Thread-safe. Completions run on the worker's thread, without its lock.
#pragma once

#include <liburing.h>

#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "tiers/nvme/block_device.h"

namespace kvtier {

class UringWorker {
 public:
  // A queued I/O plus what the ring needs to finish it.
  struct Op : IoJob {
    size_t transferred = 0;  // partial completions resubmit the rest
    Status rejected;         // not ok: completed with this on the thread, never sent to the ring
  };

  // Sets up a ring of `queue_depth` (+1 for the wake-up read) entries on
  // `fd` (borrowed; must outlive the worker). `counters` is borrowed too.
  static Result<std::unique_ptr<UringWorker>> Create(int fd, uint32_t queue_depth, DeviceCounters& counters);
  // Lets every submitted I/O complete, then stops the thread.
  ~UringWorker();

  void Submit(std::unique_ptr<Op> op);
  // Registers `buffers` as this ring's fixed buffers, on the ring's thread;
  // waits for the outcome.
  Status RegisterBuffers(const std::vector<iovec>& buffers);

 private:
  UringWorker(int fd, uint32_t queue_depth, DeviceCounters& counters);
  void Loop();
  void ArmWakeRead();
  // Makes the armed eventfd read complete, waking the thread.
  void Wake();
  // Moves queued work (and a pending command) to the thread's side.
  bool TakeQueued();
  // Fills SQEs for waiting ops while slots and depth allow.
  void Prepare();
  void Reap();
  void Finish(Op* op, int result);
  // Index of the fixed buffer holding [data, data + length), or -1.
  int FixedBufferIndex(const std::byte* data, size_t length) const;

  const int fd_;
  const uint32_t depth_;
  DeviceCounters& counters_;
  io_uring ring_{};
  bool ring_ready_ = false;
  int event_fd_ = -1;

  Mutex mu_;
  std::deque<std::unique_ptr<Op>> queue_ GUARDED_BY(mu_);
  std::function<void()> command_ GUARDED_BY(mu_);  // runs on the thread (buffer registration)
  bool stopping_ GUARDED_BY(mu_) = false;

  // Thread-only state:
  // Taken from queue_, not yet in the ring: reads, and writes with flushes.
  std::deque<std::unique_ptr<Op>> waiting_reads_;
  std::deque<std::unique_ptr<Op>> waiting_writes_;
  uint32_t in_flight_ = 0;         // I/Os in the ring (not the wake-up read)
  uint32_t writes_in_flight_ = 0;  // the writes and flushes among them
  std::deque<std::unique_ptr<Op>>& LaneOf(const Op& op) {
    return op.kind == DeviceCounters::Op::kRead ? waiting_reads_ : waiting_writes_;
  }
  // The next op to send, from the lane whose turn it is; null if none may go.
  std::unique_ptr<Op> NextOp();
  uint64_t wake_value_ = 0;   // the eventfd read's target
  std::vector<iovec> fixed_;  // registered fixed buffers
  std::thread thread_;
};

}  // namespace kvtier
