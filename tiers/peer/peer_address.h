// Peer addresses: "host:port" (an IPv4 address or a name) or "[v6]:port",
// as `[peer]` listen and members name them.
#pragma once

#include <sys/socket.h>

#include <string>
#include <string_view>

#include "kvtier/result.h"

namespace kvtier {

struct PeerAddress {
  sockaddr_storage addr{};
  socklen_t length = 0;
  std::string text;  // as given
};

// Resolves `text` (a name through the system's resolver, so it may block:
// at start-up only). InvalidArgument naming what is wrong. Port 0 only when
// `any_port` (a listener that takes a free port).
Result<PeerAddress> ParsePeerAddress(std::string_view text, bool any_port = false);

// "host:port" of a socket address ("[v6]:port" for IPv6).
std::string FormatPeerAddress(const sockaddr* addr);

}  // namespace kvtier
