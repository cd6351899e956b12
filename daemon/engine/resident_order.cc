#include "daemon/engine/resident_order.h"

#include <utility>

#include "common/check.h"

namespace kvtier {

ResidentOrder::ResidentOrder(std::unique_ptr<EvictionPolicy> policy) : policy_(std::move(policy)) {
  KVTIER_CHECK(policy_ != nullptr && policy_->size() == 0, "a level's order starts from an empty policy");
}

bool ResidentOrder::Insert(const BlockKey& key, const NamespaceFingerprint& ns, uint64_t now_us) {
  const BlockHandle handle = next_handle_;
  if (!by_key_.try_emplace(key, Entry{ns, handle}).second) return false;
  ++next_handle_;
  by_handle_.emplace(handle, key);
  policy_->OnInsertKeyed(handle, key, now_us);
  return true;
}

void ResidentOrder::Touch(const BlockKey& key, uint64_t now_us) {
  auto it = by_key_.find(key);
  if (it != by_key_.end()) policy_->OnAccess(it->second.handle, now_us);
}

bool ResidentOrder::Remove(const BlockKey& key, const NamespaceFingerprint* ns) {
  auto it = by_key_.find(key);
  if (it == by_key_.end() || (ns != nullptr && it->second.ns != *ns)) return false;
  policy_->OnRemove(it->second.handle);
  by_handle_.erase(it->second.handle);
  by_key_.erase(it);
  return true;
}

std::optional<ResidentOrder::Victim> ResidentOrder::PopVictim() {
  std::optional<EvictionCandidate> candidate = policy_->Victim();
  if (!candidate) return std::nullopt;
  auto handle = by_handle_.find(candidate->handle);
  KVTIER_CHECK(handle != by_handle_.end(), "the policy names a block the level does not hold");
  const BlockKey key = handle->second;
  Victim victim{key, by_key_.at(key).ns};
  Remove(key);
  return victim;
}

}  // namespace kvtier
