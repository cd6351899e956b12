// The C ABI's blocks (kvtier_c.h): puts, gets, pins and erases, and
// reservations (reserve, write in place, commit).
#include <memory>
#include <optional>
#include <span>

#include "client_lib/c_api_support.h"

using kvtier::c_abi::Guard;
using kvtier::c_abi::Missing;
using kvtier::c_abi::Report;

extern "C" {

int kvtier_put(kvtier_client* client, uint32_t ns, kvtier_key key, const void* data, size_t len) {
  return Guard([&] {
    if (client == nullptr) return Missing("client");
    if (data == nullptr && len > 0) return Missing("data");
    std::span<const std::byte> bytes(static_cast<const std::byte*>(data), len);
    return Report(client->client->Put(ns, kvtier::c_abi::ToKey(key), bytes));
  });
}

namespace {

// kvtier_put_batch and kvtier_put_chain: the batch, with `links`.
int PutBatch(kvtier_client* client, uint32_t ns, const kvtier_key* keys, const void* const* data, const size_t* lens,
             size_t n, int* statuses, const kvtier::ChainLinks& links) {
  if (client == nullptr) return Missing("client");
  if (n > 0 && (keys == nullptr || data == nullptr || lens == nullptr || statuses == nullptr)) {
    return Missing("keys, data, lens or statuses");
  }
  if (kvtier::Status s = kvtier::c_abi::CheckNamespace(*client, ns); !s.ok()) return Report(s);
  std::vector<std::span<const std::byte>> spans;
  for (size_t i = 0; i < n; ++i) spans.emplace_back(static_cast<const std::byte*>(data[i]), lens[i]);
  auto outcomes = client->client->PutBatch(ns, kvtier::c_abi::ToKeys(keys, n), spans, links);
  kvtier::c_abi::ReportEach(outcomes, statuses, [](const kvtier::Status& s) -> const kvtier::Status& { return s; });
  return KVTIER_OK;
}

}  // namespace

int kvtier_put_batch(kvtier_client* client, uint32_t ns, const kvtier_key* keys, const void* const* data,
                     const size_t* lens, size_t n, int* statuses) {
  return Guard([&] { return PutBatch(client, ns, keys, data, lens, n, statuses, {}); });
}

int kvtier_put_chain(kvtier_client* client, uint32_t ns, const kvtier_key* keys, const void* const* data,
                     const size_t* lens, size_t n, const kvtier_key* parent, int* statuses) {
  return Guard([&] {
    kvtier::ChainLinks links{true, std::nullopt};
    if (parent != nullptr) links.parent = kvtier::c_abi::ToKey(*parent);
    return PutBatch(client, ns, keys, data, lens, n, statuses, links);
  });
}

int kvtier_get(kvtier_client* client, uint32_t ns, kvtier_key key, void* dst, size_t capacity, size_t* len) {
  return Guard([&] {
    if (client == nullptr) return Missing("client");
    if (len == nullptr) return Missing("len");
    if (dst == nullptr && capacity > 0) return Missing("dst");
    *len = 0;
    std::span<std::byte> bytes(static_cast<std::byte*>(dst), capacity);
    auto r = client->client->Get(ns, kvtier::c_abi::ToKey(key), bytes);
    if (!r.ok()) return Report(r.status());
    *len = *r;
    return KVTIER_OK;
  });
}

int kvtier_get_batch(kvtier_client* client, uint32_t ns, const kvtier_key* keys, void* const* dst,
                     const size_t* capacities, size_t n, size_t* lens, int* statuses) {
  return Guard([&] {
    if (client == nullptr) return Missing("client");
    if (n > 0 &&
        (keys == nullptr || dst == nullptr || capacities == nullptr || lens == nullptr || statuses == nullptr)) {
      return Missing("keys, dst, capacities, lens or statuses");
    }
    if (kvtier::Status s = kvtier::c_abi::CheckNamespace(*client, ns); !s.ok()) return Report(s);
    std::vector<std::span<std::byte>> spans;
    for (size_t i = 0; i < n; ++i) spans.emplace_back(static_cast<std::byte*>(dst[i]), capacities[i]);
    auto outcomes = client->client->GetBatch(ns, kvtier::c_abi::ToKeys(keys, n), spans);
    for (size_t i = 0; i < outcomes.size(); ++i) lens[i] = outcomes[i].ok() ? *outcomes[i] : 0;
    kvtier::c_abi::ReportEach(outcomes, statuses,
                              [](const kvtier::Result<size_t>& r) -> const kvtier::Status& { return r.status(); });
    return KVTIER_OK;
  });
}

int kvtier_pin(kvtier_client* client, uint32_t ns, kvtier_key key, kvtier_view** out, const void** data, size_t* len) {
  return Guard([&] {
    if (out == nullptr) return Missing("out");
    *out = nullptr;
    if (client == nullptr) return Missing("client");
    if (data == nullptr || len == nullptr) return Missing("data or len");
    const kvtier::BlockKey k = kvtier::c_abi::ToKey(key);
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

int kvtier_erase(kvtier_client* client, uint32_t ns, const kvtier_key* keys, size_t n, size_t* erased) {
  return Guard([&] {
    if (client == nullptr) return Missing("client");
    if (keys == nullptr && n > 0) return Missing("keys");
    auto r = client->client->Erase(ns, kvtier::c_abi::ToKeys(keys, n));
    if (!r.ok()) return Report(r.status());
    if (erased != nullptr) *erased = *r;
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
    auto reserved = client->client->Reserve(ns, kvtier::c_abi::ToKeys(keys, n), lengths);
    if (!reserved.ok()) return Report(reserved.status());
    auto handle = std::make_unique<kvtier_reservation>(kvtier_reservation{std::move(*reserved), false});
    const auto& blocks = handle->reservation.blocks();
    for (size_t i = 0; i < n; ++i) data[i] = blocks[i].status.ok() ? blocks[i].data.data() : nullptr;
    kvtier::c_abi::ReportEach(blocks, statuses,
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
    kvtier::c_abi::ReportEach(outcomes, statuses, [](const kvtier::Status& s) -> const kvtier::Status& { return s; });
    return KVTIER_OK;
  });
}

void kvtier_reservation_free(kvtier_reservation* reservation) {
  Guard([&] {
    delete reservation;  // a reservation not committed is aborted by its destructor
    return KVTIER_OK;
  });
}

}  // extern "C"
