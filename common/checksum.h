// Block checksums: XXH3-64 with seed 0 over the block's bytes.
//
// The same function everywhere (commit, demotion, every NVMe read): it runs
// over every byte a tier moves, so its speed shows in every path. On x86-64
// CPUs with AVX2 it uses an AVX2 build of XXH3 (about 2.4x the distribution
// library's SSE2 build here); the value is identical by definition of XXH3.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace kvtier {

uint64_t BlockChecksum(std::span<const std::byte> bytes);

// Copies `src` into `dst` and returns BlockChecksum(src): a put's copy and
// its checksum in one pass over the source. It goes a chunk at a time
// (kCopyChunkBytes, which stays in the L1/L2 cache): the chunk is hashed,
// which brings it into the cache, then copied from there. From
// kStreamingCopyBytes on, the destination is written with non-temporal
// stores (as memcpy does for large copies), so the copy does not first read
// the destination's cache lines. Precondition: dst.size() == src.size(),
// and the two do not overlap.
uint64_t CopyWithChecksum(std::span<std::byte> dst, std::span<const std::byte> src);
inline constexpr size_t kCopyChunkBytes = 16 << 10;
inline constexpr size_t kStreamingCopyBytes = 256 << 10;

namespace internal {
// The two implementations BlockChecksum chooses between (for tests).
uint64_t BlockChecksumPortable(const void* data, size_t length);
// Precondition: the CPU has AVX2 (Avx2Available()).
uint64_t BlockChecksumAvx2(const void* data, size_t length);
bool Avx2Available();
// The same for CopyWithChecksum.
uint64_t CopyWithChecksumPortable(void* dst, const void* src, size_t length);
uint64_t CopyWithChecksumAvx2(void* dst, const void* src, size_t length);
}  // namespace internal

}  // namespace kvtier
