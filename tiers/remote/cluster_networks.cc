#include "tiers/remote/cluster_networks.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <charconv>
#include <cstring>
#include <optional>

namespace kvtier {
namespace {

int MaxBits(int family) { return family == AF_INET ? 32 : 128; }

// Whether the first `bits` bits of `a` and `b` agree.
bool SamePrefix(const std::array<uint8_t, 16>& a, const std::array<uint8_t, 16>& b, int bits) {
  const int whole = bits / 8;
  if (std::memcmp(a.data(), b.data(), static_cast<size_t>(whole)) != 0) return false;
  const int rest = bits % 8;
  if (rest == 0) return true;
  const uint8_t mask = static_cast<uint8_t>(0xff << (8 - rest));
  return (a[whole] & mask) == (b[whole] & mask);
}

}  // namespace

bool ClusterNetworks::Normalize(const sockaddr* address, Network* out) {
  if (address == nullptr) return false;
  if (address->sa_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(address);
    out->family = AF_INET;
    std::memcpy(out->bytes.data(), &v4->sin_addr, 4);
    return true;
  }
  if (address->sa_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(address);
    if (IN6_IS_ADDR_V4MAPPED(&v6->sin6_addr)) {
      out->family = AF_INET;
      std::memcpy(out->bytes.data(), v6->sin6_addr.s6_addr + 12, 4);
      return true;
    }
    out->family = AF_INET6;
    std::memcpy(out->bytes.data(), v6->sin6_addr.s6_addr, 16);
    return true;
  }
  return false;
}

Result<ClusterNetworks> ClusterNetworks::Parse(std::span<const std::string> texts) {
  ClusterNetworks out;
  for (const std::string& text : texts) {
    auto bad = [&text] {
      return InvalidArgument("'" + text + "' is not a network (an IPv4 or IPv6 address, optionally /prefix bits)");
    };
    const size_t slash = text.find('/');
    const std::string address = text.substr(0, slash);
    Network network;
    if (::inet_pton(AF_INET, address.c_str(), network.bytes.data()) == 1) {
      network.family = AF_INET;
    } else if (::inet_pton(AF_INET6, address.c_str(), network.bytes.data()) == 1) {
      network.family = AF_INET6;
    } else {
      return bad();
    }
    network.prefix_bits = MaxBits(network.family);
    if (slash != std::string::npos) {
      const char* begin = text.data() + slash + 1;
      const char* end = text.data() + text.size();
      auto [parsed, ec] = std::from_chars(begin, end, network.prefix_bits);
      if (begin == end || ec != std::errc() || parsed != end || network.prefix_bits < 0 ||
          network.prefix_bits > MaxBits(network.family)) {
        return bad();
      }
    }
    out.Add(network);
  }
  return out;
}

void ClusterNetworks::Add(Network network) {
  // Host bits below the prefix are dropped: 10.0.5.7/24 is 10.0.5.0/24.
  for (int bit = network.prefix_bits; bit < 128; ++bit) {
    network.bytes[bit / 8] &= static_cast<uint8_t>(~(0x80 >> (bit % 8)));
  }
  for (const Network& n : networks_) {
    if (n.family == network.family && n.prefix_bits <= network.prefix_bits &&
        SamePrefix(n.bytes, network.bytes, n.prefix_bits)) {
      return;  // already inside a network of the set
    }
  }
  networks_.push_back(network);
}

void ClusterNetworks::AddAround(const sockaddr* address) {
  Network network;
  if (!Normalize(address, &network)) return;
  network.prefix_bits = network.family == AF_INET ? kDefaultV4PrefixBits : kDefaultV6PrefixBits;
  Add(network);
}

bool ClusterNetworks::Contains(const sockaddr* address) const {
  Network candidate;
  if (!Normalize(address, &candidate)) return false;
  for (const Network& n : networks_) {
    if (n.family == candidate.family && SamePrefix(n.bytes, candidate.bytes, n.prefix_bits)) return true;
  }
  return false;
}

std::optional<bool> ClusterNetworks::ContainsNumeric(const std::string& host) const {
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return std::nullopt;
  const bool inside = found != nullptr && Contains(found->ai_addr);
  ::freeaddrinfo(found);
  return inside;
}

std::string ClusterNetworks::ToString() const {
  std::string out;
  for (const Network& n : networks_) {
    char text[INET6_ADDRSTRLEN] = {};
    ::inet_ntop(n.family, n.bytes.data(), text, sizeof text);
    if (!out.empty()) out += ", ";
    out += std::string(text) + "/" + std::to_string(n.prefix_bits);
  }
  return out.empty() ? "none" : out;
}

}  // namespace kvtier
