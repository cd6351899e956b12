// The C ABI (kvtier_c.h) over kvtier::Client: errors, keys, connecting,
// lookups, queue hints and counters. Blocks are in c_api_blocks.cc,
// layer-wise saves and loads in c_api_layers.cc; what they share in
// c_api_support.h.
#include <chrono>
#include <cstring>
#include <span>

#include "client_lib/c_api_support.h"

using kvtier::c_abi::Guard;
using kvtier::c_abi::Missing;
using kvtier::c_abi::Report;

extern "C" {

const char* kvtier_last_error(void) { return kvtier::c_abi::last_error.c_str(); }

const char* kvtier_status_name(int code) {
  // StatusCodeName returns string literals, so data() is NUL-terminated.
  return kvtier::StatusCodeName(static_cast<kvtier::StatusCode>(code)).data();
}

int kvtier_namespace_fingerprint(const kvtier_namespace* ns, kvtier_key* out) {
  return Guard([&] {
    if (ns == nullptr) return Missing("ns");
    if (out == nullptr) return Missing("out");
    kvtier::NamespaceDescriptor d = kvtier::c_abi::ToDescriptor(*ns);
    if (kvtier::Status s = d.Validate(); !s.ok()) return Report(s);
    *out = kvtier::c_abi::ToC(kvtier::FingerprintNamespace(d));
    return KVTIER_OK;
  });
}

int kvtier_chain_keys(const kvtier_namespace* ns, const uint32_t* tokens, size_t n_tokens, kvtier_key* out,
                      size_t out_capacity, size_t* out_count) {
  return kvtier_chain_keys_salted(ns, nullptr, 0, tokens, n_tokens, out, out_capacity, out_count);
}

int kvtier_chain_keys_salted(const kvtier_namespace* ns, const char* cache_salt, size_t salt_len,
                             const uint32_t* tokens, size_t n_tokens, kvtier_key* out, size_t out_capacity,
                             size_t* out_count) {
  return Guard([&] {
    if (ns == nullptr) return Missing("ns");
    if (out_count == nullptr) return Missing("out_count");
    if (tokens == nullptr && n_tokens > 0) return Missing("tokens");
    if (cache_salt == nullptr && salt_len > 0) return Missing("cache_salt");
    auto hasher = kvtier::ChainHasher::Create(kvtier::c_abi::ToDescriptor(*ns));
    if (!hasher.ok()) return Report(hasher.status());
    kvtier::ChainExtras extras;
    if (salt_len > 0) extras.cache_salt.assign(cache_salt, salt_len);
    if (kvtier::Status s = extras.Validate(); !s.ok()) return Report(s);
    const size_t needed = n_tokens / hasher->block_tokens();
    *out_count = needed;
    if (needed > out_capacity) {
      return Report(kvtier::InvalidArgument("out_capacity " + std::to_string(out_capacity) + " < " +
                                            std::to_string(needed) + " keys"));
    }
    if (out == nullptr && needed > 0) return Missing("out");
    auto keys = hasher->Keys(std::span<const uint32_t>(tokens, n_tokens), extras);
    if (!keys.ok()) return Report(keys.status());
    for (size_t i = 0; i < keys->size(); ++i) out[i] = kvtier::c_abi::ToC((*keys)[i]);
    return KVTIER_OK;
  });
}

int kvtier_key_to_hex(kvtier_key key, char out[33]) {
  return Guard([&] {
    if (out == nullptr) return Missing("out");
    const std::string hex = kvtier::c_abi::ToKey(key).ToHex();
    std::memcpy(out, hex.c_str(), 33);
    return KVTIER_OK;
  });
}

void kvtier_client_options_init(kvtier_client_options* options) {
  Guard([&] {
    if (options == nullptr) return KVTIER_OK;
    *options = kvtier_client_options{};
    options->size = sizeof(kvtier_client_options);
    options->verify_checksums = kvtier::ClientOptions{}.verify_checksums ? 1 : 0;
    return KVTIER_OK;
  });
}

int kvtier_connect(const char* socket_path, const kvtier_namespace* namespaces, size_t n_namespaces,
                   kvtier_client** out) {
  return kvtier_connect_with_options(socket_path, namespaces, n_namespaces, nullptr, out);
}

int kvtier_connect_with_options(const char* socket_path, const kvtier_namespace* namespaces, size_t n_namespaces,
                                const kvtier_client_options* c_options, kvtier_client** out) {
  return Guard([&] {
    if (out == nullptr) return Missing("out");
    *out = nullptr;
    if (namespaces == nullptr && n_namespaces > 0) return Missing("namespaces");
    kvtier::ClientOptions options;
    if (c_options != nullptr) {
      // Fields past the caller's `size` (an older header) keep their defaults.
      constexpr size_t kFirstVersion = offsetof(kvtier_client_options, verify_checksums) + sizeof(int);
      if (c_options->size < kFirstVersion) {
        return Report(kvtier::InvalidArgument("kvtier_client_options.size is " + std::to_string(c_options->size) +
                                              ": initialise the options with kvtier_client_options_init"));
      }
      options.verify_checksums = c_options->verify_checksums != 0;
    }
    if (socket_path != nullptr) options.socket_path = socket_path;
    options.client_name = "kvtier-c-client";
    for (size_t i = 0; i < n_namespaces; ++i) {
      options.namespaces.push_back(kvtier::c_abi::ToDescriptor(namespaces[i]));
    }
    auto client = kvtier::Client::Connect(options);
    if (!client.ok()) return Report(client.status());
    *out = new kvtier_client{std::move(*client)};
    return KVTIER_OK;
  });
}

void kvtier_close(kvtier_client* client) {
  Guard([&] {
    delete client;
    return KVTIER_OK;
  });
}

int kvtier_lookup(kvtier_client* client, uint32_t ns, const kvtier_key* keys, size_t n, size_t* prefix_blocks,
                  uint8_t* tiers) {
  return Guard([&] {
    if (client == nullptr) return Missing("client");
    if (prefix_blocks == nullptr) return Missing("prefix_blocks");
    if (keys == nullptr && n > 0) return Missing("keys");
    auto r = client->client->Lookup(ns, kvtier::c_abi::ToKeys(keys, n));
    if (!r.ok()) return Report(r.status());
    *prefix_blocks = r->prefix_blocks;
    for (size_t i = 0; tiers != nullptr && i < n; ++i) {
      tiers[i] = i < r->tiers.size() && i < r->prefix_blocks ? static_cast<uint8_t>(r->tiers[i]) : KVTIER_TIER_NONE;
    }
    return KVTIER_OK;
  });
}

int kvtier_estimate_ready(kvtier_client* client, uint32_t ns, const kvtier_key* keys, size_t n,
                          kvtier_ready_estimate* out, uint8_t* tiers, kvtier_ready_tier* below, size_t below_cap) {
  return Guard([&] {
    if (client == nullptr) return Missing("client");
    if (out == nullptr) return Missing("out");
    if (keys == nullptr && n > 0) return Missing("keys");
    auto r = client->client->EstimateReady(ns, kvtier::c_abi::ToKeys(keys, n));
    if (!r.ok()) return Report(r.status());
    *out = kvtier_ready_estimate{r->prefix_blocks,  r->prefix_bytes,         r->host_ready_us, r->gpu_ready_us,
                                 r->gpu_copy_bytes, r->gpu_copy_bytes_per_s, r->below.size()};
    for (size_t i = 0; tiers != nullptr && i < n; ++i) {
      tiers[i] = i < r->tiers.size() ? static_cast<uint8_t>(r->tiers[i]) : KVTIER_TIER_NONE;
    }
    for (size_t i = 0; below != nullptr && i < below_cap && i < r->below.size(); ++i) {
      const kvtier::ReadyTierShare& b = r->below[i];
      below[i] = kvtier_ready_tier{static_cast<uint8_t>(b.tier), b.blocks,       b.bytes,
                                   b.promoting_blocks,           b.queued_reads, b.queued_bytes,
                                   b.read_bytes_per_s,           b.overhead_us,  b.ready_us};
    }
    return KVTIER_OK;
  });
}

int kvtier_enqueue(kvtier_client* client, uint64_t request, uint32_t ns, const kvtier_key* keys, size_t n,
                   uint64_t start_in_us, uint64_t session) {
  return Guard([&] {
    if (client == nullptr) return Missing("client");
    if (keys == nullptr && n > 0) return Missing("keys");
    const auto start = std::chrono::steady_clock::now() + std::chrono::microseconds(start_in_us);
    return Report(client->client->Enqueue(request, ns, kvtier::c_abi::ToKeys(keys, n), start, session));
  });
}

int kvtier_request_started(kvtier_client* client, uint64_t request) {
  return Guard([&] { return client == nullptr ? Missing("client") : Report(client->client->Started(request)); });
}

int kvtier_request_finished(kvtier_client* client, uint64_t request) {
  return Guard([&] { return client == nullptr ? Missing("client") : Report(client->client->Finished(request)); });
}

int kvtier_session_hint(kvtier_client* client, uint64_t session, int open) {
  return Guard([&] {
    if (client == nullptr) return Missing("client");
    return Report(open != 0 ? client->client->OpenSession(session) : client->client->CloseSession(session));
  });
}

int kvtier_stat(kvtier_client* client, const char* name, int64_t* value) {
  return Guard([&] {
    if (client == nullptr) return Missing("client");
    if (name == nullptr || value == nullptr) return Missing("name or value");
    auto counters = client->client->Stats();
    if (!counters.ok()) return Report(counters.status());
    for (const kvtier::Counter& c : *counters) {
      if (c.name == name) {
        *value = c.value;
        return KVTIER_OK;
      }
    }
    return Report(kvtier::NotFound(std::string("no counter named \"") + name + "\""));
  });
}

int kvtier_arena(kvtier_client* client, void** base, size_t* len) {
  return Guard([&] {
    if (client == nullptr) return Missing("client");
    if (base == nullptr || len == nullptr) return Missing("base or len");
    const std::span<std::byte> arena = client->client->arena();
    *base = arena.data();
    *len = arena.size();
    return KVTIER_OK;
  });
}

}  // extern "C"
