"""A real (tiny) model reuses its prefix through kvtier, bit for bit.

TinyDecoder (tiny_model.py: seeded, fp32, CPU, deterministic) runs in the
mini vLLM engine with a paged, layer-major KV cache. Request 1 prefills and
saves its KV through KvtierConnector; request 2 shares the prefix, loads it
layer by layer through kvtier in a fresh engine and computes only the
suffix. Its logits and KV must equal, bit for bit, the same engine's
computation from its own retained blocks, and its greedy tokens a full
recompute; a changed byte, a changed layer order and a changed model
revision must each break that; and after a daemon restart the prefix comes
from NVMe, still bit-exact."""

import time

import numpy as np
import pytest
import torch

import kvtier
from mini_vllm import MiniEngine, make_kv_cache_config, make_vllm_config
from vllm_harness import (deterministic, model,  # noqa: F401 (fixtures)
                          BLOCK_TOKENS, computed_at_start, drain_commits, greedy_generate, kvtier_engine, prompt,
                          quiet_client, rank_keys, run_request)

SHARED = prompt(40, 18)          # two kvtier blocks (16 tokens) and 2 more
P1 = SHARED + prompt(41, 3)
P2 = SHARED + prompt(42, 6)
NEW_TOKENS = 4


@pytest.fixture(scope="module")
def retained(model):
    """Request 2 computed from the engine's own retained blocks of request 1."""
    engine = MiniEngine(model, make_vllm_config(model, kv_connector=None), make_kv_cache_config(model, 64))
    run_request(engine, P1, 2, "r1")
    toks, logits = run_request(engine, P2, NEW_TOKENS, "r2")
    so = next(h.scheduler_output for h in engine.history if "r2" in h.scheduler_output.num_scheduled_tokens)
    assert so.scheduled_new_reqs[0].num_computed_tokens == 16
    return toks, logits, engine.request_kv("r2", len(P2))


def save_request_1(model, daemon):
    a = kvtier_engine(model, daemon)
    run_request(a, P1, 2, "r1")
    drain_commits(a)
    a.shutdown()
    keys, namespaces = rank_keys(a, SHARED)
    return keys[0], namespaces[0]


def load_request_2(model, daemon, **kw):
    b = kvtier_engine(model, daemon, **kw)
    toks, logits = run_request(b, P2, NEW_TOKENS, "r2")
    kv = b.request_kv("r2", len(P2))
    b.shutdown()
    return b, toks, logits, kv


def same(result, retained):
    _, toks, logits, kv = result
    r_toks, r_logits, r_kv = retained
    return (toks == r_toks and len(logits) == len(r_logits)
            and all(torch.equal(x, y) for x, y in zip(logits, r_logits)) and torch.equal(kv, r_kv))


def rewrite(daemon, namespace, key, change):
    """Replaces the stored bytes of `key` with change(bytes)."""
    with quiet_client(daemon, [namespace]) as c:
        data = bytearray(namespace.block_bytes)
        assert c.get(0, key, data) == namespace.block_bytes
        assert c.erase(0, [key]) == 1
        c.put(0, key, change(data))


def test_the_prefix_loaded_through_kvtier_is_bit_exact(model, daemon, retained):
    save_request_1(model, daemon)
    result = load_request_2(model, daemon)
    b = result[0]
    assert computed_at_start(b, "r2") == 16
    loads = [h.scheduler_output.kv_connector_metadata.loads for h in b.history if h.scheduler_output.kv_connector_metadata]
    assert sum(len(l) for l in loads) == 1  # one layer-wise load of both blocks
    assert same(result, retained)
    assert result[1] == greedy_generate(model, P2, NEW_TOKENS)  # and the tokens of a full recompute


def test_one_changed_byte_breaks_it(model, daemon, retained):
    keys, ns = save_request_1(model, daemon)

    def flip(data):
        data[5] ^= 0x40  # a K value of layer 0, first token
        return data
    rewrite(daemon, ns, keys[0], flip)
    result = load_request_2(model, daemon)
    assert computed_at_start(result[0], "r2") == 16  # the block was served...
    assert not same(result, retained)                # ...and the comparison catches it


def test_a_changed_layer_order_breaks_it(model, daemon, retained):
    keys, ns = save_request_1(model, daemon)

    def swap_layers_0_and_1(data):
        n = ns.layer_bytes
        data[0:n], data[n:2 * n] = data[n:2 * n], data[0:n]
        return data
    rewrite(daemon, ns, keys[1], swap_layers_0_and_1)
    result = load_request_2(model, daemon)
    assert computed_at_start(result[0], "r2") == 16
    assert not same(result, retained)


def test_another_model_revision_never_hits(model, daemon, retained):
    save_request_1(model, daemon)
    result = load_request_2(model, daemon, revision="another-commit")
    assert computed_at_start(result[0], "r2") == 0  # nothing loaded: computed from scratch
    assert result[1] == retained[0]


def test_after_a_restart_the_prefix_comes_from_nvme_and_is_bit_exact(model, make_daemon, retained):
    daemon = make_daemon(host_bytes=4 << 20, nvme_bytes=64 << 20)
    keys, ns = save_request_1(model, daemon)
    with quiet_client(daemon, [ns]) as c:  # push the blocks out of the host tier onto NVMe
        filler = kvtier.ChainHasher(ns).keys(list(range(BLOCK_TOKENS * 400)))
        for i, k in enumerate(filler):
            c.put(0, k, np.full(ns.block_bytes * 32, i % 251, np.uint8))
        deadline = time.monotonic() + 30
        while c.lookup(0, keys).tiers != [kvtier.Tier.NVME] * 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.lookup(0, keys).tiers == [kvtier.Tier.NVME] * 2
    daemon.restart()  # the host tier is gone; the NVMe tier and its index stay
    with quiet_client(daemon, [ns]) as c:
        assert c.lookup(0, keys).tiers == [kvtier.Tier.NVME] * 2
    result = load_request_2(model, daemon)
    assert computed_at_start(result[0], "r2") == 16
    assert same(result, retained)
