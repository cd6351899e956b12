"""KvtierConnector under vLLM's async scheduling (--async-scheduling), against a real kvtierd.

The mini engine then steps as vLLM's EngineCore.step_with_batch_queue does with two steps in
flight (mini_vllm/__init__.py, "Async scheduling"): the scheduler side of the connector sees
get_num_new_matched_tokens / build_connector_meta of step N+1 before update_connector_output and
request_finished of step N, and aborts land while a step is in flight. The workers run the steps
in order, either after the next step was scheduled (default) or as soon as each is scheduled
(worker_runs_ahead). Every check is bit-exact against the engine without a connector and the
tiny model's full recompute; the scheduler asserts that no finished_sending / finished_recving
names a request it does not know, and check_transfers that kvtier reports none at all.
"""

import pytest
import torch

import mini_vllm as mv
from vllm_harness import (deterministic, model,  # noqa: F401 (fixtures)
                          BLOCK_TOKENS, computed_at_start, drain_commits, greedy_generate, kvtier_engine, prompt,
                          quiet_client, rank_keys, reference_engine, run_request)

AHEAD = pytest.mark.parametrize("ahead", [False, True], ids=["workers-after-next-schedule", "workers-run-ahead"])


def async_engine(model, daemon, ahead=False, **kw):
    engine = kvtier_engine(model, daemon, async_scheduling=True, worker_runs_ahead=ahead, **kw)
    assert isinstance(engine.scheduler, mv.AsyncScheduler) and engine.batch_queue_size == 2
    return engine


def check_transfers(engine):
    """kvtier never holds a request's blocks past its step: no step reports finished_sending or
    finished_recving (one naming an unknown request would have failed the scheduler's assert)."""
    for h in engine.history:
        kv = h.model_runner_output.kv_connector_output
        assert kv is None or not (kv.finished_sending or kv.finished_recving), kv
    assert not engine.has_requests() and not engine.in_flight


def token_rows(engine, req_id):
    """The logits row each of the request's output tokens was sampled from."""
    return [h.model_runner_output.logits[req_id][-1] for h in engine.history
            for o in h.outputs if o.request_id == req_id and o.new_token_ids]


def same_tensors(xs, ys):
    return len(xs) == len(ys) and all(torch.equal(x, y) for x, y in zip(xs, ys))


def daemon_stats(daemon):
    with quiet_client(daemon, []) as c:
        return c.stats()


@AHEAD
@pytest.mark.parametrize("num_workers", [1, 2])
def test_a_prefix_saved_by_one_engine_is_loaded_by_another(model, daemon, ahead, num_workers):
    shared = prompt(1, 18)
    p1, p2 = shared + prompt(2, 3), shared + prompt(3, 6)
    a = async_engine(model, daemon, ahead, num_workers=num_workers)
    run_request(a, p1, 2, "r1")
    drain_commits(a)
    keys, namespaces = rank_keys(a, p1)
    with quiet_client(daemon, namespaces) as c:
        for r in range(num_workers):
            assert c.lookup(r, keys[r]).prefix_blocks == len(p1) // BLOCK_TOKENS
    b = async_engine(model, daemon, ahead, num_workers=num_workers)
    toks, logits = run_request(b, p2, 3, "r2")
    assert computed_at_start(b, "r2") == 16  # two kvtier blocks loaded
    ref = reference_engine(model, num_workers)
    ref_toks, ref_logits = run_request(ref, p2, 3, "r2")
    assert toks == ref_toks == greedy_generate(model, p2, 3)
    assert torch.equal(logits[0], ref_logits[0][16:]) and same_tensors(logits[1:], ref_logits[1:])
    assert torch.equal(b.request_kv("r2", len(p2)), ref.request_kv("r2", len(p2)))
    for e in (a, b):
        check_transfers(e)
    b.shutdown()
    a.shutdown()


@AHEAD
def test_concurrent_requests_with_shared_prefixes(model, daemon, ahead):
    """Several requests at once, chunked prefill (saves spread over steps, lookups of one request
    while another's saves are in flight), one stopping on a stop token while its next step is in
    flight; then a second engine whose concurrent requests load the prefixes."""
    base = prompt(4, 17)
    branch = base + prompt(5, 8)  # 25 tokens: 3 kvtier blocks
    first = {"a0": base + prompt(6, 5), "a1": branch + prompt(7, 3), "a2": base[:9] + prompt(8, 12),
             "a3": branch + prompt(9, 6)}
    stop = greedy_generate(model, first["a2"], 6)[1]
    a = async_engine(model, daemon, ahead, max_num_batched_tokens=16)
    for rid, p in first.items():
        a.add_request(p, 6, rid, stop_token_ids=[stop] if rid == "a2" else None)
    a.run_until_done()
    assert a.finish_reasons["a2"] == "stop" and any(h.ignored_req_ids == {"a2"} for h in a.history)
    drain_commits(a)
    second = {"b0": base + prompt(10, 4), "b1": branch + prompt(11, 2), "b2": branch[:20] + prompt(12, 7)}
    b = async_engine(model, daemon, ahead, max_num_batched_tokens=16)
    for rid, p in second.items():
        b.add_request(p, 4, rid)
    b.run_until_done()
    # b0: two kvtier blocks loaded; b1: the two b0 loads in the same step (a local hit) and a third
    # loaded; b2: a local hit on b1's blocks (five engine blocks, more than kvtier's whole two).
    assert [computed_at_start(b, r) for r in second] == [16, 24, 20]
    loads = {(l.req_id, l.first) for h in b.history for l in h.scheduler_output.kv_connector_metadata.loads}
    assert loads == {("b0", 0), ("b1", 2)}
    for engine, prompts, n in ((a, first, 6), (b, second, 4)):
        for rid, p in prompts.items():
            ref, ref_logits = greedy_generate(model, p, n, return_logits=True)
            out = engine.outputs[rid]
            assert out == ref[:len(out)] and same_tensors(token_rows(engine, rid), ref_logits[:len(out)])
        check_transfers(engine)
    assert a.outputs["a2"] == greedy_generate(model, first["a2"], 2)
    ref = reference_engine(model)
    for rid, p in second.items():
        run_request(ref, p, 4, rid)
        assert torch.equal(b.request_kv(rid, len(p)), ref.request_kv(rid, len(p)))
    b.shutdown()
    a.shutdown()


@AHEAD
def test_a_request_aborted_while_its_load_is_in_flight(model, daemon, ahead):
    shared = prompt(13, 17)
    a = async_engine(model, daemon, ahead)
    run_request(a, shared + [1], 1, "r1")
    drain_commits(a)
    b = async_engine(model, daemon, ahead)
    p2, p3 = shared + [2, 3, 4], shared + [5, 6]
    b.add_request(p2, 4, "r2")
    assert b.step() is None  # step 1 (r2's load of two kvtier blocks) queued, not taken
    (step1,) = b.in_flight
    assert [load.req_id for load in step1.kv_connector_metadata.loads] == ["r2"]
    b.abort("r2")  # while step 1 is in flight (it has run already when the workers run ahead)
    assert "r2" not in b.scheduler_connector._scheduler._requests
    b.add_request(p3, 2, "r3")
    b.run_until_done()
    assert b.finish_reasons["r2"] == "abort" and b.outputs["r2"] == []
    assert b.history[0].ignored_req_ids == {"r2"}
    assert computed_at_start(b, "r3") == 16 and b.outputs["r3"] == greedy_generate(model, p3, 2)
    stats = daemon_stats(daemon)
    assert stats["engine.loads_open"] == 0 and stats["engine.pinned_blocks"] == 0
    assert b.block_pool.get_num_free_blocks() == b.block_pool.num_gpu_blocks - 1
    check_transfers(b)
    b.shutdown()
    a.shutdown()


@AHEAD
def test_a_request_aborted_while_its_save_is_in_flight(model, daemon, ahead):
    """The step in flight still runs, and with it the save it planned: the aborted request's
    blocks are stored whole and correct (another engine loads them bit-exact)."""
    p1 = prompt(14, 25)
    a = async_engine(model, daemon, ahead, max_num_batched_tokens=8)
    a.add_request(p1, 3, "r1")
    a.step()
    a.step()  # step 1 (tokens 0..7) taken; step 2 (tokens 8..15, saving kvtier block 1) in flight
    (step2,) = a.in_flight
    assert step2.num_scheduled_tokens == {"r1": 8}
    assert [(s.req_id, s.first) for s in step2.kv_connector_metadata.saves] == [("r1", 1)]
    a.abort("r1")
    a.run_until_done()
    drain_commits(a)
    assert a.outputs["r1"] == [] and a.history[1].ignored_req_ids == {"r1"}
    keys, namespaces = rank_keys(a, p1)
    with quiet_client(daemon, namespaces) as c:
        assert c.lookup(0, keys[0]).prefix_blocks == 2
    b = async_engine(model, daemon, ahead)
    p2 = p1[:16] + prompt(15, 5)
    toks, logits = run_request(b, p2, 3, "r2")
    assert computed_at_start(b, "r2") == 16
    ref = reference_engine(model)
    ref_toks, ref_logits = run_request(ref, p2, 3, "r2")
    assert toks == ref_toks == greedy_generate(model, p2, 3)
    assert torch.equal(logits[0], ref_logits[0][16:]) and same_tensors(logits[1:], ref_logits[1:])
    assert torch.equal(b.request_kv("r2", len(p2)), ref.request_kv("r2", len(p2)))
    for e in (a, b):
        check_transfers(e)
    stats = daemon_stats(daemon)
    assert stats["engine.loads_open"] == 0 and stats["engine.pinned_blocks"] == 0
    b.shutdown()
    a.shutdown()


@AHEAD
def test_preemption_with_steps_in_flight_loads_again_on_resume(model, daemon, ahead):
    """A small block pool: requests preempted by the schedule of step N+1 while step N is in
    flight, resumed later (looked up and loaded from kvtierd again)."""
    shared = prompt(16, 17)
    a = async_engine(model, daemon, ahead)
    run_request(a, shared + [1], 1, "r0")
    drain_commits(a)
    b = async_engine(model, daemon, ahead, num_blocks=11, prefix_caching=False)  # both start, neither can finish
    prompts = {"r1": shared + prompt(17, 3), "r2": shared + prompt(18, 2)}
    for rid, p in prompts.items():
        b.add_request(p, 8, rid)
    b.run_until_done()
    assert any(h.scheduler_output.preempted_req_ids for h in b.history)
    loads = [l.req_id for h in b.history for l in h.scheduler_output.kv_connector_metadata.loads]
    assert len(loads) > len(prompts)  # loaded again after a preemption
    for rid, p in prompts.items():
        ref, ref_logits = greedy_generate(model, p, 8, return_logits=True)
        assert b.outputs[rid] == ref and same_tensors(token_rows(b, rid), ref_logits)
    check_transfers(b)
    stats = daemon_stats(daemon)
    assert stats["engine.loads_open"] == 0 and stats["engine.pinned_blocks"] == 0
    b.shutdown()
    a.shutdown()


@AHEAD
def test_events_of_a_request_aborted_with_its_save_in_flight_wait_for_that_save(model, daemon, ahead):
    """docs/INTEGRATIONS.md: take_events returns BlockStored "once a step's saves are in the arena".
    vLLM applies an abort that came while step N ran right before update_from_output(N) (EngineCore's
    aborts queue, MiniEngine.queue_abort), and takes the connector's events at the end of that
    update; with async scheduling step N+1 is in flight then, with the saves it planned for the
    aborted request. Those events must wait until the save ran."""
    p1 = prompt(19, 25)
    # The connector's own events (kvtierd's, forwarded, come after the commit by construction).
    a = async_engine(model, daemon, ahead, max_num_batched_tokens=8, forward_tier_events=False)
    ran, published = [], []
    execute = a.execute_model
    a.execute_model = lambda so: ran.append(so) or execute(so)  # the steps the workers ran, in order
    take = a.scheduler_connector.take_events

    def take_events():  # what vLLM publishes, and which saves had run by then
        taken = list(take())
        saved = {(s.req_id, s.first) for so in ran for s in so.kv_connector_metadata.saves}
        published.extend((e, saved) for e in taken)
        return taken
    a.scheduler_connector.take_events = take_events
    a.add_request(p1, 3, "r1")
    a.step()  # step 1: tokens 0..7, saving kvtier block 0
    a.queue_abort("r1")  # arrives while step 1 runs
    a.step()  # step 2 scheduled (tokens 8..15, saving block 1); step 1 taken; the abort; its update
    (step2,) = a.in_flight
    assert [(s.req_id, s.first) for s in step2.kv_connector_metadata.saves] == [("r1", 1)]
    a.run_until_done()
    drain_commits(a)
    keys, namespaces = rank_keys(a, p1)
    with quiet_client(daemon, namespaces) as c:
        assert c.lookup(0, keys[0]).prefix_blocks == 2  # both saves ran in the end
    stamped = []
    for event, saved in published:
        offset = next(i for i in range(0, len(p1), BLOCK_TOKENS) if p1[i:i + len(event.token_ids)] == event.token_ids)
        stamped.append((offset // BLOCK_TOKENS, ("r1", offset // BLOCK_TOKENS) in saved))
    assert stamped and all(ran_before for _, ran_before in stamped), \
        f"(kvtier block, its save had run when the event was taken): {stamped}"
    check_transfers(a)
    a.shutdown()
