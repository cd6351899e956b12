// kvtier.Key, kvtier.Namespace, kvtier.ChainHasher and kvtier.Tier: the
// key scheme of docs/KEYS.md, computed by the C++ library (no connection).
#include <pybind11/operators.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <xxhash.h>

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

// docs/KEYS.md section 3, "Keys from an engine's own page keys":
// XXH3_128(canonical16(fingerprint) || u32 LE 0xffffffff || engine key bytes).
BlockKey ExternalKey(const BlockKey& fingerprint, std::string_view engine_key) {
  std::string link(static_cast<std::string>(py::bytes(Canonical(fingerprint))));
  link.append("\xff\xff\xff\xff", 4);
  link.append(engine_key);
  const XXH128_hash_t h = XXH3_128bits(link.data(), link.size());
  return BlockKey{h.high64, h.low64};
}

std::string BytesOf(const py::handle& o) {
  if (py::isinstance<py::str>(o)) return o.cast<std::string>();
  if (py::isinstance<py::bytes>(o)) return static_cast<std::string>(o.cast<py::bytes>());
  if (PyObject_CheckBuffer(o.ptr())) return static_cast<std::string>(py::bytes(py::reinterpret_borrow<py::object>(o)));
  throw StatusError(InvalidArgument("an extra key is str or bytes"));
}

std::vector<ExtraKey> ToExtraList(const py::handle& list, bool allow_salt) {
  std::vector<ExtraKey> out;
  for (py::handle item : list) {
    auto pair = py::reinterpret_borrow<py::tuple>(item);
    if (pair.size() != 2) throw StatusError(InvalidArgument("an extra key is a (ExtraKind, bytes) pair"));
    auto kind = pair[0].cast<ExtraKeyKind>();
    if (!allow_salt && kind == ExtraKeyKind::kCacheSalt) {
      throw StatusError(InvalidArgument("the cache salt is passed as cache_salt, not as a block's extra key"));
    }
    out.push_back(ExtraKey{kind, BytesOf(pair[1])});
  }
  return out;
}

ChainExtras ToExtras(const py::object& cache_salt, const py::object& extras) {
  ChainExtras e;
  if (!cache_salt.is_none()) e.cache_salt = BytesOf(cache_salt);
  if (!extras.is_none()) {
    for (py::handle block : extras)
      e.blocks.push_back(block.is_none() ? std::vector<ExtraKey>{} : ToExtraList(block, false));
  }
  return e;
}

}  // namespace

void BindKeys(py::module_& m) {
  py::enum_<ExtraKeyKind>(m, "ExtraKind", "Kinds of a block's extra keys (docs/KEYS.md).")
      .value("CACHE_SALT", ExtraKeyKind::kCacheSalt)
      .value("MULTIMODAL", ExtraKeyKind::kMultimodal)
      .value("PROMPT_EMBEDS", ExtraKeyKind::kPromptEmbeds);

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
      .def(py::init([](uint64_t hi, uint64_t lo) {
             return BlockKey{hi, lo};
           }),
           py::arg("hi"), py::arg("lo"))
      .def_readwrite("hi", &BlockKey::hi)
      .def_readwrite("lo", &BlockKey::lo)
      .def("hex", &BlockKey::ToHex)
      .def_static(
          "from_hex", [](std::string_view hex) { return ValueOrThrow(BlockKey::FromHex(hex)); }, py::arg("hex"))
      .def("canonical", &Canonical, "The canonical 16 bytes: hi then lo, each big-endian.")
      .def(py::self == py::self)
      .def(py::self != py::self)
      .def(py::self < py::self)
      .def("__hash__", [](const BlockKey& k) { return std::hash<BlockKey>{}(k); })
      .def("__repr__", [](const BlockKey& k) { return "Key('" + k.ToHex() + "')"; })
      .def(py::pickle([](const BlockKey& k) { return py::make_tuple(k.hi, k.lo); },
                      [](const py::tuple& t) {
                        return BlockKey{t[0].cast<uint64_t>(), t[1].cast<uint64_t>()};
                      }));

  py::class_<NamespaceDescriptor>(m, "Namespace",
                                  "Everything that changes the bytes of a KV block (docs/KEYS.md); "
                                  "two engines share blocks only if every field is equal.")
      .def(py::init([](std::string model_id, std::string model_revision, std::string kv_dtype, uint32_t block_tokens,
                       uint32_t layer_count, uint64_t bytes_per_token_per_layer, std::string kv_layout,
                       std::string adapter_id, std::string adapter_revision, uint32_t tp_rank, uint32_t tp_size,
                       uint32_t pp_rank, uint32_t pp_size, uint32_t kv_format_version, std::string object_kind) {
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
             d.pp_rank = pp_rank;
             d.pp_size = pp_size;
             d.kv_format_version = kv_format_version;
             d.object_kind = std::move(object_kind);
             return d;
           }),
           py::kw_only(), py::arg("model_id"), py::arg("model_revision"), py::arg("kv_dtype"), py::arg("block_tokens"),
           py::arg("layer_count"), py::arg("bytes_per_token_per_layer"), py::arg("kv_layout") = "layer_major_kv",
           py::arg("adapter_id") = "", py::arg("adapter_revision") = "", py::arg("tp_rank") = 0, py::arg("tp_size") = 1,
           py::arg("pp_rank") = 0, py::arg("pp_size") = 1, py::arg("kv_format_version") = 1,
           py::arg("object_kind") = "kv")
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
      .def_readwrite("pp_rank", &NamespaceDescriptor::pp_rank)
      .def_readwrite("pp_size", &NamespaceDescriptor::pp_size)
      .def_readwrite("kv_format_version", &NamespaceDescriptor::kv_format_version)
      .def_readwrite("object_kind", &NamespaceDescriptor::object_kind)
      .def(
          "validate", [](const NamespaceDescriptor& d) { ThrowIfError(d.Validate()); },
          "Raises InvalidArgumentError naming the first bad field.")
      .def_property_readonly("block_bytes", &NamespaceDescriptor::BlockBytes)
      .def_property_readonly("layer_bytes", &NamespaceDescriptor::LayerBytes)
      .def("canonical_bytes",
           [](const NamespaceDescriptor& d) {
             ThrowIfError(d.Validate());
             std::vector<uint8_t> b = CanonicalNamespaceBytes(d);
             return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
           })
      .def("fingerprint",
           [](const NamespaceDescriptor& d) {
             ThrowIfError(d.Validate());
             return FingerprintNamespace(d);
           })
      .def("__repr__", [](const NamespaceDescriptor& d) {
        return "Namespace(model_id='" + d.model_id + "', model_revision='" + d.model_revision + "', object_kind='" +
               d.object_kind + "', block_tokens=" + std::to_string(d.block_tokens) +
               ", layer_count=" + std::to_string(d.layer_count) + ", tp=" + std::to_string(d.tp_rank) + "/" +
               std::to_string(d.tp_size) + ", pp=" + std::to_string(d.pp_rank) + "/" + std::to_string(d.pp_size) + ")";
      });

  py::class_<ChainHasher>(m, "ChainHasher", "Computes the key chain of token sequences for one namespace.")
      .def(py::init([](const NamespaceDescriptor& d) { return ValueOrThrow(ChainHasher::Create(d)); }),
           py::arg("namespace"))
      .def_property_readonly("fingerprint", &ChainHasher::fingerprint)
      .def_property_readonly("block_tokens", &ChainHasher::block_tokens)
      .def(
          "keys",
          [](const ChainHasher& h, const py::object& tokens, const py::object& cache_salt, const py::object& extras) {
            std::vector<uint32_t> t = ToTokens(tokens);
            ChainExtras e = ToExtras(cache_salt, extras);
            py::gil_scoped_release unlocked;
            return ValueOrThrow(h.Keys(t, e));
          },
          py::arg("tokens"), py::kw_only(), py::arg("cache_salt") = py::none(), py::arg("extras") = py::none(),
          "Keys of every full block of `tokens` (ints in the u32 range); a partial trailing block "
          "gets none. `cache_salt` (str or bytes) isolates a tenant or user from block 0 on; "
          "`extras[i]` lists block i's extra keys as (ExtraKind, bytes) pairs in their order in the "
          "block: multimodal content hashes overlapping it, prompt-embedding hashes (docs/KEYS.md).")
      .def(
          "extend",
          [](const ChainHasher& h, const py::object& tokens, const py::object& chain, const py::object& cache_salt,
             const py::object& extras) {
            std::vector<uint32_t> t = ToTokens(tokens);
            std::vector<BlockKey> c = ToKeys(chain);
            ChainExtras e = ToExtras(cache_salt, extras);
            if (c.size() > t.size() / h.block_tokens()) {
              throw StatusError(InvalidArgument("chain has more keys than tokens has full blocks"));
            }
            py::gil_scoped_release unlocked;
            ThrowIfError(h.Extend(t, e, c));
            return c;
          },
          py::arg("tokens"), py::arg("chain"), py::kw_only(), py::arg("cache_salt") = py::none(),
          py::arg("extras") = py::none(),
          "The keys of `chain` (the first len(chain) blocks of `tokens`) followed by "
          "those of the remaining full blocks, without rehashing the prefix; the salt and extras "
          "are those of the whole sequence, as for keys().");

  m.def(
      "external_key",
      [](const BlockKey& fingerprint, const py::object& engine_key) {
        std::string bytes = py::isinstance<py::str>(engine_key)
                                ? engine_key.cast<std::string>()
                                : static_cast<std::string>(engine_key.cast<py::bytes>());
        if (bytes.empty()) throw StatusError(InvalidArgument("empty engine key"));
        return ExternalKey(fingerprint, bytes);
      },
      py::arg("fingerprint"), py::arg("engine_key"),
      "The kvtier key of a block an engine names with its own deterministic, content-derived "
      "page key (str as UTF-8, or bytes), scoped to the namespace `fingerprint` (docs/KEYS.md).");
  m.def(
      "chain_key",
      [](const BlockKey& prev, uint32_t position, const py::object& tokens, const py::object& extras) {
        std::vector<uint32_t> t = ToTokens(tokens);
        std::vector<ExtraKey> e = extras.is_none() ? std::vector<ExtraKey>{} : ToExtraList(extras, true);
        return ChainKey(prev, position, t, e);
      },
      py::arg("prev"), py::arg("position"), py::arg("block_tokens"), py::arg("extras") = py::none(),
      "One chain link (docs/KEYS.md section 3); `extras` as (ExtraKind, bytes) pairs, the salt "
      "first for block 0. Not validated (ChainHasher.keys is).");
}

}  // namespace kvtier::python
