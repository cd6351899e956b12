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

#if !defined(KVTIER_HAVE_AVX2_CHECKSUM)
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

}  // namespace kvtier
