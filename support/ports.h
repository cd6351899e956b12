// Loopback TCP ports for servers the tools and the tests start (Redis
// Cluster nodes above all), part of kvtier_support.
#pragma once

#include <vector>

namespace kvtier::support {

// Up to `count` distinct ports drawn at random from [lowest, highest] such
// that 127.0.0.1:port and, when `companion_offset` > 0, 127.0.0.1:port +
// companion_offset (a Redis Cluster node's bus port) were both free a moment
// ago: each is held bound until all are chosen, so they differ, and released
// before returning. Each port is also claimed for the rest of this process's
// life against every other process that draws through this function (a lock
// file per port in /tmp/kvtier-ports-<uid>), so parallel tests never draw
// the same port; a program outside that convention may still take one
// meanwhile (callers retry on EADDRINUSE where they can). Fewer than `count` when the range is crowded (1000
// draws at most). Keep the range below Linux's ephemeral range (32768 and
// up by default) so no outgoing connection takes a port meanwhile.
// Thread-safe (each thread draws from its own generator).
std::vector<int> ReserveLoopbackPorts(int count, int lowest, int highest, int companion_offset);

}  // namespace kvtier::support
