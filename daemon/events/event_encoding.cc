#include "daemon/events/event_encoding.h"

#include <vector>

#include "common/msgpack.h"

namespace kvtier {
namespace {

// Consecutive events that travel as one.
struct Group {
  const BlockEvent* first = nullptr;
  std::vector<BlockKey> keys;
};

bool Joins(const Group& g, const BlockEvent& e) {
  const BlockEvent& f = *g.first;
  if (e.kind != f.kind || e.tier != f.tier || e.ns != f.ns || g.keys.size() >= kMaxKeysPerEvent) return false;
  if (e.kind == BlockEventKind::kCleared) return false;
  return e.kind == BlockEventKind::kRemoved || (e.parent && *e.parent == g.keys.back());
}

std::vector<Group> GroupEvents(std::span<const BlockEvent> events) {
  std::vector<Group> groups;
  for (const BlockEvent& e : events) {
    if (groups.empty() || !Joins(groups.back(), e)) groups.push_back(Group{&e, {}});
    groups.back().keys.push_back(e.key);
  }
  return groups;
}

void Keys(MsgpackWriter& w, const std::vector<BlockKey>& keys) {
  w.ArrayHeader(static_cast<uint32_t>(keys.size()));
  for (const BlockKey& k : keys) w.Bin(KeyBytes(k));
}

// One event: a map of its fields, or an array of their values.
class EventWriter {
 public:
  EventWriter(MsgpackWriter& w, EventFormat format) : w_(w), map_(format == EventFormat::kMap) {}
  void Begin(std::string_view type, uint32_t fields) {
    if (map_) {
      w_.MapHeader(fields + 1);
      w_.Str("type");
    } else {
      w_.ArrayHeader(fields + 1);
    }
    w_.Str(type);
  }
  MsgpackWriter& Field(std::string_view name) {
    if (map_) w_.Str(name);
    return w_;
  }
  bool map() const { return map_; }

 private:
  MsgpackWriter& w_;
  const bool map_;
};

void WriteStored(EventWriter& e, const Group& g, const NamespaceInfoOf& info) {
  const std::optional<EventNamespaceInfo> ns = info ? info(g.first->ns) : std::nullopt;
  // vLLM's optional fields after lora_name (extra_keys, group_idx and the
  // cache spec's two) are omitted from a map; an array holds them as nil
  // so that kvtier_namespace comes after every field vLLM declares.
  e.Begin("BlockStored", e.map() ? 8 : 12);
  Keys(e.Field("block_hashes"), g.keys);
  if (g.first->parent) {
    e.Field("parent_block_hash").Bin(KeyBytes(*g.first->parent));
  } else {
    e.Field("parent_block_hash").Nil();
  }
  e.Field("token_ids").ArrayHeader(0);
  e.Field("block_size").Uint(ns ? ns->block_tokens : 0);
  e.Field("lora_id").Nil();
  e.Field("medium").Str(MediumName(g.first->tier));
  if (ns && !ns->adapter.empty()) {
    e.Field("lora_name").Str(ns->adapter);
  } else {
    e.Field("lora_name").Nil();
  }
  if (!e.map()) {
    for (int i = 0; i < 4; ++i) e.Field("").Nil();
  }
  e.Field("kvtier_namespace").Bin(KeyBytes(g.first->ns));
}

void WriteRemoved(EventWriter& e, const Group& g) {
  e.Begin("BlockRemoved", e.map() ? 3 : 4);
  Keys(e.Field("block_hashes"), g.keys);
  e.Field("medium").Str(MediumName(g.first->tier));
  if (!e.map()) e.Field("").Nil();  // group_idx
  e.Field("kvtier_namespace").Bin(KeyBytes(g.first->ns));
}

}  // namespace

std::optional<EventFormat> ParseEventFormat(std::string_view name) {
  if (name == "map") return EventFormat::kMap;
  if (name == "array") return EventFormat::kArray;
  return std::nullopt;
}

std::string EncodeEventError(std::string_view message) {
  MsgpackWriter w;
  w.MapHeader(1);
  w.Str("error");
  w.Str(message);
  return w.Take();
}

std::string EncodeEventBatch(double ts, std::span<const BlockEvent> events, EventFormat format,
                             const NamespaceInfoOf& info) {
  const std::vector<Group> groups = GroupEvents(events);
  MsgpackWriter w;
  if (format == EventFormat::kMap) {
    w.MapHeader(2);
    w.Str("ts");
  } else {
    w.ArrayHeader(2);
  }
  w.Double(ts);
  if (format == EventFormat::kMap) w.Str("events");
  w.ArrayHeader(static_cast<uint32_t>(groups.size()));
  EventWriter e(w, format);
  for (const Group& g : groups) {
    switch (g.first->kind) {
      case BlockEventKind::kStored:
        WriteStored(e, g, info);
        break;
      case BlockEventKind::kRemoved:
        WriteRemoved(e, g);
        break;
      case BlockEventKind::kCleared:
        e.Begin("AllBlocksCleared", 0);
        break;
    }
  }
  return w.Take();
}

}  // namespace kvtier
