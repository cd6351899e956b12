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

namespace internal {
// The two implementations BlockChecksum chooses between (for tests).
uint64_t BlockChecksumPortable(const void* data, size_t length);
// Precondition: the CPU has AVX2 (Avx2Available()).
uint64_t BlockChecksumAvx2(const void* data, size_t length);
bool Avx2Available();
}  // namespace internal

}  // namespace kvtier
