#include "common/kv_event_forms.h"

namespace kvtier {

std::string KeyBytes(const BlockKey& key) {
  std::string out(16, '\0');
  for (int i = 0; i < 8; ++i) {
    out[i] = static_cast<char>(key.hi >> (56 - 8 * i));
    out[8 + i] = static_cast<char>(key.lo >> (56 - 8 * i));
  }
  return out;
}

std::optional<BlockKey> KeyFromBytes(std::string_view bytes) {
  if (bytes.size() != 16) return std::nullopt;
  BlockKey k;
  for (int i = 0; i < 8; ++i) {
    k.hi = (k.hi << 8) | static_cast<unsigned char>(bytes[i]);
    k.lo = (k.lo << 8) | static_cast<unsigned char>(bytes[8 + i]);
  }
  return k;
}

std::string SeqBytes(int64_t seq) {
  std::string out(8, '\0');
  const auto v = static_cast<uint64_t>(seq);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(v >> (56 - 8 * i));
  return out;
}

int64_t SeqFromBytes(std::string_view bytes) {
  uint64_t v = 0;
  for (unsigned char c : bytes) v = (v << 8) | c;
  return static_cast<int64_t>(v);
}

std::string_view MediumName(Tier tier) {
  switch (tier) {
    case Tier::kHbm:
      return "GPU";
    case Tier::kHost:
      return "CPU_PINNED";
    case Tier::kNvme:
      return "DISK";
    case Tier::kRemote:
      return "REMOTE";
    case Tier::kNone:
      break;
  }
  return "";
}

Tier TierOfMedium(std::string_view medium) {
  for (Tier t : {Tier::kHbm, Tier::kHost, Tier::kNvme, Tier::kRemote}) {
    if (MediumName(t) == medium) return t;
  }
  return Tier::kNone;
}

}  // namespace kvtier
