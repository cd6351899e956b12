#include "daemon/connection_usage.h"

namespace kvtier {

void ConnectionUsage::Reserved(const BlockKey& key, uint64_t bytes, Clock::time_point now) {
  auto [it, inserted] = reservations_.try_emplace(key, Reservation{bytes, now});
  if (!inserted) {
    reserved_bytes_ -= it->second.bytes;
    it->second = Reservation{bytes, now};
  }
  reserved_bytes_ += bytes;
  by_age_.emplace_back(now, key);
}

void ConnectionUsage::Ended(const BlockKey& key) {
  auto it = reservations_.find(key);
  if (it == reservations_.end()) return;
  reserved_bytes_ -= it->second.bytes;
  reservations_.erase(it);
  if (reservations_.empty()) by_age_.clear();
}

std::vector<BlockKey> ConnectionUsage::TakeExpired(Clock::time_point now) {
  std::vector<BlockKey> expired;
  while (!by_age_.empty() && now - by_age_.front().first >= reservation_timeout_) {
    const auto [at, key] = by_age_.front();
    by_age_.pop_front();
    auto it = reservations_.find(key);
    if (it == reservations_.end() || it->second.at != at) continue;  // ended, or made again since
    expired.push_back(key);
    reserved_bytes_ -= it->second.bytes;
    reservations_.erase(it);
  }
  return expired;
}

std::optional<ConnectionUsage::Clock::time_point> ConnectionUsage::NextExpiry() {
  while (!by_age_.empty()) {
    const auto& [at, key] = by_age_.front();
    auto it = reservations_.find(key);
    if (it != reservations_.end() && it->second.at == at) return at + reservation_timeout_;
    by_age_.pop_front();
  }
  return std::nullopt;
}

void ConnectionUsage::LoadBegun(uint64_t load, uint64_t blocks) {
  loads_[load] += blocks;
  Leased(blocks);
}

void ConnectionUsage::LoadEnded(uint64_t load) {
  auto it = loads_.find(load);
  if (it == loads_.end()) return;
  Released(it->second);
  loads_.erase(it);
}

}  // namespace kvtier
