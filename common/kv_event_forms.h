// The small pure forms KV events share between the daemon's publisher
// (daemon/events/) and their readers (`kvtier events`, tools/cli/): a key's
// 16-byte wire form, a sequence number's 8-byte frame and the media vLLM's
// consumers read for a tier.
//
// Pure functions; no state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kvtier/block_key.h"
#include "kvtier/client.h"

namespace kvtier {

// The 16-byte canonical form of a key (hi then lo, each big-endian).
std::string KeyBytes(const BlockKey& key);
// Its inverse: nullopt unless `bytes` is 16 bytes long.
std::optional<BlockKey> KeyFromBytes(std::string_view bytes);

// A batch's sequence number as its 8-byte frame (big-endian; the end
// marker of a replay socket's answer is kEventEndSeq), and its inverse (of
// the bytes given: callers check that there are 8).
inline constexpr int64_t kEventEndSeq = -1;
std::string SeqBytes(int64_t seq);
int64_t SeqFromBytes(std::string_view bytes);

// The medium vLLM's consumers read for a tier ("GPU", "CPU_PINNED",
// "DISK", "REMOTE"; "" for kNone).
std::string_view MediumName(Tier tier);
// Its inverse: Tier::kNone for anything else.
Tier TierOfMedium(std::string_view medium);

}  // namespace kvtier
