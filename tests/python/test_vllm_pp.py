"""KvtierConnector under pipeline parallelism (vLLM's pipeline_parallel_size), driven by the mini
vLLM engine against a real kvtierd: each stage's workers hold only their stage's layers (the tiny
model's 3 layers split 2 + 1, vLLM's get_pp_indices), each rank (tp, pp) saves and loads its own
namespace."""

import pytest
import torch

from model_fixtures import mla_model  # noqa: F401 (fixture)
from vllm_harness import (deterministic, model,  # noqa: F401 (fixtures)
                          BLOCK_TOKENS, computed_at_start, drain_commits, greedy_generate, kvtier_engine, prompt,
                          quiet_client, rank_keys, reference_engine, run_request)

PP = 2
L = [f"model.layers.{i}.self_attn.attn" for i in range(3)]


@pytest.mark.parametrize("num_workers", [1, 2])
def test_a_prefix_saved_by_one_pp_engine_is_loaded_by_another(model, daemon, num_workers):
    shared = prompt(71, 18)
    p1, p2 = shared + prompt(72, 3), shared + prompt(73, 6)
    a = kvtier_engine(model, daemon, num_workers, pipeline_parallel_size=PP)
    world = PP * num_workers
    assert [c.disabled_reason for c in a.worker_connectors] == [None] * world
    assert a.scheduler_connector.disabled_reason is None
    assert [sorted(c) for c in a.worker_kv_caches] == [L[:2]] * num_workers + [L[2:]] * num_workers
    run_request(a, p1, 2, "r1")
    drain_commits(a)
    assert [c.disabled_reason for c in a.worker_connectors] == [None] * world
    keys, namespaces = rank_keys(a, p1)
    assert len(namespaces) == world  # one namespace per (tp, pp) rank
    assert [(ns.tp_rank, ns.pp_rank) for ns in namespaces] == [(t, p) for p in range(PP) for t in range(num_workers)]
    assert [ns.layer_count for ns in namespaces] == [2] * num_workers + [1] * num_workers  # 3 layers -> 2 + 1
    with quiet_client(daemon, namespaces) as c:
        for r in range(world):  # every stage's and TP rank's namespace holds the prompt's whole blocks
            assert c.lookup(r, keys[r]).prefix_blocks == len(p1) // BLOCK_TOKENS
    b = kvtier_engine(model, daemon, num_workers, pipeline_parallel_size=PP)
    toks, logits = run_request(b, p2, 3, "r2")
    assert [c.disabled_reason for c in b.worker_connectors] == [None] * world
    assert computed_at_start(b, "r2") == 16  # two kvtier blocks loaded, by every stage's workers
    ref = reference_engine(model, num_workers)  # one stage, no connector
    ref_toks, ref_logits = run_request(ref, p2, 3, "r2")
    assert toks == ref_toks == greedy_generate(model, p2, 3)
    assert len(logits) == len(ref_logits)
    assert torch.equal(logits[0], ref_logits[0][16:])
    assert all(torch.equal(x, y) for x, y in zip(logits[1:], ref_logits[1:]))
    assert torch.equal(b.request_kv("r2", len(p2)), ref.request_kv("r2", len(p2)))
    b.shutdown()
    a.shutdown()


def test_each_stage_loads_its_own_layers(model, daemon):
    """A prefix saved under PP=2 is loaded into exactly the layers each stage holds: the loaded
    K/V of every layer equals a full prefill's."""
    p = prompt(74, 2 * BLOCK_TOKENS + 3)
    a = kvtier_engine(model, daemon, pipeline_parallel_size=PP)
    run_request(a, p, 1, "r1")
    drain_commits(a)
    b = kvtier_engine(model, daemon, pipeline_parallel_size=PP)
    b.add_request(p, 1, "r2")
    b.step()  # schedules the load; with PP the batch queue takes one more step before the output
    b.run_until_done()
    assert computed_at_start(b, "r2") == 2 * BLOCK_TOKENS
    ref = reference_engine(model, pipeline_parallel_size=PP)
    run_request(ref, p, 1, "r2")
    table_b, table_ref = b.finished_block_ids["r2"], ref.finished_block_ids["r2"]
    n = 2 * BLOCK_TOKENS
    assert torch.equal(b.token_kv(table_b, n), ref.token_kv(table_ref, n))
    stage1 = b.runner.ranks[1]
    assert list(stage1.kv_caches) == L[2:] and list(b.runner.ranks[0].kv_caches) == L[:2]
    b.shutdown()
    a.shutdown()


def test_mla_over_two_stages_and_two_tp_ranks(mla_model, daemon):
    """MLA under PP x TP: one namespace per stage (not per TP rank), TP rank
    0 of each stage saves, every rank loads; bit-exact."""
    p = prompt(70, 19)
    a = kvtier_engine(mla_model, daemon, num_workers=2, pipeline_parallel_size=2)
    run_request(a, p, 1, "r1")
    drain_commits(a)
    keys, namespaces = rank_keys(a, p)
    assert [(ns.tp_size, ns.pp_rank, ns.layer_count) for ns in namespaces] == [(1, 0, 1), (1, 1, 1)]
    with quiet_client(daemon, namespaces) as c:
        assert [c.lookup(i, keys[i]).prefix_blocks for i in range(2)] == [2, 2]
    b = kvtier_engine(mla_model, daemon, num_workers=2, pipeline_parallel_size=2)
    p2 = p + [3, 4]
    toks, logits = run_request(b, p2, 2, "r2")
    assert computed_at_start(b, "r2") == 16
    assert all(w.disabled_reason is None for w in b.worker_connectors)
    ref_toks, ref_logits = run_request(reference_engine(mla_model, 2), p2, 2, "r2")
    assert toks == ref_toks and torch.equal(logits[0], ref_logits[0][16:])
    a.shutdown()
    b.shutdown()
