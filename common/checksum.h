// Block checksums: XXH3-64 with seed 0 over the block's bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace kvtier {

uint64_t BlockChecksum(std::span<const std::byte> bytes);

}  // namespace kvtier
