// XXH3-64 compiled for AVX2 (this file only is built with -mavx2; nothing
// here runs unless internal::Avx2Available()). XXH_INLINE_ALL keeps these
// definitions private to this file, apart from the library's.
#include "common/checksum.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

namespace kvtier::internal {
namespace {

// memcpy with non-temporal stores: the destination's lines are written
// whole without being read into the cache first. The caller fences.
void StreamingCopy(unsigned char* dst, const unsigned char* src, size_t length) {
  const size_t head = std::min(length, (32 - reinterpret_cast<uintptr_t>(dst) % 32) % 32);
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 128 <= length; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 64));
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + i + 96), d);
  }
  std::memcpy(dst + i, src + i, length - i);
}

}  // namespace

uint64_t BlockChecksumAvx2(const void* data, size_t length) { return XXH3_64bits(data, length); }

uint64_t CopyWithChecksumAvx2(void* dst, const void* src, size_t length) {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  const bool streaming = length >= kStreamingCopyBytes;
  for (size_t done = 0; done < length;) {
    const size_t n = std::min(kCopyChunkBytes, length - done);
    XXH3_64bits_update(&state, s + done, n);  // brings the chunk into the cache
    if (streaming) {
      StreamingCopy(d + done, s + done, n);
    } else {
      std::memcpy(d + done, s + done, n);
    }
    done += n;
  }
  if (streaming) _mm_sfence();  // the stores are visible before the Commit that follows
  return XXH3_64bits_digest(&state);
}

uint64_t PiecesChecksumAvx2(std::span<const std::span<const std::byte>> pieces) {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (const auto& piece : pieces) XXH3_64bits_update(&state, piece.data(), piece.size());
  return XXH3_64bits_digest(&state);
}

uint64_t LayerChecksumsAvx2(void* dst, const void* src, size_t length, uint64_t* layers, size_t layer_count) {
  XXH3_state_t block, layer;
  XXH3_64bits_reset(&block);
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  const bool streaming = d != nullptr && length >= kStreamingCopyBytes;
  const size_t layer_bytes = length / layer_count;
  for (size_t l = 0; l < layer_count; ++l) {
    XXH3_64bits_reset(&layer);
    const size_t begin = l * layer_bytes;
    for (size_t done = 0; done < layer_bytes;) {
      const size_t n = std::min(kCopyChunkBytes, layer_bytes - done);
      const size_t at = begin + done;
      XXH3_64bits_update(&block, s + at, n);  // brings the chunk into the cache
      XXH3_64bits_update(&layer, s + at, n);
      if (streaming) {
        StreamingCopy(d + at, s + at, n);
      } else if (d != nullptr) {
        std::memcpy(d + at, s + at, n);
      }
      done += n;
    }
    layers[l] = XXH3_64bits_digest(&layer);
  }
  if (streaming) _mm_sfence();
  return XXH3_64bits_digest(&block);
}

}  // namespace kvtier::internal
