// The client's side of the block directory (common/block_directory.h):
// Lookup and copying Get of host-resident blocks served from shared memory,
// without a round trip. Anything the directory cannot settle is left to the
// daemon (the caller sends those keys over the socket).
#pragma once

#include <cstddef>
#include <optional>
#include <span>

#include "common/block_directory.h"
#include "kvtier/block_key.h"
#include "kvtier/result.h"

namespace kvtier::internal {

struct LocalLookup {
  size_t hits = 0;        // keys[0, hits) are published host blocks
  bool complete = false;  // hits is the whole answer (all hit, or a final miss)
};

// Walks `keys` in order while the directory holds them.
LocalLookup LookupInDirectory(const DirectoryReader& dir, const NamespaceFingerprint& ns,
                              std::span<const BlockKey> keys);

// Which layers of a block to copy: [first, last) of a block of the
// namespace's block size (block_bytes, split into layer_count equal
// layers); a block of any other size is one layer.
struct LayerPick {
  uint32_t first = 0;
  uint32_t last = 0;
  uint32_t layer_count = 1;
  uint64_t block_bytes = 0;
};

// Copies `key`'s bytes (or the layers `pick` names, when not null) from
// `arena` into `dst` if the directory publishes it, retrying when the entry
// changes during the copy. Returns
//   the bytes copied                   a validated copy (checksum checked
//                                      when `verify` and the whole block is
//                                      copied: Corruption on mismatch);
//   NotFound                           a final miss (MissesAreFinal);
//   InvalidArgument                    `dst` is smaller than the bytes, or
//                                      the layers are not in the block;
//   nullopt                            the directory cannot settle it (a miss
//                                      that may be cached below, a table that
//                                      kept changing, or a verified read of
//                                      part of a block: the table has no
//                                      layer checksums): ask the daemon.
// `dst` may hold partial bytes after nullopt.
std::optional<Result<size_t>> CopyFromDirectory(const DirectoryReader& dir, std::span<const std::byte> arena,
                                                const NamespaceFingerprint& ns, const BlockKey& key,
                                                std::span<std::byte> dst, bool verify, const LayerPick* pick = nullptr);

}  // namespace kvtier::internal
