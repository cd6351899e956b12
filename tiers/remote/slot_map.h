// SlotMapBuilder: a CLUSTER SLOTS reply, checked range by range as it is
// read off the connection, into the ranges and the distinct nodes they
// name. Whatever a node sends, what the builder keeps is bounded before it
// is read (each range with RespLimits kRangeLimits) or kept (the counts
// below): a cluster map holds at most one range per slot, a sane number of
// nodes and host names DNS can hold. Anything else (a slot out of range, a
// port that is none, an entry of the wrong type, a bound passed) makes the
// whole map a ProtocolError saying what is wrong: a map is taken whole or
// not at all (cluster_client.h keeps the previous one).
//
// A node is "host:port" as the reply names it; an empty host or "?"
// (Redis 7's unknown endpoint) stands for the host of the node asked.
//
// Not thread-safe: one per map read.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvtier/result.h"
#include "tiers/remote/hash_slot.h"
#include "tiers/remote/redis_connection.h"

namespace kvtier {

class SlotMapBuilder {
 public:
  // Ranges in one map: one per slot at the most.
  static constexpr int64_t kMaxRanges = kClusterSlots;
  // Distinct nodes (masters and replicas) one map may name: twice the
  // thousand nodes Redis Cluster is designed for.
  static constexpr size_t kMaxNodes = 2048;
  // Nodes one range may name: its master and up to 63 replicas.
  static constexpr size_t kMaxNodesPerRange = 64;
  // Bytes of a host name (DNS allows 253) or address.
  static constexpr size_t kMaxHostBytes = 255;
  // What reading one range may take: its nodes, each with an id and Redis
  // 7's metadata (a few key-value pairs), and short strings only.
  static constexpr RespLimits kRangeLimits{/*max_elements=*/512, /*max_bulk_bytes=*/1024};

  struct Node {
    std::string host;
    int port = 0;
  };
  struct Range {
    uint16_t first = 0;
    uint16_t last = 0;  // inclusive
    size_t master = 0;  // index in nodes()
  };

  explicit SlotMapBuilder(std::string asked_host) : asked_host_(std::move(asked_host)) {}

  // Checks that a reply announcing `count` ranges may be read at all.
  static Status CheckRangeCount(int64_t count);
  // Adds one element of the reply: [first, last, master, replica...], each
  // node [host, port, id, ...]. ProtocolError saying what is wrong.
  Status Add(const RespReply& range);

  const std::vector<Range>& ranges() const { return ranges_; }
  // Masters first named first; replicas too (after a failover one of
  // them is whom to ask).
  const std::vector<Node>& nodes() const { return nodes_; }

 private:
  // The node's index, added if new; ProtocolError past kMaxNodes or for
  // an entry that is not a node.
  Result<size_t> NodeOf(const RespReply& entry);

  const std::string asked_host_;
  std::vector<Range> ranges_;
  std::vector<Node> nodes_;
  std::unordered_map<std::string, size_t> index_;  // "host:port" -> nodes_
};

}  // namespace kvtier
