#include "tiers/peer/peer_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <charconv>
#include <cstring>

namespace kvtier {

Result<PeerAddress> ParsePeerAddress(std::string_view text, bool any_port) {
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == text.size()) {
    return InvalidArgument("peer address '" + std::string(text) + "': expected host:port");
  }
  std::string host(text.substr(0, colon));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string_view port_text = text.substr(colon + 1);
  unsigned port = 0;
  const auto parsed = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (parsed.ec != std::errc() || parsed.ptr != port_text.data() + port_text.size() || port > 65535 ||
      (port == 0 && !any_port)) {
    return InvalidArgument("peer address '" + std::string(text) + "': bad port '" + std::string(port_text) + "'");
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0 || found == nullptr) {
    return InvalidArgument("peer address '" + std::string(text) + "': " + ::gai_strerror(rc));
  }
  PeerAddress out;
  std::memcpy(&out.addr, found->ai_addr, found->ai_addrlen);
  out.length = found->ai_addrlen;
  ::freeaddrinfo(found);
  if (out.addr.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&out.addr)->sin_port = htons(static_cast<uint16_t>(port));
  } else if (out.addr.ss_family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(&out.addr)->sin6_port = htons(static_cast<uint16_t>(port));
  } else {
    return InvalidArgument("peer address '" + std::string(text) + "': not an IP address");
  }
  out.text = std::string(text);
  return out;
}

std::string FormatPeerAddress(const sockaddr* addr) {
  char host[INET6_ADDRSTRLEN] = {};
  if (addr->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(addr);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (addr->sa_family == AF_INET6) {
    const auto* in = reinterpret_cast<const sockaddr_in6*>(addr);
    ::inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof(host));
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(in->sin6_port));
  }
  return "?";
}

}  // namespace kvtier
