"""Hybrid attention: a toy model with a sliding-window attention layer and a
recurrent layer (tiny_model.TinyHybrid) reuses a prefix through kvtier only
where the recurrent state at that block boundary was stored, and then bit
for bit."""

import numpy as np
import torch

import kvtier
from kvtier.integrations.hybrid import HybridPrefix, state_namespace
from model_fixtures import deterministic, prompt  # noqa: F401 (fixtures)
from tiny_model import KVCache, TinyHybrid

NAME = "model.layers.0.self_attn.attn"


def connect(model, daemon):
    cache = KVCache.allocate(model, 1)[NAME]
    kv = kvtier.Namespace(model_id="kvtier-test/tiny-hybrid", model_revision="seed-0", kv_dtype="float32",
                          block_tokens=model.block_size, layer_count=1,
                          bytes_per_token_per_layer=2 * cache.shape[3] * cache.shape[4] * 4, kv_layout="vllm_kv_first")
    client = kvtier.Client(daemon.socket_path, [kv, state_namespace(kv)])
    return client, HybridPrefix(client, 0, 1, kv, window_tokens=model.window)


def block_bytes(caches, block_id):
    return caches[NAME][:, block_id].contiguous().view(-1).view(torch.uint8).numpy()


def test_a_hit_needs_the_state_of_that_boundary_and_is_bit_exact(daemon):
    model = TinyHybrid(seed=0)
    bs = model.block_size
    p1 = prompt(1, 30)
    table = list(range(8))
    caches = KVCache.allocate(model, 8)
    run1 = model.forward(p1, list(range(30)), table, caches)
    client, hybrid = connect(model, daemon)
    blocks = [block_bytes(caches, b) for b in range(30 // bs)]  # 7 whole blocks
    states = {n: run1.boundary_states[n * bs].numpy() for n in (2, 4)}  # states kept only after blocks 2 and 4
    assert all(s.ok for s in hybrid.save(p1, blocks, states))

    p2 = p1[:26] + prompt(2, 6)  # shares 6 whole blocks
    assert client.lookup(0, hybrid.keys(p2)[0]).prefix_blocks == 6  # the KV chain alone says 6...
    n = hybrid.lookup(p2)
    assert n == 4  # ...but the state after block 6 (or 5) was never stored

    # Resume request 2 after block 4 from kvtier alone: window blocks and state.
    fresh = KVCache.allocate(model, 8, fill=float("nan"))  # anything not restored is poison
    needed = list(hybrid.blocks_read_at(n))
    assert needed == list(model.blocks_needed_to_resume(n * bs))
    outs = [np.zeros(blocks[0].size, np.uint8) for _ in needed]
    state = np.zeros(model.initial_state().numel(), np.float32)
    hybrid.load(p2, n, outs, state)
    for b, data in zip(needed, outs):
        fresh[NAME][:, b] = torch.from_numpy(data).view(torch.float32).view(fresh[NAME][:, b].shape)
    resumed = model.forward(p2[n * bs:], list(range(n * bs, len(p2))), table, fresh, state=torch.from_numpy(state))
    full = model.forward(p2, list(range(len(p2))), table, KVCache.allocate(model, 8))
    assert torch.equal(resumed.logits, full.logits[n * bs:])
    assert torch.equal(resumed.state, full.state)

    # Without that state the next usable boundary is block 2; without a
    # window block of it, nothing.
    state_keys = hybrid.keys(p2)[1]
    assert client.erase(1, [state_keys[3]]) == 1
    assert hybrid.lookup(p2) == 2
    assert client.erase(0, [hybrid.keys(p2)[0][1]]) == 1
    assert hybrid.lookup(p2) == 0
    client.close()


def test_state_and_kv_namespaces_never_share_keys():
    kv = kvtier.Namespace(model_id="m", model_revision="r", kv_dtype="float32", block_tokens=4, layer_count=1,
                          bytes_per_token_per_layer=64)
    state = state_namespace(kv)
    assert state.object_kind == "recurrent_state" and kv.object_kind == "kv"
    tokens = list(range(8))
    assert set(kvtier.ChainHasher(kv).keys(tokens)).isdisjoint(kvtier.ChainHasher(state).keys(tokens))
