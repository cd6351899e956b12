// Protected shares on a tier several owners share (the NVMe tier under
// tenants: daemon/tenants/tenant_tier.h). Each owner (a tenant) has a share: the
// bytes of its blocks (as the tier counts them: the NVMe tier counts what
// they take on the drive) that the tier's reclaim never takes while the
// owner holds no more than that. A block may be evicted only when its
// owner holds more than its share, or when it has no owner (owner 0:
// blocks of no tenant). This file decides which blocks of the region the
// tier reclaims next may go; the tier copies the others forward.
//
// Pure and synchronous like every policy: O(c log c) for c candidates.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "kvtier/block_key.h"

namespace kvtier {

// Whose a block is, and what that owner's share is.
struct ShareOwner {
  uint32_t owner = 0;        // 0: no owner (never protected)
  uint64_t share_bytes = 0;  // bytes protected (0: none)
};

struct ShareCandidate {
  BlockKey key;
  ShareOwner owner;
  uint64_t bytes = 0;   // what it takes on the tier, in the unit of the shares
  uint64_t offset = 0;  // where its record lies: the oldest goes first
};

struct ShareSplit {
  std::vector<ShareCandidate> may_go;      // owner over its share (or none): reclaim may drop them, log order
  std::vector<ShareCandidate> protected_;  // must stay: copied forward before the region goes, log order
};

// Splits the blocks of the region about to be reclaimed. `held` is each
// owner's bytes on the whole tier now (owners absent hold 0). In
// log order, a candidate may go while its owner still holds more than its
// share after the candidates of it already let go are counted off; from
// then on the owner's candidates are protected. So reclaim takes from an
// owner no more than its excess rounded up to one block, oldest first,
// and never a block of an owner within its share.
ShareSplit SplitByShare(std::vector<ShareCandidate> candidates, const std::unordered_map<uint32_t, uint64_t>& held);

}  // namespace kvtier
