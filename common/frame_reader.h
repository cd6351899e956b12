// FrameReader: reassembles the frames of one connection (common/framing.h)
// from the bytes a socket delivers, with memory that follows the bytes that
// arrived, not the sizes frames announce.
//
// A header announcing a 1 MiB frame costs nothing until the bytes come: the
// buffer starts at kInitialBytes and doubles only when it is full and the
// frame in it is still incomplete, so it never holds more than twice what
// the peer sent (and never more than one whole frame's worth above
// kInitialBytes). Once every buffered frame is consumed the growth is given
// back. Growth above kInitialBytes is charged to a FrameMemory: a
// FrameBudget shared by all connections bounds what partial frames hold
// daemon-wide (kvtierd charges the connection's tenant as well).
//
// Use: read into ReadSpace(), tell Received(n), then call Next() until it
// says kNeedMore, calling Consume() after each frame it returns.
//
// Thread-compatible (one connection's thread); FrameBudget is thread-safe.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace kvtier {

// What a FrameReader charges the growth of its buffer to.
class FrameMemory {
 public:
  virtual ~FrameMemory() = default;
  // Takes `bytes` if they fit; false (taking nothing) if not.
  virtual bool TryTake(size_t bytes) = 0;
  // Gives back `bytes` taken before.
  virtual void Give(size_t bytes) = 0;
};

// The bytes every FrameReader together may hold above its initial buffer.
// Thread-safe.
class FrameBudget final : public FrameMemory {
 public:
  explicit FrameBudget(size_t limit_bytes) : limit_bytes_(limit_bytes) {}

  bool TryTake(size_t bytes) override;
  void Give(size_t bytes) override { used_bytes_.fetch_sub(bytes, std::memory_order_relaxed); }

  size_t used_bytes() const { return used_bytes_.load(std::memory_order_relaxed); }
  size_t limit_bytes() const { return limit_bytes_; }
  // Growths refused so far.
  int64_t refusals() const { return refusals_.load(std::memory_order_relaxed); }

 private:
  const size_t limit_bytes_;
  std::atomic<size_t> used_bytes_{0};
  std::atomic<int64_t> refusals_{0};
};

class FrameReader {
 public:
  static constexpr size_t kInitialBytes = 4096;

  enum class State {
    kNeedMore,   // no whole frame buffered: read more
    kFrame,      // `body` is the next frame's payload
    kOversized,  // the next frame announces more than max_frame_bytes
  };

  // `budget` is borrowed (may be null: no bound) and must outlive the
  // reader.
  explicit FrameReader(uint32_t max_frame_bytes, FrameMemory* budget = nullptr);
  ~FrameReader();
  FrameReader(const FrameReader&) = delete;
  FrameReader& operator=(const FrameReader&) = delete;

  // Where the next read may write: never empty, unless the buffer had to
  // grow for the frame in progress and the budget refused (then empty:
  // the caller should give up on the connection). Invalidates a body
  // returned by Next.
  std::span<uint8_t> ReadSpace();
  // `n` bytes were written at the start of the last ReadSpace().
  void Received(size_t n);

  // The next whole frame, if buffered. `body` stays valid until Consume,
  // ReadSpace or the reader's end. After kOversized the stream cannot be
  // resynchronised: the caller closes the connection.
  State Next(std::span<const uint8_t>& body);
  // Drops the frame the last Next returned (precondition: it said kFrame).
  void Consume();

  // Bytes received and not yet consumed.
  size_t buffered_bytes() const { return end_ - begin_; }
  // Bytes the buffer holds now (what this connection's frames cost).
  size_t capacity_bytes() const { return capacity_; }
  // The announced payload size of the frame in progress; 0 without a
  // whole header buffered.
  uint32_t announced_bytes() const;

 private:
  // Reallocates to `capacity` bytes (>= buffered_bytes()), moving the
  // buffered bytes to the front. False if the budget refused.
  bool Resize(size_t capacity);

  const uint32_t max_frame_bytes_;
  FrameMemory* const budget_;
  std::unique_ptr<uint8_t[]> buffer_;
  size_t capacity_ = 0;
  size_t begin_ = 0;        // first unconsumed byte
  size_t end_ = 0;          // one past the last received byte
  size_t frame_bytes_ = 0;  // header + body of the frame Next returned; 0: none
};

}  // namespace kvtier
