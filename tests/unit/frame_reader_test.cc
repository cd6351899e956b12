#include "common/frame_reader.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/framing.h"

namespace kvtier {
namespace {

std::string Frame(const std::string& body) {
  std::string out(kFrameHeaderBytes, '\0');
  EncodeFrameHeader(static_cast<uint32_t>(body.size()), reinterpret_cast<uint8_t*>(out.data()));
  return out + body;
}

// Feeds `bytes` into `reader` in pieces of at most `piece` bytes, collecting
// every frame it returns. Stops at the first kOversized.
std::vector<std::string> Feed(FrameReader& reader, const std::string& bytes, size_t piece, bool* oversized = nullptr) {
  std::vector<std::string> frames;
  size_t at = 0;
  while (at < bytes.size()) {
    std::span<uint8_t> space = reader.ReadSpace();
    EXPECT_FALSE(space.empty());
    if (space.empty()) return frames;
    const size_t n = std::min({space.size(), piece, bytes.size() - at});
    std::memcpy(space.data(), bytes.data() + at, n);
    reader.Received(n);
    at += n;
    std::span<const uint8_t> body;
    for (;;) {
      FrameReader::State state = reader.Next(body);
      if (state == FrameReader::State::kOversized) {
        if (oversized != nullptr) *oversized = true;
        return frames;
      }
      if (state == FrameReader::State::kNeedMore) break;
      frames.emplace_back(reinterpret_cast<const char*>(body.data()), body.size());
      reader.Consume();
    }
  }
  return frames;
}

TEST(FrameReader, AHeaderAnnouncingAMebibyteCostsNothingUntilTheBytesArrive) {
  FrameBudget budget(64u << 20);
  FrameReader reader(1u << 20, &budget);
  std::string header = Frame(std::string(1u << 20, 'x')).substr(0, kFrameHeaderBytes);
  EXPECT_TRUE(Feed(reader, header, 4).empty());
  EXPECT_EQ(reader.capacity_bytes(), FrameReader::kInitialBytes);
  EXPECT_EQ(budget.used_bytes(), 0u);
  EXPECT_EQ(reader.announced_bytes(), 1u << 20);
}

TEST(FrameReader, TheBufferNeverHoldsMoreThanTwiceWhatArrived) {
  FrameBudget budget(64u << 20);
  FrameReader reader(1u << 20, &budget);
  const std::string frame = Frame(std::string(1u << 20, 'y'));
  size_t sent = 0;
  while (sent + 1000 < frame.size()) {
    std::span<uint8_t> space = reader.ReadSpace();
    ASSERT_FALSE(space.empty());
    const size_t n = std::min<size_t>(space.size(), 1000);
    std::memcpy(space.data(), frame.data() + sent, n);
    reader.Received(n);
    sent += n;
    EXPECT_LE(reader.capacity_bytes(), std::max(FrameReader::kInitialBytes, 2 * sent + kFrameHeaderBytes)) << sent;
    EXPECT_EQ(budget.used_bytes(), reader.capacity_bytes() - FrameReader::kInitialBytes);
  }
  EXPECT_LE(reader.capacity_bytes(), frame.size());
}

TEST(FrameReader, FramesComeOutWhole_InAnyPieces_AndTheGrowthIsGivenBack) {
  std::mt19937 rng(7);
  std::string stream;
  std::vector<std::string> bodies;
  for (int i = 0; i < 200; ++i) {
    std::string body(rng() % (i % 10 == 0 ? 200000 : 300), '\0');
    for (char& c : body) c = static_cast<char>(rng());
    bodies.push_back(body);
    stream += Frame(body);
  }
  for (size_t piece : {size_t{1}, size_t{7}, size_t{4096}, size_t{1} << 20}) {
    FrameBudget budget(64u << 20);
    {
      FrameReader reader(1u << 20, &budget);
      const std::vector<std::string> got = Feed(reader, stream, piece);
      ASSERT_EQ(got.size(), bodies.size()) << "piece " << piece;
      for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], bodies[i]) << "frame " << i << " piece " << piece;
      EXPECT_EQ(reader.buffered_bytes(), 0u);
      reader.ReadSpace();  // everything consumed: back to the initial buffer
      EXPECT_EQ(reader.capacity_bytes(), FrameReader::kInitialBytes);
    }
    EXPECT_EQ(budget.used_bytes(), 0u);
  }
}

TEST(FrameReader, AFrameOverTheCapIsOversized) {
  FrameReader reader(4096);
  bool oversized = false;
  Feed(reader, Frame(std::string(4097, 'z')), 100, &oversized);
  EXPECT_TRUE(oversized);
  FrameReader exact(4096);
  EXPECT_EQ(Feed(exact, Frame(std::string(4096, 'z')), 100).size(), 1u);
}

TEST(FrameReader, GrowthPastTheBudgetIsRefused_AndTheBudgetIsShared) {
  FrameBudget budget(3 * FrameReader::kInitialBytes);
  FrameReader first(1u << 20, &budget);
  FrameReader second(1u << 20, &budget);
  const std::string big = Frame(std::string(1u << 20, 'b'));
  // The first takes the whole budget: 4 KiB -> 8 KiB -> 16 KiB (charged 12 KiB).
  size_t sent = 0;
  for (;;) {
    std::span<uint8_t> space = first.ReadSpace();
    if (space.empty()) break;
    std::memcpy(space.data(), big.data() + sent, space.size());
    first.Received(space.size());
    sent += space.size();
  }
  EXPECT_EQ(budget.used_bytes(), 3 * FrameReader::kInitialBytes);
  EXPECT_EQ(first.capacity_bytes(), 4 * FrameReader::kInitialBytes);
  EXPECT_EQ(budget.refusals(), 1);
  // The second still reads small frames within its initial buffer...
  EXPECT_EQ(Feed(second, Frame("small") + Frame("frames"), 3).size(), 2u);
  // ... and cannot grow until the first gives its growth back.
  std::span<uint8_t> space = second.ReadSpace();
  std::memcpy(space.data(), big.data(), space.size());
  second.Received(space.size());
  EXPECT_TRUE(second.ReadSpace().empty());
}

}  // namespace
}  // namespace kvtier
