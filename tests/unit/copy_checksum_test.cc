// CopyWithChecksum: the put's fused copy + hash. Whichever implementation
// runs, the destination holds exactly the source bytes and the value is
// BlockChecksum of them, for every length (XXH3 changes strategy at 16,
// 128 and 240 bytes, per stripe and per block), alignment, the chunk
// boundaries, and both sides of the non-temporal-store threshold.
#include "common/checksum.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace kvtier {
namespace {

using CopyFn = uint64_t (*)(void* dst, const void* src, size_t length);

struct Impl {
  const char* name;
  CopyFn copy;
};

std::vector<Impl> Implementations() {
  std::vector<Impl> out = {{"portable", internal::CopyWithChecksumPortable}};
  if (internal::Avx2Available()) out.push_back({"avx2", internal::CopyWithChecksumAvx2});
  return out;
}

// Copies src[src_offset, +length) to dst[dst_offset, +length) and checks
// the bytes, the value, and that nothing around the destination changed.
void CheckOne(const Impl& impl, const std::vector<unsigned char>& src, size_t src_offset, size_t dst_offset,
              size_t length) {
  SCOPED_TRACE(std::string(impl.name) + " length " + std::to_string(length) + " src+" + std::to_string(src_offset) +
               " dst+" + std::to_string(dst_offset));
  std::vector<unsigned char> dst(dst_offset + length + 64, 0xA5);
  const uint64_t got = impl.copy(dst.data() + dst_offset, src.data() + src_offset, length);
  ASSERT_EQ(got, internal::BlockChecksumPortable(src.data() + src_offset, length));
  ASSERT_EQ(std::memcmp(dst.data() + dst_offset, src.data() + src_offset, length), 0);
  for (size_t i = 0; i < dst_offset; ++i) ASSERT_EQ(dst[i], 0xA5) << "before, at " << i;
  for (size_t i = dst_offset + length; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xA5) << "after, at " << i;
}

class CopyWithChecksumTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device{}();
    std::mt19937_64 rng(seed_);
    src_.resize(2 * kStreamingCopyBytes + 4 * kCopyChunkBytes + 128);
    for (auto& b : src_) b = static_cast<unsigned char>(rng());
  }
  uint32_t seed_ = 0;
  std::vector<unsigned char> src_;
};

TEST_F(CopyWithChecksumTest, EmptyInputCopiesNothingAndIsTheXxh3ReferenceValue) {
  for (const Impl& impl : Implementations()) {
    unsigned char dst = 0x5A;
    EXPECT_EQ(impl.copy(&dst, src_.data(), 0), 0x2D06800538D394C2ULL) << impl.name;
    EXPECT_EQ(dst, 0x5A) << impl.name;
  }
}

TEST_F(CopyWithChecksumTest, SmallLengthsAtEveryAlignment) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  for (const Impl& impl : Implementations()) {
    for (size_t length = 1; length <= 1100; ++length) CheckOne(impl, src_, length % 32, (length * 7) % 32, length);
  }
}

TEST_F(CopyWithChecksumTest, ChunkBoundaries) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  for (const Impl& impl : Implementations()) {
    for (size_t chunks : {1, 2, 3}) {
      for (ptrdiff_t delta : {-1, 0, 1, 63, 64, 65}) {
        const size_t length = chunks * kCopyChunkBytes + delta;
        CheckOne(impl, src_, 0, 0, length);
        CheckOne(impl, src_, 3, 17, length);
      }
    }
  }
}

TEST_F(CopyWithChecksumTest, AroundTheStreamingThreshold) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  for (const Impl& impl : Implementations()) {
    for (size_t length : {kStreamingCopyBytes - 1, kStreamingCopyBytes, kStreamingCopyBytes + 1,
                          kStreamingCopyBytes + kCopyChunkBytes / 2 + 5, 2 * kStreamingCopyBytes}) {
      for (size_t dst_offset : {0, 1, 31, 32, 33}) CheckOne(impl, src_, dst_offset % 7, dst_offset, length);
    }
  }
}

TEST_F(CopyWithChecksumTest, PublicFunctionMatchesBlockChecksum) {
  std::vector<std::byte> dst(kStreamingCopyBytes + 12345);
  auto src = std::as_bytes(std::span(src_)).first(dst.size());
  EXPECT_EQ(CopyWithChecksum(dst, src), BlockChecksum(src));
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), dst.size()), 0);
}

}  // namespace
}  // namespace kvtier
