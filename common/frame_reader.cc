#include "common/frame_reader.h"

#include <algorithm>
#include <cstring>

#include "common/framing.h"

namespace kvtier {

bool FrameBudget::TryTake(size_t bytes) {
  size_t used = used_bytes_.load(std::memory_order_relaxed);
  do {
    if (bytes > limit_bytes_ || used > limit_bytes_ - bytes) {
      refusals_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
  } while (!used_bytes_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
  return true;
}

FrameReader::FrameReader(uint32_t max_frame_bytes, FrameMemory* budget)
    : max_frame_bytes_(max_frame_bytes),
      budget_(budget),
      buffer_(new uint8_t[kInitialBytes]),
      capacity_(kInitialBytes) {}

FrameReader::~FrameReader() {
  if (budget_ != nullptr) budget_->Give(capacity_ - kInitialBytes);
}

uint32_t FrameReader::announced_bytes() const {
  return buffered_bytes() >= kFrameHeaderBytes ? DecodeFrameHeader(buffer_.get() + begin_) : 0;
}

bool FrameReader::Resize(size_t capacity) {
  const size_t old_charge = capacity_ - kInitialBytes;
  const size_t new_charge = capacity - kInitialBytes;
  if (new_charge > old_charge && budget_ != nullptr && !budget_->TryTake(new_charge - old_charge)) return false;
  auto grown = std::make_unique<uint8_t[]>(capacity);
  const size_t buffered = buffered_bytes();
  if (buffered > 0) std::memcpy(grown.get(), buffer_.get() + begin_, buffered);
  buffer_ = std::move(grown);
  if (new_charge < old_charge && budget_ != nullptr) budget_->Give(old_charge - new_charge);
  capacity_ = capacity;
  begin_ = 0;
  end_ = buffered;
  return true;
}

std::span<uint8_t> FrameReader::ReadSpace() {
  frame_bytes_ = 0;  // a body Next returned is no longer valid
  if (begin_ == end_) {
    begin_ = end_ = 0;
    // Everything was consumed: give the growth back.
    if (capacity_ > kInitialBytes) Resize(kInitialBytes);
  }
  if (end_ == capacity_ && begin_ > 0) {
    // Full, but consumed frames sit at the front: move the rest down.
    std::memmove(buffer_.get(), buffer_.get() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  if (end_ == capacity_) {
    // Full of one unfinished frame: double, never past what it still needs.
    const size_t needed = kFrameHeaderBytes + std::min(announced_bytes(), max_frame_bytes_);
    const size_t target = std::min(2 * capacity_, std::max(needed, capacity_ + kFrameHeaderBytes));
    if (!Resize(target)) return {};
  }
  return {buffer_.get() + end_, capacity_ - end_};
}

void FrameReader::Received(size_t n) { end_ = std::min(end_ + n, capacity_); }

FrameReader::State FrameReader::Next(std::span<const uint8_t>& body) {
  if (buffered_bytes() < kFrameHeaderBytes) return State::kNeedMore;
  const uint32_t length = announced_bytes();
  if (length > max_frame_bytes_) return State::kOversized;
  if (buffered_bytes() - kFrameHeaderBytes < length) return State::kNeedMore;
  body = {buffer_.get() + begin_ + kFrameHeaderBytes, length};
  frame_bytes_ = kFrameHeaderBytes + length;
  return State::kFrame;
}

void FrameReader::Consume() {
  begin_ += frame_bytes_;
  frame_bytes_ = 0;
  if (begin_ == end_) begin_ = end_ = 0;
}

}  // namespace kvtier
