// Not compiled: input of ctest include_rules_catches_cross_tier.
#pragma once

#include "tiers/nvme/nvme_tier.h"
