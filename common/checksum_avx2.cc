// XXH3-64 compiled for AVX2 (this file only is built with -mavx2; nothing
// here runs unless internal::Avx2Available()). XXH_INLINE_ALL keeps these
// definitions private to this file, apart from the library's.
#include "common/checksum.h"

#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

namespace kvtier::internal {

uint64_t BlockChecksumAvx2(const void* data, size_t length) { return XXH3_64bits(data, length); }

}  // namespace kvtier::internal
