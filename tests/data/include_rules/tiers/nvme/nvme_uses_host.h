// Not compiled: input of ctest include_rules_catches_cross_tier.
#pragma once

#include "tiers/host/arena_allocator.h"
#include "tiers/host/host_tier.h"
