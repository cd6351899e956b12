// Test helper for eviction policies.
#pragma once

#include <vector>

#include "policy/eviction_policy.h"

namespace kvtier::testing {

// Evicts everything in victim order (removing each victim), returning the
// handles in the order they came out.
inline std::vector<BlockHandle> Drain(EvictionPolicy& p) {
  std::vector<BlockHandle> out;
  while (auto v = p.Victim()) {
    out.push_back(v->handle);
    p.OnRemove(v->handle);
  }
  return out;
}

}  // namespace kvtier::testing
