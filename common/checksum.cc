#include "common/checksum.h"

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

#if !defined(KVTIER_HAVE_AVX2_CHECKSUM)
uint64_t BlockChecksumAvx2(const void* data, size_t length) { return BlockChecksumPortable(data, length); }
#endif

}  // namespace internal

uint64_t BlockChecksum(std::span<const std::byte> bytes) {
  if (internal::Avx2Available()) return internal::BlockChecksumAvx2(bytes.data(), bytes.size());
  return internal::BlockChecksumPortable(bytes.data(), bytes.size());
}

}  // namespace kvtier
