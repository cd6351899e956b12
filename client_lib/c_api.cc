// The C ABI (kvtier_c.h) over kvtier::Client. Each entry point clears the
// thread's error message, runs its body inside Guard (no exception crosses
// the ABI) and turns a Status into its code, keeping the message.
#include <chrono>
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvtier/client.h"
#include "kvtier/kvtier_c.h"

struct kvtier_client {
  std::unique_ptr<kvtier::Client> client;
};

struct kvtier_view {
  kvtier::BlockView view;
};

struct kvtier_reservation {
  kvtier::Reservation reservation;
  bool committed = false;
};

struct kvtier_layer_save {
  kvtier::LayerSave save;
};

struct kvtier_layer_load {
  kvtier::LayerLoad load;
};

namespace kvtier {
namespace {

static_assert(KVTIER_OK == static_cast<int>(StatusCode::kOk));
static_assert(KVTIER_INVALID_ARGUMENT == static_cast<int>(StatusCode::kInvalidArgument));
static_assert(KVTIER_NOT_FOUND == static_cast<int>(StatusCode::kNotFound));
static_assert(KVTIER_ALREADY_EXISTS == static_cast<int>(StatusCode::kAlreadyExists));
static_assert(KVTIER_NO_SPACE == static_cast<int>(StatusCode::kNoSpace));
static_assert(KVTIER_BUSY == static_cast<int>(StatusCode::kBusy));
static_assert(KVTIER_IO_ERROR == static_cast<int>(StatusCode::kIoError));
static_assert(KVTIER_CORRUPTION == static_cast<int>(StatusCode::kCorruption));
static_assert(KVTIER_PROTOCOL_ERROR == static_cast<int>(StatusCode::kProtocolError));
static_assert(KVTIER_VERSION_MISMATCH == static_cast<int>(StatusCode::kVersionMismatch));
static_assert(KVTIER_UNAVAILABLE == static_cast<int>(StatusCode::kUnavailable));
static_assert(KVTIER_PERMISSION_DENIED == static_cast<int>(StatusCode::kPermissionDenied));
static_assert(KVTIER_FAILED_PRECONDITION == static_cast<int>(StatusCode::kFailedPrecondition));
static_assert(KVTIER_UNIMPLEMENTED == static_cast<int>(StatusCode::kUnimplemented));
static_assert(KVTIER_INTERNAL == static_cast<int>(StatusCode::kInternal));
static_assert(KVTIER_CANCELLED == static_cast<int>(StatusCode::kCancelled));
static_assert(KVTIER_TIMED_OUT == static_cast<int>(StatusCode::kTimedOut));
static_assert(KVTIER_TIER_NONE == static_cast<int>(Tier::kNone));
static_assert(KVTIER_TIER_HBM == static_cast<int>(Tier::kHbm));
static_assert(KVTIER_TIER_HOST == static_cast<int>(Tier::kHost));
static_assert(KVTIER_TIER_NVME == static_cast<int>(Tier::kNvme));
static_assert(KVTIER_TIER_REMOTE == static_cast<int>(Tier::kRemote));

// Owned by this thread; kvtier_last_error hands out its c_str().
thread_local std::string last_error;

int Code(const Status& s) { return static_cast<int>(s.code()); }

// Records `s` as this thread's error (if it is one) and returns its code.
int Report(const Status& s) {
  if (!s.ok()) last_error = s.message().empty() ? std::string(StatusCodeName(s.code())) : s.message();
  return Code(s);
}

int Missing(const char* what) { return Report(InvalidArgument(std::string(what) + " is NULL")); }

// Runs one entry point: clears the error, maps any exception to Internal.
template <typename Body>
int Guard(Body&& body) noexcept {
  try {
    last_error.clear();
    return body();
  } catch (const std::exception& e) {
    return Report(Internal(std::string("unexpected exception: ") + e.what()));
  } catch (...) {
    return Report(Internal("unexpected non-standard exception"));
  }
}

BlockKey ToKey(kvtier_key k) { return BlockKey{k.hi, k.lo}; }
kvtier_key ToC(const BlockKey& k) { return kvtier_key{k.hi, k.lo}; }
kvtier_preload_plan ToC(const PreloadPlan& p) {
  return kvtier_preload_plan{p.layers_to_preload, p.buffer_bytes, p.read_bytes_per_s, p.read_us_per_layer,
                             p.stall_us,          p.total_us,     p.recompute_instead ? 1 : 0};
}

std::vector<BlockKey> ToKeys(const kvtier_key* keys, size_t n) {
  std::vector<BlockKey> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) out.push_back(ToKey(keys[i]));
  return out;
}

std::string Str(const char* s) { return s == nullptr ? std::string() : std::string(s); }

NamespaceDescriptor ToDescriptor(const kvtier_namespace& c) {
  NamespaceDescriptor d;
  d.model_id = Str(c.model_id);
  d.model_revision = Str(c.model_revision);
  d.adapter_id = Str(c.adapter_id);
  d.adapter_revision = Str(c.adapter_revision);
  d.kv_dtype = Str(c.kv_dtype);
  d.block_tokens = c.block_tokens;
  d.layer_count = c.layer_count;
  d.kv_layout = Str(c.kv_layout);
  d.bytes_per_token_per_layer = c.bytes_per_token_per_layer;
  d.tp_rank = c.tp_rank;
  d.tp_size = c.tp_size;
  // Appended in key v2: zero / NULL read as the defaults (kvtier_c.h).
  d.pp_rank = c.pp_rank;
  d.pp_size = c.pp_size == 0 ? 1 : c.pp_size;
  d.kv_format_version = c.kv_format_version == 0 ? 1 : c.kv_format_version;
  d.object_kind = c.object_kind == nullptr ? std::string("kv") : std::string(c.object_kind);
  return d;
}

// InvalidArgument unless `ns` was registered by this client. Checked here
// so that batch calls can tell a bad call from per-key failures.
Status CheckNamespace(const kvtier_client& c, uint32_t ns) {
  const size_t registered = c.client->namespaces().size();
  if (ns < registered) return Status::Ok();
  return InvalidArgument("namespace " + std::to_string(ns) + " out of range (" +
                         std::to_string(registered) + " registered)");
}

// Writes per-key codes; the thread's message becomes the first failure's.
template <typename Outcome, typename StatusOf>
void ReportEach(const std::vector<Outcome>& outcomes, int* statuses, StatusOf status_of) {
  bool reported = false;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    const Status& s = status_of(outcomes[i]);
    statuses[i] = Code(s);
    if (!s.ok() && !reported) {
      last_error = "key " + std::to_string(i) + ": " + s.ToString();
      reported = true;
    }
  }
}

}  // namespace
}  // namespace kvtier

using kvtier::Guard;
using kvtier::Missing;
using kvtier::Report;

namespace kvtier {
namespace {

// kvtier_begin_load and kvtier_begin_load_device once their options are built.
int BeginLoad(kvtier_client* client, uint32_t ns, const kvtier_key* keys, size_t n, LoadOptions options,
              kvtier_layer_load** out, uint32_t* layers, size_t* layer_bytes, int* statuses) {
  auto begun = client->client->BeginLoad(ns, ToKeys(keys, n), std::move(options));
  if (!begun.ok()) return Report(begun.status());
  auto handle = std::make_unique<kvtier_layer_load>(kvtier_layer_load{std::move(*begun)});
  if (statuses != nullptr) {
    std::vector<kvtier::Status> outcomes;
    for (size_t i = 0; i < n; ++i) outcomes.push_back(handle->load.status(i));
    kvtier::ReportEach(outcomes, statuses, [](const kvtier::Status& s) -> const kvtier::Status& { return s; });
  }
  if (layers != nullptr) *layers = handle->load.layer_count();
  if (layer_bytes != nullptr) *layer_bytes = handle->load.layer_bytes();
  *out = handle.release();
  return KVTIER_OK;
}

}  // namespace
}  // namespace kvtier

extern "C" {

const char* kvtier_last_error(void) { return kvtier::last_error.c_str(); }

const char* kvtier_status_name(int code) {
  // StatusCodeName returns string literals, so data() is NUL-terminated.
  return kvtier::StatusCodeName(static_cast<kvtier::StatusCode>(code)).data();
}

int kvtier_namespace_fingerprint(const kvtier_namespace* ns, kvtier_key* out) {
  return Guard([&] {
    if (ns == nullptr) return Missing("ns");
    if (out == nullptr) return Missing("out");
    kvtier::NamespaceDescriptor d = kvtier::ToDescriptor(*ns);
    if (kvtier::Status s = d.Validate(); !s.ok()) return Report(s);
    *out = kvtier::ToC(kvtier::FingerprintNamespace(d));
    return KVTIER_OK;
  });
}

int kvtier_chain_keys(const kvtier_namespace* ns, const uint32_t* tokens, size_t n_tokens,
                      kvtier_key* out, size_t out_capacity, size_t* out_count) {
  return kvtier_chain_keys_salted(ns, nullptr, 0, tokens, n_tokens, out, out_capacity, out_count);
}

int kvtier_chain_keys_salted(const kvtier_namespace* ns, const char* cache_salt, size_t salt_len,
                             const uint32_t* tokens, size_t n_tokens, kvtier_key* out,
                             size_t out_capacity, size_t* out_count) {
  return Guard([&] {
    if (ns == nullptr) return Missing("ns");
    if (out_count == nullptr) return Missing("out_count");
    if (tokens == nullptr && n_tokens > 0) return Missing("tokens");
    if (cache_salt == nullptr && salt_len > 0) return Missing("cache_salt");
    auto hasher = kvtier::ChainHasher::Create(kvtier::ToDescriptor(*ns));
    if (!hasher.ok()) return Report(hasher.status());
    kvtier::ChainExtras extras;
    if (salt_len > 0) extras.cache_salt.assign(cache_salt, salt_len);
    if (kvtier::Status s = extras.Validate(); !s.ok()) return Report(s);
    const size_t needed = n_tokens / hasher->block_tokens();
    *out_count = needed;
    if (needed > out_capacity) {
      return Report(kvtier::InvalidArgument("out_capacity " + std::to_string(out_capacity) +
                                            " < " + std::to_string(needed) + " keys"));
    }
    if (out == nullptr && needed > 0) return Missing("out");
    auto keys = hasher->Keys(std::span<const uint32_t>(tokens, n_tokens), extras);
    if (!keys.ok()) return Report(keys.status());
    for (size_t i = 0; i < keys->size(); ++i) out[i] = kvtier::ToC((*keys)[i]);
    return KVTIER_OK;
  });
}

int kvtier_key_to_hex(kvtier_key key, char out[33]) {
  return Guard([&] {
    if (out == nullptr) return Missing("out");
    const std::string hex = kvtier::ToKey(key).ToHex();
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

int kvtier_connect(const char* socket_path, const kvtier_namespace* namespaces,
                   size_t n_namespaces, kvtier_client** out) {
  return kvtier_connect_with_options(socket_path, namespaces, n_namespaces, nullptr, out);
}

int kvtier_connect_with_options(const char* socket_path, const kvtier_namespace* namespaces,
                                size_t n_namespaces, const kvtier_client_options* c_options,
                                kvtier_client** out) {
  return Guard([&] {
    if (out == nullptr) return Missing("out");
    *out = nullptr;
    if (namespaces == nullptr && n_namespaces > 0) return Missing("namespaces");
    kvtier::ClientOptions options;
    if (c_options != nullptr) {
      // Fields past the caller's `size` (an older header) keep their defaults.
      constexpr size_t kFirstVersion = offsetof(kvtier_client_options, verify_checksums) + sizeof(int);
      if (c_options->size < kFirstVersion) {
        return Report(kvtier::InvalidArgument(
            "kvtier_client_options.size is " + std::to_string(c_options->size) +
            ": initialise the options with kvtier_client_options_init"));
      }
      options.verify_checksums = c_options->verify_checksums != 0;
    }
    if (socket_path != nullptr) options.socket_path = socket_path;
    options.client_name = "kvtier-c-client";
    for (size_t i = 0; i < n_namespaces; ++i) {
      options.namespaces.push_back(kvtier::ToDescriptor(namespaces[i]));
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

int kvtier_lookup(kvtier_client* client, uint32_t ns, const kvtier_key* keys, size_t n,
                  size_t* prefix_blocks, uint8_t* tiers) {
  return Guard([&] {
    if (client == nullptr) return Missing("client");
    if (prefix_blocks == nullptr) return Missing("prefix_blocks");
    if (keys == nullptr && n > 0) return Missing("keys");
    auto r = client->client->Lookup(ns, kvtier::ToKeys(keys, n));
    if (!r.ok()) return Report(r.status());
    *prefix_blocks = r->prefix_blocks;
    for (size_t i = 0; tiers != nullptr && i < n; ++i) {
      tiers[i] = i < r->tiers.size() && i < r->prefix_blocks ? static_cast<uint8_t>(r->tiers[i])
                                                             : KVTIER_TIER_NONE;
    }
    return KVTIER_OK;
  });
}

int kvtier_put(kvtier_client* client, uint32_t ns, kvtier_key key, const void* data, size_t len) {
  return Guard([&] {
    if (client == nullptr) return Missing("client");
    if (data == nullptr && len > 0) return Missing("data");
    std::span<const std::byte> bytes(static_cast<const std::byte*>(data), len);
    return Report(client->client->Put(ns, kvtier::ToKey(key), bytes));
  });
}

namespace {

// kvtier_put_batch and kvtier_put_chain: the batch, with `links`.
int PutBatch(kvtier_client* client, uint32_t ns, const kvtier_key* keys, const void* const* data,
             const size_t* lens, size_t n, int* statuses, const kvtier::ChainLinks& links) {
  if (client == nullptr) return Missing("client");
  if (n > 0 && (keys == nullptr || data == nullptr || lens == nullptr || statuses == nullptr)) {
    return Missing("keys, data, lens or statuses");
  }
  if (kvtier::Status s = kvtier::CheckNamespace(*client, ns); !s.ok()) return Report(s);
  std::vector<std::span<const std::byte>> spans;
  for (size_t i = 0; i < n; ++i) spans.emplace_back(static_cast<const std::byte*>(data[i]), lens[i]);
  auto outcomes = client->client->PutBatch(ns, kvtier::ToKeys(keys, n), spans, links);
  kvtier::ReportEach(outcomes, statuses, [](const kvtier::Status& s) -> const kvtier::Status& { return s; });
  return KVTIER_OK;
}

}  // namespace

int kvtier_put_batch(kvtier_client* client, uint32_t ns, const kvtier_key* keys,
                     const void* const* data, const size_t* lens, size_t n, int* statuses) {
  return Guard([&] { return PutBatch(client, ns, keys, data, lens, n, statuses, {}); });
}

int kvtier_put_chain(kvtier_client* client, uint32_t ns, const kvtier_key* keys,
                     const void* const* data, const size_t* lens, size_t n, const kvtier_key* parent,
                     int* statuses) {
  return Guard([&] {
    kvtier::ChainLinks links{true, std::nullopt};
    if (parent != nullptr) links.parent = kvtier::ToKey(*parent);
    return PutBatch(client, ns, keys, data, lens, n, statuses, links);
  });
}

int kvtier_get(kvtier_client* client, uint32_t ns, kvtier_key key, void* dst, size_t capacity,
               size_t* len) {
  return Guard([&] {
    if (client == nullptr) return Missing("client");
    if (len == nullptr) return Missing("len");
    if (dst == nullptr && capacity > 0) return Missing("dst");
    *len = 0;
    std::span<std::byte> bytes(static_cast<std::byte*>(dst), capacity);
    auto r = client->client->Get(ns, kvtier::ToKey(key), bytes);
    if (!r.ok()) return Report(r.status());
    *len = *r;
    return KVTIER_OK;
  });
}

int kvtier_get_batch(kvtier_client* client, uint32_t ns, const kvtier_key* keys,
                     void* const* dst, const size_t* capacities, size_t n, size_t* lens,
                     int* statuses) {
  return Guard([&] {
    if (client == nullptr) return Missing("client");
    if (n > 0 && (keys == nullptr || dst == nullptr || capacities == nullptr || lens == nullptr ||
                  statuses == nullptr)) {
      return Missing("keys, dst, capacities, lens or statuses");
    }
    if (kvtier::Status s = kvtier::CheckNamespace(*client, ns); !s.ok()) return Report(s);
    std::vector<std::span<std::byte>> spans;
    for (size_t i = 0; i < n; ++i) spans.emplace_back(static_cast<std::byte*>(dst[i]), capacities[i]);
    auto outcomes = client->client->GetBatch(ns, kvtier::ToKeys(keys, n), spans);
    for (size_t i = 0; i < outcomes.size(); ++i) lens[i] = outcomes[i].ok() ? *outcomes[i] : 0;
    kvtier::ReportEach(outcomes, statuses,
                       [](const kvtier::Result<size_t>& r) -> const kvtier::Status& { return r.status(); });
    return KVTIER_OK;
  });
}

int kvtier_pin(kvtier_client* client, uint32_t ns, kvtier_key key, kvtier_view** out,
               const void** data, size_t* len) {
  return Guard([&] {
    if (out == nullptr) return Missing("out");
    *out = nullptr;
    if (client == nullptr) return Missing("client");
    if (data == nullptr || len == nullptr) return Missing("data or len");
    const kvtier::BlockKey k = kvtier::ToKey(key);
    auto pinned = client->client->Pin(ns, std::span<const kvtier::BlockKey>(&k, 1));
    if (pinned.empty()) return Report(kvtier::Internal("Pin returned no result"));
    if (!pinned[0].ok()) return Report(pinned[0].status());
    auto view = std::make_unique<kvtier_view>(kvtier_view{std::move(*pinned[0])});
    *data = view->view.data().data();
    *len = view->view.data().size();
    *out = view.release();
    return KVTIER_OK;
  });
}

int kvtier_view_release(kvtier_view* view) {
  return Guard([&] {
    std::unique_ptr<kvtier_view> owned(view);
    return owned == nullptr ? KVTIER_OK : Report(owned->view.Release());
  });
}

int kvtier_erase(kvtier_client* client, uint32_t ns, const kvtier_key* keys, size_t n,
                 size_t* erased) {
  return Guard([&] {
    if (client == nullptr) return Missing("client");
    if (keys == nullptr && n > 0) return Missing("keys");
    auto r = client->client->Erase(ns, kvtier::ToKeys(keys, n));
    if (!r.ok()) return Report(r.status());
    if (erased != nullptr) *erased = *r;
    return KVTIER_OK;
  });
}

int kvtier_enqueue(kvtier_client* client, uint64_t request, uint32_t ns, const kvtier_key* keys, size_t n,
                   uint64_t start_in_us, uint64_t session) {
  return Guard([&] {
    if (client == nullptr) return Missing("client");
    if (keys == nullptr && n > 0) return Missing("keys");
    const auto start = std::chrono::steady_clock::now() + std::chrono::microseconds(start_in_us);
    return Report(client->client->Enqueue(request, ns, kvtier::ToKeys(keys, n), start, session));
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

int kvtier_reserve(kvtier_client* client, uint32_t ns, const kvtier_key* keys, const size_t* sizes, size_t n,
                   kvtier_reservation** out, void** data, int* statuses) {
  return Guard([&] {
    if (out == nullptr) return Missing("out");
    *out = nullptr;
    if (client == nullptr) return Missing("client");
    if (n > 0 && (keys == nullptr || sizes == nullptr || data == nullptr || statuses == nullptr)) {
      return Missing("keys, sizes, data or statuses");
    }
    const std::vector<uint64_t> lengths(sizes, sizes + n);
    auto reserved = client->client->Reserve(ns, kvtier::ToKeys(keys, n), lengths);
    if (!reserved.ok()) return Report(reserved.status());
    auto handle = std::make_unique<kvtier_reservation>(kvtier_reservation{std::move(*reserved), false});
    const auto& blocks = handle->reservation.blocks();
    for (size_t i = 0; i < n; ++i) data[i] = blocks[i].status.ok() ? blocks[i].data.data() : nullptr;
    kvtier::ReportEach(blocks, statuses,
                       [](const kvtier::WritableBlock& b) -> const kvtier::Status& { return b.status; });
    *out = handle.release();
    return KVTIER_OK;
  });
}

int kvtier_commit(kvtier_reservation* reservation, int* statuses) {
  return Guard([&] {
    if (reservation == nullptr) return Missing("reservation");
    if (statuses == nullptr && !reservation->reservation.blocks().empty()) return Missing("statuses");
    if (reservation->committed) return Report(kvtier::FailedPrecondition("the reservation was committed before"));
    reservation->committed = true;
    std::vector<kvtier::Status> outcomes = reservation->reservation.Commit();
    kvtier::ReportEach(outcomes, statuses, [](const kvtier::Status& s) -> const kvtier::Status& { return s; });
    return KVTIER_OK;
  });
}

void kvtier_reservation_free(kvtier_reservation* reservation) {
  Guard([&] {
    delete reservation;  // a reservation not committed is aborted by its destructor
    return KVTIER_OK;
  });
}

int kvtier_begin_save(kvtier_client* client, uint32_t ns, const kvtier_key* keys, size_t n,
                      const kvtier_key* parent, kvtier_layer_save** out, size_t* layer_bytes, int* statuses) {
  return Guard([&] {
    if (out == nullptr) return Missing("out");
    *out = nullptr;
    if (client == nullptr) return Missing("client");
    if (layer_bytes == nullptr) return Missing("layer_bytes");
    if (n > 0 && (keys == nullptr || statuses == nullptr)) return Missing("keys or statuses");
    kvtier::ChainLinks links;
    links.chain = true;
    if (parent != nullptr) links.parent = kvtier::ToKey(*parent);
    auto begun = client->client->BeginSave(ns, kvtier::ToKeys(keys, n), links);
    if (!begun.ok()) return Report(begun.status());
    auto handle = std::make_unique<kvtier_layer_save>(kvtier_layer_save{std::move(*begun)});
    std::vector<kvtier::Status> outcomes;
    for (size_t i = 0; i < n; ++i) outcomes.push_back(handle->save.status(i));
    kvtier::ReportEach(outcomes, statuses, [](const kvtier::Status& s) -> const kvtier::Status& { return s; });
    *layer_bytes = handle->save.layer_bytes();
    *out = handle.release();
    return KVTIER_OK;
  });
}

int kvtier_save_layer(kvtier_layer_save* save, uint32_t layer, const void* const* src) {
  return Guard([&] {
    if (save == nullptr) return Missing("save");
    if (src == nullptr && save->save.size() > 0) return Missing("src");
    std::vector<std::span<const std::byte>> spans;
    for (size_t i = 0; i < save->save.size(); ++i) {
      const bool wanted = save->save.status(i).ok();
      if (wanted && src[i] == nullptr) return Missing("src entry of a block to save");
      spans.emplace_back(static_cast<const std::byte*>(src[i]), wanted ? save->save.layer_bytes() : 0);
    }
    return Report(save->save.SaveLayer(layer, spans));
  });
}

int kvtier_save_layer_span(kvtier_layer_save* save, size_t block, uint32_t layer, void** data) {
  return Guard([&] {
    if (data == nullptr) return Missing("data");
    *data = nullptr;
    if (save == nullptr) return Missing("save");
    std::span<std::byte> span = save->save.LayerSpan(block, layer);
    if (span.empty()) {
      return Report(kvtier::InvalidArgument("no writable layer " + std::to_string(layer) + " of block " +
                                            std::to_string(block) + " (out of range, not reserved, or finished)"));
    }
    *data = span.data();
    return KVTIER_OK;
  });
}

int kvtier_layer_written(kvtier_layer_save* save, uint32_t layer) {
  return Guard([&] { return save == nullptr ? Missing("save") : Report(save->save.LayerWritten(layer)); });
}

int kvtier_finish_save(kvtier_layer_save* save, int* statuses) {
  return Guard([&] {
    if (save == nullptr) return Missing("save");
    if (statuses == nullptr && save->save.size() > 0) return Missing("statuses");
    auto committed = save->save.FinishSave();
    if (!committed.ok()) return Report(committed.status());
    kvtier::ReportEach(*committed, statuses, [](const kvtier::Status& s) -> const kvtier::Status& { return s; });
    return KVTIER_OK;
  });
}

void kvtier_save_free(kvtier_layer_save* save) {
  Guard([&] {
    delete save;  // an unfinished save's reservation is aborted by its destructor
    return KVTIER_OK;
  });
}

int kvtier_begin_load(kvtier_client* client, uint32_t ns, const kvtier_key* keys, size_t n, void* const* dst,
                      size_t dst_capacity, double compute_us_per_layer, int wait_for_depth,
                      kvtier_layer_load** out, uint32_t* layers, size_t* layer_bytes, int* statuses) {
  return Guard([&] {
    if (out == nullptr) return Missing("out");
    *out = nullptr;
    if (client == nullptr) return Missing("client");
    if (n > 0 && keys == nullptr) return Missing("keys");
    kvtier::LoadOptions options;
    options.compute_us_per_layer = compute_us_per_layer;
    options.wait_for_depth = wait_for_depth != 0;
    if (dst != nullptr) {
      for (size_t i = 0; i < n; ++i) {
        if (dst[i] == nullptr) return Missing("dst entry");
        options.dst.emplace_back(static_cast<std::byte*>(dst[i]), dst_capacity);
      }
    }
    return kvtier::BeginLoad(client, ns, keys, n, std::move(options), out, layers, layer_bytes, statuses);
  });
}

int kvtier_begin_load_device(kvtier_client* client, uint32_t ns, const kvtier_key* keys, size_t n,
                             void* const* device_dst, int device_ordinal, void* cuda_stream,
                             double compute_us_per_layer, int wait_for_depth, kvtier_layer_load** out,
                             uint32_t* layers, size_t* layer_bytes, int* statuses) {
  return Guard([&] {
    if (out == nullptr) return Missing("out");
    *out = nullptr;
    if (client == nullptr) return Missing("client");
    if (n > 0 && (keys == nullptr || device_dst == nullptr)) return Missing("keys or device_dst");
    kvtier::LoadOptions options;
    options.compute_us_per_layer = compute_us_per_layer;
    options.wait_for_depth = wait_for_depth != 0;
    options.device_dst.assign(device_dst, device_dst + n);
    options.device_ordinal = device_ordinal;
    options.cuda_stream = cuda_stream;
    return kvtier::BeginLoad(client, ns, keys, n, std::move(options), out, layers, layer_bytes, statuses);
  });
}

int kvtier_wait_layer(kvtier_layer_load* load, uint32_t layer) {
  return Guard([&] { return load == nullptr ? Missing("load") : Report(load->load.WaitLayer(layer)); });
}

uint32_t kvtier_layers_ready(const kvtier_layer_load* load) {
  return load == nullptr ? 0 : load->load.layers_ready();
}

int kvtier_load_block_status(const kvtier_layer_load* load, size_t block) {
  return Guard([&] { return load == nullptr ? Missing("load") : Report(load->load.status(block)); });
}

size_t kvtier_load_usable_prefix(const kvtier_layer_load* load) {
  return load == nullptr ? 0 : load->load.usable_prefix();
}

int kvtier_load_layer_span(const kvtier_layer_load* load, size_t block, uint32_t layer, const void** data) {
  return Guard([&] {
    if (data == nullptr) return Missing("data");
    *data = nullptr;
    if (load == nullptr) return Missing("load");
    // InvalidArgument, NotFound (failed, or not in place yet),
    // FailedPrecondition (in device memory), ProtocolError.
    auto span = load->load.TryLayerSpan(block, layer);
    if (!span.ok()) return Report(span.status());
    *data = span->data();
    return KVTIER_OK;
  });
}

int kvtier_load_plan(const kvtier_layer_load* load, kvtier_preload_plan* out) {
  return Guard([&] {
    if (load == nullptr) return Missing("load");
    if (out == nullptr) return Missing("out");
    if (!load->load.plan()) return Report(kvtier::NotFound("the load was begun without a compute time"));
    *out = kvtier::ToC(*load->load.plan());
    return KVTIER_OK;
  });
}

int kvtier_end_load(kvtier_layer_load* load) {
  return Guard([&] {
    if (load == nullptr) return KVTIER_OK;
    const int code = Report(load->load.End());
    delete load;
    return code;
  });
}

int kvtier_plan_preload(kvtier_client* client, uint8_t source_tier, uint64_t bytes_per_layer,
                        double compute_us_per_layer, uint32_t layers, double recompute_us_per_layer,
                        kvtier_preload_plan* out) {
  return Guard([&] {
    if (client == nullptr) return Missing("client");
    if (out == nullptr) return Missing("out");
    auto plan = client->client->PlanPreload(static_cast<kvtier::Tier>(source_tier), bytes_per_layer,
                                            compute_us_per_layer, layers, recompute_us_per_layer);
    if (!plan.ok()) return Report(plan.status());
    *out = kvtier::ToC(*plan);
    return KVTIER_OK;
  });
}

}  // extern "C"
