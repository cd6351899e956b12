// Client: the public API over internal::Connection. Every operation is one
// pipelined round trip (Lookup, Pin, Erase, Stats) or two (Reserve + Commit
// for puts; Pin + a Release that is not waited for, for copying gets),
// except what the block directory settles locally: lookups of host blocks
// and copying gets of host blocks cost no round trip at all (only the keys
// it cannot settle go to the daemon).
// Copies run on the thread that reads the response: the caller itself for
// synchronous calls, a reading thread for the *Async variants (directory
// copies run on the calling thread).
// Every call takes its connection from the Reconnector first
// (client_lib/reconnect.h), which replaces one the daemon closed.
#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <future>

#include "client_lib/connection.h"
#include "client_lib/directory_path.h"
#include "client_lib/put_path.h"
#include "client_lib/reconnect.h"
#include "client_lib/release.h"
#include "client_lib/verify.h"
#include "common/checksum.h"
#include "proto/wire.h"

namespace kvtier {

using internal::BuildCommit;
using internal::Connection;
using internal::MergeCommit;
using internal::ToWritable;

namespace {

Status CheckNamespace(const Connection& conn, NamespaceId ns) {
  if (ns >= conn.namespaces().size()) {
    return InvalidArgument("namespace " + std::to_string(ns) + " was not registered at Connect (" +
                           std::to_string(conn.namespaces().size()) + " registered)");
  }
  return Status::Ok();
}

// Checks `copy`, the layers a layer-range grant `b` handed out: each
// against its own checksum when the grant has them, else within the whole
// block (a host block whose writer sent no layer checksums).
Status VerifyLayerGrant(const Connection& conn, const v1::PinnedBlock& b, std::span<const std::byte> copy,
                        uint32_t first_layer, const BlockKey& key) {
  if (b.layer_checksums_size() > 0 || b.block_length() == 0) {
    return internal::VerifyLayers(copy, {b.layer_checksums().data(), static_cast<size_t>(b.layer_checksums_size())},
                                  first_layer, key);
  }
  auto block = conn.Slot(b.block_offset(), b.block_length());
  if (!block.ok() || b.offset() < b.block_offset()) {
    return ProtocolError("kvtierd granted layers of block " + key.ToHex() + " outside the block it names");
  }
  return internal::VerifyRangeInBlock(*block, b.offset() - b.block_offset(), copy, b.checksum(), key);
}

// Copies pinned blocks into `dst`, then releases them, and hands the
// outcome to `deliver`. Runs wherever the Pin response is handled. With
// verify_checksums each copy is checked against the grant's checksum
// (whole blocks) or layer checksums (`first_layer` on, for layer ranges);
// a block that does not match is Corruption, reported (before its
// release) and `deliver` runs once kvtierd answered the report (read by
// `reader`), else at once.
void CopyPinned(Connection& conn, const Result<v1::Response>& pinned, NamespaceId ns, std::span<const BlockKey> keys,
                const std::vector<std::span<std::byte>>& dst, bool whole_blocks, uint32_t first_layer,
                Connection::Reader reader, std::function<void(std::vector<Result<size_t>>)> deliver) {
  std::vector<Result<size_t>> out;
  if (!pinned.ok()) {
    out.assign(dst.size(), pinned.status());
    return deliver(std::move(out));
  }
  std::vector<BlockKey> corrupt;
  const auto& blocks = pinned->pin().blocks();
  std::vector<uint64_t> leases;
  for (size_t i = 0; i < dst.size(); ++i) {
    if (static_cast<int>(i) >= blocks.size()) {
      out.emplace_back(ProtocolError("Pin response has fewer blocks than keys"));
      continue;
    }
    const auto& b = blocks[static_cast<int>(i)];
    Status s = wire::FromProto(b.status());
    if (!s.ok()) {
      out.emplace_back(s);
      continue;
    }
    leases.push_back(b.lease());
    auto slot = conn.Slot(b.offset(), b.length());
    if (!slot.ok()) {
      out.emplace_back(slot.status());
      continue;
    }
    if (dst[i].size() < slot->size()) {
      out.emplace_back(InvalidArgument("destination of " + std::to_string(dst[i].size()) +
                                       " bytes is smaller than the " + std::to_string(slot->size()) +
                                       " bytes asked for"));
      continue;
    }
    std::memcpy(dst[i].data(), slot->data(), slot->size());
    if (conn.verify_checksums()) {
      // The copy is what is checked: the bytes the caller gets.
      const std::span<const std::byte> copy = dst[i].first(slot->size());
      Status verified = whole_blocks ? internal::VerifyBlock(copy, b.checksum(), keys[i])
                                     : VerifyLayerGrant(conn, b, copy, first_layer, keys[i]);
      if (verified.code() == StatusCode::kCorruption) corrupt.push_back(keys[i]);
      if (!verified.ok()) {
        out.emplace_back(verified);
        continue;
      }
    }
    out.emplace_back(slot->size());
  }
  internal::ReportCorrupt(conn, ns, std::move(corrupt), reader,
                          [deliver = std::move(deliver), out = std::move(out)]() mutable { deliver(std::move(out)); });
  conn.ReleaseLater(leases);  // after the report: the daemon checks the bytes this pin still holds
}

// The three data operations, started without waiting. Callbacks hold the
// Connection by reference: it outlives them, since ~Connection (via Close)
// runs every pending callback before the Connection goes.
std::future<Result<LookupResult>> StartLookup(Connection& conn, NamespaceId ns, std::span<const BlockKey> keys,
                                              Connection::Reader reader) {
  auto promise = std::make_shared<std::promise<Result<LookupResult>>>();
  auto future = promise->get_future();
  if (Status s = CheckNamespace(conn, ns); !s.ok()) {
    promise->set_value(s);
    return future;
  }
  // Host hits from the directory first; the daemon answers from the first
  // key the directory cannot settle (it may be cached in a lower tier).
  internal::LocalLookup local;
  if (const DirectoryReader* dir = conn.directory())
    local = internal::LookupInDirectory(*dir, conn.namespaces()[ns], keys);
  if (local.complete) {
    conn.NoteLocalLookups(1, keys.size(), local.hits);
    promise->set_value(LookupResult{local.hits, std::vector<Tier>(local.hits, Tier::kHost)});
    return future;
  }
  // The daemon counts this lookup; the keys the directory settled count here.
  conn.NoteLocalLookups(0, local.hits, local.hits);
  const size_t hits = local.hits;
  conn.Call(
      wire::MakeLookup(ns, keys.subspan(hits)),
      [promise, hits](Result<v1::Response> r) {
        if (!r.ok()) return promise->set_value(r.status());
        LookupResult out;
        out.prefix_blocks = hits + r->lookup().prefix_blocks();
        out.tiers.assign(hits, Tier::kHost);
        for (uint32_t t : r->lookup().tiers()) out.tiers.push_back(static_cast<Tier>(t));
        promise->set_value(std::move(out));
      },
      reader);
  return future;
}

// Reserve -> copy into the arena (on the reading thread) -> Commit.
std::future<std::vector<Status>> StartPut(Connection& conn, NamespaceId ns, std::vector<BlockKey> keys,
                                          std::vector<std::span<const std::byte>> data, const ChainLinks& links,
                                          Connection::Reader reader) {
  auto promise = std::make_shared<std::promise<std::vector<Status>>>();
  auto future = promise->get_future();
  Status s = CheckNamespace(conn, ns);
  if (s.ok() && keys.size() != data.size()) s = InvalidArgument("PutBatch: keys and data differ in length");
  if (!s.ok()) {
    promise->set_value(std::vector<Status>(keys.size(), s));
    return future;
  }
  std::vector<uint64_t> sizes;
  for (const auto& d : data) sizes.push_back(d.size());
  auto shared_keys = std::make_shared<std::vector<BlockKey>>(std::move(keys));
  Connection* c = &conn;
  conn.Call(
      wire::MakeReserve(ns, *shared_keys, sizes, links.chain, links.parent),
      [c, ns, shared_keys, data = std::move(data), promise, reader](Result<v1::Response> r) {
        if (!r.ok()) return promise->set_value(std::vector<Status>(shared_keys->size(), r.status()));
        auto blocks = std::make_shared<std::vector<WritableBlock>>(ToWritable(*c, *shared_keys, *r));
        const auto [layer_count, block_bytes] = c->layout(ns);
        // A client that verifies also records each layer's checksum of the
        // whole blocks it puts (in the same pass, ~20% more hashing), so that
        // layer reads of them verify per layer; one that does not pays nothing.
        const bool layer_sums = c->verify_checksums() && layer_count > 1;
        for (size_t i = 0; i < blocks->size(); ++i) {
          // The checksum is computed as the bytes pass through the cache, and
          // spares the daemon a pass over the block at Commit.
          WritableBlock& b = (*blocks)[i];
          if (b.status.ok() && b.data.size() != data[i].size()) {
            // A daemon bug: never copy past the slot. The slot stays reserved
            // until the connection closes.
            b.status = ProtocolError("Reserve granted " + std::to_string(b.data.size()) + " bytes for a block of " +
                                     std::to_string(data[i].size()));
          }
          if (!b.status.ok()) continue;
          if (layer_sums && data[i].size() == block_bytes) {
            b.layer_checksums.resize(layer_count);
            b.checksum = CopyWithLayerChecksums(b.data, data[i], b.layer_checksums);
          } else {
            b.checksum = CopyWithChecksum(b.data, data[i]);
          }
        }
        v1::Request commit;
        if (!BuildCommit(ns, *blocks, commit, layer_count, block_bytes)) {
          // Nothing to publish: every outcome is already decided by Reserve.
          return promise->set_value(MergeCommit(*blocks, v1::Response(), true));
        }
        c->Call(
            std::move(commit),
            [blocks, promise](Result<v1::Response> committed) {
              promise->set_value(MergeCommit(*blocks, committed, true));
            },
            reader);
      },
      reader);
  return future;
}

// Pin -> copy out of the arena (on the reading thread) -> Release, not
// waited for; or a directory copy. `layers` (if set) picks [first, last).
std::future<std::vector<Result<size_t>>> StartGet(Connection& conn, NamespaceId ns, std::span<const BlockKey> keys,
                                                  std::vector<std::span<std::byte>> dst, Connection::Reader reader,
                                                  std::optional<std::pair<uint32_t, uint32_t>> layers = std::nullopt) {
  auto promise = std::make_shared<std::promise<std::vector<Result<size_t>>>>();
  auto future = promise->get_future();
  Status s = CheckNamespace(conn, ns);
  if (s.ok() && keys.size() != dst.size()) s = InvalidArgument("GetBatch: keys and dst differ in length");
  if (!s.ok()) {
    promise->set_value(std::vector<Result<size_t>>(keys.size(), s));
    return future;
  }
  // Copy what the directory settles; Pin the rest.
  std::vector<Result<size_t>> out(keys.size(), Result<size_t>(size_t{0}));  // every slot is overwritten
  std::vector<size_t> ask;                                                  // indices left to the daemon
  std::optional<internal::LayerPick> pick;
  if (layers) {
    const auto [layer_count, block_bytes] = conn.layout(ns);
    pick = internal::LayerPick{layers->first, layers->second, layer_count, block_bytes};
  }
  std::vector<BlockKey> corrupt;  // copied from the directory, not matching
  if (const DirectoryReader* dir = conn.directory()) {
    std::vector<BlockKey> used;
    for (size_t i = 0; i < keys.size(); ++i) {
      auto copied = internal::CopyFromDirectory(*dir, conn.arena(), conn.namespaces()[ns], keys[i], dst[i],
                                                conn.verify_checksums(), pick ? &*pick : nullptr);
      if (!copied) {
        ask.push_back(i);
        continue;
      }
      if (copied->ok()) used.push_back(keys[i]);
      if (copied->status().code() == StatusCode::kCorruption) corrupt.push_back(keys[i]);
      out[i] = std::move(*copied);
    }
    conn.NoteDirectoryUses(ns, used);
  } else {
    for (size_t i = 0; i < keys.size(); ++i) ask.push_back(i);
  }
  if (ask.empty()) {
    // The result waits for the report's answer: the blocks are gone by then.
    internal::ReportCorrupt(conn, ns, std::move(corrupt), reader,
                            [promise, out = std::move(out)]() mutable { promise->set_value(std::move(out)); });
    return future;
  }
  // Answered before the Pin below (one connection answers in order), so
  // the Pin's answer comes after the check.
  internal::ReportCorrupt(conn, ns, std::move(corrupt), Connection::Reader::kDetached, [] {});
  std::vector<BlockKey> ask_keys;
  std::vector<std::span<std::byte>> ask_dst;
  for (size_t i : ask) {
    ask_keys.push_back(keys[i]);
    ask_dst.push_back(dst[i]);
  }
  Connection* c = &conn;
  v1::Request pin =
      layers ? wire::MakePinLayers(ns, ask_keys, layers->first, layers->second) : wire::MakePin(ns, ask_keys);
  conn.Call(
      std::move(pin),
      [c, ns, ask = std::move(ask), ask_keys = std::move(ask_keys), ask_dst = std::move(ask_dst), out = std::move(out),
       promise, whole = !layers.has_value(), first = layers ? layers->first : 0,
       reader](Result<v1::Response> r) mutable {
        CopyPinned(*c, r, ns, ask_keys, ask_dst, whole, first, reader,
                   [ask = std::move(ask), out = std::move(out), promise](std::vector<Result<size_t>> pinned) mutable {
                     for (size_t j = 0; j < ask.size(); ++j) out[ask[j]] = std::move(pinned[j]);
                     promise->set_value(std::move(out));
                   });
      },
      reader);
  return future;
}

}  // namespace

Client::Client(std::unique_ptr<internal::Reconnector> link) : link_(std::move(link)) {}

std::shared_ptr<Connection> Client::Current() { return link_->Current(); }

// Only lets go of the connection: it closes when the last BlockView or
// Reservation sharing it is gone too (their pins and reservations must stay
// held on the daemon while they live), at once if there is none.
Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  auto conn = Connection::Open(options);
  if (!conn.ok()) return conn.status();
  return std::unique_ptr<Client>(new Client(std::make_unique<internal::Reconnector>(options, std::move(*conn))));
}

const std::vector<NamespaceFingerprint>& Client::namespaces() const { return link_->namespaces(); }

EventsEndpoints Client::events_endpoints() const { return link_->Peek()->events_endpoints(); }

std::span<std::byte> Client::arena() const { return link_->Peek()->arena(); }

uint64_t Client::reconnects() const { return link_->reconnects(); }

Result<LookupResult> Client::Lookup(NamespaceId ns, std::span<const BlockKey> keys) {
  std::shared_ptr<Connection> conn = Current();
  return conn->Await(StartLookup(*conn, ns, keys, Connection::Reader::kCaller));
}

std::future<Result<LookupResult>> Client::LookupAsync(NamespaceId ns, std::vector<BlockKey> keys) {
  std::shared_ptr<Connection> conn = Current();
  return StartLookup(*conn, ns, keys, Connection::Reader::kBackground);
}

Status Client::Put(NamespaceId ns, const BlockKey& key, std::span<const std::byte> data) {
  std::span<const std::byte> one[] = {data};
  return PutBatch(ns, std::span<const BlockKey>(&key, 1), one)[0];
}

std::vector<Status> Client::PutBatch(NamespaceId ns, std::span<const BlockKey> keys,
                                     std::span<const std::span<const std::byte>> data, const ChainLinks& links) {
  std::shared_ptr<Connection> conn = Current();
  return conn->Await(StartPut(*conn, ns, std::vector<BlockKey>(keys.begin(), keys.end()),
                              std::vector<std::span<const std::byte>>(data.begin(), data.end()), links,
                              Connection::Reader::kCaller));
}

std::future<std::vector<Status>> Client::PutBatchAsync(NamespaceId ns, std::vector<BlockKey> keys,
                                                       std::vector<std::span<const std::byte>> data, ChainLinks links) {
  std::shared_ptr<Connection> conn = Current();
  return StartPut(*conn, ns, std::move(keys), std::move(data), links, Connection::Reader::kBackground);
}

Result<Reservation> Client::Reserve(NamespaceId ns, std::span<const BlockKey> keys, std::span<const uint64_t> sizes,
                                    const ChainLinks& links) {
  std::shared_ptr<Connection> conn = Current();
  if (Status s = CheckNamespace(*conn, ns); !s.ok()) return s;
  if (keys.size() != sizes.size()) return InvalidArgument("Reserve: keys and sizes differ in length");
  auto r = conn->CallSync(wire::MakeReserve(ns, keys, sizes, links.chain, links.parent));
  if (!r.ok()) return r.status();
  Reservation reservation;
  reservation.conn_ = conn;
  reservation.ns_ = ns;
  reservation.blocks_ = ToWritable(*conn, keys, *r);
  return reservation;
}

Result<size_t> Client::Get(NamespaceId ns, const BlockKey& key, std::span<std::byte> dst) {
  std::span<std::byte> one[] = {dst};
  return std::move(GetBatch(ns, std::span<const BlockKey>(&key, 1), one)[0]);
}

std::vector<Result<size_t>> Client::GetBatch(NamespaceId ns, std::span<const BlockKey> keys,
                                             std::span<const std::span<std::byte>> dst) {
  std::shared_ptr<Connection> conn = Current();
  return conn->Await(StartGet(*conn, ns, keys, std::vector<std::span<std::byte>>(dst.begin(), dst.end()),
                              Connection::Reader::kCaller));
}

std::vector<Result<size_t>> Client::GetLayers(NamespaceId ns, std::span<const BlockKey> keys, uint32_t first_layer,
                                              uint32_t last_layer, std::span<const std::span<std::byte>> dst) {
  if (first_layer >= last_layer) {
    return std::vector<Result<size_t>>(keys.size(), InvalidArgument("layer range [" + std::to_string(first_layer) +
                                                                    ", " + std::to_string(last_layer) + ") is empty"));
  }
  std::shared_ptr<Connection> conn = Current();
  return conn->Await(StartGet(*conn, ns, keys, std::vector<std::span<std::byte>>(dst.begin(), dst.end()),
                              Connection::Reader::kCaller, std::make_pair(first_layer, last_layer)));
}

std::future<std::vector<Result<size_t>>> Client::GetBatchAsync(NamespaceId ns, std::vector<BlockKey> keys,
                                                               std::vector<std::span<std::byte>> dst) {
  std::shared_ptr<Connection> conn = Current();
  return StartGet(*conn, ns, keys, std::move(dst), Connection::Reader::kBackground);
}

std::vector<Result<BlockView>> Client::Pin(NamespaceId ns, std::span<const BlockKey> keys) {
  std::shared_ptr<Connection> conn = Current();
  std::vector<Result<BlockView>> out;
  Status s = CheckNamespace(*conn, ns);
  auto r = s.ok() ? conn->CallSync(wire::MakePin(ns, keys)) : Result<v1::Response>(s);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!r.ok()) {
      out.emplace_back(r.status());
      continue;
    }
    if (static_cast<int>(i) >= r->pin().blocks_size()) {
      out.emplace_back(ProtocolError("Pin response has fewer blocks than keys"));
      continue;
    }
    const auto& b = r->pin().blocks(static_cast<int>(i));
    Status block_status = wire::FromProto(b.status());
    if (!block_status.ok()) {
      out.emplace_back(block_status);
      continue;
    }
    auto slot = conn->Slot(b.offset(), b.length());
    if (!slot.ok()) {
      conn->ReleaseLater(std::vector<uint64_t>{b.lease()});
      out.emplace_back(slot.status());
      continue;
    }
    if (conn->verify_checksums()) {
      // Checked in place before the view is handed out; a bad block is
      // reported first, then its pin goes.
      Status verified = internal::VerifyBlock(*slot, b.checksum(), keys[i]);
      if (!verified.ok()) {
        internal::ReportCorruptAndWait(*conn, ns, keys[i]);  // the block is gone when this returns
        conn->ReleaseLater(std::vector<uint64_t>{b.lease()});
        out.emplace_back(verified);
        continue;
      }
    }
    BlockView view;
    view.conn_ = conn;
    view.data_ = *slot;
    view.key_ = keys[i];
    view.lease_ = b.lease();
    view.checksum_ = b.checksum();
    out.emplace_back(std::move(view));
  }
  return out;
}

Status Client::Release(uint64_t lease) { return internal::ReleaseAndWait(*Current(), lease); }

Result<PreloadPlan> Client::PlanPreload(Tier source, uint64_t bytes_per_layer, double compute_us_per_layer,
                                        uint32_t layers, double recompute_us_per_layer) {
  std::shared_ptr<Connection> conn = Current();
  auto r = conn->CallSync(wire::MakePreloadPlan(static_cast<uint32_t>(source), bytes_per_layer, compute_us_per_layer,
                                                layers, recompute_us_per_layer));
  if (!r.ok()) return r.status();
  return wire::FromProto(r->preload_plan());
}

Result<ReadyEstimate> Client::EstimateReady(NamespaceId ns, std::span<const BlockKey> keys) {
  std::shared_ptr<Connection> conn = Current();
  if (Status s = CheckNamespace(*conn, ns); !s.ok()) return s;
  auto r = conn->CallSync(wire::MakeReadyEstimate(ns, keys));
  if (!r.ok()) return r.status();
  return wire::FromProto(r->ready_estimate());
}

Result<size_t> Client::Erase(NamespaceId ns, std::span<const BlockKey> keys) {
  std::shared_ptr<Connection> conn = Current();
  if (Status s = CheckNamespace(*conn, ns); !s.ok()) return s;
  auto r = conn->CallSync(wire::MakeErase(ns, keys));
  if (!r.ok()) return r.status();
  return static_cast<size_t>(r->erase().erased());
}

Status Client::Enqueue(uint64_t request, NamespaceId ns, std::span<const BlockKey> keys,
                       std::chrono::steady_clock::time_point expected_start, uint64_t session) {
  const auto until = expected_start - std::chrono::steady_clock::now();
  return Enqueue(request, ns, keys, std::chrono::duration_cast<std::chrono::microseconds>(until), session);
}

Status Client::Enqueue(uint64_t request, NamespaceId ns, std::span<const BlockKey> keys,
                       std::chrono::microseconds start_in, uint64_t session) {
  std::shared_ptr<Connection> conn = Current();
  if (Status s = CheckNamespace(*conn, ns); !s.ok()) return s;
  const int64_t start_in_us = std::max<int64_t>(0, start_in.count());
  return conn->CallSync(wire::MakeEnqueue(ns, request, keys, static_cast<uint64_t>(start_in_us), session)).status();
}

Status Client::Started(uint64_t request) { return Current()->CallSync(wire::MakeRequestEvent(request, true)).status(); }

Status Client::Finished(uint64_t request) {
  return Current()->CallSync(wire::MakeRequestEvent(request, false)).status();
}

Status Client::OpenSession(uint64_t session) {
  return Current()->CallSync(wire::MakeSessionHint(session, true)).status();
}

Status Client::CloseSession(uint64_t session) {
  std::shared_ptr<Connection> conn = Current();
  return conn->CallSync(wire::MakeSessionHint(session, false)).status();
}

Result<std::vector<Counter>> Client::Stats() {
  std::shared_ptr<Connection> conn = Current();
  auto r = conn->CallSync(wire::MakeStats());
  if (!r.ok()) return r.status();
  std::vector<Counter> out;
  for (const auto& c : r->stats().counters()) out.push_back({c.name(), c.value()});
  return out;
}

}  // namespace kvtier
