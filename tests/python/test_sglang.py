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
import time
from pathlib import Path

import pytest
import torch

import kvtier
from sglang_fakes import (HybridController, MambaPoolHost, MHAHostPool, MHATokenToKVPoolFP4Host, MLAHostPool,
                          PoolHitPolicy, PoolName, PoolTransfer, fresh_adapter, host_indices,
                          load_dynamic_backend, page_keys, storage_config)

MODULE = "kvtier.integrations.sglang"
INTERFACES = Path(__file__).resolve().parents[2] / "python/kvtier/integrations/engine_interfaces.json"


@pytest.fixture
def sglang(monkeypatch):
    """Fake SGLang modules; the adapter is imported afresh so it subclasses
    the fake HiCacheStorage ABC. Restores sys.modules afterwards."""
    yield from fresh_adapter(monkeypatch, MODULE)


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


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_exists_stops_at_the_first_missing_page_and_a_missing_v_is_a_miss(daemon, sglang, layout):
    pool = MHAHostPool(layout)
    pool.fill_random(seed=2)
    store = backend(daemon, pool)
    keys = keys_for(4)
    assert store.batch_set_v1([keys[0], keys[1], keys[3]], host_indices([0, 1, 3], 4)) == [True] * 3
    assert store.batch_exists(keys) == 2
    assert store.exists(keys[3]) and not store.exists(keys[2])

    ns = documented_namespace(layout)
    v1 = kvtier.external_key(ns.fingerprint(), keys[1] + "_v")
    with kvtier.Client(daemon.socket_path, [ns]) as c:
        assert c.erase(0, [v1]) == 1
        assert store.batch_exists(keys) == 1
        c.put(0, v1, b"short")  # a V object of the wrong size is no page either

        before = pool.page_bytes(6)
        assert store.batch_get_v1(keys, host_indices([4, 5, 6, 7], 4)) == [True, False, False, True]
        assert pool.page_bytes(4) == pool.page_bytes(0) and pool.page_bytes(7) == pool.page_bytes(3)
        assert pool.page_bytes(6) == before  # a missing page writes nothing
        # layer_first reads by pinning: no pin outlives the get (the unpins
        # go out with the connection's next request, or within about 1 ms)
        store.batch_exists(keys)
        deadline = time.monotonic() + 5
        while c.stats()["engine.pinned_blocks"] != 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert c.stats()["engine.pinned_blocks"] == 0


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


# ---- v2: HostPoolGroup pools (batch_exists_v2 / batch_get_v2 / batch_set_v2) ----


def hybrid(daemon, kv_pool, mamba_pool, *, tp_rank=0, tp_size=1, is_mla=False, **kw):
    """A backend attached the way HybridCacheController attaches it."""
    e = extra(daemon, **kw)
    store = adapter_class()(storage_config(e, tp_rank, tp_size, is_mla, kv_pool.layout), {})
    controller = HybridController(store, kv_pool, [(PoolName.MAMBA, mamba_pool)], tp_rank=tp_rank, is_mla=is_mla)
    controller.attach()
    return store, controller


@pytest.mark.parametrize("kv_kind", ["mha", "mla"])
def test_v2_backup_then_prefetch_into_another_pool_set_copies_kv_and_mamba_state(daemon, sglang, kv_kind):
    new_kv = MLAHostPool if kv_kind == "mla" else MHAHostPool
    kv_a, kv_b, m_a, m_b = new_kv(), new_kv(), MambaPoolHost(), MambaPoolHost()
    kv_a.fill_random(seed=11)
    m_a.fill_random(seed=12)
    keys = keys_for(3)
    _, writer = hybrid(daemon, kv_a, m_a, is_mla=kv_kind == "mla")
    assert writer.backup(keys, [4, 0, 6], mamba_slot=2) == ({PoolName.MAMBA: 1}, 3)

    _, reader = hybrid(daemon, kv_b, m_b, is_mla=kv_kind == "mla")
    result, done, pool_hits = reader.prefetch(keys, [1, 7, 2], mamba_slot=5)
    assert (result.kv_hit_pages, done, pool_hits) == (3, 3, {PoolName.MAMBA: 1})
    assert result.restorable_prefix_pages == [3] and result.extra_pool_hit_pages[PoolName.MAMBA] == 3
    for s, d in zip([4, 0, 6], [1, 7, 2]):
        assert kv_b.page_bytes(d) == kv_a.page_bytes(s)
    assert m_b.state_bytes(5) == m_a.state_bytes(2)
    assert all(m_b.state_bytes(slot) == bytes(len(m_b.state_bytes(slot))) for slot in range(6) if slot != 5)


def test_v2_exists_needs_the_state_at_the_end_of_the_prefix(daemon, sglang):
    kv, mamba = MHAHostPool(), MambaPoolHost()
    kv.fill_random(seed=13)
    mamba.fill_random(seed=14)
    store, controller = hybrid(daemon, kv, mamba)
    keys = keys_for(5)
    placeholder = [PoolTransfer(PoolName.MAMBA, keys=["__placeholder__"], hit_policy=PoolHitPolicy.TRAILING_PAGES)]
    assert controller.backup(keys[:4], [0, 1, 2, 3]) == ({}, 4)  # KV only: no state anywhere
    assert store.batch_exists(keys) == 4
    assert store.batch_exists_v2(keys, placeholder).kv_hit_pages == 0  # KV alone is no hybrid hit
    assert controller.backup(keys[:2], [0, 1], mamba_slot=0)[0] == {PoolName.MAMBA: 1}  # state after page 2
    got = store.batch_exists_v2(keys, placeholder)
    assert (got.kv_hit_pages, got.extra_pool_hit_pages) == (2, {PoolName.KV: 4, PoolName.MAMBA: 2})
    assert controller.backup(keys[:4], [0, 1, 2, 3], mamba_slot=1)[0] == {PoolName.MAMBA: 1}
    assert store.batch_exists_v2(keys, placeholder).kv_hit_pages == 4  # the longest prefix with its state
    window = [PoolTransfer(PoolName.MAMBA, keys=["a", "b"], hit_policy=PoolHitPolicy.TRAILING_PAGES)]
    assert store.batch_exists_v2(keys, window).kv_hit_pages == 0  # states after pages 3 and 4: only 4 stored
    all_pages = [PoolTransfer(PoolName.MAMBA, hit_policy=PoolHitPolicy.ALL_PAGES)]
    assert store.batch_exists_v2(keys, all_pages).kv_hit_pages == 0  # page 1 has no state
    assert store.batch_exists_v2(keys, []).kv_hit_pages == 4
    # A state whose KV pages are gone is no hit either.
    ns = documented_namespace()
    with kvtier.Client(daemon.socket_path, [ns]) as c:
        assert c.erase(0, [kvtier.external_key(ns.fingerprint(), keys[2] + "_k")]) == 1
    assert store.batch_exists_v2(keys, placeholder).kv_hit_pages == 2
    # What the controller then reads: the KV prefix and the state of its last page.
    result, done, pool_hits = controller.prefetch(keys, [4, 5, 6, 7, 0], mamba_slot=3)
    assert (result.kv_hit_pages, done, pool_hits) == (2, 2, {PoolName.MAMBA: 1})
    assert mamba.state_bytes(3) == mamba.state_bytes(0)


def test_v2_a_state_of_another_tp_rank_or_revision_is_no_hit(daemon, sglang):
    kv, mamba = MHAHostPool(), MambaPoolHost()
    kv.fill_random(seed=15)
    mamba.fill_random(seed=16)
    keys = keys_for(2)
    placeholder = [PoolTransfer(PoolName.MAMBA, keys=["x"], hit_policy=PoolHitPolicy.TRAILING_PAGES)]
    _, rank0 = hybrid(daemon, kv, mamba, tp_rank=0, tp_size=2)
    assert rank0.backup(keys, [0, 1], mamba_slot=4) == ({PoolName.MAMBA: 1}, 2)
    control, _ = hybrid(daemon, MHAHostPool(), MambaPoolHost(), tp_rank=0, tp_size=2)
    assert control.batch_exists_v2(keys, placeholder).kv_hit_pages == 2
    rank1, _ = hybrid(daemon, MHAHostPool(), MambaPoolHost(), tp_rank=1, tp_size=2)
    assert rank1.batch_exists_v2(keys, placeholder).kv_hit_pages == 0
    states = [PoolTransfer(PoolName.MAMBA, host_indices=torch.tensor([0]), keys=keys[-1:])]
    assert rank1.batch_get_v2(states) == {PoolName.MAMBA: [False]}
    other, _ = hybrid(daemon, MHAHostPool(), MambaPoolHost(), tp_rank=0, tp_size=2, revision="rev-2")
    assert other.batch_exists_v2(keys, placeholder).kv_hit_pages == 0
    # The state is not in the KV namespace either: a hit needs both.
    assert control.batch_exists_v2(keys_for(2, first_token=100), placeholder).kv_hit_pages == 0


def test_v2_mla_kv_is_written_by_rank_0_only_and_the_mamba_state_by_every_rank(daemon, sglang):
    kv, m0, m1 = MLAHostPool(), MambaPoolHost(), MambaPoolHost()
    kv.fill_random(seed=17)
    m0.fill_random(seed=18)
    m1.fill_random(seed=19)
    keys = keys_for(2)
    placeholder = [PoolTransfer(PoolName.MAMBA, keys=["x"], hit_policy=PoolHitPolicy.TRAILING_PAGES)]
    s1, rank1 = hybrid(daemon, kv, m1, tp_rank=1, tp_size=2, is_mla=True)
    assert rank1.backup(keys, [0, 1], mamba_slot=1) == ({PoolName.MAMBA: 1}, 0)  # the MLA KV is skipped
    assert s1.batch_exists(keys) == 0 and s1.batch_exists_v2(keys, placeholder).kv_hit_pages == 0
    s0, rank0 = hybrid(daemon, kv, m0, tp_rank=0, tp_size=2, is_mla=True)
    assert rank0.backup(keys, [0, 1], mamba_slot=3) == ({PoolName.MAMBA: 1}, 2)
    assert s1.batch_exists_v2(keys, placeholder).kv_hit_pages == 2  # rank 0's KV, rank 1's own state
    reader_kv, reader_m = MLAHostPool(), MambaPoolHost()
    _, reader = hybrid(daemon, reader_kv, reader_m, tp_rank=1, tp_size=2, is_mla=True)
    assert reader.prefetch(keys, [5, 6], mamba_slot=0)[1:] == (2, {PoolName.MAMBA: 1})
    assert reader_kv.page_bytes(5) == kv.page_bytes(0) and reader_m.state_bytes(0) == m1.state_bytes(1)
    # An MLA-class sidecar pool (a draft pool) is replicated too: rank 1 reports it stored without writing.
    draft0, draft1 = MLAHostPool(), MLAHostPool()
    draft0.fill_random(seed=20)
    draft1.fill_random(seed=20)
    s1.register_mem_host_pool_v2(draft1, PoolName.DRAFT)
    s0.register_mem_host_pool_v2(draft0, PoolName.DRAFT)
    t = PoolTransfer(PoolName.DRAFT, host_indices=host_indices([2], 4), keys=keys[:1])
    assert s1.batch_set_v2([t]) == {PoolName.DRAFT: [True]} and s1.get_stats()["pages_set_skipped"] >= 1
    assert s0.batch_exists_v2(keys[:1], [PoolTransfer(PoolName.DRAFT)]).kv_hit_pages == 0
    assert s0.batch_set_v2([t]) == {PoolName.DRAFT: [True]}
    assert s1.batch_exists_v2(keys[:1], [PoolTransfer(PoolName.DRAFT)]).kv_hit_pages == 1
    back = PoolTransfer(PoolName.DRAFT, host_indices=host_indices([7], 4), keys=keys[:1])
    assert s1.batch_get_v2([back]) == {PoolName.DRAFT: [True]} and draft1.page_bytes(7) == draft0.page_bytes(2)
    # The draft pages are not the target's: the KV namespace does not see them, nor they the KV pages.
    assert s1.batch_exists_v2(keys_for(1, first_token=50), [PoolTransfer(PoolName.DRAFT)]).kv_hit_pages == 0


def test_v2_an_unsupported_pool_is_refused_at_registration(daemon, sglang):
    e = extra(daemon)
    store = adapter_class()(storage_config(e), {})
    with pytest.raises(ValueError, match="MHATokenToKVPoolFP4Host is not supported"):
        store.register_mem_pool_host(MHATokenToKVPoolFP4Host())
    store = backend(daemon, MHAHostPool())
    with pytest.raises(ValueError, match="MHATokenToKVPoolFP4Host is not supported"):
        store.register_mem_host_pool_v2(MHATokenToKVPoolFP4Host(), PoolName.SWA)
    with pytest.raises(ValueError, match="is not supported"):
        store.register_mem_host_pool_v2(object(), PoolName.INDEXER)
    with pytest.raises(ValueError, match="layout 'layer_first'"):
        store.register_mem_host_pool_v2(MHAHostPool("layer_first"), PoolName.SWA)
    with pytest.raises(ValueError, match="is_mla_model"):
        backend(daemon, MLAHostPool(), is_mla=False)
    with pytest.raises(ValueError, match="not the one"):
        store.register_mem_host_pool_v2(MHAHostPool(), PoolName.KV)
    # A transfer for a pool never registered is a miss, not an exception.
    t = PoolTransfer(PoolName.INDEXER, host_indices=host_indices([0], 4), keys=keys_for(1))
    assert store.batch_get_v2([t]) == {PoolName.INDEXER: [False]}
    assert store.batch_set_v2([t]) == {PoolName.INDEXER: [False]}
    assert store.batch_exists_v2(keys_for(1), [t]).kv_hit_pages == 0


def test_v2_methods_answer_in_shape_before_registration_and_while_the_daemon_is_down(daemon, sglang):
    keys = keys_for(3)
    placeholder = [PoolTransfer(PoolName.MAMBA, keys=["x"], hit_policy=PoolHitPolicy.TRAILING_PAGES)]
    state = PoolTransfer(PoolName.MAMBA, host_indices=torch.tensor([0]), keys=keys[-1:])
    kv_t = PoolTransfer(PoolName.KV, host_indices=host_indices([0, 1, 2], 4), keys=keys)
    early = adapter_class()(storage_config(extra(daemon)), {})
    assert early.batch_exists_v2(keys, placeholder).kv_hit_pages == 0
    assert early.batch_get_v2([state, kv_t]) == {PoolName.MAMBA: [False], PoolName.KV: [False] * 3}
    assert early.batch_set_v2([state]) == {PoolName.MAMBA: [False]}

    kv, mamba = MHAHostPool(), MambaPoolHost()
    kv.fill_random(seed=21)
    mamba.fill_random(seed=22)
    store, controller = hybrid(daemon, kv, mamba)
    assert store.batch_set_v2([state, kv_t]) == {PoolName.MAMBA: [True], PoolName.KV: [True] * 3}
    assert store.batch_exists_v2(keys, placeholder).kv_hit_pages == 3
    bad = PoolTransfer(PoolName.MAMBA, host_indices=torch.tensor([0, 1]), keys=keys[-1:])  # 2 slots, 1 key
    assert store.batch_set_v2([bad]) == {PoolName.MAMBA: [False]}
    daemon.stop()
    assert store.batch_exists_v2(keys, placeholder).kv_hit_pages in (0, 3)  # the block directory may answer
    assert store.batch_get_v2([state, kv_t]) == {PoolName.MAMBA: [False], PoolName.KV: [False] * 3}
    assert store.batch_set_v2([state]) == {PoolName.MAMBA: [False]}
    assert controller.prefetch(keys, [3, 4, 5], mamba_slot=2)[1:] == (0, {})
    daemon.start()
    assert store.batch_set_v2([state]) == {PoolName.MAMBA: [True]}
    assert store.batch_get_v2([PoolTransfer(PoolName.MAMBA, host_indices=torch.tensor([4]), keys=keys[-1:])]) == {
        PoolName.MAMBA: [True]}
    assert mamba.state_bytes(4) == mamba.state_bytes(0)


def test_v2_conv_only_mamba_pool_stores_its_conv_states(daemon, sglang):
    kv, a, b = MHAHostPool(), MambaPoolHost(temporal_shape=(0,)), MambaPoolHost(temporal_shape=(0,))
    a.fill_random(seed=23)
    store, _ = hybrid(daemon, kv, a)
    keys = keys_for(1)
    assert store.batch_set_v2([PoolTransfer(PoolName.MAMBA, host_indices=torch.tensor([1]), keys=keys)]) == {
        PoolName.MAMBA: [True]}
    reader, _ = hybrid(daemon, MHAHostPool(), b)
    assert reader.batch_get_v2([PoolTransfer(PoolName.MAMBA, host_indices=torch.tensor([3]), keys=keys)]) == {
        PoolName.MAMBA: [True]}
    assert b.state_bytes(3) == a.state_bytes(1) and len(a.state_bytes(1)) > 0
    store.clear()  # erases the objects it stored, in every namespace
    assert reader.batch_get_v2([PoolTransfer(PoolName.MAMBA, host_indices=torch.tensor([2]), keys=keys)]) == {
        PoolName.MAMBA: [False]}


def test_v2_exists_finds_a_state_far_below_the_kv_prefix(daemon, sglang):
    """More stop points than one scan chunk: the state after page 3 of 70."""
    kv, mamba = MHAHostPool(page_num=72), MambaPoolHost()
    kv.fill_random(seed=24)
    mamba.fill_random(seed=25)
    store, controller = hybrid(daemon, kv, mamba)
    keys = keys_for(70)
    assert controller.backup(keys, list(range(70))) == ({}, 70)
    assert controller.backup(keys[:3], [0, 1, 2], mamba_slot=1)[0] == {PoolName.MAMBA: 1}
    placeholder = [PoolTransfer(PoolName.MAMBA, keys=["x"], hit_policy=PoolHitPolicy.TRAILING_PAGES)]
    for _ in range(2):  # the lookups left in flight by the first answer do not disturb the next
        got = store.batch_exists_v2(keys, placeholder)
        assert (got.kv_hit_pages, got.restorable_prefix_pages) == (3, [3])
    assert controller.backup(keys[:67], list(range(67)), mamba_slot=2)[0] == {PoolName.MAMBA: 1}
    assert store.batch_exists_v2(keys, placeholder).kv_hit_pages == 67
