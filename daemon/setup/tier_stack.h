// TierStack: the tiers below the host tier that kvtierd's configuration
// turns on, opened in stack order (highest first) and owned here; the
// engine borrows them (Engine::Create with `lower`).
//
// Adding a tier: a folder under tiers/ with a BlockTier implementation and
// one row in tier_stack.cc's registration table (its opener and its
// admission). Nothing else in the daemon names it.
#pragma once

#include <memory>
#include <vector>

#include "common/clock.h"
#include "daemon/config/config.h"
#include "daemon/engine/engine.h"
#include "kvtier/result.h"
#include "tiers/tier.h"

namespace kvtier {

struct TierStack {
  std::vector<std::unique_ptr<BlockTier>> tiers;  // highest first
  std::vector<LowerTier> lower;                   // the same tiers with their admission, for Engine::Create
};

// Opens every configured tier in stack order, logging what each found.
// Errors name the tier and the option or path at fault. `clock` is
// borrowed for the tiers' lifetime. An empty stack when none is configured.
Result<TierStack> OpenTierStack(const DaemonConfig& config, Clock& clock);

}  // namespace kvtier
