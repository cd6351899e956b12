// The listing of `kvtier ls --blocks`, and of `kvtier events --rebuild`'s
// index in the same form, so that the two can be diffed.
//
// One entry per block a tier holds: its tier ("hbm", "host", "nvme",
// "remote": TierName), its namespace fingerprint and its key (32 hex each,
// BlockKey::ToHex), and its tenant when kvtierd has tenants. Printed sorted
// by (tenant, tier top first, namespace, key), each block once:
//   text   a header line "TIER    NAMESPACE  KEY" (TENANT first with
//          tenants), then one line per block;
//   --json one JSON array of {"tier", "namespace", "key"[, "tenant"]}, one
//          object a line.
#pragma once

#include <cstdio>
#include <vector>

#include "kvtier/client.h"

namespace kvtier::tools {

void PrintBlocks(std::vector<HeldBlockInfo> blocks, bool json, std::FILE* out = stdout);

}  // namespace kvtier::tools
