// ClusterClient's slot map (cluster_client.h): CLUSTER SLOTS read range by
// range within SlotMapBuilder's bounds and taken whole or not at all, one
// read at a time for commands failing together, and the targets of
// MOVED / ASK redirects.
#include <algorithm>
#include <charconv>

#include <spdlog/spdlog.h>

#include "tiers/remote/cluster_client.h"
#include "tiers/remote/cluster_client_node.h"
#include "tiers/remote/slot_map.h"

namespace kvtier {

void ClusterClient::CountRefusedMap(const Status& why) {
  maps_refused_.fetch_add(1, std::memory_order_relaxed);
  uint64_t suppressed = 0;
  if (!refusal_log_.Allow(suppressed)) return;
  spdlog::warn("remote tier: {}; the previous map keeps routing{}", why.message(),
               suppressed == 0 ? std::string() : " (" + std::to_string(suppressed) + " such lines suppressed)");
}

size_t ClusterClient::NodeForSlot(uint16_t slot) {
  ReaderMutexLock lock(mu_);
  const int32_t owner = slot_owner_[slot];
  return owner >= 0 ? static_cast<size_t>(owner) : 0;
}

int64_t ClusterClient::NowNs() { return std::chrono::steady_clock::now().time_since_epoch().count(); }

Status ClusterClient::Refresh(RedisDeadline deadline) { return RefreshAfter(NowNs(), deadline); }

Status ClusterClient::RefreshAfter(int64_t since_ns, RedisDeadline deadline) {
  MutexLock one(refresh_mu_);
  // Many commands failing at once (a master died) would each read the map:
  // a read begun after a caller saw its failure answers for it too.
  if (last_refresh_start_ns_ >= since_ns) return last_refresh_status_;
  last_refresh_start_ns_ = NowNs();
  last_refresh_status_ = ReadMap(deadline);
  return last_refresh_status_;
}

Status ClusterClient::ReadMap(RedisDeadline deadline) {
  size_t count;
  {
    ReaderMutexLock lock(mu_);
    count = nodes_.size();
  }
  Status last = Unavailable("no cluster node answered");
  for (size_t i = 0; i < count; ++i) {
    if (std::chrono::steady_clock::now() >= deadline) break;
    Status read = RefreshFrom(i, deadline);
    if (read.ok()) {
      refreshes_.fetch_add(1, std::memory_order_relaxed);
      reachable_.store(true, std::memory_order_relaxed);
      return read;
    }
    if (Outside(i)) continue;  // refused without connecting: no answer either way
    last = read;
  }
  refresh_failures_.fetch_add(1, std::memory_order_relaxed);
  if (last.code() == StatusCode::kUnavailable) reachable_.store(false, std::memory_order_relaxed);
  return Status(last.code(), "reading the cluster's slot map: " + last.message());
}

Status ClusterClient::RefreshFrom(size_t index, RedisDeadline deadline) {
  auto connection = Acquire(index, deadline);
  if (!connection.ok()) return connection.status();
  const RespArg args[] = {{"CLUSTER"}, {"SLOTS"}};
  (*connection)->Append(args);
  Status sent = (*connection)->Flush(deadline);
  // Only the reply's head: its ranges are read one at a time, each
  // within bounds, so an announced size costs nothing until it arrives.
  Result<RespReply> head = sent.ok() ? (*connection)->ReadReplyHead(deadline) : Result<RespReply>(sent);
  std::string asked_address;
  {
    ReaderMutexLock lock(mu_);
    asked_address = nodes_[index]->address;
  }
  if (!head.ok()) {
    if (head.status().code() == StatusCode::kProtocolError) {
      CountRefusedMap(
          ProtocolError("CLUSTER SLOTS reply of " + asked_address + " refused: " + head.status().message()));
    }
    return head.status();
  }
  if (head->is_error()) {
    Release(index, std::move(*connection));
    if (head->text.starts_with("NOAUTH") || head->text.starts_with("WRONGPASS")) {
      return PermissionDenied("redis node " + asked_address + " wants a password: " + head->text);
    }
    if (head->text.find("cluster support disabled") == std::string::npos) {
      return Unavailable("CLUSTER SLOTS answered: " + head->text);
    }
    WriterMutexLock lock(mu_);
    slot_owner_.fill(static_cast<int32_t>(index));  // a plain Redis: it holds every key
    return Status::Ok();
  }
  if (head->type != RespReply::Type::kArray) {
    Release(index, std::move(*connection));
    Status refused =
        ProtocolError("CLUSTER SLOTS reply of " + asked_address + " refused: neither an array nor an error");
    CountRefusedMap(refused);
    return refused;
  }
  Status read = ReadSlotRanges(**connection, head->integer, index, deadline);
  // A map refused part way leaves the rest of it unread: the connection
  // is dropped, not pooled.
  if (read.ok()) Release(index, std::move(*connection));
  return read;
}

Status ClusterClient::ReadSlotRanges(RedisConnection& connection, int64_t count, size_t index, RedisDeadline deadline) {
  std::string asked_host, asked_address;
  {
    ReaderMutexLock lock(mu_);
    asked_host = nodes_[index]->host;
    asked_address = nodes_[index]->address;
  }
  auto refuse = [&](const Status& why) {
    Status refused = ProtocolError("CLUSTER SLOTS reply of " + asked_address + " refused: " + why.message());
    CountRefusedMap(refused);
    return refused;
  };
  if (Status s = SlotMapBuilder::CheckRangeCount(count); !s.ok()) return refuse(s);
  SlotMapBuilder map(asked_host);
  for (int64_t i = 0; i < count; ++i) {
    Result<RespReply> range = connection.ReadReply(deadline, SlotMapBuilder::kRangeLimits);
    if (!range.ok())
      return range.status().code() == StatusCode::kProtocolError ? refuse(range.status()) : range.status();
    if (Status s = map.Add(*range); !s.ok()) return refuse(s);
  }
  // Whole and well formed: the nodes it names are learned (those the
  // networks allow), and it replaces the map.
  std::vector<int32_t> learned(map.nodes().size(), -1);
  for (size_t n = 0; n < map.nodes().size(); ++n) {
    const SlotMapBuilder::Node& node = map.nodes()[n];
    auto admitted = Admit(node.host, node.port, "the cluster map of " + asked_address);
    if (admitted.ok()) learned[n] = static_cast<int32_t>(*admitted);
  }
  std::array<int32_t, kClusterSlots> owners;
  owners.fill(-1);
  for (const SlotMapBuilder::Range& range : map.ranges()) {
    std::fill(owners.begin() + range.first, owners.begin() + range.last + 1, learned[range.master]);
  }
  WriterMutexLock lock(mu_);
  slot_owner_ = owners;
  return Status::Ok();
}

Result<size_t> ClusterClient::RedirectTarget(const std::string& error, size_t from, uint16_t* slot) {
  // "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381"; an empty host
  // ("MOVED 3999 :6381", Redis 7's unknown endpoint) means the host of the
  // node that answered, on that port.
  const size_t first = error.find(' ');
  const size_t second = first == std::string::npos ? std::string::npos : error.find(' ', first + 1);
  if (second == std::string::npos) return ProtocolError("malformed redirect '" + error + "'");
  unsigned long number = 0;
  const char* slot_begin = error.data() + first + 1;
  const char* slot_end = error.data() + second;
  auto [slot_parsed, slot_ec] = std::from_chars(slot_begin, slot_end, number);
  if (slot_ec != std::errc() || slot_parsed != slot_end || number >= kClusterSlots) {
    return ProtocolError("malformed redirect '" + error + "'");
  }
  std::string endpoint = error.substr(second + 1);
  if (!endpoint.empty() && endpoint.front() == ':') {
    ReaderMutexLock lock(mu_);
    const std::string& host = nodes_[from]->host;
    endpoint = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + endpoint;
  }
  auto address = ParseRedisAddress(endpoint);
  if (!address.ok() || address->first.size() > SlotMapBuilder::kMaxHostBytes) {
    return ProtocolError("malformed redirect '" + error.substr(0, 64 + SlotMapBuilder::kMaxHostBytes) + "'");
  }
  *slot = static_cast<uint16_t>(number);
  std::string from_address;
  {
    ReaderMutexLock lock(mu_);
    from_address = nodes_[from]->address;
  }
  return Admit(address->first, address->second, "a redirect from " + from_address);
}

}  // namespace kvtier
