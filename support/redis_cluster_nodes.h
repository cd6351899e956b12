// What RedisCluster (redis_cluster.h) reads of its nodes' answers: CLUSTER
// NODES lines, and text helpers. Private to redis_cluster*.cc.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvtier::support::redis_cluster_internal {

// One line of CLUSTER NODES: "<id> <ip:port@bus[,host]> <flags> <master-id|->
// <ping> <pong> <config-epoch> <link> <slot ranges...>".
struct NodeLine {
  std::string id;
  int port = -1;
  bool myself = false;
  bool master = false;
  bool failing = false;   // flagged fail or fail?
  std::string master_id;  // "-" for a master
  int64_t config_epoch = 0;
  std::vector<std::pair<int, int>> slots;  // served ranges, inclusive; open (importing/migrating) ones left out

  bool Holds(int slot) const {
    return std::any_of(slots.begin(), slots.end(),
                       [slot](const auto& r) { return r.first <= slot && slot <= r.second; });
  }
};

// The last `lines` lines of `text`.
std::string LastLines(const std::string& text, int lines);
// The non-empty parts of `text` between `separator`s, without a trailing '\r'.
std::vector<std::string> Split(const std::string& text, char separator);
// `text` as a whole decimal number, or `fallback`.
int64_t ToInt(std::string_view text, int64_t fallback = -1);
NodeLine ParseNodeLine(const std::string& line);
// A node's view reduced to what all nodes must agree on: who is there, who
// replicates whom, who serves which slots.
std::string Canonical(const std::vector<NodeLine>& lines);
// The line of the node that answered (flagged myself); null if none.
const NodeLine* Myself(const std::vector<NodeLine>& lines);

}  // namespace kvtier::support::redis_cluster_internal
