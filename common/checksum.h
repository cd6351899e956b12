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

// Per-layer checksums. A block of L > 1 equal layers (layer-major: its
// namespace's block size, daemon/engine/engine.h NamespaceLayout) has, besides
// the checksum of its whole payload, the BlockChecksum of each layer
// [i * layer_bytes, (i + 1) * layer_bytes), so that a read of a layer range
// verifies just those layers. A block of one layer needs none: its one
// layer's checksum is the block's.
//
// BlockChecksum(block), returned, and the checksum of each of
// layers.size() layers of block.size() / layers.size() bytes into
// `layers`, in one pass over the bytes: each cache-sized chunk is hashed
// twice while it is in the cache, once into the block's state and once
// into its layer's. Precondition: layers is not empty and divides
// block.size() evenly.
uint64_t ChecksumWithLayers(std::span<const std::byte> block, std::span<uint64_t> layers);
// CopyWithChecksum that also fills `layers` as ChecksumWithLayers does.
// Same preconditions as both.
uint64_t CopyWithLayerChecksums(std::span<std::byte> dst, std::span<const std::byte> src, std::span<uint64_t> layers);
// BlockChecksum of the concatenation of `pieces`, without concatenating
// them: how a reader checks a copied layer range against the whole
// block's checksum (the bytes before it, the copy, the bytes after it).
uint64_t ChecksumOfPieces(std::span<const std::span<const std::byte>> pieces);
// Checks each of the layers of `bytes` (layers.size() equal layers)
// against `layers`. The index of the first that does not match, or
// layers.size() when all do. Precondition: layers divides bytes.size().
size_t FirstBadLayer(std::span<const std::byte> bytes, std::span<const uint64_t> layers);

namespace internal {
// The two implementations BlockChecksum chooses between (for tests).
uint64_t BlockChecksumPortable(const void* data, size_t length);
// Precondition: the CPU has AVX2 (Avx2Available()).
uint64_t BlockChecksumAvx2(const void* data, size_t length);
bool Avx2Available();
// The same for CopyWithChecksum.
uint64_t CopyWithChecksumPortable(void* dst, const void* src, size_t length);
uint64_t CopyWithChecksumAvx2(void* dst, const void* src, size_t length);
// The same for ChecksumWithLayers and CopyWithLayerChecksums (dst null:
// no copy).
uint64_t LayerChecksumsPortable(void* dst, const void* src, size_t length, uint64_t* layers, size_t layer_count);
uint64_t LayerChecksumsAvx2(void* dst, const void* src, size_t length, uint64_t* layers, size_t layer_count);
// The same for ChecksumOfPieces.
uint64_t PiecesChecksumPortable(std::span<const std::span<const std::byte>> pieces);
uint64_t PiecesChecksumAvx2(std::span<const std::span<const std::byte>> pieces);
}  // namespace internal

}  // namespace kvtier
