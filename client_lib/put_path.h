// The Commit/Abort building and result merging shared by the copying puts
// (client.cc) and the zero-copy Reservation (handles.cc). Internal.
#pragma once

#include <span>
#include <vector>

#include "client_lib/connection.h"

namespace kvtier::internal {

// Turns a Reserve response into writable blocks (one per key).
std::vector<WritableBlock> ToWritable(const Connection& conn, std::span<const BlockKey> keys,
                                      const v1::Response& response);

// Builds the Commit of every ok block, with their checksums when every ok
// block has one (else with none); false if there is none to commit. With
// the namespace's layout (`layer_count` layers in blocks of `block_bytes`),
// also the layer checksums when every ok block of several layers has one
// per layer (else none: those blocks then have no layer checksums).
bool BuildCommit(NamespaceId ns, const std::vector<WritableBlock>& blocks, v1::Request& request,
                 uint32_t layer_count = 1, uint64_t block_bytes = 0);

// The Abort of every ok block.
v1::Request BuildAbort(NamespaceId ns, const std::vector<WritableBlock>& blocks);

// One Status per block: Reserve's outcome for blocks that were not ok
// (AlreadyExists becomes Ok when `already_is_ok`, as for idempotent puts),
// else the Commit's outcome in order.
std::vector<Status> MergeCommit(const std::vector<WritableBlock>& blocks, const Result<v1::Response>& committed,
                                bool already_is_ok);

}  // namespace kvtier::internal
