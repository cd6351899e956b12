"""Prefill/decode disaggregation through kvtier (_vllm_handoff.py), as vLLM's
P/D deployments run it (vLLM @002a1057e9ae nixl_connector.py; the proxy of
tests/v1/kv_connector/nixl_integration/toy_proxy_server.py @e009930196c9):

  1. the proxy sends the prompt to the prefill engine P with max_tokens 1
     and kv_transfer_params {"do_remote_decode": true, ...};
  2. P's connector saves the prompt's blocks into P's kvtierd and answers,
     in request_finished, (delay_free, params): vLLM puts params in P's
     response and keeps the request's blocks until P's workers report it in
     finished_sending (its saves committed);
  3. the proxy sends the same prompt, with its real max_tokens, to the
     decode engine D, with P's params as its kv_transfer_params (through
     JSON: an HTTP hop);
  4. D's connector looks the prefix up in D's kvtierd (which pulls it from
     P's through the peer tier), answers (tokens, load_async=True), and its
     workers load the blocks outside the forward pass and report the
     request in finished_recving; vLLM then schedules the rest.

The tiny real model (tiny_model.py) runs in the mini vLLM engine; D's
tokens and logits must equal, bit for bit, one engine's computation of the
same request from its own retained prefix."""

import json
import logging
import time

import pytest
import torch

import kvtier
from mini_vllm import MiniEngine, make_kv_cache_config, make_vllm_config
from peer_pair import start_peer_pair, stats
from vllm_harness import (deterministic, model,  # noqa: F401 (fixtures)
                          BLOCK_TOKENS, computed_at_start, drain_commits, greedy_generate, kvtier_engine, prompt,
                          rank_keys, run_request)

PROMPT = prompt(70, 21)   # two kvtier blocks (16 tokens) and 5 more
NEW_TOKENS = 5

# What vLLM's toy proxy puts in the prefill request (toy_proxy_server.py, send_request_to_service).
PROXY_PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                        "remote_block_ids": None, "remote_host": None, "remote_port": None}


@pytest.fixture(scope="module")
def single_node(model):
    """One engine, no connector: a prompt sharing PROMPT's first 16 tokens (its
    blocks stay in the prefix cache), then PROMPT with NEW_TOKENS, computed
    from those 16 retained tokens as D computes it from the 16 loaded."""
    engine = MiniEngine(model, make_vllm_config(model, kv_connector=None), make_kv_cache_config(model, 64))
    run_request(engine, PROMPT[:2 * BLOCK_TOKENS] + prompt(71, 3), 1, "warm")
    toks, logits = run_request(engine, PROMPT, NEW_TOKENS, "again")
    assert computed_at_start(engine, "again") == 2 * BLOCK_TOKENS
    return toks, logits


def prefill(model, daemon, req_id="p1", params=PROXY_PREFILL_PARAMS, **kw):
    """Step 1-2: the prefill engine P; returns (P, P's kv_transfer_params as the proxy receives them)."""
    p = kvtier_engine(model, daemon, kv_role="kv_producer", **kw)
    toks, _ = run_request(p, PROMPT, 1, req_id, kv_transfer_params=dict(params) if params is not None else None)
    assert len(toks) == 1
    p.shutdown()
    answer = p.kv_transfer_params.get(req_id)
    return p, (json.loads(json.dumps(answer)) if answer is not None else None)  # an HTTP hop


def decode(model, daemon, params, req_id="d1", **kw):
    """Step 3-4: the decode engine D with P's params."""
    d = kvtier_engine(model, daemon, kv_role="kv_consumer", **kw)
    toks, logits = run_request(d, PROMPT, NEW_TOKENS, req_id, kv_transfer_params=params)
    d.shutdown()
    return d, toks, logits


def kv_outputs(engine):
    return [h.model_runner_output.kv_connector_output for h in engine.history
            if h.model_runner_output.kv_connector_output is not None]


def worker_stats(engine):
    total = {}
    for out in kv_outputs(engine):
        stats = out.kv_connector_stats
        for k, v in (stats.data if stats is not None else {}).items():
            if not isinstance(v, list):
                total[k] = total.get(k, 0) + v
    return total


def metas(engine):
    return [h.scheduler_output.kv_connector_metadata for h in engine.history
            if h.scheduler_output.kv_connector_metadata is not None]


def bit_exact(toks, logits, reference):
    r_toks, r_logits = reference
    return toks == r_toks and len(logits) == len(r_logits) and all(torch.equal(a, b) for a, b in zip(logits, r_logits))


def assert_handed_off(d, req_id="d1"):
    """D loaded the 16 prefix tokens from kvtier, asynchronously, rather than computing them."""
    assert computed_at_start(d, req_id) == 2 * BLOCK_TOKENS
    loads = [spec for m in metas(d) for spec in m.async_loads if spec.req_id == req_id]
    assert len(loads) == 1 and loads[0].first == 0 and len(loads[0].groups[0].block_ids) == 2
    assert not any(spec.req_id == req_id for m in metas(d) for spec in m.loads)  # no sync load too
    assert any(req_id in (o.finished_recving or ()) for o in kv_outputs(d))
    assert not any(o.invalid_block_ids for o in kv_outputs(d))
    assert worker_stats(d).get("load_blocks") == 2
    # The request waited (WAITING_FOR_REMOTE_KVS): not scheduled in the step that planned its load.
    first_plan = next(i for i, h in enumerate(d.history) if h.scheduler_output.kv_connector_metadata is not None
                      and any(s.req_id == req_id for s in h.scheduler_output.kv_connector_metadata.async_loads))
    assert req_id not in d.history[first_plan].scheduler_output.num_scheduled_tokens


# ---- the params round trip, on one daemon ----

def test_prefill_answers_kvtier_params_and_delays_the_free_until_committed(model, daemon):
    p, params = prefill(model, daemon, peer="127.0.0.1:7470")
    keys, namespaces = rank_keys(p, PROMPT)
    assert params == {
        "do_remote_prefill": True, "do_remote_decode": False,
        "remote_engine_id": p.vllm_config.kv_transfer_config.engine_id, "remote_request_id": "p1",
        "kvtier_version": 1, "kvtier_peer": "127.0.0.1:7470",
        "kvtier_namespace": namespaces[0].fingerprint().hex(), "kvtier_block_tokens": BLOCK_TOKENS,
        "kvtier_blocks": 2, "kvtier_last_key": keys[0][1].hex()}
    # delay_free: the blocks stayed with the request until the worker reported it sent.
    finished_step = next(i for i, h in enumerate(p.history) if any(o.request_id == "p1" and o.finish_reason
                                                                    for o in h.outputs))
    sent = [i for i, h in enumerate(p.history) if h.model_runner_output.kv_connector_output is not None
            and "p1" in (h.model_runner_output.kv_connector_output.finished_sending or ())]
    assert len(sent) == 1 and sent[0] > finished_step
    assert any("p1" in m.handoff_sends for m in metas(p))
    assert "p1" not in p.scheduler.requests  # freed in the end
    assert p.scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 64 - 1  # all but the null block
    with kvtier.Client(daemon.socket_path, [namespaces[0]], client_name="test") as c:
        assert c.lookup(0, keys[0]).prefix_blocks == 2  # committed by then


def test_decode_loads_the_hand_off_asynchronously_bit_exact(model, daemon, single_node):
    _, params = prefill(model, daemon)
    d, toks, logits = decode(model, daemon, params)
    assert_handed_off(d)
    assert bit_exact(toks, logits, single_node)
    assert toks == greedy_generate(model, PROMPT, NEW_TOKENS)


def test_requests_without_kvtier_params_are_served_as_before(model, daemon, single_node):
    # A prefill request without do_remote_decode: no params, no delayed free.
    p, params = prefill(model, daemon, params=None)
    assert params is None
    assert not any(m.handoff_sends for m in metas(p))
    assert not any(o.finished_sending for o in kv_outputs(p))
    # A decode request without params: an ordinary, synchronous, layer-wise load.
    d, toks, logits = decode(model, daemon, None)
    assert computed_at_start(d, "d1") == 2 * BLOCK_TOKENS
    assert not any(m.async_loads for m in metas(d))
    assert sum(len(m.loads) for m in metas(d)) == 1
    assert bit_exact(toks, logits, single_node)


def test_a_prefill_that_saved_nothing_delays_nothing(model, daemon):
    _, params = prefill(model, daemon, params=dict(PROXY_PREFILL_PARAMS, kvtier={"save": False}))
    assert params["kvtier_blocks"] == 0 and params["kvtier_last_key"] is None
    # D finds nothing to wait for and computes the prompt itself.
    d, toks, _ = decode(model, daemon, params, handoff_wait=30)
    assert computed_at_start(d, "d1") == 0
    assert toks == greedy_generate(model, PROMPT, NEW_TOKENS)


def test_missing_blocks_fail_open_after_handoff_wait(model, make_daemon, caplog):
    """P's kvtierd is not D's peer: D waits handoff_wait, warns, recomputes."""
    p_daemon, d_daemon = make_daemon(), make_daemon()
    _, params = prefill(model, p_daemon)
    caplog.set_level(logging.WARNING, logger="kvtier.vllm")
    start = time.monotonic()
    d, toks, _ = decode(model, d_daemon, params, handoff_wait=0.3)
    assert time.monotonic() - start >= 0.3
    assert computed_at_start(d, "d1") == 0
    assert toks == greedy_generate(model, PROMPT, NEW_TOKENS)
    assert d.scheduler_connector.disabled_reason is None
    assert "0 of the 2 blocks P saved found" in caplog.text


@pytest.mark.parametrize("change, why", [
    (lambda p: dict(p, kvtier_namespace="00" * 16), "namespace differs"),
    (lambda p: dict(p, kvtier_last_key="11" * 16), "another prompt"),
    (lambda p: dict(p, kvtier_block_tokens=16), "blocks are of 16 tokens"),
])
def test_a_hand_off_of_another_namespace_or_prompt_is_refused(model, daemon, caplog, change, why):
    _, params = prefill(model, daemon)
    caplog.set_level(logging.WARNING, logger="kvtier.vllm")
    d, toks, _ = decode(model, daemon, change(params))
    assert why in caplog.text
    assert not any(m.async_loads for m in metas(d))  # served as any other request: a sync load of what is there
    assert computed_at_start(d, "d1") == 2 * BLOCK_TOKENS
    assert toks == greedy_generate(model, PROMPT, NEW_TOKENS)


def test_unreadable_params_never_crash_the_engine(model, daemon, caplog):
    caplog.set_level(logging.WARNING, logger="kvtier.vllm")
    bad = {"do_remote_prefill": True, "kvtier_version": 1, "kvtier_blocks": "many"}
    d, toks, _ = decode(model, daemon, bad)
    assert "cannot read" in caplog.text
    assert d.scheduler_connector.disabled_reason is None
    assert toks == greedy_generate(model, PROMPT, NEW_TOKENS)
    d, toks, _ = decode(model, daemon, {"do_remote_prefill": True, "kvtier_version": 99})
    assert toks == greedy_generate(model, PROMPT, NEW_TOKENS)


def test_handoff_async_false_loads_synchronously(model, daemon, single_node):
    _, params = prefill(model, daemon)
    d, toks, logits = decode(model, daemon, params, handoff_async=False)
    assert not any(m.async_loads for m in metas(d))
    assert sum(len(m.loads) for m in metas(d)) == 1
    assert computed_at_start(d, "d1") == 2 * BLOCK_TOKENS
    assert bit_exact(toks, logits, single_node)


def test_a_hand_off_whose_blocks_vanish_is_recomputed(model, daemon):
    """The lookup found both blocks, then the second was erased before the
    async load read it: the workers report its engine blocks failed with the
    request's finished_recving, and vLLM recomputes from there."""
    p, params = prefill(model, daemon)
    keys, namespaces = rank_keys(p, PROMPT)
    d = kvtier_engine(model, daemon, kv_role="kv_consumer")
    d.add_request(PROMPT, NEW_TOKENS, "d1", kv_transfer_params=params)
    for _ in range(1000):
        so = d.schedule()
        planned = any(s.req_id == "d1" for s in so.kv_connector_metadata.async_loads)
        if planned:  # between the scheduler's plan and the workers' start_load_kv
            with kvtier.Client(daemon.socket_path, [namespaces[0]], client_name="test") as c:
                assert c.erase(0, keys[0][1:2]) == 1
        d.update_from_output(so, d.execute_model(so))
        if planned:
            break
    d.run_until_done()
    d.shutdown()
    assert any(o.invalid_block_ids for o in kv_outputs(d))
    assert any("d1" in (o.finished_recving or ()) for o in kv_outputs(d))
    assert computed_at_start(d, "d1") == BLOCK_TOKENS  # the first block loaded, the second recomputed
    assert list(d.outputs["d1"]) == greedy_generate(model, PROMPT, NEW_TOKENS)


def test_async_scheduling_on_both_sides(model, daemon, single_node):
    _, params = prefill(model, daemon, async_scheduling=True)
    assert params["kvtier_blocks"] == 2
    d, toks, logits = decode(model, daemon, params, async_scheduling=True)
    assert_handed_off(d)
    assert toks == single_node[0]


def test_tensor_parallel_workers_each_report(model, daemon):
    _, params = prefill(model, daemon, num_workers=2)
    d, toks, _ = decode(model, daemon, params, num_workers=2)
    assert computed_at_start(d, "d1") == 2 * BLOCK_TOKENS
    assert any("d1" in (o.finished_recving or ()) for o in kv_outputs(d))
    assert toks == greedy_generate(model, PROMPT, NEW_TOKENS)


# ---- two daemons: P's kvtierd and D's, peers of each other ----

@pytest.fixture
def peer_pair(make_daemon, monkeypatch, tmp_path):
    """P's kvtierd and D's, listing each other in [peer] members, one cluster secret, UCX over TCP."""
    p_daemon, d_daemon = start_peer_pair(make_daemon, monkeypatch, tmp_path)
    return p_daemon, d_daemon, p_daemon.peer_address


def test_prefill_on_one_daemon_decode_on_another_bit_exact(model, peer_pair, single_node):
    p_daemon, d_daemon, p_peer = peer_pair
    p, params = prefill(model, p_daemon, peer=p_peer)
    assert params["kvtier_peer"] == p_peer and params["kvtier_blocks"] == 2
    keys, namespaces = rank_keys(p, PROMPT)
    ns = namespaces[0]
    before = stats(d_daemon, ns)
    assert before.get("engine.blocks", 0) == 0  # D's node holds nothing of it: every byte must come from P's

    d, toks, logits = decode(model, d_daemon, params)

    assert_handed_off(d)
    assert bit_exact(toks, logits, single_node)
    assert toks == greedy_generate(model, PROMPT, NEW_TOKENS)
    after = stats(d_daemon, ns)
    # The two blocks came from P's host memory through D's peer tier.
    assert after["peer.read_bytes"] - before.get("peer.read_bytes", 0) == 2 * ns.block_bytes
    assert after.get("peer.corrupt", 0) == 0
    with kvtier.Client(d_daemon.socket_path, [ns], client_name="test") as c:
        assert c.lookup(0, keys[0]).tiers == [kvtier.Tier.HOST] * 2  # promoted into D's host tier


def test_a_second_decode_of_the_same_prefix_is_served_by_d_s_own_host_tier(model, peer_pair, single_node):
    p_daemon, d_daemon, p_peer = peer_pair
    p, params = prefill(model, p_daemon, peer=p_peer)
    ns = rank_keys(p, PROMPT)[1][0]
    decode(model, d_daemon, params)
    read = stats(d_daemon, ns)["peer.read_bytes"]
    d, toks, logits = decode(model, d_daemon, params, req_id="d2")
    assert_handed_off(d, "d2")
    assert stats(d_daemon, ns)["peer.read_bytes"] == read  # no second pull
    assert bit_exact(toks, logits, single_node)


def test_handoff_free_source_frees_p_s_copy_once_d_has_read_it(model, peer_pair, single_node):
    p_daemon, d_daemon, p_peer = peer_pair
    p, params = prefill(model, p_daemon, peer=p_peer, handoff_free_source=True)
    keys, namespaces = rank_keys(p, PROMPT)
    ns = namespaces[0]
    saves = [spec for m in metas(p) for spec in m.saves]
    assert saves and all(spec.handoff for spec in saves)
    with kvtier.Client(p_daemon.socket_path, [ns], client_name="test") as c:
        assert c.lookup(0, keys[0]).tiers == [kvtier.Tier.HOST] * 2  # P keeps it until D has it

    d, toks, logits = decode(model, d_daemon, params)

    assert_handed_off(d)
    assert bit_exact(toks, logits, single_node)
    deadline = time.monotonic() + 10
    while stats(p_daemon, ns).get("engine.handoffs_freed", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stats(p_daemon, ns).get("engine.handoffs_freed", 0) == 2
    with kvtier.Client(p_daemon.socket_path, [ns], client_name="test") as c:
        assert kvtier.Tier.HOST not in c.lookup(0, keys[0]).tiers  # gone from P (D's copy may answer as REMOTE)
    with kvtier.Client(d_daemon.socket_path, [ns], client_name="test") as c:
        assert c.lookup(0, keys[0]).tiers == [kvtier.Tier.HOST] * 2


def test_without_handoff_free_source_p_keeps_its_copy(model, peer_pair, single_node):
    p_daemon, d_daemon, p_peer = peer_pair
    p, params = prefill(model, p_daemon, peer=p_peer)
    keys, namespaces = rank_keys(p, PROMPT)
    ns = namespaces[0]
    assert not any(spec.handoff for m in metas(p) for spec in m.saves)
    decode(model, d_daemon, params)
    deadline = time.monotonic() + 10
    while stats(p_daemon, ns).get("peer_server.taken", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stats(p_daemon, ns).get("peer_server.taken", 0) == 2  # D read both whole
    assert stats(p_daemon, ns).get("engine.handoffs_freed", 0) == 0
    with kvtier.Client(p_daemon.socket_path, [ns], client_name="test") as c:
        assert c.lookup(0, keys[0]).tiers == [kvtier.Tier.HOST] * 2


def test_p_gone_before_decode_fails_open(model, peer_pair, caplog):
    p_daemon, d_daemon, p_peer = peer_pair
    _, params = prefill(model, p_daemon, peer=p_peer)
    p_daemon.stop()
    caplog.set_level(logging.WARNING, logger="kvtier.vllm")
    d, toks, _ = decode(model, d_daemon, params, handoff_wait=0.5)
    assert toks == greedy_generate(model, PROMPT, NEW_TOKENS)
    assert d.scheduler_connector.disabled_reason is None
    assert computed_at_start(d, "d1") == 0
