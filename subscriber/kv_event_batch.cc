#include "subscriber/kv_event_batch.h"

#include <string>

#include "common/kv_event_forms.h"
#include "common/msgpack.h"

namespace kvtier::events {
namespace {

// An event's fields by name (the map form) or by position (the array
// form: the type's name, then the fields in declaration order).
class Fields {
 public:
  Fields(const MsgpackValue& event, size_t index) : event_(event), index_(index) {}
  // The field `name`, at `position` in the array form; nullptr if absent.
  const MsgpackValue* Get(std::string_view name, size_t position) const {
    if (const MsgpackArray* a = event_.array()) return position < a->size() ? &(*a)[position] : nullptr;
    return event_.Find(name);
  }
  Status Bad(std::string_view what) const {
    return InvalidArgument("event " + std::to_string(index_) + ": " + std::string(what));
  }

 private:
  const MsgpackValue& event_;
  const size_t index_;
};

Result<BlockKey> KeyOf(const MsgpackValue* v, const Fields& f, std::string_view field) {
  const std::string* bytes = v != nullptr ? v->str() : nullptr;
  std::optional<BlockKey> key = bytes != nullptr && v->is_binary ? KeyFromBytes(*bytes) : std::nullopt;
  if (!key) return f.Bad(std::string(field) + " is not a 16-byte binary");
  return *key;
}

Result<KvEvent> DecodeEvent(const MsgpackValue& value, size_t index) {
  const Fields f(value, index);
  const MsgpackValue* type = f.Get("type", 0);
  if (value.map() == nullptr && value.array() == nullptr) return f.Bad("is neither a map nor an array");
  if (type == nullptr || type->str() == nullptr) return f.Bad("has no type");
  KvEvent e;
  const std::string& name = *type->str();
  if (name == "AllBlocksCleared") return e;
  const bool stored = name == "BlockStored";
  if (!stored && name != "BlockRemoved") return f.Bad("unknown type " + name);
  e.kind = stored ? KvEventKind::kStored : KvEventKind::kRemoved;
  const MsgpackValue* hashes = f.Get("block_hashes", 1);
  if (hashes == nullptr || hashes->array() == nullptr) return f.Bad("block_hashes is not an array");
  for (const MsgpackValue& k : *hashes->array()) {
    auto key = KeyOf(&k, f, "a block hash");
    if (!key.ok()) return key.status();
    e.keys.push_back(*key);
  }
  const MsgpackValue* medium = f.Get("medium", stored ? 6 : 2);
  if (medium == nullptr || medium->str() == nullptr) return f.Bad("medium is not a string");
  e.tier = TierOfMedium(*medium->str());
  if (e.tier == Tier::kNone) return f.Bad("unknown medium " + *medium->str());
  auto ns = KeyOf(f.Get("kvtier_namespace", stored ? 12 : 4), f, "kvtier_namespace");
  if (!ns.ok()) return ns.status();
  e.ns = *ns;
  if (stored) {
    const MsgpackValue* parent = f.Get("parent_block_hash", 2);
    if (parent != nullptr && !parent->is_nil()) {
      auto p = KeyOf(parent, f, "parent_block_hash");
      if (!p.ok()) return p.status();
      e.parent = *p;
    }
  }
  return e;
}

}  // namespace

std::string_view KvEventKindName(KvEventKind kind) {
  switch (kind) {
    case KvEventKind::kStored:
      return "stored";
    case KvEventKind::kRemoved:
      return "removed";
    case KvEventKind::kCleared:
      break;
  }
  return "cleared";
}

Result<KvEventBatch> DecodeKvEventBatch(std::string_view payload) {
  auto decoded = DecodeMsgpack(payload);
  if (!decoded.ok()) return decoded.status();
  const MsgpackValue* ts = nullptr;
  const MsgpackValue* events = nullptr;
  if (const MsgpackArray* a = decoded->array(); a != nullptr && a->size() == 2) {
    ts = &(*a)[0];
    events = &(*a)[1];
  } else if (decoded->map() != nullptr) {
    ts = decoded->Find("ts");
    events = decoded->Find("events");
  }
  if (ts == nullptr || events == nullptr || events->array() == nullptr) {
    return InvalidArgument("a batch is {\"ts\", \"events\"} or [ts, events]");
  }
  KvEventBatch batch;
  int64_t whole = 0;
  if (const double* d = std::get_if<double>(&ts->v)) {
    batch.ts = *d;
  } else if (ts->AsInt(&whole)) {
    batch.ts = static_cast<double>(whole);
  } else {
    return InvalidArgument("the batch's ts is not a number");
  }
  for (size_t i = 0; i < events->array()->size(); ++i) {
    auto e = DecodeEvent((*events->array())[i], i);
    if (!e.ok()) return e.status();
    batch.events.push_back(std::move(*e));
  }
  return batch;
}

}  // namespace kvtier::events
