// A KV events batch as `kvtier events` reads it: the msgpack payload the
// daemon publishes (daemon/events/event_encoding.h, docs/OPERATIONS.md "KV
// events"), in either of its forms (events.format "map" or "array"),
// decoded with common/msgpack.h's checked reader.
//
// DecodeKvEventBatch refuses (InvalidArgument saying what and where) a
// payload that is no batch: not msgpack, a field missing or of another
// type, a key that is not 16 bytes, an unknown event type or medium.
// Fields kvtier's events carry that a reader does not need (token_ids,
// block_size, lora_*) are not checked.
//
// Pure functions; no state.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/client.h"
#include "kvtier/result.h"

namespace kvtier::events {

enum class KvEventKind { kStored, kRemoved, kCleared };
std::string_view KvEventKindName(KvEventKind kind);  // "stored", "removed", "cleared"

struct KvEvent {
  KvEventKind kind = KvEventKind::kCleared;
  Tier tier = Tier::kNone;  // kNone for kCleared
  NamespaceFingerprint ns;
  std::vector<BlockKey> keys;      // root first
  std::optional<BlockKey> parent;  // kStored: the first key's parent, when known
};

struct KvEventBatch {
  double ts = 0;  // seconds since the epoch
  std::vector<KvEvent> events;
};

Result<KvEventBatch> DecodeKvEventBatch(std::string_view payload);

}  // namespace kvtier::events
