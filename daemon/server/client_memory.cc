#include "daemon/server/client_memory.h"

#include <algorithm>

namespace kvtier {

ClientMemory::ClientMemory(uint64_t total_bytes, size_t parties, uint32_t reserved_percent)
    : total_(total_bytes),
      part_(PartedBudget(total_bytes, parties, reserved_percent).part()),
      budget_(total_bytes, parties, reserved_percent) {}

uint64_t ClientMemory::used() const {
  MutexLock lock(mu_);
  return budget_.used();
}

uint64_t ClientMemory::used_of(size_t party) const {
  MutexLock lock(mu_);
  return budget_.used_of(party);
}

uint64_t ClientMemory::TakeUnits(size_t party, uint64_t want, uint64_t unit) {
  MutexLock lock(mu_);
  const uint64_t units = std::min(want, unit == 0 ? want : budget_.Room(party) / unit);
  budget_.Take(party, units * unit);
  return units;
}

void ClientMemory::TakeSpent(size_t party, uint64_t bytes) {
  MutexLock lock(mu_);
  budget_.Take(party, bytes);
}

void ClientMemory::Give(size_t party, uint64_t bytes) {
  MutexLock lock(mu_);
  budget_.Give(party, bytes);
}

ClientMemoryAccount::ClientMemoryAccount(ClientMemory* memory, size_t party, uint64_t limit_bytes)
    : memory_(memory), party_(party), limit_(limit_bytes == 0 ? UINT64_MAX : limit_bytes) {}

ClientMemoryAccount::~ClientMemoryAccount() {
  if (memory_ != nullptr) memory_->Give(party_, held());
}

uint64_t ClientMemoryAccount::OwnRoom() const {
  const uint64_t held = held_.load(std::memory_order_relaxed);
  return held >= limit_ ? 0 : limit_ - held;
}

uint64_t ClientMemoryAccount::ChargeUpTo(uint64_t units, uint64_t unit_bytes) {
  if (units == 0) return 0;
  const uint64_t own_fit = unit_bytes == 0 ? units : std::min(units, OwnRoom() / unit_bytes);
  uint64_t fit = own_fit;
  if (memory_ != nullptr && fit > 0) fit = memory_->TakeUnits(party_, fit, unit_bytes);
  held_.fetch_add(fit * unit_bytes, std::memory_order_relaxed);
  if (fit < units) {
    own_bound_.store(own_fit < units, std::memory_order_relaxed);
    if (memory_ != nullptr) memory_->CountRefusal();
  }
  return fit;
}

void ClientMemoryAccount::ChargeSpent(uint64_t bytes) {
  if (memory_ != nullptr) memory_->TakeSpent(party_, bytes);
  held_.fetch_add(bytes, std::memory_order_relaxed);
}

void ClientMemoryAccount::Release(uint64_t bytes) {
  uint64_t held = held_.load(std::memory_order_relaxed);
  do {
    bytes = std::min(bytes, held);
  } while (!held_.compare_exchange_weak(held, held - bytes, std::memory_order_relaxed));
  if (memory_ != nullptr) memory_->Give(party_, bytes);
}

std::string ClientMemoryAccount::Refusal(std::string_view what) const {
  const std::string held = std::to_string(held_.load(std::memory_order_relaxed));
  if (own_bound_.load(std::memory_order_relaxed) || memory_ == nullptr) {
    return "this connection holds " + held + " bytes of client state, its limit " +
           "(server.max_client_memory_per_connection = " + std::to_string(limit_) + "); no room for " +
           std::string(what) + ": release, dequeue or commit first";
  }
  return "the client state of this connection's tenant (or of all connections) is at its bound " +
         std::string("(server.client_memory_bytes = ") + std::to_string(memory_->total()) + ", part kept per tenant " +
         std::to_string(memory_->part()) + "); no room for " + std::string(what) +
         ": release, dequeue or close other connections first";
}

}  // namespace kvtier
