#include "tiers/remote/member_registry.h"

#include <algorithm>
#include <cstring>
#include <span>

#include "common/little_endian.h"

namespace kvtier {
namespace {

// A value: "kvm1", the lapse time (8 bytes, little-endian, ms since the
// epoch), the address, then the MAC tag over the domain, the field's
// length and bytes, and all of that. The domain keeps a registry tag apart
// from any other message under the cluster secret's MAC (a remote value's,
// whose bytes a client chooses): no value of another kind verifies here.
constexpr std::string_view kMagic = "kvm1";
constexpr size_t kHeadBytes = 4 + 8;
constexpr std::string_view kDomain = "kvtier peer registry v1";
constexpr size_t kMaxFieldBytes = 64;
constexpr size_t kMaxAddressBytes = 300;
// An entry may lapse at most this many lifetimes ahead (clocks that
// disagree a little); one further ahead is refused, so none lives forever.
constexpr int64_t kMaxLifetimesAhead = 2;

std::span<const std::byte> Bytes(std::string_view s) { return std::as_bytes(std::span(s.data(), s.size())); }

// What the tag covers before the value: the domain and the field, its length first.
std::string Covered(std::string_view field) {
  std::string out(kDomain);
  out.push_back('\0');
  std::byte length[4];
  StoreLe32(length, static_cast<uint32_t>(field.size()));
  out.append(reinterpret_cast<const char*>(length), sizeof(length));
  out.append(field);
  return out;
}

int64_t WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Result<std::unique_ptr<MemberRegistry>> MemberRegistry::Create(std::unique_ptr<ClusterClient> client,
                                                               std::string_view secret, MemberRegistryOptions options) {
  if (client == nullptr) return InvalidArgument("member registry: no Redis client");
  if (options.self_id.empty() || options.self_id.size() > kMaxFieldBytes) {
    return InvalidArgument("member registry: this node's id must be 1 to 64 bytes");
  }
  if (options.self_address.empty() || options.self_address.size() > kMaxAddressBytes) {
    return InvalidArgument("member registry: this node's address must be 1 to 300 bytes");
  }
  if (options.ttl.count() <= 0) return InvalidArgument("member registry: the entries' lifetime must be positive");
  auto mac = ValueMac::Create(secret);
  if (!mac.ok()) return mac.status();
  if (!options.now_ms) options.now_ms = WallMs;
  return std::unique_ptr<MemberRegistry>(new MemberRegistry(std::move(client), std::move(*mac), std::move(options)));
}

MemberRegistry::MemberRegistry(std::unique_ptr<ClusterClient> client, std::unique_ptr<ValueMac> mac,
                               MemberRegistryOptions options)
    : client_(std::move(client)), mac_(std::move(mac)), options_(std::move(options)) {}

MemberRegistry::~MemberRegistry() = default;

std::string MemberRegistry::Encode(const std::string& field, const std::string& address, int64_t lapses_ms) const {
  std::string value(kMagic);
  value.resize(kHeadBytes);
  StoreLe64(reinterpret_cast<std::byte*>(value.data() + kMagic.size()), static_cast<uint64_t>(lapses_ms));
  value += address;
  const ValueMacTag tag = mac_->Compute(Bytes(Covered(field)), Bytes(value));
  value.append(reinterpret_cast<const char*>(tag.data()), tag.size());
  return value;
}

Result<std::string> MemberRegistry::Decode(const std::string& field, const std::string& value, int64_t now_ms,
                                           int64_t* lapses_ms) const {
  if (field.size() > kMaxFieldBytes || value.size() <= kHeadBytes + kValueMacBytes ||
      value.size() > kHeadBytes + kMaxAddressBytes + kValueMacBytes || value.compare(0, kMagic.size(), kMagic) != 0) {
    return Corruption("member registry: entry " + field + " is not a registry entry");
  }
  const std::string_view body(value.data(), value.size() - kValueMacBytes);
  const auto tag = std::as_bytes(std::span(value.data() + body.size(), kValueMacBytes));
  if (!mac_->Verify(Bytes(Covered(field)), Bytes(body), tag.first<kValueMacBytes>())) {
    return Corruption("member registry: entry " + field + " does not carry this cluster's MAC");
  }
  const auto lapses = static_cast<int64_t>(LoadLe64(reinterpret_cast<const std::byte*>(body.data() + kMagic.size())));
  if (lapses_ms != nullptr) *lapses_ms = lapses;
  if (lapses <= now_ms) return NotFound("member registry: entry " + field + " lapsed");
  if (lapses - now_ms > kMaxLifetimesAhead * options_.ttl.count()) {
    return Corruption("member registry: entry " + field + " lapses further ahead than an entry can");
  }
  return std::string(body.substr(kHeadBytes));
}

Result<RespReply> MemberRegistry::Command(std::vector<std::string> args) {
  const auto deadline = [this] { return std::chrono::steady_clock::now() + options_.timeout; };
  return client_->Run(
      options_.hash_key,
      [&](RedisConnection& c) -> Result<RespReply> {
        std::vector<RespArg> resp;
        resp.reserve(args.size());
        for (const std::string& a : args) resp.push_back(RespArg{a});
        c.Append(resp);
        if (Status s = c.Flush(deadline()); !s.ok()) return s;
        // HGETALL: two elements per field.
        RespLimits limits;
        limits.max_elements = static_cast<int64_t>(2 * options_.max_entries);
        limits.max_bulk_bytes = static_cast<int64_t>(kHeadBytes + kMaxAddressBytes + kValueMacBytes);
        return c.ReadReply(deadline(), limits);
      },
      deadline());
}

Result<RegistryMembers> MemberRegistry::Refresh() {
  const int64_t now = options_.now_ms();
  RegistryMembers out;
  // A write that fails (a full Redis answers OOM) still reads the others.
  auto wrote = Command({"HSET", options_.hash_key, options_.self_id,
                        Encode(options_.self_id, options_.self_address, now + options_.ttl.count())});
  if (!wrote.ok()) {
    out.announce_failure = wrote.status();
  } else if (wrote->is_error()) {
    out.announce_failure = Unavailable("member registry: HSET " + options_.hash_key + ": " + wrote->text);
  }
  auto all = Command({"HGETALL", options_.hash_key});
  if (!all.ok()) return all.status();
  if (all->is_error()) return Unavailable("member registry: HGETALL " + options_.hash_key + ": " + all->text);
  if (all->type != RespReply::Type::kArray || all->elements.size() % 2 != 0) {
    return ProtocolError("member registry: " + options_.hash_key + " is not a hash");
  }
  std::vector<std::string> long_lapsed;
  for (size_t i = 0; i < all->elements.size(); i += 2) {
    const RespReply& field = all->elements[i];
    const RespReply& value = all->elements[i + 1];
    if (field.type != RespReply::Type::kBulk || value.type != RespReply::Type::kBulk) {
      ++out.refused;
      continue;
    }
    if (field.text == options_.self_id) continue;
    int64_t lapses = 0;
    auto address = Decode(field.text, value.text, now, &lapses);
    if (address.ok()) {
      out.addresses.push_back(std::move(*address));
    } else if (address.status().code() == StatusCode::kNotFound) {
      ++out.lapsed;
      if (now - lapses > options_.ttl.count()) long_lapsed.push_back(field.text);
    } else {
      ++out.refused;
    }
  }
  if (!long_lapsed.empty()) {
    std::vector<std::string> del{"HDEL", options_.hash_key};
    del.insert(del.end(), long_lapsed.begin(), long_lapsed.end());
    (void)Command(std::move(del));  // whoever reads next tries again
  }
  std::sort(out.addresses.begin(), out.addresses.end());
  out.addresses.erase(std::unique(out.addresses.begin(), out.addresses.end()), out.addresses.end());
  return out;
}

Status MemberRegistry::Leave() {
  auto reply = Command({"HDEL", options_.hash_key, options_.self_id});
  if (!reply.ok()) return reply.status();
  if (reply->is_error()) return Unavailable("member registry: HDEL " + options_.hash_key + ": " + reply->text);
  return Status::Ok();
}

}  // namespace kvtier
