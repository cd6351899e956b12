// kvtier.Key, kvtier.Namespace, kvtier.ChainHasher and kvtier.Tier: the
// key scheme of docs/KEYS.md, computed by the C++ library (no connection).
#include <pybind11/operators.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <functional>
#include <string>

#include "kvtier/block_key.h"
#include "kvtier/client.h"
#include "python/src/bind.h"
#include "python/src/convert.h"
#include "python/src/errors.h"

namespace kvtier::python {
namespace py = pybind11;

namespace {

py::bytes Canonical(const BlockKey& k) {
  char out[16];
  for (int i = 0; i < 8; ++i) {
    out[i] = static_cast<char>(k.hi >> (56 - 8 * i));
    out[8 + i] = static_cast<char>(k.lo >> (56 - 8 * i));
  }
  return py::bytes(out, 16);
}

}  // namespace

void BindKeys(py::module_& m) {
  py::enum_<Tier>(m, "Tier", "Where a copy of a block lives.")
      .value("NONE", Tier::kNone)
      .value("HBM", Tier::kHbm)
      .value("HOST", Tier::kHost)
      .value("NVME", Tier::kNvme)
      .value("REMOTE", Tier::kRemote);

  py::class_<BlockKey>(m, "Key",
                       "A 128-bit block key (docs/KEYS.md): `hi` and `lo` are the high and low "
                       "64 bits; hex() is the canonical 32 lower-case hex digits.")
      .def(py::init<>())
      .def(py::init([](uint64_t hi, uint64_t lo) { return BlockKey{hi, lo}; }), py::arg("hi"), py::arg("lo"))
      .def_readwrite("hi", &BlockKey::hi)
      .def_readwrite("lo", &BlockKey::lo)
      .def("hex", &BlockKey::ToHex)
      .def_static("from_hex", [](std::string_view hex) { return ValueOrThrow(BlockKey::FromHex(hex)); },
                  py::arg("hex"))
      .def("canonical", &Canonical, "The canonical 16 bytes: hi then lo, each big-endian.")
      .def(py::self == py::self)
      .def(py::self != py::self)
      .def(py::self < py::self)
      .def("__hash__", [](const BlockKey& k) { return std::hash<BlockKey>{}(k); })
      .def("__repr__", [](const BlockKey& k) { return "Key('" + k.ToHex() + "')"; })
      .def(py::pickle([](const BlockKey& k) { return py::make_tuple(k.hi, k.lo); },
                      [](const py::tuple& t) { return BlockKey{t[0].cast<uint64_t>(), t[1].cast<uint64_t>()}; }));

  py::class_<NamespaceDescriptor>(m, "Namespace",
                                  "Everything that changes the bytes of a KV block (docs/KEYS.md); "
                                  "two engines share blocks only if every field is equal.")
      .def(py::init([](std::string model_id, std::string model_revision, std::string kv_dtype,
                       uint32_t block_tokens, uint32_t layer_count, uint64_t bytes_per_token_per_layer,
                       std::string kv_layout, std::string adapter_id, std::string adapter_revision,
                       uint32_t tp_rank, uint32_t tp_size) {
             NamespaceDescriptor d;
             d.model_id = std::move(model_id);
             d.model_revision = std::move(model_revision);
             d.kv_dtype = std::move(kv_dtype);
             d.block_tokens = block_tokens;
             d.layer_count = layer_count;
             d.bytes_per_token_per_layer = bytes_per_token_per_layer;
             d.kv_layout = std::move(kv_layout);
             d.adapter_id = std::move(adapter_id);
             d.adapter_revision = std::move(adapter_revision);
             d.tp_rank = tp_rank;
             d.tp_size = tp_size;
             return d;
           }),
           py::kw_only(), py::arg("model_id"), py::arg("model_revision"), py::arg("kv_dtype"),
           py::arg("block_tokens"), py::arg("layer_count"), py::arg("bytes_per_token_per_layer"),
           py::arg("kv_layout") = "layer_major_kv", py::arg("adapter_id") = "", py::arg("adapter_revision") = "",
           py::arg("tp_rank") = 0, py::arg("tp_size") = 1)
      .def_readwrite("model_id", &NamespaceDescriptor::model_id)
      .def_readwrite("model_revision", &NamespaceDescriptor::model_revision)
      .def_readwrite("adapter_id", &NamespaceDescriptor::adapter_id)
      .def_readwrite("adapter_revision", &NamespaceDescriptor::adapter_revision)
      .def_readwrite("kv_dtype", &NamespaceDescriptor::kv_dtype)
      .def_readwrite("block_tokens", &NamespaceDescriptor::block_tokens)
      .def_readwrite("layer_count", &NamespaceDescriptor::layer_count)
      .def_readwrite("kv_layout", &NamespaceDescriptor::kv_layout)
      .def_readwrite("bytes_per_token_per_layer", &NamespaceDescriptor::bytes_per_token_per_layer)
      .def_readwrite("tp_rank", &NamespaceDescriptor::tp_rank)
      .def_readwrite("tp_size", &NamespaceDescriptor::tp_size)
      .def("validate", [](const NamespaceDescriptor& d) { ThrowIfError(d.Validate()); },
           "Raises InvalidArgumentError naming the first bad field.")
      .def_property_readonly("block_bytes", &NamespaceDescriptor::BlockBytes)
      .def_property_readonly("layer_bytes", &NamespaceDescriptor::LayerBytes)
      .def("canonical_bytes", [](const NamespaceDescriptor& d) {
        ThrowIfError(d.Validate());
        std::vector<uint8_t> b = CanonicalNamespaceBytes(d);
        return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
      })
      .def("fingerprint", [](const NamespaceDescriptor& d) {
        ThrowIfError(d.Validate());
        return FingerprintNamespace(d);
      })
      .def("__repr__", [](const NamespaceDescriptor& d) {
        return "Namespace(model_id='" + d.model_id + "', model_revision='" + d.model_revision + "', block_tokens=" +
               std::to_string(d.block_tokens) + ", layer_count=" + std::to_string(d.layer_count) + ")";
      });

  py::class_<ChainHasher>(m, "ChainHasher", "Computes the key chain of token sequences for one namespace.")
      .def(py::init([](const NamespaceDescriptor& d) { return ValueOrThrow(ChainHasher::Create(d)); }),
           py::arg("namespace"))
      .def_property_readonly("fingerprint", &ChainHasher::fingerprint)
      .def_property_readonly("block_tokens", &ChainHasher::block_tokens)
      .def(
          "keys",
          [](const ChainHasher& h, const py::object& tokens) {
            std::vector<uint32_t> t = ToTokens(tokens);
            py::gil_scoped_release unlocked;
            return h.Keys(t);
          },
          py::arg("tokens"),
          "Keys of every full block of `tokens` (ints in the u32 range); a partial "
          "trailing block gets none.")
      .def(
          "extend",
          [](const ChainHasher& h, const py::object& tokens, const py::object& chain) {
            std::vector<uint32_t> t = ToTokens(tokens);
            std::vector<BlockKey> c = ToKeys(chain);
            if (c.size() > t.size() / h.block_tokens()) {
              throw StatusError(InvalidArgument("chain has more keys than tokens has full blocks"));
            }
            py::gil_scoped_release unlocked;
            h.Extend(t, c);
            return c;
          },
          py::arg("tokens"), py::arg("chain"),
          "The keys of `chain` (the first len(chain) blocks of `tokens`) followed by "
          "those of the remaining full blocks, without rehashing the prefix.");

  m.def(
      "chain_key",
      [](const BlockKey& prev, uint32_t position, const py::object& tokens) {
        std::vector<uint32_t> t = ToTokens(tokens);
        return ChainKey(prev, position, t);
      },
      py::arg("prev"), py::arg("position"), py::arg("block_tokens"),
        "One chain link (docs/KEYS.md section 3).");
}

}  // namespace kvtier::python
