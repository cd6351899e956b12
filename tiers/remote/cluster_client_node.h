// ClusterClient::Node (cluster_client.h): one Redis node the client knows
// and its pool of idle connections. Private to ClusterClient's files
// (cluster_client.cc, cluster_client_nodes.cc, cluster_client_map.cc).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "tiers/remote/cluster_client.h"
#include "tiers/remote/redis_connection.h"

namespace kvtier {

struct ClusterClient::Node {
  std::string host;
  int port = 0;
  std::string address;
  bool seed = false;                 // configured: allowed wherever it is
  std::atomic<bool> outside{false};  // its addresses were refused lately
  Mutex mu;
  std::vector<std::unique_ptr<RedisConnection>> idle GUARDED_BY(mu);
  std::atomic<uint64_t> down_until_us{0};  // on the client's Clock; 0: up
};

}  // namespace kvtier
