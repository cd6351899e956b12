#include "daemon/server/connection_usage.h"

namespace kvtier {

void ConnectionUsage::GiveBack(uint64_t units, uint64_t unit_bytes) {
  if (account_ != nullptr) account_->Release(units * unit_bytes);
}

uint64_t ConnectionUsage::TakeLeaseRoom(uint64_t wanted) {
  wanted = std::min(wanted, LeaseRoom());
  return account_ == nullptr ? wanted : account_->ChargeUpTo(wanted, ClientStateCost::kLease);
}

void ConnectionUsage::Leased(uint64_t granted, uint64_t room_taken) {
  leases_ += granted;
  if (room_taken > granted) GiveBack(room_taken - granted, ClientStateCost::kLease);
}

void ConnectionUsage::Released(uint64_t count) {
  count = std::min(count, leases_);
  leases_ -= count;
  GiveBack(count, ClientStateCost::kLease);
}

uint64_t ConnectionUsage::TakeReservationRoom(uint64_t wanted) {
  return account_ == nullptr ? wanted : account_->ChargeUpTo(wanted, ClientStateCost::kReservation);
}

void ConnectionUsage::GiveBackReservationRoom(uint64_t count) { GiveBack(count, ClientStateCost::kReservation); }

void ConnectionUsage::Reserved(const BlockKey& key, uint64_t bytes, Clock::time_point now) {
  auto [it, inserted] = reservations_.try_emplace(key, Reservation{bytes, now});
  if (!inserted) {
    reserved_bytes_ -= it->second.bytes;
    it->second = Reservation{bytes, now};
    GiveBackReservationRoom(1);  // one record, its room taken once
  }
  reserved_bytes_ += bytes;
  by_age_.emplace_back(now, key);
  // Entries of reservations that ended or were made again are skipped when
  // they come up; a client that reserves and aborts in a loop while it
  // holds an old reservation would pile them up, so they are dropped once
  // they outnumber the live ones.
  if (by_age_.size() > 2 * reservations_.size() + 64) {
    std::erase_if(by_age_, [this](const auto& entry) {
      auto live = reservations_.find(entry.second);
      return live == reservations_.end() || live->second.at != entry.first;
    });
  }
}

void ConnectionUsage::Ended(const BlockKey& key) {
  auto it = reservations_.find(key);
  if (it == reservations_.end()) return;
  reserved_bytes_ -= it->second.bytes;
  reservations_.erase(it);
  GiveBackReservationRoom(1);
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
    GiveBackReservationRoom(1);
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

Status ConnectionUsage::TakeLoadRoom(uint64_t blocks) {
  if (blocks > LeaseRoom()) {
    return Busy("a load of " + std::to_string(blocks) + " blocks would pass server.max_leases_per_connection (" +
                std::to_string(max_leases_) + ", " + std::to_string(leases_) + " held): end loads or release first");
  }
  if (account_ == nullptr) return Status::Ok();
  if (account_->TryCharge(blocks * (ClientStateCost::kLease + ClientStateCost::kLoadBlock))) return Status::Ok();
  return Busy(account_->Refusal("a load of " + std::to_string(blocks) + " blocks"));
}

void ConnectionUsage::LoadRefused(uint64_t blocks) {
  GiveBack(blocks, ClientStateCost::kLease + ClientStateCost::kLoadBlock);
}

void ConnectionUsage::LoadBegun(uint64_t load, uint64_t blocks) {
  loads_[load] += blocks;
  leases_ += blocks;
}

void ConnectionUsage::LoadEnded(uint64_t load) {
  auto it = loads_.find(load);
  if (it == loads_.end()) return;
  leases_ -= std::min(it->second, leases_);
  GiveBack(it->second, ClientStateCost::kLease + ClientStateCost::kLoadBlock);
  loads_.erase(it);
}

namespace {

uint64_t QueuedCost(uint64_t keys) {
  return keys == 0 ? 0 : ClientStateCost::kQueuedRequest + keys * ClientStateCost::kQueuedKey;
}

}  // namespace

Status ConnectionUsage::SetQueued(uint64_t request, uint64_t keys) {
  const uint64_t before = queued_keys(request);
  const uint64_t had = QueuedCost(before), needs = QueuedCost(keys);
  if (needs > had && account_ != nullptr) {
    if (!account_->TryCharge(needs - had)) {
      return Busy(account_->Refusal("a queued request of " + std::to_string(keys) + " keys"));
    }
  } else if (needs < had && account_ != nullptr) {
    account_->Release(had - needs);
  }
  if (keys == 0) {
    queued_.erase(request);
  } else {
    queued_[request] = keys;
  }
  return Status::Ok();
}

uint64_t ConnectionUsage::queued_keys(uint64_t request) const {
  auto it = queued_.find(request);
  return it == queued_.end() ? 0 : it->second;
}

Status ConnectionUsage::ChargeNamespaces(uint64_t bytes) {
  if (account_ == nullptr || bytes == 0) return Status::Ok();
  if (account_->TryCharge(bytes)) return Status::Ok();
  return Busy(account_->Refusal("namespace registrations of " + std::to_string(bytes) + " bytes"));
}

}  // namespace kvtier
