"""kvtier.integrations.sglang.KvtierStorage against a real kvtierd, loaded
the way SGLang's dynamic backend factory loads it (sglang_fakes.py), with
fake host pools whose bytes are checked page by page."""

import importlib
import importlib.util
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kvtier
from sglang_fakes import (MHAHostPool, MLAHostPool, host_indices, install_fake_sglang, load_dynamic_backend,
                          page_keys, storage_config)

MODULE = "kvtier.integrations.sglang"
INTERFACES = Path(__file__).resolve().parents[2] / "python/kvtier/integrations/engine_interfaces.json"


@pytest.fixture
def sglang(monkeypatch):
    """Fake SGLang modules; the adapter is imported afresh so it subclasses
    the fake HiCacheStorage ABC. Restores sys.modules afterwards."""
    install_fake_sglang(monkeypatch)
    package = importlib.import_module("kvtier.integrations")
    saved = sys.modules.pop(MODULE, None)
    monkeypatch.setattr(package, "sglang", saved, raising=False)
    yield
    sys.modules.pop(MODULE, None)
    if saved is not None:
        sys.modules[MODULE] = saved


def adapter_class():
    return importlib.import_module(MODULE).KvtierStorage


def extra(daemon, revision="rev-1", v1=1, **more):
    return dict(backend_name="kvtier", module_path=MODULE, class_name="KvtierStorage", interface_v1=v1,
                socket_path=daemon.socket_path, model_revision=revision, reconnect_interval_s=0, **more)


def backend(daemon, pool, *, tp_rank=0, tp_size=1, is_mla=False, **kw):
    e = extra(daemon, **kw)
    return load_dynamic_backend(e, storage_config(e, tp_rank, tp_size, is_mla, pool.layout), pool)


def documented_namespace(layout="page_first"):
    """The namespace the module docstring promises for an MHAHostPool()."""
    return kvtier.Namespace(model_id="org/model", model_revision="rev-1", kv_dtype="bf16", block_tokens=4,
                            layer_count=3, bytes_per_token_per_layer=2 * 2 * 8 * 2, kv_layout=f"sglang_{layout}_kv")


def stored_object(daemon, layout, engine_key):
    """The bytes kvtierd holds under the documented key, read by another client."""
    ns = documented_namespace(layout)
    with kvtier.Client(daemon.socket_path, [ns]) as c:
        out = bytearray(1 << 16)
        return bytes(out[:c.get(0, kvtier.external_key(ns.fingerprint(), engine_key), out)])


def keys_for(n, first_token=0, page_size=4):
    return page_keys(list(range(first_token, first_token + n * page_size)), page_size)


@pytest.mark.parametrize("layout", ["page_first", "page_first_direct", "layer_first"])
def test_backup_then_prefetch_into_an_empty_pool_copies_the_bytes(daemon, sglang, layout):
    a, b = MHAHostPool(layout), MHAHostPool(layout)
    a.fill_random(seed=1)
    keys = keys_for(3)
    src, dst = [5, 1, 6], [0, 7, 3]  # non-contiguous, different slots in each pool
    store = backend(daemon, a)
    assert store.batch_set_v1(keys, host_indices(src, 4)) == [True] * 3
    assert store.batch_set_v1(keys, host_indices(src, 4)) == [True] * 3  # already cached: success

    for page, slot in enumerate(src):  # K then V, as get_page_buffer_meta orders them
        assert stored_object(daemon, layout, keys[page] + "_k") == a.component_bytes(slot, 0)
        assert stored_object(daemon, layout, keys[page] + "_v") == a.component_bytes(slot, 1)

    reader = backend(daemon, b)
    assert reader.batch_exists(keys) == 3
    assert reader.batch_get_v1(keys, host_indices(dst, 4)) == [True] * 3
    for s, d in zip(src, dst):
        assert b.page_bytes(d) == a.page_bytes(s)
    untouched = [slot for slot in range(8) if slot not in dst]
    assert all(b.page_bytes(slot) == bytes(len(b.page_bytes(slot))) for slot in untouched)
    stats = reader.get_stats()
    assert stats["pages_hit"] == 3 and stats["bytes_read"] == 3 * len(a.page_bytes(0))
    assert isinstance(stats, sys.modules["sglang.srt.metrics.collector"].StorageMetrics)
    assert stats.prefetch_pgs == [3] and reader.get_stats().prefetch_pgs == []  # samples reset per call


def test_exists_stops_at_the_first_missing_page_and_a_missing_v_is_a_miss(daemon, sglang):
    pool = MHAHostPool()
    pool.fill_random(seed=2)
    store = backend(daemon, pool)
    keys = keys_for(4)
    assert store.batch_set_v1([keys[0], keys[1], keys[3]], host_indices([0, 1, 3], 4)) == [True] * 3
    assert store.batch_exists(keys) == 2
    assert store.exists(keys[3]) and not store.exists(keys[2])

    ns = documented_namespace()
    v1 = kvtier.external_key(ns.fingerprint(), keys[1] + "_v")
    with kvtier.Client(daemon.socket_path, [ns]) as c:
        assert c.erase(0, [v1]) == 1
        assert store.batch_exists(keys) == 1
        c.put(0, v1, b"short")  # a V object of the wrong size is no page either

    before = pool.page_bytes(6)
    assert store.batch_get_v1(keys, host_indices([4, 5, 6, 7], 4)) == [True, False, False, True]
    assert pool.page_bytes(4) == pool.page_bytes(0) and pool.page_bytes(7) == pool.page_bytes(3)
    assert pool.page_bytes(6) == before  # a missing page writes nothing


def test_tp_ranks_revisions_and_layouts_do_not_share_pages(daemon, sglang):
    pool = MHAHostPool()
    pool.fill_random(seed=3)
    keys = keys_for(2)
    assert backend(daemon, pool, tp_rank=0, tp_size=2).batch_set_v1(keys, host_indices([0, 1], 4)) == [True] * 2
    assert backend(daemon, MHAHostPool(), tp_rank=0, tp_size=2).batch_exists(keys) == 2  # control
    assert backend(daemon, MHAHostPool(), tp_rank=1, tp_size=2).batch_exists(keys) == 0
    assert backend(daemon, MHAHostPool(), tp_rank=0, tp_size=2, revision="rev-2").batch_exists(keys) == 0
    assert backend(daemon, MHAHostPool("layer_first"), tp_rank=0, tp_size=2).batch_exists(keys) == 0
    other = backend(daemon, MHAHostPool(), tp_rank=1, tp_size=2)
    assert other.batch_get_v1(keys, host_indices([0, 1], 4)) == [False, False]


def test_mla_only_rank_0_writes_and_other_ranks_read_its_pages(daemon, sglang):
    pool = MLAHostPool()
    pool.fill_random(seed=4)
    keys = keys_for(2)
    rank0 = backend(daemon, pool, tp_rank=0, tp_size=2, is_mla=True)
    rank1 = backend(daemon, pool, tp_rank=1, tp_size=2, is_mla=True)
    assert rank1.batch_set_v1(keys, host_indices([2, 3], 4)) == [True] * 2  # skipped, reported stored
    assert rank0.batch_exists(keys) == 0 and rank1.get_stats()["pages_set_skipped"] == 2
    assert rank0.batch_set_v1(keys, host_indices([2, 3], 4)) == [True] * 2
    reader = MLAHostPool()
    rank1 = backend(daemon, reader, tp_rank=1, tp_size=2, is_mla=True)
    assert rank1.batch_exists(keys) == 2
    assert rank1.batch_get_v1(keys, host_indices([6, 0], 4)) == [True] * 2
    assert reader.page_bytes(6) == pool.page_bytes(2) and reader.page_bytes(0) == pool.page_bytes(3)


def test_generic_path_stores_flat_pages_and_misses_are_none(daemon, sglang):
    a, b = MHAHostPool(), MHAHostPool()
    a.fill_random(seed=5)
    store = backend(daemon, a, v1=0)
    keys = keys_for(3)
    # HiCacheController._generic_page_set / _generic_page_get.
    assert store.batch_set(keys[:2], [a.get_data_page(i * 4) for i in (2, 4)]) is True
    got = store.batch_get(keys, [b.get_dummy_flat_data_page() for _ in keys])
    assert got[2] is None and all(isinstance(t, torch.Tensor) for t in got[:2])
    for t, slot in zip(got[:2], (1, 5)):
        b.set_from_flat_data_page(slot * 4, t)
    assert b.page_bytes(1) == a.page_bytes(2) and b.page_bytes(5) == a.page_bytes(4)
    assert store.get(keys[2], b.get_dummy_flat_data_page()) is None and not store.exists(keys[2])
    assert store.set(keys[2], a.get_data_page(0)) is True and store.exists(keys[2])
    page = store.get(keys[2], b.get_dummy_flat_data_page())
    assert torch.equal(page.view(torch.int16), a.get_data_page(0).view(torch.int16))
    assert store.batch_exists(keys) == 3
    assert backend(daemon, b).batch_exists(keys) == 0  # the zero-copy path stores other objects
    store.clear()
    assert store.batch_exists(keys) == 0


def test_results_keep_their_shape_before_registration_and_after_the_daemon_stops(daemon, sglang):
    pool = MHAHostPool()
    pool.fill_random(seed=6)
    keys = keys_for(3)
    idx = host_indices([0, 1, 2], 4)
    e = extra(daemon)
    no_revision = {k: v for k, v in e.items() if k != "model_revision"}
    with pytest.raises(ValueError, match="model_revision"):
        load_dynamic_backend(no_revision, storage_config(no_revision), pool)
    early = adapter_class()(storage_config(e), {})
    assert early.batch_get_v1(keys, idx) == [False] * 3 and early.batch_set_v1(keys, idx) == [False] * 3
    assert early.batch_exists(keys) == 0 and early.get(keys[0]) is None and early.set(keys[0], b"x") is False

    store = backend(daemon, pool)
    assert store.batch_set_v1(keys, idx[:8]) == [False] * 3  # a bad call: still one bool per key
    assert store.batch_get_v1(keys, idx[:8]) == [False] * 3
    assert store.batch_set_v1(keys[:1], idx[:4]) == [True]
    daemon.stop()
    assert store.batch_set_v1(keys, idx) == [False] * 3
    assert store.batch_get_v1(keys, idx) == [False] * 3
    assert store.batch_exists(keys) in (0, 1)  # the block directory may still answer
    assert store.batch_get(keys, [pool.get_dummy_flat_data_page() for _ in keys]) == [None] * 3
    assert store.batch_set(keys, [pool.get_data_page(0) for _ in keys]) is False
    assert store.get_stats()["errors"] >= 4
    daemon.start()  # a new daemon on the same socket: the backend reconnects
    assert store.batch_set_v1(keys, idx) == [True] * 3 and store.batch_exists(keys) == 3


def test_method_signatures_match_sglang(sglang):
    spec = json.loads(INTERFACES.read_text())["sglang"]
    cls = adapter_class()
    init = list(inspect.signature(cls.__init__).parameters.values())[1:]
    assert [p.name for p in init] == spec["constructor"]["params_as_called"] and init[1].default is None
    implemented = [name for name in spec["methods"] if name in cls.__dict__]
    assert {"register_mem_pool_host", "batch_get_v1", "batch_set_v1", "get", "batch_get", "set", "batch_set",
            "exists", "batch_exists", "clear", "get_stats"} <= set(implemented)
    for name in implemented:
        want = spec["methods"][name]
        params = list(inspect.signature(getattr(cls, name)).parameters.values())[1:]
        assert [p.name for p in params] == want["params"], name
        defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
        assert defaults == want.get("defaults", {}), name


@pytest.mark.skipif(importlib.util.find_spec("sglang") is not None, reason="SGLang is installed")
def test_module_imports_without_sglang_and_without_torch():
    code = ("import sys, kvtier.integrations.sglang as m; "
            "assert 'torch' not in sys.modules and 'sglang' not in sys.modules; "
            "assert m.KvtierStorage.__mro__[1] is object")
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ))
