// BlockChecksum is XXH3-64 (seed 0) whichever implementation runs: the AVX2
// build and the library's agree on every length and alignment, and both
// match the published value for the empty input.
#include "common/checksum.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace kvtier {
namespace {

TEST(Checksum, EmptyInputIsTheXxh3ReferenceValue) {
  EXPECT_EQ(BlockChecksum({}), 0x2D06800538D394C2ULL);
  EXPECT_EQ(internal::BlockChecksumPortable(nullptr, 0), 0x2D06800538D394C2ULL);
}

TEST(Checksum, Avx2AndPortableAgreeOnEveryLengthAndAlignment) {
  if (!internal::Avx2Available()) GTEST_SKIP() << "this CPU (or build) has no AVX2: only the portable path runs";
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<unsigned char> bytes((4 << 20) + 64);
  for (auto& b : bytes) b = static_cast<unsigned char>(rng());
  // Every length up to 2 KiB (XXH3 changes strategy at 16, 128, 240 bytes
  // and per stripe), at every offset modulo 32.
  for (size_t length = 0; length <= 2048; ++length) {
    const size_t offset = length % 32;
    ASSERT_EQ(internal::BlockChecksumAvx2(bytes.data() + offset, length),
              internal::BlockChecksumPortable(bytes.data() + offset, length))
        << "length " << length << " offset " << offset;
  }
  for (int i = 0; i < 50; ++i) {
    const size_t offset = rng() % 64;
    const size_t length = rng() % (bytes.size() - offset);
    ASSERT_EQ(internal::BlockChecksumAvx2(bytes.data() + offset, length),
              internal::BlockChecksumPortable(bytes.data() + offset, length))
        << "length " << length << " offset " << offset;
  }
  EXPECT_EQ(BlockChecksum(std::as_bytes(std::span(bytes))),
            internal::BlockChecksumPortable(bytes.data(), bytes.size()));
}

}  // namespace
}  // namespace kvtier
