"""A hybrid model with a recurrent layer through the kvtier vLLM connector,
as vLLM runs Qwen3-Next, Jamba, Nemotron-H or Granite 4: the mini vLLM
engine in Mamba "align" mode under the hybrid KV cache manager, and
TinyHybridRecurrent (a sliding-window attention layer and a recurrent mixer
whose state lives in the layer's Mamba pages). One engine saves a prompt;
another, with its own GPU cache, loads the window's KV and the recurrent
state after the last stored boundary and continues bit for bit as a full
recompute does. A changed stored byte, another revision or a state gone
before the load never yields wrong tokens."""

import time

import pytest
import torch

from mini_vllm import MiniEngine, make_kv_cache_config, make_vllm_config
from model_fixtures import deterministic, prompt  # noqa: F401 (fixtures)
from tiny_model import TinyHybridRecurrent, greedy_generate, make_deterministic
from vllm_harness import (BLOCK_TOKENS, computed_at_start, drain_commits, hma_connector, quiet_client, rank_keys,
                          run_request)

SW, MAMBA = 0, 1  # the KV cache groups
BS = 8            # TinyHybridRecurrent's block size, raised as vLLM raises it; one kvtier block


@pytest.fixture(scope="module")
def hybrid():
    make_deterministic()
    return TinyHybridRecurrent(seed=7)


@pytest.fixture
def connector():
    with hma_connector() as cls:
        yield cls


def engine(m, daemon, connector, num_workers=1, revision=None, chunk=2048, policy="recompute", vllm_version="0.29",
           async_scheduling=False, **extra):
    """An engine with the connector as docs/INTEGRATIONS.md configures it,
    prefix caching on (so vLLM runs the recurrent group in "align" mode);
    vllm_version picks how vLLM hands over boundary states (0.29:
    kv_connector_block_state, 0.28: partial_tail_offloads)."""
    cfg = make_vllm_config(m, kv_connector="KvtierConnector", kv_connector_module_path="kvtier.integrations.vllm",
                           kv_connector_extra_config=dict(socket_path=daemon.socket_path, block_tokens=BLOCK_TOKENS,
                                                          **extra),
                           tensor_parallel_size=num_workers, revision=revision, kv_load_failure_policy=policy,
                           disable_hybrid_kv_cache_manager=False, max_num_batched_tokens=chunk,
                           vllm_version=vllm_version, async_scheduling=async_scheduling)
    kv_config = make_kv_cache_config(m, 48, num_workers, mamba_cache_mode="align",
                                     max_model_len=cfg.model_config.max_model_len)
    e = MiniEngine(m, cfg, kv_config, connector, num_workers=num_workers)
    assert e.vllm_config.cache_config.mamba_cache_mode == "align"
    return e


def saved(m, daemon, connector, tokens, max_tokens=1, **kwargs):
    """An engine that ran `tokens` as request r1 with its saves committed,
    and the keys and namespaces of `tokens` as its connector computes them."""
    e = engine(m, daemon, connector, **kwargs)
    run_request(e, tokens, max_tokens, "r1")
    drain_commits(e)
    keys, namespaces = rank_keys(e, tokens)
    return e, keys, namespaces


def reference(m, p, n):
    return greedy_generate(m, p, n, return_logits=True)


def assert_bit_exact(m, p, toks, logits, n):
    ref_toks, ref_logits = reference(m, p, n)
    assert toks == ref_toks
    assert all(torch.equal(x[-1], y) for x, y in zip(logits[-n:], ref_logits))


@pytest.mark.parametrize("vllm_version", ["0.29", "0.28"])
def test_the_state_after_the_last_boundary_is_saved_and_loaded_bit_exact(hybrid, daemon, connector, vllm_version):
    shared = prompt(1, 35)  # the prompt's blocks: 4 whole (32 tokens), 3 more
    a = engine(hybrid, daemon, connector, vllm_version=vllm_version)
    assert a.scheduler_connector.disabled_reason is None
    assert all(w.disabled_reason is None for w in a.worker_connectors)
    run_request(a, shared, 1, "r1")
    drain_commits(a)
    keys, namespaces = rank_keys(a, shared)
    assert [ns.object_kind for ns in namespaces] == ["kv", "recurrent_state"]
    with quiet_client(daemon, namespaces) as c:
        assert c.lookup(0, keys[0][3:4]).prefix_blocks == 1  # the window's block at the end
        assert c.lookup(1, keys[1][3:4]).prefix_blocks == 1  # the state after 32 tokens
        assert c.lookup(1, keys[1][2:3]).prefix_blocks == 0  # none at 24: vLLM offered only 32
    b = engine(hybrid, daemon, connector, vllm_version=vllm_version)
    p2 = shared + prompt(2, 6)
    toks, logits = run_request(b, p2, 4, "r2")
    assert computed_at_start(b, "r2") == 32
    assert_bit_exact(hybrid, p2, toks, logits, 4)
    new = b.history[0].scheduler_output.scheduled_new_reqs[0]
    assert new.block_ids[MAMBA][:3] == [0, 0, 0] and new.block_ids[MAMBA][3] != 0  # one block, the state's
    assert sum(x.shape[0] for x in logits) == len(p2) - 32 + 3  # only the suffix was computed
    a.shutdown()
    b.shutdown()


def test_a_hit_ends_at_the_last_stored_state_not_at_the_attention_chain(hybrid, daemon, connector):
    """Saved in chunks of 8, the prompt leaves states at 8, 16, 24 and 32;
    a prompt that shares 29 tokens resumes at 24, bit-exact; one that
    shares 29 tokens of a prompt saved in one chunk (a state at 32 only)
    finds no usable state."""
    shared = prompt(3, 29)
    a = engine(hybrid, daemon, connector, chunk=8)
    run_request(a, shared + prompt(4, 6), 1, "r1")
    drain_commits(a)
    b = engine(hybrid, daemon, connector)
    p2 = shared + prompt(5, 7)
    toks, logits = run_request(b, p2, 3, "r2")
    assert computed_at_start(b, "r2") == 24
    assert_bit_exact(hybrid, p2, toks, logits, 3)

    shared = prompt(6, 29)
    c = engine(hybrid, daemon, connector)
    run_request(c, shared + prompt(7, 6), 1, "r3")
    drain_commits(c)
    d = engine(hybrid, daemon, connector)
    p4 = shared + prompt(8, 7)
    toks, logits = run_request(d, p4, 3, "r4")
    assert computed_at_start(d, "r4") == 0  # blocks 0..2 are stored, but no state at 8, 16 or 24
    assert_bit_exact(hybrid, p4, toks, logits, 3)
    for e in (a, b, c, d):
        e.shutdown()


def test_a_changed_stored_state_byte_changes_the_logits(hybrid, daemon, connector):
    """What the model reads after a hit is the stored state itself."""
    shared = prompt(9, 34)
    a, keys, namespaces = saved(hybrid, daemon, connector, shared)
    with quiet_client(daemon, namespaces) as c:
        state = bytearray(namespaces[1].block_bytes)
        c.get(1, keys[1][3], state)
        state[5] ^= 0x40  # a bit of the first float's exponent
        assert c.erase(1, keys[1][3:4]) == 1
        c.put(1, keys[1][3], bytes(state))
    b = engine(hybrid, daemon, connector)
    p2 = shared + [3, 1]
    toks, logits = run_request(b, p2, 1, "r2")
    assert computed_at_start(b, "r2") == 32
    ref = reference(hybrid, p2, 1)[1]
    assert not torch.equal(logits[-1][-1], ref[0])
    a.shutdown()
    b.shutdown()


def test_another_revision_never_hits(hybrid, daemon, connector):
    shared = prompt(10, 34)
    a, keys, namespaces = saved(hybrid, daemon, connector, shared)
    b = engine(hybrid, daemon, connector, revision="another")
    toks, logits = run_request(b, shared + [4], 2, "r2")
    assert computed_at_start(b, "r2") == 0
    assert_bit_exact(hybrid, shared + [4], toks, logits, 2)
    a.shutdown()
    b.shutdown()


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_a_state_gone_before_the_load_is_recomputed(hybrid, daemon, connector, policy):
    """The hit was promised, then the state was evicted: every block of the
    load is a load error, vLLM recomputes from the same token, and the
    tokens are right ("recompute"), or the request ends with an error
    ("fail"), never with wrong tokens."""
    shared = prompt(11, 34)
    a, keys, namespaces = saved(hybrid, daemon, connector, shared)
    b = engine(hybrid, daemon, connector, policy=policy)
    p2 = shared + [6, 2]
    request = b.make_request(p2, 3, "r2")
    sched = b.scheduler_connector
    while sched.get_num_new_matched_tokens(request, 0)[0] is None:  # counts as a miss after lookup_timeout
        time.sleep(0.005)
    assert sched.get_num_new_matched_tokens(request, 0) == (32, False)  # the lookup is done and kept
    with quiet_client(daemon, namespaces) as c:
        assert c.erase(1, keys[1][3:4]) == 1
    b.add_request(request)
    b.run_until_done()
    if policy == "recompute":
        assert_bit_exact(hybrid, p2, b.outputs["r2"], b.logits["r2"], 3)
    else:
        assert b.finish_reasons["r2"] == "error"
    a.shutdown()
    b.shutdown()


def test_two_tp_ranks_each_save_and_load_their_rows_of_the_state(hybrid, daemon, connector):
    shared = prompt(12, 34)
    a, keys, namespaces = saved(hybrid, daemon, connector, shared, num_workers=2)
    assert [(ns.tp_rank, ns.object_kind) for ns in namespaces] == [
        (0, "kv"), (0, "recurrent_state"), (1, "kv"), (1, "recurrent_state")]
    with quiet_client(daemon, namespaces) as c:
        halves = []
        for ns in (1, 3):
            buf = bytearray(namespaces[ns].block_bytes)
            c.get(ns, keys[ns][3], buf)
            halves.append(bytes(buf))
    assert halves[0] != halves[1]  # each rank its own rows
    b = engine(hybrid, daemon, connector, num_workers=2)
    p2 = shared + prompt(13, 5)
    toks, logits = run_request(b, p2, 3, "r2")
    assert computed_at_start(b, "r2") == 32
    assert_bit_exact(hybrid, p2, toks, logits, 3)
    a.shutdown()
    b.shutdown()


def test_async_scheduling_saves_and_loads_states_bit_exact(hybrid, daemon, connector):
    """vLLM's --async-scheduling: step N+1 is scheduled before step N's
    output is processed; a state offered in step N is still saved from
    the block that step wrote."""
    shared = prompt(14, 30)
    a, keys, namespaces = saved(hybrid, daemon, connector, shared, 2, chunk=8, async_scheduling=True)
    b = engine(hybrid, daemon, connector, async_scheduling=True)
    p2 = shared[:27] + prompt(15, 4)
    toks, logits = run_request(b, p2, 3, "r2")
    assert computed_at_start(b, "r2") == 24
    assert_bit_exact(hybrid, p2, toks, logits, 3)
    a.shutdown()
    b.shutdown()
