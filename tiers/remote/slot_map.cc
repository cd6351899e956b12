#include "tiers/remote/slot_map.h"

namespace kvtier {
namespace {

Status Malformed(const std::string& what) { return ProtocolError(what); }

bool IsInteger(const RespReply& r) { return r.type == RespReply::Type::kInteger; }

}  // namespace

Status SlotMapBuilder::CheckRangeCount(int64_t count) {
  if (count > kMaxRanges) {
    return Malformed(std::to_string(count) + " slot ranges announced, at most " + std::to_string(kMaxRanges));
  }
  return Status::Ok();
}

Status SlotMapBuilder::Add(const RespReply& range) {
  if (static_cast<int64_t>(ranges_.size()) >= kMaxRanges) {
    return Malformed("more than " + std::to_string(kMaxRanges) + " slot ranges");
  }
  if (range.type != RespReply::Type::kArray || range.elements.size() < 3) {
    return Malformed("a slot range is not [first, last, master, ...]");
  }
  if (range.elements.size() - 2 > kMaxNodesPerRange) {
    return Malformed("a slot range names " + std::to_string(range.elements.size() - 2) + " nodes, at most " +
                     std::to_string(kMaxNodesPerRange));
  }
  const RespReply& first = range.elements[0];
  const RespReply& last = range.elements[1];
  if (!IsInteger(first) || !IsInteger(last) || first.integer < 0 || last.integer >= kClusterSlots ||
      first.integer > last.integer) {
    return Malformed("slot range [" + (IsInteger(first) ? std::to_string(first.integer) : "?") + ", " +
                     (IsInteger(last) ? std::to_string(last.integer) : "?") + "] is not within [0, " +
                     std::to_string(kClusterSlots - 1) + "]");
  }
  Result<size_t> master = NodeOf(range.elements[2]);
  if (!master.ok()) return master.status();
  for (size_t r = 3; r < range.elements.size(); ++r) {
    if (Result<size_t> replica = NodeOf(range.elements[r]); !replica.ok()) return replica.status();
  }
  ranges_.push_back(Range{static_cast<uint16_t>(first.integer), static_cast<uint16_t>(last.integer), *master});
  return Status::Ok();
}

Result<size_t> SlotMapBuilder::NodeOf(const RespReply& entry) {
  if (entry.type != RespReply::Type::kArray || entry.elements.size() < 2) {
    return Malformed("a node entry is not [host, port, ...]");
  }
  const RespReply& host_reply = entry.elements[0];
  const RespReply& port = entry.elements[1];
  if (host_reply.type != RespReply::Type::kBulk && host_reply.type != RespReply::Type::kSimple) {
    return Malformed("a node's host is not a string");
  }
  if (host_reply.text.size() > kMaxHostBytes) {
    return Malformed("a node's host has " + std::to_string(host_reply.text.size()) + " bytes, at most " +
                     std::to_string(kMaxHostBytes));
  }
  for (char c : host_reply.text) {
    if (c <= ' ' || c > '~') return Malformed("a node's host holds a byte that is not printable ASCII");
  }
  if (!IsInteger(port) || port.integer <= 0 || port.integer > 65535) {
    return Malformed("a node's port " + (IsInteger(port) ? std::to_string(port.integer) : "?") + " is not 1..65535");
  }
  std::string host = host_reply.text;
  if (host.empty() || host == "?") host = asked_host_;
  std::string key = host + ":" + std::to_string(port.integer);
  if (auto it = index_.find(key); it != index_.end()) return it->second;
  if (nodes_.size() >= kMaxNodes) return Malformed("more than " + std::to_string(kMaxNodes) + " nodes");
  nodes_.push_back(Node{std::move(host), static_cast<int>(port.integer)});
  index_.emplace(std::move(key), nodes_.size() - 1);
  return nodes_.size() - 1;
}

}  // namespace kvtier
