"""A real (tiny) model reuses its prefix through SGLang's HiCache path and
KvtierStorage, bit for bit.

TinyDecoder and TinyMLA (tiny_model.py) run in mini_sglang.MiniSGLang: a
device MHA/MLATokenToKVPool, a page_first host pool and HiCacheController's storage
calls (interface_v1: batch_set_v1 / batch_exists / batch_get_v1). Engine A
prefills request 1 and backs its full pages up device -> host -> kvtier.
Engine B (fresh pools, the same weights, its own KvtierStorage on the same
kvtierd) gets request 2 sharing the prefix: it prefetches the pages from
kvtier into its host pool, loads them into device slots and computes only
the suffix. Its logits and KV must equal, by torch.equal, engine A's run of
request 2 from its own device pages (its radix-tree hit), and its greedy
tokens a full recompute; a changed stored byte must break that, and
another model revision must never hit."""

import pytest
import torch

import kvtier
from mini_sglang import MiniSGLang
from model_fixtures import deterministic, mla_model, model, prompt  # noqa: F401 (fixtures)
from sglang_fakes import fresh_adapter, load_dynamic_backend, page_keys, storage_config
from tiny_model import KVCache, greedy_generate

MODULE = "kvtier.integrations.sglang"
SHARED = prompt(40, 18)          # four 4-token pages and 2 more tokens
P1 = SHARED + prompt(41, 3)
P2 = SHARED + prompt(42, 6)
NEW_TOKENS = 4
PREFIX_TOKENS = 16


@pytest.fixture
def sglang(monkeypatch):
    """Fake SGLang modules; the adapter is imported afresh so it subclasses
    the fake HiCacheStorage ABC (as test_sglang.py does)."""
    yield from fresh_adapter(monkeypatch, MODULE)


@pytest.fixture(params=["mha", "mla"])
def tiny(request):
    """TinyDecoder (MHA pools) or TinyMLA (MLA pools)."""
    return request.getfixturevalue("model" if request.param == "mha" else "mla_model")


def is_mla(model):
    return getattr(model, "use_mla", False)


def engine(model, daemon, revision="rev-1"):
    """A MiniSGLang whose storage is KvtierStorage, loaded by the dynamic factory."""
    e = MiniSGLang(model)
    extra = dict(backend_name="kvtier", module_path=MODULE, class_name="KvtierStorage", interface_v1=1,
                 socket_path=daemon.socket_path, model_revision=revision, reconnect_interval_s=0)
    config = storage_config(extra, is_mla=is_mla(model), model=f"tiny/{type(model).__name__}")
    e.storage = load_dynamic_backend(extra, config, e.host_pool)
    return e


def request_kv(e, n_tokens):
    """[layers, planes, tokens, heads, width]: K and V, or the MLA latent."""
    return KVCache.gather_tokens(e.device.kv_caches, e.last["block_table"], n_tokens, e.page_size,
                                 kv_format="legacy_kv_first")


def run_both(model, daemon, revision="rev-1", change=None):
    """Engine A serves request 1 (and backs it up), then request 2 from its
    own device pages (the reference, not backed up); `change` may rewrite
    the store; engine B serves request 2 from storage. Returns (B, B's
    result, A's): (tokens, per-step logits, request 2's K/V)."""
    a = engine(model, daemon)
    a.generate(P1, 2)
    assert a.storage.get_stats()["pages_set"] == len(P1) // 4  # every full prompt page backed up
    ref = a.generate(P2, NEW_TOKENS, backup=False) + (request_kv(a, len(P2)),)
    assert a.last["local_hit_tokens"] == PREFIX_TOKENS and a.last["computed_tokens"] == PREFIX_TOKENS
    if change is not None:
        change(a.storage)
    b = engine(model, daemon, revision)
    got = b.generate(P2, NEW_TOKENS) + (request_kv(b, len(P2)),)
    return b, got, ref


def same(got, ref):
    return (got[0] == ref[0] and len(got[1]) == len(ref[1])
            and all(torch.equal(x, y) for x, y in zip(got[1], ref[1])) and torch.equal(got[2], ref[2]))


def test_the_prefix_prefetched_from_kvtier_is_bit_exact(tiny, daemon, sglang):
    b, got, ref = run_both(tiny, daemon)
    # a real storage hit: 4 pages read from kvtier, only the suffix computed
    assert b.last["local_hit_tokens"] == 0
    assert b.last["storage_hit_tokens"] == PREFIX_TOKENS and b.last["computed_tokens"] == PREFIX_TOKENS
    assert b.last["prefill_logits"].shape[0] == len(P2) - PREFIX_TOKENS
    stats = b.storage.get_stats()
    assert stats["pages_hit"] == PREFIX_TOKENS // 4 and stats["pages_miss"] == 0
    assert stats["bytes_read"] == PREFIX_TOKENS * b.host_pool.get_size_per_token()
    assert same(got, ref)
    assert got[0] == greedy_generate(tiny, P2, NEW_TOKENS)  # a full recompute's tokens


def test_one_changed_stored_byte_breaks_it(tiny, daemon, sglang):
    def flip(storage):
        # page 1 (tokens 4..7): its K half, or the MLA latent
        key = page_keys(P1, 4)[1] + ("_kv" if is_mla(tiny) else "_k")
        okey = kvtier.external_key(storage.fingerprint, key)
        with kvtier.Client(daemon.socket_path, [storage.namespace]) as c:
            data = bytearray(1 << 16)
            n = c.get(0, okey, data)
            assert n > 0
            data = data[:n]
            data[2] ^= 0x10  # the first float (token 4, layer 0, head 0) changes
            assert c.erase(0, [okey]) == 1
            c.put(0, okey, data)
    b, got, ref = run_both(tiny, daemon, change=flip)
    assert b.last["storage_hit_tokens"] == PREFIX_TOKENS  # the page was served...
    assert not same(got, ref)                            # ...and the comparison catches it
    assert not torch.equal(got[1][0], ref[1][0])


def test_another_model_revision_never_hits(tiny, daemon, sglang):
    b, got, ref = run_both(tiny, daemon, revision="another-commit")
    assert b.last["storage_hit_tokens"] == 0 and b.last["computed_tokens"] == 0
    assert b.storage.get_stats()["pages_get"] == 0
    assert got[0] == ref[0] == greedy_generate(tiny, P2, NEW_TOKENS)
