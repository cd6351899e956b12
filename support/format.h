// Sizes as the tools print them (kvtier_support).
#pragma once

#include <cstdint>
#include <string>

namespace kvtier::support {

// "12.34 MiB" (KiB below 1 MiB).
std::string Mib(uint64_t bytes);

}  // namespace kvtier::support
