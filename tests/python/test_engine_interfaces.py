"""The adapters' method signatures against the engines' interfaces as
transcribed from their sources (python/kvtier/integrations/
engine_interfaces.json names the repository, file and commit), and, where an
engine is importable, against the engine itself."""

import importlib
import inspect
import json
from pathlib import Path

import pytest

import kvtier.integrations

MANIFEST = json.loads((Path(kvtier.integrations.__file__).parent / "engine_interfaces.json").read_text())

# The methods issue 15 names, which each adapter must implement itself.
REQUIRED = {
    "vllm": ["get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta", "request_finished",
             "register_kv_caches", "start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save",
             "get_finished", "get_block_ids_with_load_errors"],
    "sglang": ["get", "set", "exists", "batch_get", "batch_set", "batch_exists", "batch_get_v1", "batch_set_v1",
               "register_mem_pool_host",
               # issue 34: the hybrid controller's v2 calls
               "register_mem_host_pool_v2", "batch_exists_v2", "batch_get_v2", "batch_set_v2"],
}
ADAPTERS = {
    "vllm": ("kvtier.integrations.vllm", "KvtierConnector"),
    "sglang": ("kvtier.integrations.sglang", "KvtierStorage"),
}
ENGINE_BASES = {
    "vllm": ("vllm.distributed.kv_transfer.kv_connector.v1.base", "KVConnectorBase_V1"),
    "sglang": ("sglang.srt.mem_cache.hicache_storage", "HiCacheStorage"),
}


def adapter(engine):
    module, name = ADAPTERS[engine]
    return getattr(importlib.import_module(module), name)


def params_of(function):
    """Parameter names as the manifest writes them: no self/cls, *args and
    **kwargs with their stars; and the defaults."""
    names, defaults = [], {}
    for p in list(inspect.signature(function).parameters.values()):
        if p.name in ("self", "cls"):
            continue
        star = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        names.append(star + p.name)
        if p.default is not p.empty:
            defaults[p.name] = p.default
    return names, defaults


def own_methods(cls):
    """Methods the adapter defines or inherits from its own modules (not an
    engine's base class)."""
    out = {}
    for klass in cls.__mro__:
        if not klass.__module__.startswith("kvtier"):
            continue
        for name, value in vars(klass).items():
            if not name.startswith("_") and name not in out:
                out[name] = value
    return out


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_manifest_names_its_source(engine):
    source = MANIFEST[engine]["source"]
    assert len(source["commit"]) == 40 and source["path"].endswith(".py") and source["repo"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_adapter_implements_what_the_issue_names(engine):
    methods = MANIFEST[engine]["methods"]
    cls = adapter(engine)
    own = own_methods(cls)
    required = set(REQUIRED[engine]) | {n for n, m in methods.items() if m.get("abstract")}
    missing = sorted(n for n in required if n not in own)
    assert not missing, f"{cls.__name__} lacks {missing}"


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_adapter_signatures_match_the_engine(engine):
    methods = MANIFEST[engine]["methods"]
    cls = adapter(engine)
    mismatches = []
    for name, raw in own_methods(cls).items():
        spec = methods.get(name)
        if spec is None or isinstance(raw, property):
            continue
        kind = "classmethod" if isinstance(raw, classmethod) else (
            "staticmethod" if isinstance(raw, staticmethod) else "instance")
        if kind != spec["kind"]:
            mismatches.append(f"{name}: a {kind}, the engine declares a {spec['kind']}")
        names, defaults = params_of(getattr(cls, name))
        if names != spec["params"]:
            mismatches.append(f"{name}{tuple(names)}: the engine calls it with {tuple(spec['params'])}")
        for param, default in spec.get("defaults", {}).items():
            if defaults.get(param, "<none>") != default:
                mismatches.append(f"{name}: {param} defaults to {defaults.get(param, '<none>')!r}, "
                                  f"the engine's to {default!r}")
    assert not mismatches, "\n".join(mismatches)


def test_vllm_constructor_matches():
    names, _ = params_of(adapter("vllm").__init__)
    assert names == MANIFEST["vllm"]["constructor"]["params"]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_against_the_real_engine_when_installed(engine):
    module, name = ENGINE_BASES[engine]
    try:
        base = getattr(importlib.import_module(module), name)
    except ImportError as e:
        pytest.skip(f"{engine} is not installed here ({e}); checked against the manifest only")
    cls = adapter(engine)
    assert issubclass(cls, base)
    for method, raw in own_methods(cls).items():
        if hasattr(base, method) and callable(getattr(base, method)) and not isinstance(raw, property):
            assert params_of(getattr(cls, method))[0] == params_of(getattr(base, method))[0], method
    abstract = getattr(base, "__abstractmethods__", frozenset())
    assert not (abstract - set(own_methods(cls))), "abstract methods left unimplemented"


def test_the_vllm_harness_builds_what_the_manifest_says_vllm_builds():
    """The mini vLLM engine follows the contracts recorded per version:
    the KV tensors' dimensions, KVCacheTensor's fields and the default
    kv_load_failure_policy."""
    import dataclasses

    import mini_vllm
    from mini_vllm.kv_cache_interface import allocate_kv_caches
    from tiny_model import TinyDecoder
    current = MANIFEST["vllm_contracts"]["versions"]["0.28+"]
    model = TinyDecoder(seed=0)
    config = mini_vllm.make_kv_cache_config(model, 8)
    assert [f.name for f in dataclasses.fields(config.kv_cache_tensors[0])][:5] == current["kv_cache_tensor_fields"]
    assert mini_vllm.KVTransferConfig().kv_load_failure_policy == current["kv_load_failure_policy_default"]
    for layout in current["kv_tensor"]["layouts"]:
        caches = allocate_kv_caches(mini_vllm.make_kv_cache_config(model, 8, layout=layout), layout=layout)
        for tensor in caches.values():
            assert tensor.dim() == current["kv_tensor"]["dims"] and not tensor.is_contiguous() or layout == "LBHNC"
    older = MANIFEST["vllm_contracts"]["versions"]["before 0.28"]
    legacy = allocate_kv_caches(config, kv_cache_format="legacy_kv_first")
    assert all(t.dim() == older["kv_tensor"]["dims"] for t in legacy.values())


def test_the_vllm_harness_runs_recurrent_layers_as_the_manifest_says():
    """The Mamba contracts of the manifest, in the mini vLLM engine: the
    hybrid manager required, mamba_cache_mode "align" with prefix caching,
    the [num_blocks, 1, 1, state bytes] int8 view, and the boundary-state
    offers under each version's field (only that version's)."""
    import mini_vllm
    from tiny_model import TinyHybridRecurrent, make_deterministic
    mamba = MANIFEST["vllm_contracts"]["versions"]["0.28+"]["mamba"]
    make_deterministic()
    model = TinyHybridRecurrent(seed=0)
    assert mini_vllm.CacheConfig().mamba_cache_mode == mamba["mamba_cache_mode_default"]
    engine = mini_vllm.MiniEngine(model)
    assert engine.vllm_config.cache_config.mamba_cache_mode == mamba["mamba_cache_mode_with_prefix_caching"].split()[0]
    (view,) = [engine.kv_caches[n] for n in engine.kv_caches if n.endswith("mixer")]
    assert view.dim() == mamba["kv_tensor"]["dims"]
    assert str(view.dtype) == "torch." + mamba["kv_tensor"]["dtype"].split()[0]
    assert tuple(view.shape[1:]) == (1, 1, model.state_bytes)
    with pytest.raises(ValueError):  # the hybrid manager is required
        mini_vllm.MiniEngine(model, mini_vllm.make_vllm_config(model, kv_connector=None,
                                                               disable_hybrid_kv_cache_manager=True))

    class Producer(mini_vllm.KVConnectorBase_V1, mini_vllm.SupportsHMA):
        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            return 0, False

        def update_state_after_alloc(self, request, blocks, num_external_tokens):
            pass

        def build_connector_meta(self, scheduler_output):
            return mini_vllm.KVConnectorMetadata()

        def request_finished_all_groups(self, request, block_ids):
            return False, None

        def start_load_kv(self, forward_context, **kwargs):
            pass

        def wait_for_layer_load(self, layer_name):
            pass

        def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
            pass

        def wait_for_save(self):
            pass

    fields = mamba["boundary_state_offers"]["field"]
    for version, path in fields.items():
        cfg = mini_vllm.make_vllm_config(model, vllm_version=version)
        engine = mini_vllm.MiniEngine(model, cfg, None, Producer)
        mini_vllm.run_request(engine, list(range(1, 20)), 1, "r")
        offers = []
        for record in engine.history:
            value = record.scheduler_output
            for part in path.split("."):
                value = getattr(value, part) if value is not None else None
            offers.append(value)
            for other in fields.values():
                if other != path:
                    assert not hasattr(record.scheduler_output, other.split(".")[0])
        # 19 prompt tokens: a first chunk of 16 ends on the boundary, the offer names its state block.
        first = engine.history[0].scheduler_output
        assert first.num_scheduled_tokens == {"r": 16}
        assert offers[0] == {"r": [(1, first.scheduled_new_reqs[0].block_ids[1][-1], 16)]}
        assert not any(offers[1:])


def test_the_sglang_stand_in_has_the_v2_types_and_pools_the_manifest_records():
    """sglang_fakes.py builds what SGLang builds: PoolTransfer and
    PoolTransferResult with SGLang's fields, PoolName/PoolHitPolicy members,
    a MambaPoolHost with page_size 1 and [size, layers, 1, *shape] buffers
    whose page meta lists temporal then conv_i, and v2 defaults that raise."""
    import dataclasses

    import sglang_fakes as fakes
    import torch
    spec = MANIFEST["sglang"]
    types_ = spec["related_types"]
    for name in ("PoolTransfer", "PoolTransferResult"):
        want = [f["name"] for f in types_[name]["fields"]]
        assert [f.name for f in dataclasses.fields(getattr(fakes, name))] == want, name
    assert {m.name: m.value for m in fakes.PoolName} == types_["PoolName"]["members"]
    assert {m.name: m.value for m in fakes.PoolHitPolicy} == types_["PoolHitPolicy"]["members"]
    for method in ("batch_exists_v2", "batch_get_v2", "batch_set_v2"):
        assert spec["methods"][method]["default_behavior"] == "raise NotImplementedError()"
        assert params_of(getattr(fakes.HiCacheStorage, method))[0] == spec["methods"][method]["params"]
    mamba = spec["host_pools"]["kinds"]["MambaPoolHost"]
    pool = fakes.MambaPoolHost(size=4, layers=2, temporal_shape=(3,), conv_shapes=((2, 2),))
    assert pool.page_size == mamba["page_size"] and pool.layout in mamba["layouts"]
    assert tuple(pool.temporal_buffer.shape) == (4, 2, 1, 3) and tuple(pool.conv_buffer[0].shape) == (4, 2, 1, 2, 2)
    ptrs, sizes = pool.get_page_buffer_meta(torch.tensor([3]))
    assert ptrs == [pool.temporal_buffer[3].data_ptr(), pool.conv_buffer[0][3].data_ptr()]
    assert sizes == [t[3].numel() * t.element_size() for t in (pool.temporal_buffer, pool.conv_buffer[0])]
    conv_only = fakes.MambaPoolHost(temporal_shape=(0,))
    assert len(conv_only.get_page_buffer_meta(torch.tensor([0]))[0]) == len(conv_only.conv_buffer)
