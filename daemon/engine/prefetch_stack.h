// PrefetchStack: the Prefetcher's view of the stack (Prefetcher::Stack,
// prefetcher.h, whose contracts its hooks keep), built from the parts
// that know it: the host tier's index shards, the tiers below the host
// and the Promoter that reads a block up.
//   place                   a key of the namespace committed in the host
//                           tier or being promoted into it is kHost; else
//                           the highest tier below holding it under the
//                           namespace (kBelow, its level and bytes); else
//                           kNowhere.
//   read_bandwidths         each tier below's read meter, highest first.
//   unused_prefetched_bytes the shards' prefetched bytes, summed.
//   start_read              claims a key held below and in no host entry
//                           as a pin's promotion does (kPromoting,
//                           prefetched: pins wait for this read), calls
//                           `read_started`, then has the Promoter read
//                           it; nullopt, claiming nothing, for a key no
//                           tier below holds (evicted meanwhile) or one
//                           the host tier has (cached or being written).
//
// Every hook takes one shard lock at a time, and below it only the
// tiers' leaf locks (BlockTier::Find); none is held across the read or
// `read_started`. The parts are borrowed and must outlive the Stack.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "daemon/engine/engine_levels.h"
#include "daemon/engine/prefetcher.h"
#include "daemon/engine/promoter.h"

namespace kvtier {

class BlockIndex;

struct PrefetchStackParts {
  std::vector<std::unique_ptr<BlockIndex>>& shards;
  const std::vector<std::unique_ptr<TierLevel>>& below;  // highest first
  Promoter& promoter;
  // A read of a plan is about to start (Prefetcher::ReadStarted); no lock
  // held.
  std::function<void()> read_started;
};

Prefetcher::Stack MakePrefetchStack(PrefetchStackParts parts);

}  // namespace kvtier
