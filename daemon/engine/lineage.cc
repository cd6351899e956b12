#include "daemon/engine/lineage.h"

namespace kvtier {

void Lineage::Record(std::span<const BlockKey> chain, uint64_t conversation) {
  MutexLock lock(mu_);
  for (size_t i = 0; i < chain.size(); ++i) {
    Info info;
    if (i > 0) info.parent = chain[i - 1];
    info.conversation = conversation;
    Set(chain[i], info);
  }
  if (conversation != 0 && conversations_.count(conversation) == 0) Remember(conversation, State::kOpen);
}

void Lineage::RecordLinks(std::span<const BlockKey> chain, const std::optional<BlockKey>& parent) {
  MutexLock lock(mu_);
  for (size_t i = 0; i < chain.size(); ++i) {
    std::optional<BlockKey> parent_of = i > 0 ? std::optional<BlockKey>(chain[i - 1]) : parent;
    if (!parent_of) continue;
    auto it = keys_.find(chain[i]);
    Info info;
    info.parent = parent_of;
    if (it != keys_.end()) info.conversation = it->second.conversation;
    Set(chain[i], info);
  }
}

void Lineage::Set(const BlockKey& key, const Info& info) {
  auto [it, fresh] = keys_.insert_or_assign(key, info);
  if (!fresh) return;
  key_order_.push_back(key);
  if (key_order_.size() > capacity_) {
    keys_.erase(key_order_.front());
    key_order_.pop_front();
  }
}

std::optional<Lineage::Info> Lineage::Find(const BlockKey& key) const {
  MutexLock lock(mu_);
  auto it = keys_.find(key);
  if (it == keys_.end()) return std::nullopt;
  return it->second;
}

void Lineage::SetConversation(uint64_t conversation, bool open) {
  if (conversation == 0) return;
  MutexLock lock(mu_);
  Remember(conversation, open ? State::kOpen : State::kClosed);
}

Lineage::State Lineage::ConversationState(uint64_t conversation) const {
  MutexLock lock(mu_);
  auto it = conversations_.find(conversation);
  return it == conversations_.end() ? State::kUnknown : it->second;
}

size_t Lineage::keys() const {
  MutexLock lock(mu_);
  return keys_.size();
}

void Lineage::Remember(uint64_t conversation, State state) {
  auto [it, fresh] = conversations_.insert_or_assign(conversation, state);
  if (!fresh) return;
  conversation_order_.push_back(conversation);
  if (conversation_order_.size() > capacity_) {
    conversations_.erase(conversation_order_.front());
    conversation_order_.pop_front();
  }
}

}  // namespace kvtier
