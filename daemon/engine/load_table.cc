#include "daemon/engine/load_table.h"

#include <string>

namespace kvtier {

void LoadRecord::Count(size_t block, uint32_t layer) {
  uint8_t& c = counted[block * layers + layer];
  if (c != 0) return;
  c = 1;
  --pending[layer];
}

void LoadRecord::Advance() {
  const uint32_t before = ready;
  while (ready < layers && pending[ready] == 0) ++ready;
  if (ready != before) board.PublishLayers(ready);
}

Result<uint64_t> LoadTable::Open(ConnectionId connection) {
  MutexLock lock(mu_);
  auto& open = loads_[connection];
  if (open.size() >= max_per_connection_) {
    return Busy("this connection holds " + std::to_string(open.size()) + " open loads; end some first");
  }
  const uint64_t id = next_id_++;
  open.emplace(id, nullptr);
  return id;
}

void LoadTable::Fill(ConnectionId connection, uint64_t id, std::shared_ptr<LoadRecord> load) {
  MutexLock lock(mu_);
  loads_[connection][id] = std::move(load);
}

void LoadTable::Abandon(ConnectionId connection, uint64_t id) {
  MutexLock lock(mu_);
  auto conn = loads_.find(connection);
  if (conn == loads_.end()) return;
  conn->second.erase(id);
  if (conn->second.empty()) loads_.erase(conn);
}

std::shared_ptr<LoadRecord> LoadTable::Take(ConnectionId connection, uint64_t id) {
  MutexLock lock(mu_);
  auto conn = loads_.find(connection);
  if (conn == loads_.end()) return nullptr;
  auto it = conn->second.find(id);
  if (it == conn->second.end() || it->second == nullptr) return nullptr;
  std::shared_ptr<LoadRecord> load = std::move(it->second);
  conn->second.erase(it);
  if (conn->second.empty()) loads_.erase(conn);
  return load;
}

std::vector<uint64_t> LoadTable::Ids(ConnectionId connection) const {
  std::vector<uint64_t> ids;
  MutexLock lock(mu_);
  auto it = loads_.find(connection);
  if (it != loads_.end()) {
    for (const auto& [id, load] : it->second) ids.push_back(id);
  }
  return ids;
}

int64_t LoadTable::OpenCount() const {
  MutexLock lock(mu_);
  int64_t open = 0;
  for (const auto& [connection, loads] : loads_) open += static_cast<int64_t>(loads.size());
  return open;
}

}  // namespace kvtier
