// RedisCluster's slot moves (redis_cluster.h: BeginMove, MoveKeys,
// FinishMove, MoveSlot), as `redis-cli --cluster reshard` makes them.
#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "support/redis_cluster.h"
#include "support/redis_cluster_nodes.h"

namespace kvtier::support {
namespace {

using redis_cluster_internal::Split;
constexpr int kSlots = 16384;
constexpr std::chrono::milliseconds kPoll{50};  // between looks at the nodes

}  // namespace

Status RedisCluster::BeginMove(int slot, int to_port) {
  if (slot < 0 || slot >= kSlots) return InvalidArgument("no slot " + std::to_string(slot));
  if (moves_.count(slot) != 0) return FailedPrecondition("slot " + std::to_string(slot) + " is already moving");
  const int source = MasterOf(slot);
  if (source < 0) return kvtier::Unavailable("no live master serves slot " + std::to_string(slot));
  const std::vector<int> masters = Masters();
  if (to_port == source || std::find(masters.begin(), masters.end(), to_port) == masters.end()) {
    return InvalidArgument(Seed(to_port) + " is not a live master other than " + Seed(source));
  }
  const auto source_id = Cli(source, {"CLUSTER", "MYID"});
  if (!source_id.ok()) return source_id.status();
  const auto target_id = Cli(to_port, {"CLUSTER", "MYID"});
  if (!target_id.ok()) return target_id.status();
  const std::string slot_text = std::to_string(slot);
  const auto importing = Cli(to_port, {"CLUSTER", "SETSLOT", slot_text, "IMPORTING", *source_id});
  if (!importing.ok()) return importing.status();
  const auto migrating = Cli(source, {"CLUSTER", "SETSLOT", slot_text, "MIGRATING", *target_id});
  if (!migrating.ok()) {
    Cli(to_port, {"CLUSTER", "SETSLOT", slot_text, "STABLE"}).status().IgnoreError();  // best-effort undo
    return migrating.status();
  }
  moves_[slot] = Move{source, to_port, *target_id};
  return Status::Ok();
}

Result<int> RedisCluster::MoveKeys(int slot, int count) {
  const auto move = moves_.find(slot);
  if (move == moves_.end()) return FailedPrecondition("slot " + std::to_string(slot) + " is not moving");
  const Move& m = move->second;
  int moved = 0;
  while (moved < count) {
    const int batch = std::min(kMigrateBatchKeys, count - moved);
    const auto listed = Cli(m.source_port, {"CLUSTER", "GETKEYSINSLOT", std::to_string(slot), std::to_string(batch)});
    if (!listed.ok()) return listed.status();
    const std::vector<std::string> keys = Split(*listed, '\n');
    if (keys.empty()) break;
    std::vector<std::string> migrate = {"MIGRATE", "127.0.0.1", std::to_string(m.target_port),
                                        "",        "0",         std::to_string(kMigrateTimeout.count()),
                                        "REPLACE", "KEYS"};
    migrate.insert(migrate.end(), keys.begin(), keys.end());
    const auto sent = Cli(m.source_port, migrate,
                          std::chrono::duration_cast<std::chrono::seconds>(kMigrateTimeout) + std::chrono::seconds(30));
    if (!sent.ok()) return sent.status();
    moved += static_cast<int>(keys.size());
  }
  return moved;
}

Status RedisCluster::FinishMove(int slot) {
  const auto move = moves_.find(slot);
  if (move == moves_.end()) return FailedPrecondition("slot " + std::to_string(slot) + " is not moving");
  const Move m = move->second;
  if (const auto rest = MoveKeys(slot, INT_MAX); !rest.ok()) return rest.status();
  // The target first, then the source, then the other masters (CLUSTER
  // SETSLOT's documented order); replicas refuse SETSLOT and learn by gossip.
  std::vector<int> order = {m.target_port, m.source_port};
  for (int port : Masters()) {
    if (port != m.target_port && port != m.source_port) order.push_back(port);
  }
  for (int port : order) {
    const auto set = Cli(port, {"CLUSTER", "SETSLOT", std::to_string(slot), "NODE", m.target_id});
    if (!set.ok()) return set.status();
  }
  moves_.erase(move);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (true) {
    int culprit_port = -1;
    const Status routed = CheckSlotRouted(slot, m.target_port, /*require_state_ok=*/false, &culprit_port);
    if (routed.ok()) return routed;
    if (std::chrono::steady_clock::now() >= deadline) {
      return TimedOut("slot " + std::to_string(slot) + " moved, but not every node knows: " + routed.message());
    }
    std::this_thread::sleep_for(kPoll);
  }
}

Status RedisCluster::MoveSlot(int slot, int to_port) {
  if (Status s = BeginMove(slot, to_port); !s.ok()) return s;
  return FinishMove(slot);
}

}  // namespace kvtier::support
