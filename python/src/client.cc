// kvtier.Client: a connection to kvtierd (include/kvtier/client.h). Every
// call that waits for the daemon releases the GIL; a Client may be used
// from several Python threads at once.
#include <pybind11/chrono.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "kvtier/client.h"
#include "python/src/bind.h"
#include "python/src/convert.h"
#include "python/src/errors.h"
#include "python/src/handles.h"

namespace kvtier::python {
namespace py = pybind11;

namespace {

ChainLinks Links(bool chain, const std::optional<BlockKey>& parent) { return ChainLinks{chain, parent}; }

std::vector<ItemStatus> Items(std::vector<Status> statuses) {
  std::vector<ItemStatus> out;
  for (auto& s : statuses) out.push_back(ItemStatus{std::move(s), std::nullopt});
  return out;
}

std::vector<ItemStatus> SizeItems(std::vector<Result<size_t>> results) {
  std::vector<ItemStatus> out;
  for (auto& r : results) {
    out.push_back(r.ok() ? ItemStatus{Status::Ok(), *r} : ItemStatus{r.status(), std::nullopt});
  }
  return out;
}

// An answer the daemon has not given yet (Client.lookup_async).
class PendingLookup {
 public:
  explicit PendingLookup(std::future<Result<LookupResult>> f) : future_(std::move(f)) {}
  bool Done() {
    if (result_) return true;
    return future_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }
  LookupResult Get(std::optional<double> timeout_s) {
    if (!result_) {
      {
        py::gil_scoped_release unlocked;
        if (timeout_s && future_.wait_for(std::chrono::duration<double>(*timeout_s)) != std::future_status::ready) {
          py::gil_scoped_acquire locked;
          throw StatusError(TimedOut("lookup not answered yet"));
        }
        result_.emplace(future_.get());
      }
    }
    if (!result_->ok()) throw StatusError(result_->status());
    return result_->value();
  }

 private:
  std::future<Result<LookupResult>> future_;
  std::optional<Result<LookupResult>> result_;
};

class PyClient {
 public:
  explicit PyClient(const ClientOptions& options) {
    Result<std::unique_ptr<Client>> c = [&] {
      py::gil_scoped_release unlocked;
      return Client::Connect(options);
    }();
    client_ = std::shared_ptr<Client>(ValueOrThrow(std::move(c)).release());
  }

  // The client for one call: kept alive by the caller's copy even if
  // another thread closes this one meanwhile.
  std::shared_ptr<Client> Get() const {
    if (!client_) throw StatusError(FailedPrecondition("client is closed"));
    return client_;
  }
  void Close() { client_.reset(); }

 private:
  std::shared_ptr<Client> client_;
};

template <typename Fn>
auto Unlocked(Fn fn) {
  py::gil_scoped_release unlocked;
  return fn();
}

py::list PinItems(std::vector<Result<BlockView>> pins) {
  py::list out;
  for (auto& p : pins) {
    if (p.ok()) {
      out.append(py::cast(std::make_unique<PyBlockView>(std::move(p).value())));
    } else {
      out.append(py::cast(ItemStatus{p.status(), std::nullopt}));
    }
  }
  return out;
}

}  // namespace

void BindClient(py::module_& m) {
  py::class_<LookupResult>(m, "LookupResult")
      .def_readonly("prefix_blocks", &LookupResult::prefix_blocks)
      .def_readonly("tiers", &LookupResult::tiers)
      .def("__repr__",
           [](const LookupResult& r) { return "LookupResult(prefix_blocks=" + std::to_string(r.prefix_blocks) + ")"; });

  py::class_<ReadyTierShare>(m, "ReadyTierShare", "One tier below the host in a ReadyEstimate.")
      .def_readonly("tier", &ReadyTierShare::tier)
      .def_readonly("blocks", &ReadyTierShare::blocks)
      .def_readonly("bytes", &ReadyTierShare::bytes)
      .def_readonly("promoting_blocks", &ReadyTierShare::promoting_blocks)
      .def_readonly("queued_reads", &ReadyTierShare::queued_reads)
      .def_readonly("queued_bytes", &ReadyTierShare::queued_bytes)
      .def_readonly("read_bytes_per_s", &ReadyTierShare::read_bytes_per_s)
      .def_readonly("overhead_us", &ReadyTierShare::overhead_us)
      .def_readonly("ready_us", &ReadyTierShare::ready_us);
  py::class_<ReadyEstimate>(m, "ReadyEstimate",
                            "When the longest cached prefix can be in host and GPU memory (kvtier/ready_estimate.h).")
      .def_readonly("prefix_blocks", &ReadyEstimate::prefix_blocks)
      .def_readonly("tiers", &ReadyEstimate::tiers)
      .def_readonly("prefix_bytes", &ReadyEstimate::prefix_bytes)
      .def_readonly("host_ready_us", &ReadyEstimate::host_ready_us)
      .def_readonly("gpu_ready_us", &ReadyEstimate::gpu_ready_us)
      .def_readonly("gpu_copy_bytes", &ReadyEstimate::gpu_copy_bytes)
      .def_readonly("gpu_copy_bytes_per_s", &ReadyEstimate::gpu_copy_bytes_per_s)
      .def_readonly("below", &ReadyEstimate::below)
      .def("__repr__", [](const ReadyEstimate& r) {
        return "ReadyEstimate(prefix_blocks=" + std::to_string(r.prefix_blocks) +
               ", host_ready_us=" + std::to_string(r.host_ready_us) +
               ", gpu_ready_us=" + std::to_string(r.gpu_ready_us) + ")";
      });

  py::class_<PendingLookup>(m, "PendingLookup", "A lookup in flight (Client.lookup_async).")
      .def("done", &PendingLookup::Done, "Whether the answer is in (never blocks).")
      .def("result", &PendingLookup::Get, py::arg("timeout") = py::none(),
           "The LookupResult; waits (at most `timeout` seconds: TimedOutError).");

  py::class_<PyClient>(m, "Client",
                       "A connection to kvtierd. Namespaces are registered at connect; namespace id "
                       "i is namespaces[i]. Errors raise kvtier.Error subclasses. "
                       "verify_checksums=True: every read (get, get_batch, get_layers, pin, "
                       "begin_load's layers) checks the bytes it hands out against the checksums "
                       "recorded when the block was stored (per layer for layer reads); a mismatch is "
                       "CorruptionError (or that key's status), never the bytes, and the block is "
                       "dropped so later reads miss. Costs one hash of the bytes read.")
      .def(py::init([](std::string socket_path, std::vector<NamespaceDescriptor> namespaces, std::string client_name,
                       double connect_timeout_s, double call_timeout_s, bool verify_checksums, bool use_directory,
                       uint32_t max_frame_bytes) {
             ClientOptions o;
             o.socket_path = std::move(socket_path);
             o.namespaces = std::move(namespaces);
             o.client_name = std::move(client_name);
             o.connect_timeout = std::chrono::milliseconds(static_cast<int64_t>(connect_timeout_s * 1000));
             o.call_timeout = std::chrono::milliseconds(static_cast<int64_t>(call_timeout_s * 1000));
             o.verify_checksums = verify_checksums;
             o.use_directory = use_directory;
             o.max_frame_bytes = max_frame_bytes;
             return std::make_unique<PyClient>(o);
           }),
           py::arg("socket_path") = "/run/kvtier/kvtierd.sock",
           py::arg("namespaces") = std::vector<NamespaceDescriptor>{}, py::kw_only(),
           py::arg("client_name") = "kvtier-python", py::arg("connect_timeout") = 5.0, py::arg("call_timeout") = 30.0,
           py::arg("verify_checksums") = false, py::arg("use_directory") = true, py::arg("max_frame_bytes") = 1u << 20)
      .def("close", &PyClient::Close, "Lets go of the connection (open views keep it until released).")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](PyClient& c, py::handle, py::handle, py::handle) {
             c.Close();
             return false;
           })
      .def_property_readonly("fingerprints", [](const PyClient& c) { return c.Get()->namespaces(); })
      .def_property_readonly("arena_bytes", [](const PyClient& c) { return c.Get()->arena().size(); })
      .def_property_readonly(
          "arena_address", [](const PyClient& c) { return reinterpret_cast<uintptr_t>(c.Get()->arena().data()); },
          "Base address of the arena mapping (arena_bytes long), e.g. for one cudaHostRegister of it. After a "
          "reconnect (reconnects changed) it is the new daemon's arena; the old one stays mapped only while "
          "views, saves and loads from before use it.")
      .def_property_readonly(
          "events_endpoints",
          [](const PyClient& c) -> py::object {
            EventsEndpoints e = c.Get()->events_endpoints();
            if (e.publish.empty()) return py::none();
            return py::make_tuple(e.publish, e.replay);
          },
          "(publish, replay): the ZeroMQ endpoints of this caller's KV events (docs/OPERATIONS.md, \"KV "
          "events\"); None when kvtierd publishes none.")
      .def_property_readonly(
          "reconnects", [](const PyClient& c) { return c.Get()->reconnects(); },
          "How many times this client reconnected after kvtierd closed the connection; 0 until the first.")
      .def(
          "lookup",
          [](const PyClient& c, NamespaceId ns, const py::object& keys) {
            auto k = ToKeys(keys);
            auto cl = c.Get();
            return ValueOrThrow(Unlocked([&] { return cl->Lookup(ns, k); }));
          },
          py::arg("ns"), py::arg("keys"), "Longest cached prefix of `keys` and each hit's tier.")
      .def(
          "lookup_async",
          [](const PyClient& c, NamespaceId ns, const py::object& keys) {
            auto k = ToKeys(keys);
            auto cl = c.Get();
            return PendingLookup(Unlocked([&] { return cl->LookupAsync(ns, std::move(k)); }));
          },
          py::arg("ns"), py::arg("keys"))
      .def(
          "put",
          [](const PyClient& c, NamespaceId ns, const BlockKey& key, const py::object& data) {
            HeldBuffer b(data, false);
            auto cl = c.Get();
            ThrowIfError(Unlocked([&] { return cl->Put(ns, key, b.readable()); }));
          },
          py::arg("ns"), py::arg("key"), py::arg("data"), "Copies `data` into the arena and publishes it.")
      .def(
          "put_batch",
          [](const PyClient& c, NamespaceId ns, const py::object& keys, const py::object& data, bool chain,
             std::optional<BlockKey> parent) {
            auto k = ToKeys(keys);
            HeldBuffers held(data, false);
            held.ExpectOnePer(k.size());
            auto spans = held.readable();
            auto cl = c.Get();
            return Items(Unlocked([&] { return cl->PutBatch(ns, k, spans, Links(chain, parent)); }));
          },
          py::arg("ns"), py::arg("keys"), py::arg("data"), py::arg("chain") = false, py::arg("parent") = py::none(),
          "One Status per key. chain=True: the keys are consecutive blocks of one chain, root first.")
      .def(
          "get",
          [](const PyClient& c, NamespaceId ns, const BlockKey& key, const py::object& out) {
            HeldBuffer b(out, true);
            auto cl = c.Get();
            return ValueOrThrow(Unlocked([&] { return cl->Get(ns, key, b.writable()); }));
          },
          py::arg("ns"), py::arg("key"), py::arg("out"), "Copies the block into `out`; returns its length.")
      .def(
          "get_batch",
          [](const PyClient& c, NamespaceId ns, const py::object& keys, const py::object& outs) {
            auto k = ToKeys(keys);
            HeldBuffers held(outs, true);
            held.ExpectOnePer(k.size());
            auto spans = held.writable();
            auto cl = c.Get();
            return SizeItems(Unlocked([&] { return cl->GetBatch(ns, k, spans); }));
          },
          py::arg("ns"), py::arg("keys"), py::arg("outs"), "One Status per key; `value` = bytes copied.")
      .def(
          "get_layers",
          [](const PyClient& c, NamespaceId ns, const py::object& keys, uint32_t first, uint32_t last,
             const py::object& outs) {
            auto k = ToKeys(keys);
            HeldBuffers held(outs, true);
            held.ExpectOnePer(k.size());
            auto spans = held.writable();
            auto cl = c.Get();
            return SizeItems(Unlocked([&] { return cl->GetLayers(ns, k, first, last, spans); }));
          },
          py::arg("ns"), py::arg("keys"), py::arg("first_layer"), py::arg("last_layer"), py::arg("outs"))
      .def(
          "pin",
          [](const PyClient& c, NamespaceId ns, const py::object& keys) {
            auto k = ToKeys(keys);
            auto cl = c.Get();
            return PinItems(Unlocked([&] { return cl->Pin(ns, k); }));
          },
          py::arg("ns"), py::arg("keys"),
          "Zero-copy get: a list with a BlockView per hit and a Status per miss (item.ok says which).")
      .def(
          "release_lease",
          [](const PyClient& c, uint64_t lease) {
            auto cl = c.Get();
            ThrowIfError(Unlocked([&] { return cl->Release(lease); }));
          },
          py::arg("lease"))
      .def(
          "reserve",
          [](const PyClient& c, NamespaceId ns, const py::object& keys, std::vector<uint64_t> sizes, bool chain,
             std::optional<BlockKey> parent) {
            auto k = ToKeys(keys);
            auto cl = c.Get();
            return std::make_unique<PyReservation>(
                ValueOrThrow(Unlocked([&] { return cl->Reserve(ns, k, sizes, Links(chain, parent)); })));
          },
          py::arg("ns"), py::arg("keys"), py::arg("sizes"), py::arg("chain") = false, py::arg("parent") = py::none())
      .def(
          "begin_save",
          [](const PyClient& c, NamespaceId ns, const py::object& keys, bool chain, std::optional<BlockKey> parent) {
            auto k = ToKeys(keys);
            auto cl = c.Get();
            return std::make_unique<PyLayerSave>(
                ValueOrThrow(Unlocked([&] { return cl->BeginSave(ns, k, Links(chain, parent)); })));
          },
          py::arg("ns"), py::arg("keys"), py::arg("chain") = true, py::arg("parent") = py::none())
      .def(
          "begin_load",
          [](const PyClient& c, NamespaceId ns, const py::object& keys, const py::object& dst,
             std::vector<uintptr_t> device_dst, uintptr_t cuda_stream, int device_ordinal, double compute_us_per_layer,
             bool wait_for_depth, double deadline_s, double recompute_us_per_layer) {
            auto k = ToKeys(keys);
            auto state = std::make_shared<LoadState>();
            LoadOptions o;
            if (!dst.is_none()) {
              state->dst = HeldBuffers(dst, true);
              o.dst = state->dst.writable();
            }
            for (uintptr_t p : device_dst) o.device_dst.push_back(reinterpret_cast<void*>(p));
            o.cuda_stream = reinterpret_cast<void*>(cuda_stream);
            o.device_ordinal = device_ordinal;
            o.compute_us_per_layer = compute_us_per_layer;
            o.wait_for_depth = wait_for_depth;
            if (!(deadline_s >= 0)) throw py::value_error("deadline must be >= 0 (seconds)");
            // Past a year (inf included) is no deadline.
            o.deadline =
                std::chrono::microseconds(deadline_s >= 365.0 * 86400 ? 0 : static_cast<int64_t>(deadline_s * 1e6));
            o.recompute_us_per_layer = recompute_us_per_layer;
            auto cl = c.Get();
            state->load = ValueOrThrow(Unlocked([&] { return cl->BeginLoad(ns, k, std::move(o)); }));
            return std::make_unique<PyLayerLoad>(std::move(state));
          },
          py::arg("ns"), py::arg("keys"), py::arg("dst") = py::none(), py::arg("device_dst") = std::vector<uintptr_t>{},
          py::arg("cuda_stream") = 0, py::arg("device_ordinal") = 0, py::arg("compute_us_per_layer") = 0.0,
          py::arg("wait_for_depth") = false, py::arg("deadline") = 0.0, py::arg("recompute_us_per_layer") = 0.0,
          "Layer-wise load. dst=None: zero-copy (layer_span); else one writable buffer per key that "
          "wait_layer(l) fills layer by layer; device_dst: GPU pointers (CUDA builds). deadline (s, 0: "
          "layers x recompute_us_per_layer when that is given, else none): past it a wait returns and the "
          "blocks not whole fail with TimedOut (status), for the engine to recompute.")
      .def(
          "plan_preload",
          [](const PyClient& c, Tier source, uint64_t bytes_per_layer, double compute_us, uint32_t layers,
             double recompute_us) {
            auto cl = c.Get();
            return ValueOrThrow(
                Unlocked([&] { return cl->PlanPreload(source, bytes_per_layer, compute_us, layers, recompute_us); }));
          },
          py::arg("source"), py::arg("bytes_per_layer"), py::arg("compute_us_per_layer"), py::arg("layers"),
          py::arg("recompute_us_per_layer") = 0.0)
      .def(
          "estimate_ready",
          [](const PyClient& c, NamespaceId ns, const py::object& keys) {
            auto k = ToKeys(keys);
            auto cl = c.Get();
            return ValueOrThrow(Unlocked([&] { return cl->EstimateReady(ns, k); }));
          },
          py::arg("ns"), py::arg("keys"),
          "When the longest cached prefix of `keys` (root first) can be in host and GPU memory: a ReadyEstimate "
          "(each block's tier, host_ready_us, gpu_ready_us, per tier below its share). No I/O in the daemon.")
      .def(
          "erase",
          [](const PyClient& c, NamespaceId ns, const py::object& keys) {
            auto k = ToKeys(keys);
            auto cl = c.Get();
            return ValueOrThrow(Unlocked([&] { return cl->Erase(ns, k); }));
          },
          py::arg("ns"), py::arg("keys"), "Removes blocks; returns how many were cached.")
      .def(
          "drop_namespaces",
          [](const PyClient& c, const std::vector<NamespaceId>& ids) {
            auto cl = c.Get();
            const auto& registered = cl->namespaces();
            std::vector<NamespaceFingerprint> fingerprints;
            for (NamespaceId ns : ids) {
              if (ns >= registered.size()) throw py::index_error("no namespace " + std::to_string(ns));
              fingerprints.push_back(registered[ns]);
            }
            auto dropped = ValueOrThrow(Unlocked([&] { return cl->DropNamespaces(fingerprints); }));
            uint64_t blocks = 0;
            for (const NamespaceInfo& info : dropped) {
              for (const NamespaceTierUse& use : info.tiers) blocks += use.blocks;
            }
            return blocks;
          },
          py::arg("namespaces"),
          "Removes every block of the registered namespaces `namespaces` (indices) from every tier; returns "
          "how many blocks they held. The namespaces stay registered.")
      .def(
          "stats",
          [](const PyClient& c) {
            auto cl = c.Get();
            auto counters = ValueOrThrow(Unlocked([&] { return cl->Stats(); }));
            py::dict out;
            for (const Counter& k : counters) out[py::str(k.name)] = k.value;
            return out;
          },
          "Every counter of the daemon, by name.")
      .def(
          "health",
          [](const PyClient& c) {
            auto cl = c.Get();
            auto report = ValueOrThrow(Unlocked([&] { return cl->Health(); }));
            py::dict out;
            out["healthy"] = report.healthy;
            out["problems"] = report.problems;
            out["warnings"] = report.warnings;
            out["version"] = report.version;
            out["uptime_s"] = report.uptime_s;
            out["tiers"] = report.tiers;
            return out;
          },
          "The daemon's health: {healthy, problems, warnings, version, uptime_s, tiers (top first)}.")
      .def(
          "enqueue",
          [](const PyClient& c, uint64_t request, NamespaceId ns, const py::object& keys, double start_in_s,
             uint64_t session) {
            auto k = ToKeys(keys);
            auto start =
                std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                       std::chrono::duration<double>(start_in_s));
            auto cl = c.Get();
            ThrowIfError(Unlocked([&] { return cl->Enqueue(request, ns, k, start, session); }));
          },
          py::arg("request"), py::arg("ns"), py::arg("keys"), py::arg("start_in_s") = 0.0, py::arg("session") = 0,
          "Queue hint: `request` will need the chain `keys`, expected to start in `start_in_s` seconds.")
      .def(
          "started",
          [](const PyClient& c, uint64_t r) {
            auto cl = c.Get();
            ThrowIfError(Unlocked([&] { return cl->Started(r); }));
          },
          py::arg("request"))
      .def(
          "finished",
          [](const PyClient& c, uint64_t r) {
            auto cl = c.Get();
            ThrowIfError(Unlocked([&] { return cl->Finished(r); }));
          },
          py::arg("request"))
      .def(
          "open_session",
          [](const PyClient& c, uint64_t s) {
            auto cl = c.Get();
            ThrowIfError(Unlocked([&] { return cl->OpenSession(s); }));
          },
          py::arg("session"))
      .def(
          "close_session",
          [](const PyClient& c, uint64_t s) {
            auto cl = c.Get();
            ThrowIfError(Unlocked([&] { return cl->CloseSession(s); }));
          },
          py::arg("session"));
}

}  // namespace kvtier::python
