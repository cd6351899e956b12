#include "common/checksum.h"

#include <algorithm>
#include <cstring>

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

namespace kvtier {
namespace internal {

uint64_t BlockChecksumPortable(const void* data, size_t length) { return XXH3_64bits(data, length); }

bool Avx2Available() {
#if defined(__x86_64__) && defined(KVTIER_HAVE_AVX2_CHECKSUM)
  static const bool available = __builtin_cpu_supports("avx2");
  return available;
#else
  return false;
#endif
}

uint64_t CopyWithChecksumPortable(void* dst, const void* src, size_t length) {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  for (size_t done = 0; done < length;) {
    const size_t n = std::min(kCopyChunkBytes, length - done);
    XXH3_64bits_update(&state, s + done, n);
    std::memcpy(d + done, s + done, n);
    done += n;
  }
  return XXH3_64bits_digest(&state);
}

uint64_t LayerChecksumsPortable(void* dst, const void* src, size_t length, uint64_t* layers, size_t layer_count) {
  XXH3_state_t block, layer;
  XXH3_64bits_reset(&block);
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  const size_t layer_bytes = length / layer_count;
  for (size_t l = 0; l < layer_count; ++l) {
    XXH3_64bits_reset(&layer);
    const size_t begin = l * layer_bytes;
    for (size_t done = 0; done < layer_bytes;) {
      const size_t n = std::min(kCopyChunkBytes, layer_bytes - done);
      XXH3_64bits_update(&block, s + begin + done, n);
      XXH3_64bits_update(&layer, s + begin + done, n);  // from the cache
      if (d != nullptr) std::memcpy(d + begin + done, s + begin + done, n);
      done += n;
    }
    layers[l] = XXH3_64bits_digest(&layer);
  }
  return XXH3_64bits_digest(&block);
}

uint64_t PiecesChecksumPortable(std::span<const std::span<const std::byte>> pieces) {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (const auto& piece : pieces) XXH3_64bits_update(&state, piece.data(), piece.size());
  return XXH3_64bits_digest(&state);
}

#if !defined(KVTIER_HAVE_AVX2_CHECKSUM)
uint64_t PiecesChecksumAvx2(std::span<const std::span<const std::byte>> pieces) {
  return PiecesChecksumPortable(pieces);
}
uint64_t LayerChecksumsAvx2(void* dst, const void* src, size_t length, uint64_t* layers, size_t layer_count) {
  return LayerChecksumsPortable(dst, src, length, layers, layer_count);
}
uint64_t BlockChecksumAvx2(const void* data, size_t length) { return BlockChecksumPortable(data, length); }
uint64_t CopyWithChecksumAvx2(void* dst, const void* src, size_t length) {
  return CopyWithChecksumPortable(dst, src, length);
}
#endif

}  // namespace internal

uint64_t BlockChecksum(std::span<const std::byte> bytes) {
  if (internal::Avx2Available()) return internal::BlockChecksumAvx2(bytes.data(), bytes.size());
  return internal::BlockChecksumPortable(bytes.data(), bytes.size());
}

uint64_t CopyWithChecksum(std::span<std::byte> dst, std::span<const std::byte> src) {
  if (internal::Avx2Available()) return internal::CopyWithChecksumAvx2(dst.data(), src.data(), src.size());
  return internal::CopyWithChecksumPortable(dst.data(), src.data(), src.size());
}

namespace {

uint64_t LayerChecksums(std::byte* dst, std::span<const std::byte> src, std::span<uint64_t> layers) {
  if (layers.size() == 1) {  // the one layer is the block: one hash
    layers[0] = dst != nullptr ? CopyWithChecksum({dst, src.size()}, src) : BlockChecksum(src);
    return layers[0];
  }
  if (internal::Avx2Available()) {
    return internal::LayerChecksumsAvx2(dst, src.data(), src.size(), layers.data(), layers.size());
  }
  return internal::LayerChecksumsPortable(dst, src.data(), src.size(), layers.data(), layers.size());
}

}  // namespace

uint64_t ChecksumWithLayers(std::span<const std::byte> block, std::span<uint64_t> layers) {
  return LayerChecksums(nullptr, block, layers);
}

uint64_t CopyWithLayerChecksums(std::span<std::byte> dst, std::span<const std::byte> src, std::span<uint64_t> layers) {
  return LayerChecksums(dst.data(), src, layers);
}

uint64_t ChecksumOfPieces(std::span<const std::span<const std::byte>> pieces) {
  if (internal::Avx2Available()) return internal::PiecesChecksumAvx2(pieces);
  return internal::PiecesChecksumPortable(pieces);
}

size_t FirstBadLayer(std::span<const std::byte> bytes, std::span<const uint64_t> layers) {
  const size_t layer_bytes = layers.empty() ? 0 : bytes.size() / layers.size();
  for (size_t i = 0; i < layers.size(); ++i) {
    if (BlockChecksum(bytes.subspan(i * layer_bytes, layer_bytes)) != layers[i]) return i;
  }
  return layers.size();
}

}  // namespace kvtier
