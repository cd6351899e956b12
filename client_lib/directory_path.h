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

// Copies `key`'s bytes from `arena` into `dst` if the directory publishes
// it, retrying when the entry changes during the copy. Returns
//   the bytes copied                   a validated copy (checksum checked
//                                      when `verify`: Corruption on mismatch);
//   NotFound                           a final miss (MissesAreFinal);
//   InvalidArgument                    `dst` is smaller than the block;
//   nullopt                            the directory cannot settle it (a miss
//                                      that may be cached below, a table that
//                                      kept changing): ask the daemon.
// `dst` may hold partial bytes after nullopt.
std::optional<Result<size_t>> CopyFromDirectory(const DirectoryReader& dir, std::span<const std::byte> arena,
                                                const NamespaceFingerprint& ns, const BlockKey& key,
                                                std::span<std::byte> dst, bool verify);

}  // namespace kvtier::internal
