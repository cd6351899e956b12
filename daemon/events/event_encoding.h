// The wire form of KV events: vLLM's KVEventBatch (vllm/distributed/
// kv_events.py, read at vLLM commit 0181ea3173e5), msgpack-encoded, with
// kvtier's own fields added where vLLM's consumers ignore unknown ones.
//
// A batch is {"ts": seconds since the epoch (float), "events": [...]}
// (EventFormat::kMap, vLLM's current form: msgspec structs as maps, each
// event tagged by "type") or [ts, [...]] (kArray, vLLM's earlier
// array_like form: each event an array led by its type name, fields in
// declaration order, kvtier's after vLLM's). The events:
//   BlockStored   block_hashes  kvtier's block keys, 16-byte binaries (the
//                               canonical form, docs/KEYS.md), root first;
//                 parent_block_hash  the parent of the first (16 bytes), or
//                               nil (a chain's first block, or unknown);
//                 token_ids     [] (the daemon never sees tokens: a router
//                               hashes the prompt with docs/KEYS.md's
//                               scheme and compares keys);
//                 block_size    tokens per block of the namespace, 0 when
//                               it registered no descriptor since start;
//                 lora_id nil, medium, lora_name (the adapter, or nil);
//                 kvtier_namespace  the namespace fingerprint (16 bytes).
//   BlockRemoved  block_hashes, medium, kvtier_namespace.
//   AllBlocksCleared  (no fields): forget everything this node said.
// Media: GPU (the HBM tier), CPU_PINNED (host), DISK (NVMe), REMOTE.
//
// Consecutive events of one kind, tier and namespace share one event
// (stored ones only while each block's parent is the block before it), at
// most kMaxKeysPerEvent keys each.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "common/kv_event_forms.h"  // KeyBytes, KeyFromBytes, MediumName
#include "daemon/engine/block_events.h"
#include "kvtier/block_key.h"
#include "kvtier/result.h"

namespace kvtier {

enum class EventFormat : uint8_t { kMap, kArray };
// "map" | "array"; nullopt otherwise.
std::optional<EventFormat> ParseEventFormat(std::string_view name);

struct EventNamespaceInfo {
  uint32_t block_tokens = 0;
  std::string adapter;  // empty: none
};
// What the encoder knows of a namespace (nullopt: nothing).
using NamespaceInfoOf = std::function<std::optional<EventNamespaceInfo>(const NamespaceFingerprint& ns)>;

inline constexpr size_t kMaxKeysPerEvent = 512;

// The answer to a request the replay socket cannot serve: {"error": message}.
std::string EncodeEventError(std::string_view message);

// One batch's payload.
std::string EncodeEventBatch(double ts, std::span<const BlockEvent> events, EventFormat format,
                             const NamespaceInfoOf& info);

}  // namespace kvtier
