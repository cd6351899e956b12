#include "tests/testing/fault_injecting_device.h"

#include <thread>

namespace kvtier::testing {

FaultInjectingDevice::FaultInjectingDevice(BlockDevice& inner, const FaultOptions& options)
    : inner_(inner), options_(options), rng_(options.seed) {}

void FaultInjectingDevice::SetOptions(const FaultOptions& options) {
  std::lock_guard lock(mu_);
  options_ = options;
  ops_ = 0;
}

int64_t FaultInjectingDevice::injected() const {
  int64_t total = 0;
  for (const auto& n : injected_) total += n.load(std::memory_order_relaxed);
  return total;
}

FaultInjectingDevice::Decision FaultInjectingDevice::Decide(bool is_read, size_t length) {
  std::lock_guard lock(mu_);
  Decision d;
  std::uniform_real_distribution<double> unit(0, 1);
  const size_t blocks = length / alignment_bytes();
  auto prefix = [&] {  // an aligned prefix strictly shorter than the transfer
    return blocks == 0 ? 0 : std::uniform_int_distribution<size_t>(0, blocks - 1)(rng_) * alignment_bytes();
  };
  ++ops_;
  d.delayed = unit(rng_) < options_.delay_rate;
  if (options_.fail_after >= 0 && ops_ > options_.fail_after) {
    d.fault = kEio;
  } else if (unit(rng_) < options_.eio_rate) {
    d.fault = kEio;
  } else if (!is_read && length > 0 && unit(rng_) < options_.no_space_rate) {
    d.fault = kNoSpace;
  } else if (is_read && unit(rng_) < options_.short_read_rate && blocks > 0) {
    d.fault = kShortRead;
  } else if (is_read && unit(rng_) < options_.corrupt_read_rate && length > 0) {
    d.fault = kCorruptRead;
    d.flip_at = std::uniform_int_distribution<size_t>(0, length - 1)(rng_);
  } else if (!is_read && unit(rng_) < options_.short_write_rate && blocks > 0) {
    d.fault = kShortWrite;
  } else if (!is_read && unit(rng_) < options_.torn_write_rate && blocks > 0) {
    d.fault = kTornWrite;
  }
  d.prefix = prefix();
  if (d.fault != kNone) injected_[d.fault].fetch_add(1, std::memory_order_relaxed);
  return d;
}

IoDone FaultInjectingDevice::Delayed(bool delayed, IoDone done) const {
  if (!delayed) return done;
  std::chrono::microseconds delay;
  {
    std::lock_guard lock(mu_);
    delay = options_.delay;
  }
  return [delay, done = std::move(done)](Result<size_t> r) {
    std::this_thread::sleep_for(delay);  // on the device thread, as a slow drive stalls it
    done(std::move(r));
  };
}

void FaultInjectingDevice::Hold(Latch& latch) {
  std::lock_guard lock(mu_);
  latch.holding = true;
}

void FaultInjectingDevice::Release(Latch& latch) {
  std::vector<std::function<void()>> held;
  {
    std::lock_guard lock(mu_);
    latch.holding = false;
    held.swap(latch.held);
  }
  for (auto& io : held) io();
}

size_t FaultInjectingDevice::Held(const Latch& latch) const {
  std::lock_guard lock(mu_);
  return latch.held.size();
}

bool FaultInjectingDevice::Park(Latch& latch, std::function<void()> io) {
  std::lock_guard lock(mu_);
  if (!latch.holding) return false;
  latch.held.push_back(std::move(io));
  return true;
}

void FaultInjectingDevice::HoldReads() { Hold(read_latch_); }
void FaultInjectingDevice::ReleaseReads() { Release(read_latch_); }
size_t FaultInjectingDevice::held_reads() const { return Held(read_latch_); }
void FaultInjectingDevice::HoldWrites() { Hold(write_latch_); }
void FaultInjectingDevice::ReleaseWrites() { Release(write_latch_); }
size_t FaultInjectingDevice::held_writes() const { return Held(write_latch_); }

void FaultInjectingDevice::Read(uint64_t offset, std::span<std::byte> dst, IoDone done) {
  if (Park(read_latch_, [this, offset, dst, done] { Read(offset, dst, done); })) return;
  const Decision d = Decide(/*is_read=*/true, dst.size());
  done = Delayed(d.delayed, std::move(done));
  inner_.Read(offset, dst, [d, dst, done = std::move(done)](Result<size_t> r) {
    if (!r.ok() || d.fault == kNone) return done(std::move(r));
    switch (d.fault) {
      case kEio:
        return done(IoError("injected EIO on read"));
      case kShortRead:
        return done(d.prefix);
      case kCorruptRead:
        dst[d.flip_at] ^= std::byte{0x5a};
        return done(std::move(r));
      default:
        return done(std::move(r));
    }
  });
}

void FaultInjectingDevice::Write(uint64_t offset, std::span<const std::byte> src, IoDone done) {
  if (Park(write_latch_, [this, offset, src, done] { Write(offset, src, done); })) return;
  const Decision d = Decide(/*is_read=*/false, src.size());
  done = Delayed(d.delayed, std::move(done));
  if (d.fault == kNone) return inner_.Write(offset, src, std::move(done));
  const size_t full = src.size();
  // Every fault writes only a prefix (possibly empty); what it reports differs.
  inner_.Write(offset, src.first(d.prefix), [d, full, done = std::move(done)](Result<size_t> r) {
    if (!r.ok()) return done(std::move(r));
    switch (d.fault) {
      case kEio:
        return done(IoError("injected EIO on write"));
      case kNoSpace:
        return done(NoSpace("injected ENOSPC on write"));
      case kShortWrite:
        return done(d.prefix);
      case kTornWrite:
        return done(full);  // the lie
      default:
        return done(std::move(r));
    }
  });
}

void FaultInjectingDevice::Flush(IoDone done) {
  const Decision d = Decide(/*is_read=*/false, 0);
  done = Delayed(d.delayed, std::move(done));
  if (d.fault != kEio) return inner_.Flush(std::move(done));
  inner_.Flush([done = std::move(done)](Result<size_t>) { done(IoError("injected EIO on flush")); });
}

void FaultInjectingDevice::VisitCounters(CounterVisitor& visitor) const {
  inner_.VisitCounters(visitor);
  static constexpr const char* kNames[kFaultKinds] = {"",
                                                      "faults.injected_eio",
                                                      "faults.injected_short_read",
                                                      "faults.injected_short_write",
                                                      "faults.injected_torn_write",
                                                      "faults.injected_corrupt_read",
                                                      "faults.injected_no_space"};
  for (int f = kEio; f < kFaultKinds; ++f) visitor.Visit(kNames[f], injected_[f].load(std::memory_order_relaxed));
}

}  // namespace kvtier::testing
