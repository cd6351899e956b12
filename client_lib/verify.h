// Checksum verification of what the client hands out
// (ClientOptions::verify_checksums): the copying gets, zero-copy pins, layer
// reads and layer-wise loads check the bytes they hand out against the
// checksums kvtierd recorded when the block was committed (or that the tier
// below verified it against), and report a block that does not match so
// that later reads miss. Internal.
#pragma once

#include <cstdint>
#include <span>

#include "client_lib/connection.h"
#include "kvtier/block_key.h"
#include "kvtier/status.h"

namespace kvtier::internal {

// Ok if `bytes` (a whole block) hash to `checksum`, else Corruption.
Status VerifyBlock(std::span<const std::byte> bytes, uint64_t checksum, const BlockKey& key);

// Ok if `bytes` (layers first_layer, first_layer + 1, ..., equal in size)
// match `layer_checksums`, one per layer; Corruption naming the first
// layer that does not; Unimplemented when there is no checksum per layer
// (a kvtierd that sends none): the bytes cannot be verified, and are not
// reported.
Status VerifyLayers(std::span<const std::byte> bytes, std::span<const uint64_t> layer_checksums,
                    uint32_t first_layer, const BlockKey& key);

// Ok if `copy`, a copy of the bytes at `range_offset` of `block` (the
// whole block, in the arena), matches the block's `checksum` together with
// the rest of the block: how a layer range is checked when its block has
// no layer checksums (a hash of the whole block). Corruption otherwise.
Status VerifyRangeInBlock(std::span<const std::byte> block, uint64_t range_offset, std::span<const std::byte> copy,
                          uint64_t checksum, const BlockKey& key);

// Reports `key` of namespace `ns`, whose bytes did not verify, to the
// daemon: an Erase, not waited for (Connection::Reader::kDetached), so
// later reads miss. Erase reaches every tier: a good copy below the host
// tier goes too (a miss, never a wrong read). Call before releasing the
// lease that pinned the bad bytes (the Erase is then sent first, so no
// other pin sees the block between the two). Never blocks.
void ReportCorrupt(Connection& conn, uint32_t ns, const BlockKey& key);

}  // namespace kvtier::internal
