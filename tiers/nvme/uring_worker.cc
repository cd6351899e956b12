#include "tiers/nvme/uring_worker.h"

#include <algorithm>

#include <cerrno>
#include <cstring>
#include <future>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/check.h"
#include "tiers/nvme/device_file.h"

namespace kvtier {
namespace {

// user_data of the eventfd read; I/O ops carry their Op pointer.
constexpr uint64_t kWakeTag = 1;

std::string OpName(DeviceCounters::Op op) {
  switch (op) {
    case DeviceCounters::Op::kRead:
      return "read";
    case DeviceCounters::Op::kWrite:
      return "write";
    case DeviceCounters::Op::kFlush:
      return "flush";
  }
  return "io";
}

}  // namespace

UringWorker::UringWorker(int fd, uint32_t queue_depth, DeviceCounters& counters)
    : fd_(fd), depth_(queue_depth), counters_(counters) {}

Result<std::unique_ptr<UringWorker>> UringWorker::Create(int fd, uint32_t queue_depth, DeviceCounters& counters) {
  std::unique_ptr<UringWorker> w(new UringWorker(fd, queue_depth, counters));
  const int rc = io_uring_queue_init(queue_depth + 1, &w->ring_, 0);
  if (rc < 0) return Unavailable(std::string("io_uring_queue_init: ") + std::strerror(-rc));
  w->ring_ready_ = true;
  w->event_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (w->event_fd_ < 0) return ErrnoStatus(errno, "eventfd");
  w->ArmWakeRead();
  const int submitted = io_uring_submit(&w->ring_);
  if (submitted < 0) return Unavailable(std::string("io_uring_submit: ") + std::strerror(-submitted));
  w->thread_ = std::thread([raw = w.get()] { raw->Loop(); });
  return w;
}

UringWorker::~UringWorker() {
  if (thread_.joinable()) {
    {
      MutexLock lock(mu_);
      stopping_ = true;
    }
    Wake();
    thread_.join();
  }
  if (ring_ready_) io_uring_queue_exit(&ring_);  // cancels the armed wake-up read
  if (event_fd_ >= 0) ::close(event_fd_);
}

void UringWorker::Submit(std::unique_ptr<Op> op) {
  MutexLock lock(mu_);
  KVTIER_CHECK(!stopping_, "I/O submitted to a UringDevice being destroyed");
  const bool was_empty = queue_.empty();
  queue_.push_back(std::move(op));
  // The thread empties the whole queue each time it wakes, so only the
  // first submission into an empty queue needs to wake it. Under the lock:
  // once the op is queued it may complete and let the owner destroy this
  // worker (and close the eventfd) before an unlocked write would run.
  if (was_empty) Wake();
}

void UringWorker::Wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(event_fd_, &one, sizeof(one));
}

Status UringWorker::RegisterBuffers(const std::vector<iovec>& buffers) {
  std::promise<Status> outcome;
  auto future = outcome.get_future();
  {
    MutexLock lock(mu_);
    if (command_) return FailedPrecondition("a buffer registration is already pending");
    command_ = [this, &buffers, &outcome] {
      if (!fixed_.empty()) {
        outcome.set_value(FailedPrecondition("fixed buffers are already registered"));
        return;
      }
      const int rc = io_uring_register_buffers(&ring_, buffers.data(), static_cast<unsigned>(buffers.size()));
      if (rc < 0) {
        outcome.set_value(ErrnoStatus(
            -rc, "io_uring_register_buffers of " + std::to_string(buffers.size()) + " buffers (RLIMIT_MEMLOCK?)"));
        return;
      }
      fixed_ = buffers;
      outcome.set_value(Status::Ok());
    };
    if (queue_.empty()) Wake();
  }
  return future.get();
}

void UringWorker::ArmWakeRead() {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  KVTIER_CHECK(sqe != nullptr, "no SQE for the wake-up read: the ring reserves one");
  io_uring_prep_read(sqe, event_fd_, &wake_value_, sizeof(wake_value_), 0);
  io_uring_sqe_set_data64(sqe, kWakeTag);
}

bool UringWorker::TakeQueued() {
  std::function<void()> command;
  bool stopping = false;
  {
    MutexLock lock(mu_);
    while (!queue_.empty()) {
      LaneOf(*queue_.front()).push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    command.swap(command_);
    stopping = stopping_;
  }
  if (command) command();
  return stopping;
}

int UringWorker::FixedBufferIndex(const std::byte* data, size_t length) const {
  for (size_t i = 0; i < fixed_.size(); ++i) {
    const auto* base = static_cast<const std::byte*>(fixed_[i].iov_base);
    if (data >= base && data + length <= base + fixed_[i].iov_len) return static_cast<int>(i);
  }
  return -1;
}

std::unique_ptr<UringWorker::Op> UringWorker::NextOp() {
  const uint32_t write_share = depth_ >= 2 ? std::max<uint32_t>(1, depth_ / 4) : 0;
  const uint32_t reads_in_flight = in_flight_ - writes_in_flight_;
  const bool read_may_go =
      !waiting_reads_.empty() && (waiting_writes_.empty() || reads_in_flight < depth_ - write_share);
  // A write goes when no read may: none waits, or reads fill their share.
  std::deque<std::unique_ptr<Op>>* lane = nullptr;
  if (read_may_go) {
    lane = &waiting_reads_;
  } else if (!waiting_writes_.empty()) {
    lane = &waiting_writes_;
  }
  if (lane == nullptr) return nullptr;
  std::unique_ptr<Op> op = std::move(lane->front());
  lane->pop_front();
  return op;
}

void UringWorker::Prepare() {
  while (in_flight_ < depth_) {
    std::unique_ptr<Op> next = NextOp();
    if (next == nullptr) break;
    if (!next->rejected.ok()) {  // a bad request: answer it from this thread
      counters_.Record(next->kind, next->rejected);
      next->done(next->rejected);
      continue;
    }
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {  // the SQ is full until the next submit
      LaneOf(*next).push_front(std::move(next));
      break;
    }
    Op* op = next.release();
    std::byte* data = op->data + op->transferred;
    const auto length = static_cast<unsigned>(op->length - op->transferred);
    const uint64_t offset = op->offset + op->transferred;
    const int fixed = FixedBufferIndex(data, length);
    switch (op->kind) {
      case DeviceCounters::Op::kRead:
        if (fixed >= 0) {
          io_uring_prep_read_fixed(sqe, fd_, data, length, offset, fixed);
        } else {
          io_uring_prep_read(sqe, fd_, data, length, offset);
        }
        break;
      case DeviceCounters::Op::kWrite:
        if (fixed >= 0) {
          io_uring_prep_write_fixed(sqe, fd_, data, length, offset, fixed);
        } else {
          io_uring_prep_write(sqe, fd_, data, length, offset);
        }
        break;
      case DeviceCounters::Op::kFlush:
        io_uring_prep_fsync(sqe, fd_, IORING_FSYNC_DATASYNC);
        break;
    }
    io_uring_sqe_set_data(sqe, op);
    ++in_flight_;
    if (op->kind != DeviceCounters::Op::kRead) ++writes_in_flight_;
  }
}

void UringWorker::Finish(Op* raw, int result) {
  std::unique_ptr<Op> op(raw);
  --in_flight_;
  if (op->kind != DeviceCounters::Op::kRead) --writes_in_flight_;
  if (result == -EINTR || result == -EAGAIN) {  // transient: try again
    LaneOf(*op).push_front(std::move(op));
    return;
  }
  Result<size_t> outcome = size_t{0};
  if (result < 0) {
    outcome = ErrnoStatus(-result, "io_uring " + OpName(op->kind) + " of " + std::to_string(op->length) +
                                       " bytes at offset " + std::to_string(op->offset));
  } else if (op->kind != DeviceCounters::Op::kFlush) {
    op->transferred += static_cast<size_t>(result);
    if (result > 0 && op->transferred < op->length) {  // partial: submit the rest
      LaneOf(*op).push_front(std::move(op));
      return;
    }
    outcome = op->transferred;  // short only at the end of the file
  }
  counters_.Record(op->kind, outcome);
  op->done(std::move(outcome));
}

void UringWorker::Reap() {
  io_uring_cqe* cqe = nullptr;
  unsigned seen = 0;
  bool rearm = false;
  std::vector<std::pair<Op*, int>> finished;
  unsigned head;
  io_uring_for_each_cqe(&ring_, head, cqe) {
    ++seen;
    if (io_uring_cqe_get_data64(cqe) == kWakeTag) {
      rearm = true;
    } else {
      finished.emplace_back(static_cast<Op*>(io_uring_cqe_get_data(cqe)), cqe->res);
    }
  }
  io_uring_cq_advance(&ring_, seen);
  if (rearm) ArmWakeRead();
  for (auto [op, res] : finished) Finish(op, res);  // callbacks may submit more
}

void UringWorker::Loop() {
  for (;;) {
    const bool stopping = TakeQueued();
    Prepare();
    if (stopping && in_flight_ == 0 && waiting_reads_.empty() && waiting_writes_.empty()) return;
    const int rc = io_uring_submit_and_wait(&ring_, 1);
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
      KVTIER_CHECK(false, (std::string("io_uring_submit_and_wait: ") + std::strerror(-rc)).c_str());
    }
    Reap();
  }
}

}  // namespace kvtier
