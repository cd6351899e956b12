#include "common/checksum.h"

#include <xxhash.h>

namespace kvtier {

uint64_t BlockChecksum(std::span<const std::byte> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

}  // namespace kvtier
