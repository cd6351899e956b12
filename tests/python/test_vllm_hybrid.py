"""The kvtier vLLM connector under vLLM's hybrid KV cache manager (HMA, on
by default in vLLM): a model with full-attention and sliding-window layers
(TinyGemma) gets one KV cache group per layer type, one block table per
group, and the null block where a window group freed blocks. The connector
keeps one namespace per group, hits only where every group's blocks are
stored (all of them for full attention, the window for sliding window),
and loads and saves bit-exact through each group's table."""


import pytest
import torch

from mini_vllm import MiniEngine, make_kv_cache_config, make_vllm_config
from tiny_model import TinyGemma
from vllm_harness import (deterministic,  # noqa: F401 (fixture)
                          computed_at_start, drain_commits, greedy_generate, hma_connector, kvtier_engine, prompt,
                          quiet_client, rank_keys, run_request)


@pytest.fixture(scope="module")
def gemma():
    return TinyGemma(seed=3)  # layer 0 full attention, layer 1 a window of 8 tokens


@pytest.fixture
def connector():
    with hma_connector() as cls:
        yield cls


def engine(gemma, daemon, connector, **kwargs):
    return kvtier_engine(gemma, daemon, connector=connector, hma=True, **kwargs)


def reference(gemma):
    return MiniEngine(gemma, make_vllm_config(gemma, kv_connector=None, enable_prefix_caching=False),
                      make_kv_cache_config(gemma, 64))


def test_two_groups_two_namespaces_and_a_bit_exact_hit(gemma, daemon, connector):
    shared = prompt(1, 34)  # four kvtier blocks (32 tokens) and 2 more
    a = engine(gemma, daemon, connector)
    assert len(a.kv_cache_config.kv_cache_groups) == 2
    assert a.scheduler_connector.disabled_reason is None
    run_request(a, shared + [1], 1, "r1")
    drain_commits(a)
    keys, namespaces = rank_keys(a, shared)
    assert [ns.kv_layout for ns in namespaces] == ["vllm_nhc_g0of2", "vllm_nhc_g1of2"]
    with quiet_client(daemon, namespaces) as c:
        assert c.lookup(0, keys[0]).prefix_blocks == 4  # full attention: every block
        assert c.lookup(1, keys[1][3:4]).prefix_blocks == 1  # the window's block at the end
    b = engine(gemma, daemon, connector)
    p2 = shared + [5, 6, 7]
    toks, logits = run_request(b, p2, 3, "r2")
    assert computed_at_start(b, "r2") == 32
    ref = reference(gemma)
    ref_toks, ref_logits = run_request(ref, p2, 3, "r2")
    assert toks == ref_toks == greedy_generate(gemma, p2, 3)
    assert torch.equal(logits[0], ref_logits[0][32:])
    # The window group was loaded only where the window reads: the blocks before it are null.
    window_table = b.history[0].scheduler_output.scheduled_new_reqs[0].block_ids[1]
    assert 0 in window_table[:4]
    a.shutdown()
    b.shutdown()


def test_a_hit_needs_every_groups_blocks(gemma, daemon, connector):
    shared = prompt(2, 34)
    a = engine(gemma, daemon, connector)
    run_request(a, shared + [1], 1, "r1")
    drain_commits(a)
    keys, namespaces = rank_keys(a, shared)

    def hit():
        b = engine(gemma, daemon, connector)
        toks, _ = run_request(b, shared + [9], 1, "r")
        assert toks == greedy_generate(gemma, shared + [9], 1)
        b.shutdown()
        return computed_at_start(b, "r")
    with quiet_client(daemon, namespaces) as c:
        assert c.erase(1, [keys[1][0]]) == 1  # a window block before the window: not needed
    assert hit() == 32
    with quiet_client(daemon, namespaces) as c:
        assert c.erase(1, [keys[1][3]]) == 1  # the block the window reads at 32 tokens
    assert hit() < 32  # never reported from the full-attention chain alone
    a.shutdown()


def test_chunked_prefill_and_a_local_hit_under_hma(gemma, daemon, connector):
    shared = prompt(3, 42)
    a = engine(gemma, daemon, connector, max_num_batched_tokens=12)  # saves across chunks
    run_request(a, shared + [1], 1, "r1")
    drain_commits(a)
    assert sum(1 for h in a.history if "r1" in h.scheduler_output.num_scheduled_tokens) >= 4  # chunked
    b = engine(gemma, daemon, connector)
    run_request(b, shared[:18] + [4], 1, "local")  # b's own prefix cache now holds two blocks
    p2 = shared + [2, 3]
    toks, logits = run_request(b, p2, 2, "r2")
    assert computed_at_start(b, "r2") == 40
    ref = reference(gemma)
    ref_toks, ref_logits = run_request(ref, p2, 2, "r2")
    assert toks == ref_toks
    assert torch.equal(logits[0], ref_logits[0][40:])
    a.shutdown()
    b.shutdown()


def test_with_the_hybrid_manager_off_it_is_one_group_of_its_own(gemma, daemon, connector):
    shared = prompt(4, 26)
    a = kvtier_engine(gemma, daemon, connector=connector, hma=False)
    assert len(a.kv_cache_config.kv_cache_groups) == 1
    run_request(a, shared + [1], 1, "r1")
    drain_commits(a)
    b = engine(gemma, daemon, connector)  # another grouping: other namespaces, no hit
    run_request(b, shared + [2], 1, "r2")
    assert computed_at_start(b, "r2") == 0
    c = kvtier_engine(gemma, daemon, connector=connector, hma=False)
    toks, _ = run_request(c, shared + [2], 2, "r3")
    assert computed_at_start(c, "r3") == 24 and toks == greedy_generate(gemma, shared + [2], 2)
    for e in (a, b, c):
        e.shutdown()


@pytest.mark.parametrize("group,block", [(0, 0), (1, 3)])
def test_a_changed_byte_in_either_groups_blocks_changes_the_output(gemma, daemon, connector, group, block):
    """Both groups' stored bytes are what the engine computes with: a
    flipped byte in the full-attention chain or in the window's block
    shows in the logits (the load is real, not recomputed)."""
    shared = prompt(5, 34)
    a = engine(gemma, daemon, connector)
    run_request(a, shared + [1], 1, "r1")
    drain_commits(a)
    keys, namespaces = rank_keys(a, shared)
    ns = namespaces[group]
    with quiet_client(daemon, [ns]) as c:
        data = bytearray(ns.block_bytes)
        assert c.get(0, keys[group][block], data) == ns.block_bytes
        assert c.erase(0, [keys[group][block]]) == 1
        data[-1] ^= 0x40  # the exponent of the last token's last float (inside any window)
        c.put(0, keys[group][block], data)
    b = engine(gemma, daemon, connector)
    p2 = shared + [5, 6]
    _, logits = run_request(b, p2, 1, "r2")
    assert computed_at_start(b, "r2") == 32
    ref_logits = run_request(reference(gemma), p2, 1, "r2")[1]
    assert not torch.equal(logits[0], ref_logits[0][32:])
    a.shutdown()
    b.shutdown()


def test_another_revision_never_hits_under_hma(gemma, daemon, connector):
    shared = prompt(6, 26)
    a = engine(gemma, daemon, connector)
    run_request(a, shared + [1], 1, "r1")
    drain_commits(a)
    b = engine(gemma, daemon, connector, revision="seed-3-retrained")
    run_request(b, shared + [2], 1, "r2")
    assert computed_at_start(b, "r2") == 0
    a.shutdown()
    b.shutdown()
