// Fuzzes the frame decoder (common/frame_reader.h): two connections'
// FrameReaders over one FrameBudget, fed the input's bytes in chunks of
// sizes the input chooses, each drained as the server drains it (Next
// until kNeedMore, Consume after each frame; an oversized frame or a
// refused growth closes that connection).
//
// Input: bytes 0..2 max_frame_bytes (u24 little-endian); byte 3 the
// budget (0: none, else that many 512-byte units); then commands, each
//   u8 flags      bit 0: which reader; bit 1: a run of one byte
//   u16 length    little-endian
//   the chunk     with the run bit: one byte, repeated `length` times
//                 (big frames from small inputs); else the next `length`
//                 bytes (fewer if the input ends).
//
// Checked against a reference decoder over every byte each reader was
// given:
// - every frame body returned is exactly what was sent, in order, and
//   Next says kNeedMore / kOversized exactly when the reference does;
// - buffered_bytes() is what arrived and was not consumed;
// - memory follows the bytes: a growth leaves at most twice what is
//   buffered, the buffer never exceeds max(kInitialBytes, header +
//   max_frame_bytes), and it is back to kInitialBytes whenever every
//   byte was consumed;
// - the budget holds exactly each reader's growth, refuses only past its
//   limit, and is back to 0 once the readers are gone.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "common/frame_reader.h"
#include "common/framing.h"

namespace kvtier {
namespace {

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "frame_reader_fuzz: %s\n", what);
  std::abort();
}

void Check(bool ok, const char* what) {
  if (!ok) Fail(what);
}

// One connection: the reader, and every byte given to it (the reference).
class Connection {
 public:
  Connection(uint32_t max_frame_bytes, FrameBudget* budget)
      : max_frame_bytes_(max_frame_bytes), budget_(budget), reader_(max_frame_bytes, budget) {}

  bool closed() const { return closed_; }
  size_t growth_bytes() const { return reader_.capacity_bytes() - FrameReader::kInitialBytes; }

  // Delivers `chunk` the way a socket might: as much as each ReadSpace
  // takes, draining frames after each read.
  void Deliver(std::span<const uint8_t> chunk) {
    while (!closed_ && !chunk.empty()) {
      const int64_t refusals_before = budget_ != nullptr ? budget_->refusals() : 0;
      const size_t capacity_before = reader_.capacity_bytes();
      std::span<uint8_t> space = reader_.ReadSpace();
      if (space.empty()) {
        Check(budget_ != nullptr && budget_->refusals() > refusals_before, "no ReadSpace, yet no budget refused it");
        closed_ = true;  // the server gives up on the connection
        return;
      }
      CheckMemory(capacity_before);
      const size_t n = std::min(space.size(), chunk.size());
      std::memcpy(space.data(), chunk.data(), n);
      reader_.Received(n);
      sent_.insert(sent_.end(), chunk.begin(), chunk.begin() + static_cast<std::ptrdiff_t>(n));
      chunk = chunk.subspan(n);
      Drain();
    }
  }

 private:
  // The reference's view of the next frame: its announced length, when a
  // whole header is there.
  std::optional<uint32_t> ReferenceLength() const {
    if (sent_.size() - consumed_ < kFrameHeaderBytes) return std::nullopt;
    return DecodeFrameHeader(sent_.data() + consumed_);
  }

  void Drain() {
    for (;;) {
      Check(reader_.buffered_bytes() == sent_.size() - consumed_, "buffered_bytes() is not what arrived unconsumed");
      const std::optional<uint32_t> length = ReferenceLength();
      Check(reader_.announced_bytes() == length.value_or(0), "announced_bytes() differs from the header sent");
      std::span<const uint8_t> body;
      const FrameReader::State state = reader_.Next(body);
      if (state == FrameReader::State::kOversized) {
        Check(length && *length > max_frame_bytes_, "kOversized for a frame within the cap");
        closed_ = true;
        return;
      }
      const bool whole =
          length && *length <= max_frame_bytes_ && sent_.size() - consumed_ - kFrameHeaderBytes >= *length;
      if (state == FrameReader::State::kNeedMore) {
        Check(!whole && !(length && *length > max_frame_bytes_), "kNeedMore with a whole frame or an oversized one");
        return;
      }
      Check(whole, "kFrame without a whole frame sent");
      Check(body.size() == *length, "a frame body of another length than announced");
      Check(std::equal(body.begin(), body.end(),
                       sent_.begin() + static_cast<std::ptrdiff_t>(consumed_ + kFrameHeaderBytes)),
            "a frame body differs from the bytes sent");
      // Next again, before Consume, returns the same frame.
      std::span<const uint8_t> again;
      Check(reader_.Next(again) == FrameReader::State::kFrame && again.data() == body.data() &&
                again.size() == body.size(),
            "a second Next before Consume returned another frame");
      reader_.Consume();
      consumed_ += kFrameHeaderBytes + *length;
    }
  }

  // After a ReadSpace that left `capacity_before` as it was or grew it.
  void CheckMemory(size_t capacity_before) const {
    const size_t capacity = reader_.capacity_bytes();
    const size_t buffered = reader_.buffered_bytes();
    if (buffered == 0) Check(capacity == FrameReader::kInitialBytes, "growth kept with nothing buffered");
    if (capacity > capacity_before) {
      Check(capacity <= 2 * buffered, "a growth to more than twice what is buffered");
    }
    Check(capacity <= std::max<size_t>(FrameReader::kInitialBytes, kFrameHeaderBytes + size_t{max_frame_bytes_}),
          "a buffer larger than one whole frame at the cap");
  }

  const uint32_t max_frame_bytes_;
  FrameBudget* const budget_;
  FrameReader reader_;
  std::vector<uint8_t> sent_;
  size_t consumed_ = 0;  // offset of the next frame in sent_
  bool closed_ = false;
};

void Run(std::span<const uint8_t> in) {
  if (in.size() < 4) return;
  const uint32_t max_frame_bytes = uint32_t{in[0]} | (uint32_t{in[1]} << 8) | (uint32_t{in[2]} << 16);
  std::optional<FrameBudget> budget;
  if (in[3] != 0) budget.emplace(size_t{in[3]} * 512);
  in = in.subspan(4);
  {
    Connection connections[2] = {{max_frame_bytes, budget ? &*budget : nullptr},
                                 {max_frame_bytes, budget ? &*budget : nullptr}};
    std::vector<uint8_t> run;
    while (in.size() >= 3) {
      const uint8_t flags = in[0];
      const size_t length = size_t{in[1]} | (size_t{in[2]} << 8);
      in = in.subspan(3);
      std::span<const uint8_t> chunk;
      if ((flags & 2) != 0) {
        if (in.empty()) break;
        run.assign(length, in[0]);
        in = in.subspan(1);
        chunk = run;
      } else {
        chunk = in.first(std::min(length, in.size()));
        in = in.subspan(chunk.size());
      }
      connections[flags & 1].Deliver(chunk);
      if (budget) {
        Check(budget->used_bytes() == connections[0].growth_bytes() + connections[1].growth_bytes(),
              "the budget holds other than the readers' growth");
        Check(budget->used_bytes() <= budget->limit_bytes(), "the budget is over its limit");
      }
    }
  }
  if (budget) Check(budget->used_bytes() == 0, "growth not given back when the readers went");
}

}  // namespace
}  // namespace kvtier

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvtier::Run(std::span<const uint8_t>(data, size));
  return 0;
}
