#include "client_lib/directory_path.h"

#include <cstring>
#include <string>

#include "common/checksum.h"
#include "common/sanitizers.h"

namespace kvtier::internal {
namespace {

// A copy invalidated this often (its block evicted or moved in the table
// each time) goes to the daemon instead.
constexpr int kCopyAttempts = 3;

// Copies bytes that another process may be rewriting at the same moment
// (the seqlock read of the header comment in block_directory.h; the copy
// is validated afterwards and discarded if it raced). ThreadSanitizer
// cannot see that protocol, so under it the racy read is a plain byte loop
// excluded from instrumentation.
#if KVTIER_TSAN
__attribute__((no_sanitize("thread"))) void CopyMaybeRacing(std::byte* dst, const std::byte* src, size_t n) {
  const volatile std::byte* from = src;
  for (size_t i = 0; i < n; ++i) dst[i] = from[i];
}
#else
void CopyMaybeRacing(std::byte* dst, const std::byte* src, size_t n) { std::memcpy(dst, src, n); }
#endif

}  // namespace

LocalLookup LookupInDirectory(const DirectoryReader& dir, const NamespaceFingerprint& ns,
                              std::span<const BlockKey> keys) {
  LocalLookup out;
  DirectoryEntry entry;
  for (const BlockKey& key : keys) {
    switch (dir.Find(ns, key, &entry)) {
      case DirectoryReader::Outcome::kHit:
        ++out.hits;
        continue;
      case DirectoryReader::Outcome::kMiss:
        out.complete = dir.MissesAreFinal();
        return out;
      case DirectoryReader::Outcome::kUnknown:
        return out;
    }
  }
  out.complete = true;
  return out;
}

std::optional<Result<size_t>> CopyFromDirectory(const DirectoryReader& dir, std::span<const std::byte> arena,
                                                const NamespaceFingerprint& ns, const BlockKey& key,
                                                std::span<std::byte> dst, bool verify, const LayerPick* pick) {
  for (int attempt = 0; attempt < kCopyAttempts; ++attempt) {
    DirectoryEntry entry;
    switch (dir.Find(ns, key, &entry)) {
      case DirectoryReader::Outcome::kHit:
        break;
      case DirectoryReader::Outcome::kMiss:
        if (dir.MissesAreFinal()) return Result<size_t>(NotFound("block " + key.ToHex() + " is not cached"));
        return std::nullopt;
      case DirectoryReader::Outcome::kUnknown:
        return std::nullopt;
    }
    // Never trusted blindly: an entry outside the arena goes to the daemon.
    if (entry.offset > arena.size() || entry.length > arena.size() - entry.offset) return std::nullopt;
    uint64_t from = 0, length = entry.length;
    if (pick != nullptr) {
      const uint32_t layers = entry.length == pick->block_bytes && pick->layer_count > 0 ? pick->layer_count : 1;
      if (pick->first >= pick->last || pick->last > layers) {
        return Result<size_t>(InvalidArgument("layer range [" + std::to_string(pick->first) + ", " +
                                              std::to_string(pick->last) + ") is not within the " +
                                              std::to_string(layers) + " layers of block " + key.ToHex()));
      }
      const uint64_t layer_bytes = entry.length / layers;
      from = pick->first * layer_bytes;
      length = (pick->last - pick->first) * layer_bytes;
    }
    if (dst.size() < length) {
      return Result<size_t>(InvalidArgument("destination of " + std::to_string(dst.size()) +
                                            " bytes is smaller than the " + std::to_string(length) +
                                            " bytes asked for"));
    }
    // The table holds whole-block checksums only: a verified read of part
    // of a block goes to the daemon, whose grant carries its layers'.
    if (verify && length != entry.length) return std::nullopt;
    CopyMaybeRacing(dst.data(), arena.data() + entry.offset + from, length);
    if (!dir.StillPublished(entry)) continue;  // evicted or moved meanwhile: the copy may be torn
    if (verify && length == entry.length && BlockChecksum(dst.first(length)) != entry.checksum) {
      return Result<size_t>(Corruption("block bytes do not match their checksum"));
    }
    return Result<size_t>(static_cast<size_t>(length));
  }
  return std::nullopt;
}

}  // namespace kvtier::internal
