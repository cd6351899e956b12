// Checksum verification of what the client hands out
// (ClientOptions::verify_checksums): the copying gets, zero-copy pins, layer
// reads and layer-wise loads check the bytes they hand out against the
// checksums kvtierd recorded when the block was committed (or that the tier
// below verified it against), and report a block that does not match so
// that later reads miss. Internal.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

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
Status VerifyLayers(std::span<const std::byte> bytes, std::span<const uint64_t> layer_checksums, uint32_t first_layer,
                    const BlockKey& key);

// Ok if `copy`, a copy of the bytes at `range_offset` of `block` (the
// whole block, in the arena), matches the block's `checksum` together with
// the rest of the block: how a layer range is checked when its block has
// no layer checksums (a hash of the whole block). Corruption otherwise.
Status VerifyRangeInBlock(std::span<const std::byte> block, uint64_t range_offset, std::span<const std::byte> copy,
                          uint64_t checksum, const BlockKey& key);

// Reports `keys` of namespace `ns`, whose bytes did not verify, to the
// daemon (Erases with `corrupt`, one per kReportKeysPerFrame keys) and runs
// `then` once kvtierd has answered them all (or the connection failed):
// kvtierd answers a report after it has hashed its host copy of each block
// again and dropped it if that does not match either, so a read that
// returns its Corruption from `then` returns after every later read, by
// any client, misses (a copy below the host tier that verifies stays and
// may be promoted again). `reader` reads the answers: the kind of the
// call being answered. Send before releasing the lease that pinned the
// bad bytes. Never blocks; `then` runs inline when `keys` is empty.
void ReportCorrupt(Connection& conn, uint32_t ns, std::vector<BlockKey> keys, Connection::Reader reader,
                   std::function<void()> then);
// The same, waiting on this thread for the answers (at most call_timeout);
// never from a callback.
void ReportCorruptAndWait(Connection& conn, uint32_t ns, const BlockKey& key);

// Keys per report frame (kvtierd's Engine::kMaxReportedKeys).
constexpr size_t kReportKeysPerFrame = 64;

}  // namespace kvtier::internal
