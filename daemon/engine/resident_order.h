// ResidentOrder: the blocks a level of the stack holds, each with its
// namespace, in the order an eviction policy from policy/ ranks them
// (EvictionPolicy, by handle). The tier above the host keeps its blocks
// here, so its eviction order is a policy object like the host tier's,
// not a list of its own.
//
// Not thread-safe: the owner serialises every call (AboveMover's lock).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>

#include "kvtier/block_key.h"
#include "policy/eviction_policy.h"

namespace kvtier {

class ResidentOrder {
 public:
  // `policy` ranks the blocks (an empty one; owned).
  explicit ResidentOrder(std::unique_ptr<EvictionPolicy> policy);
  ResidentOrder(const ResidentOrder&) = delete;
  ResidentOrder& operator=(const ResidentOrder&) = delete;

  // Starts tracking `key` of `ns` at `now_us`; false (nothing changes)
  // when it is tracked already.
  bool Insert(const BlockKey& key, const NamespaceFingerprint& ns, uint64_t now_us);
  // A use of `key` at `now_us`, if it is tracked.
  void Touch(const BlockKey& key, uint64_t now_us);
  // Stops tracking `key` if it is tracked (under any namespace when `ns`
  // is null, else only under *ns); true when it was.
  bool Remove(const BlockKey& key, const NamespaceFingerprint* ns = nullptr);
  // Takes the block the policy would evict first out of the order and
  // returns it; nullopt when none is tracked.
  struct Victim {
    BlockKey key;
    NamespaceFingerprint ns;
  };
  std::optional<Victim> PopVictim();
  bool Contains(const BlockKey& key) const { return by_key_.count(key) != 0; }
  size_t size() const { return by_key_.size(); }

 private:
  struct Entry {
    NamespaceFingerprint ns;
    BlockHandle handle = 0;
  };
  std::unique_ptr<EvictionPolicy> policy_;
  std::unordered_map<BlockKey, Entry> by_key_;
  std::unordered_map<BlockHandle, BlockKey> by_handle_;
  BlockHandle next_handle_ = 1;
};

}  // namespace kvtier
