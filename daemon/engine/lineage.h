// Lineage: what queue hints told the engine about keys and conversations,
// for NVMe admission (docs/POLICIES.md): each key's parent in the chain
// that last named it and that chain's conversation, and which conversations
// are open or closed. A block evicted long after its request ran still
// finds its parent and conversation here.
//
// Bounded: past `capacity` keys (or conversations) the oldest recorded are
// forgotten, so an unknown key is the normal case and means "no evidence".
// Thread-safe: one mutex, a leaf (nothing is called while it is held).
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>

#include "common/mutex.h"
#include "kvtier/block_key.h"
#include "policy/admission_policy.h"

namespace kvtier {

class Lineage {
 public:
  explicit Lineage(size_t capacity) : capacity_(capacity) {}

  struct Info {
    std::optional<BlockKey> parent;  // none: the chain's root
    uint64_t conversation = 0;       // 0: none
  };
  using State = ::kvtier::ConversationState;  // policy/admission_policy.h

  // `chain` (root first) of a queued request of `conversation` (0: none):
  // chain[i]'s parent is chain[i - 1]. A conversation first seen here
  // counts as open.
  void Record(std::span<const BlockKey> chain, uint64_t conversation);
  // Parents from a put of consecutive blocks of one chain (root first):
  // chain[i]'s parent is chain[i - 1], and chain[0]'s is `parent` (none:
  // chain[0] is left as it was, its parent unknown). A key's conversation,
  // if a queue hint gave one, stays.
  void RecordLinks(std::span<const BlockKey> chain, const std::optional<BlockKey>& parent);
  std::optional<Info> Find(const BlockKey& key) const;
  // An explicit open or close hint.
  void SetConversation(uint64_t conversation, bool open);
  State ConversationState(uint64_t conversation) const;
  size_t keys() const;

 private:
  // Caller holds mu_.
  void Remember(uint64_t conversation, State state) REQUIRES(mu_);
  // Caller holds mu_: sets `key`'s record, forgetting the oldest past capacity.
  void Set(const BlockKey& key, const Info& info) REQUIRES(mu_);

  const size_t capacity_;
  mutable Mutex mu_;
  std::unordered_map<BlockKey, Info> keys_ GUARDED_BY(mu_);
  std::deque<BlockKey> key_order_ GUARDED_BY(mu_);  // first recorded first
  std::unordered_map<uint64_t, State> conversations_ GUARDED_BY(mu_);
  std::deque<uint64_t> conversation_order_ GUARDED_BY(mu_);
};

}  // namespace kvtier
