#include "support/format.h"

#include <cstdio>

namespace kvtier::support {

std::string Mib(uint64_t bytes) {
  char out[32];
  if (bytes < (1u << 20))
    std::snprintf(out, sizeof(out), "%.2f KiB", double(bytes) / 1024);
  else
    std::snprintf(out, sizeof(out), "%.2f MiB", double(bytes) / double(1 << 20));
  return out;
}

}  // namespace kvtier::support
