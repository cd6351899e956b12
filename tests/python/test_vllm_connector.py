"""KvtierConnector driven by the mini vLLM engine in vLLM's call order
(mini_vllm.py mirrors vLLM's scheduler and worker at the commits named in
engine_interfaces.json) against a real kvtierd, with the tiny model."""

import time

import pytest
import torch

from vllm_harness import (deterministic, model,  # noqa: F401 (fixtures)
                          BLOCK_TOKENS, computed_at_start, drain_commits, first_step_of, greedy_generate,
                          kvtier_engine, prompt, quiet_client, rank_keys, reference_engine, run_request)


@pytest.mark.parametrize("num_workers", [1, 2])
def test_a_prefix_saved_by_one_engine_is_loaded_by_another(model, daemon, num_workers):
    shared = prompt(1, 18)
    p1, p2 = shared + prompt(2, 3), shared + prompt(3, 6)
    a = kvtier_engine(model, daemon, num_workers)
    run_request(a, p1, 2, "r1")
    drain_commits(a)
    keys, namespaces = rank_keys(a, p1)
    with quiet_client(daemon, namespaces) as c:
        for r in range(num_workers):  # whole kvtier blocks of the prompt, each rank its own namespace
            assert c.lookup(r, keys[r]).prefix_blocks == len(p1) // BLOCK_TOKENS
    b = kvtier_engine(model, daemon, num_workers)
    toks, logits = run_request(b, p2, 3, "r2")
    assert computed_at_start(b, "r2") == 16  # two kvtier blocks loaded
    ref = reference_engine(model, num_workers)
    ref_toks, ref_logits = run_request(ref, p2, 3, "r2")
    assert toks == ref_toks == greedy_generate(model, p2, 3)
    assert torch.equal(logits[0], ref_logits[0][16:])
    assert torch.equal(b.request_kv("r2", len(p2)), ref.request_kv("r2", len(p2)))
    b.shutdown()
    a.shutdown()


def test_a_pending_lookup_answers_not_yet_and_is_asked_again(model, daemon):
    shared = prompt(4, 17)
    a = kvtier_engine(model, daemon)
    run_request(a, shared + [1], 1, "r1")
    drain_commits(a)
    b = kvtier_engine(model, daemon, use_directory=False)  # every lookup is a round trip
    b.add_request(shared + [2, 3], 2, "r2")
    daemon.pause()  # the lookup cannot be answered
    try:
        record = b.step()
        assert "r2" not in record.scheduler_output.num_scheduled_tokens  # None: skipped this step
        assert b.scheduler_connector.get_num_new_matched_tokens(b.scheduler.requests["r2"], 0) == (None, False)
    finally:
        daemon.resume()
    b.run_until_done()
    assert computed_at_start(b, "r2") == 16
    assert b.outputs["r2"] == greedy_generate(model, shared + [2, 3], 2)


def test_partial_blocks_are_never_stored(model, daemon):
    p = prompt(5, 2 * BLOCK_TOKENS + 5)  # two whole kvtier blocks and 5 tokens
    a = kvtier_engine(model, daemon)
    run_request(a, p, 6, "r1")  # generated tokens complete a third block: not saved (prompt only)
    drain_commits(a)
    keys, namespaces = rank_keys(a, p + a.outputs["r1"])
    with quiet_client(daemon, namespaces) as c:
        assert len(keys[0]) == 3 and c.lookup(0, keys[0]).prefix_blocks == 2
        assert c.stats()["engine.blocks"] == 2


def test_zero_external_tokens_with_blocks_allocated(model, daemon):
    p = prompt(6, 19)
    a = kvtier_engine(model, daemon)
    run_request(a, p, 1, "r1")
    # Again in the same engine: its own prefix cache holds what kvtier holds.
    toks, _ = run_request(a, p, 2, "r2")
    so = first_step_of(a, "r2")
    assert so.scheduled_new_reqs[0].num_computed_tokens == 16  # local hit only
    assert so.kv_connector_metadata.loads == []
    assert toks == greedy_generate(model, p, 2)


def test_a_block_lost_before_the_load_is_reported_and_recomputed(model, daemon):
    shared = prompt(7, 25)
    a = kvtier_engine(model, daemon)
    run_request(a, shared + [1], 1, "r1")
    drain_commits(a)
    b = kvtier_engine(model, daemon)
    p2 = shared + [4, 5, 6]
    b.add_request(p2, 3, "r2")
    so = b.schedule()  # looked up (3 blocks) and allocated
    assert len(so.kv_connector_metadata.loads) == 1
    keys, namespaces = rank_keys(b, p2)
    with quiet_client(daemon, namespaces) as c:
        assert c.erase(0, [keys[0][1]]) == 1  # evicted between the lookup and the load
    failed = {i for blocks in so.kv_connector_metadata.loads[0].groups[0].block_ids[1:] for i in blocks}
    b.update_from_output(so, b.execute_model(so))
    assert b.worker_connectors[0].get_block_ids_with_load_errors() == set()  # reported once, then cleared
    assert failed <= set(b.history[-1].model_runner_output.kv_connector_output.invalid_block_ids)
    b.run_until_done()
    assert b.outputs["r2"] == greedy_generate(model, p2, 3)
    ref = reference_engine(model)
    run_request(ref, p2, 3, "r2")
    assert torch.equal(b.request_kv("r2", len(p2)), ref.request_kv("r2", len(p2)))


def test_abort_mid_load_leaves_no_pins_or_loads(model, daemon):
    shared = prompt(8, 17)
    a = kvtier_engine(model, daemon)
    run_request(a, shared + [1], 1, "r1")
    drain_commits(a)
    b = kvtier_engine(model, daemon)
    b.add_request(shared + [2, 3, 4], 4, "r2")
    so = b.schedule()
    assert so.kv_connector_metadata.loads
    b.abort("r2")  # after scheduling, before the worker's pass
    b.update_from_output(so, b.execute_model(so))
    b.run_until_done()
    with quiet_client(daemon, []) as c:
        stats = c.stats()
    assert stats["engine.loads_open"] == 0 and stats["engine.pinned_blocks"] == 0
    assert "r2" not in b.scheduler_connector._scheduler._requests


def test_preemption_and_resume(model, daemon):
    shared = prompt(9, 17)
    a = kvtier_engine(model, daemon)
    run_request(a, shared + [1], 1, "r1")
    drain_commits(a)
    b = kvtier_engine(model, daemon, prefix_caching=False)
    p2 = shared + [5, 6, 7]
    b.add_request(p2, 5, "r2")
    b.step()
    b.step()
    b.preempt("r2")  # blocks freed; resumed later through resumed_req_ids
    b.run_until_done()
    assert b.outputs["r2"] == greedy_generate(model, p2, 5)
    loads = [h.scheduler_output.kv_connector_metadata.loads for h in b.history]
    assert sum(1 for l in loads if l) == 2  # loaded again on resume


def test_tensor_parallel_hit_is_what_every_rank_holds(model, daemon):
    shared = prompt(10, 25)
    a = kvtier_engine(model, daemon, num_workers=2)
    run_request(a, shared + [1], 1, "r1")
    drain_commits(a)
    keys, namespaces = rank_keys(a, shared)
    with quiet_client(daemon, namespaces) as c:
        assert c.erase(1, [keys[1][2]]) == 1  # rank 1 lost its third block
    b = kvtier_engine(model, daemon, num_workers=2)
    p2 = shared + [9, 9]
    toks, _ = run_request(b, p2, 2, "r2")
    assert computed_at_start(b, "r2") == 16  # two blocks, not three
    assert toks == greedy_generate(model, p2, 2)


def test_a_finished_requests_blocks_are_freed_at_once_and_queue_hints_reach_the_daemon(model, daemon):
    """Every copy out of engine blocks ends in the step that reads them, so
    request_finished never delays the free, and the saved blocks are in
    kvtierd once committed."""
    p = prompt(11, 21)
    a = kvtier_engine(model, daemon)
    with quiet_client(daemon, []) as c:
        before = c.stats()["engine.enqueues"]
        request = a.add_request(p, 1, "r1")
        assert a.scheduler_connector.flush_hints(10)  # hints go out from a background thread
        assert c.stats()["engine.enqueues"] == before + 1
        finished = a.scheduler_connector.request_finished
        seen = []
        a.scheduler_connector.request_finished = lambda req, ids: seen.append(finished(req, ids)) or seen[-1]
        a.run_until_done()
        assert seen == [(False, None)]  # freed with the step that finished it
        assert request.request_id not in a.scheduler.requests
        assert a.block_pool.get_num_free_blocks() == a.block_pool.num_gpu_blocks - 1
        drain_commits(a)
        assert c.stats()["engine.commits"] >= 2
    keys, namespaces = rank_keys(a, p)
    with quiet_client(daemon, namespaces) as c:
        assert c.lookup(0, keys[0]).prefix_blocks == 2


def test_a_model_revision_is_required(model, daemon):
    engine = kvtier_engine(model, daemon, revision="")  # serves, without the cache
    assert "model_revision" in engine.scheduler_connector.disabled_reason
    assert all("model_revision" in w.disabled_reason for w in engine.worker_connectors)
    p = prompt(15, 9)
    assert run_request(engine, p, 2, "r1")[0] == greedy_generate(model, p, 2)


def test_a_cache_salt_isolates_and_multimodal_inputs_are_part_of_the_key(model, daemon):
    from mini_vllm import MultiModalFeatureSpec, PlaceholderRange
    p = prompt(12, 19)
    a = kvtier_engine(model, daemon)
    run_request(a, p, 1, "r1", cache_salt="tenant-a")
    image = [MultiModalFeatureSpec("img-1", PlaceholderRange(9, 4))]  # inside the second kvtier block
    run_request(a, p, 1, "r2", mm_features=image)
    drain_commits(a)

    def hit(**request):
        b = kvtier_engine(model, daemon)
        run_request(b, p, 1, "r", **request)
        return computed_at_start(b, "r")
    assert hit(cache_salt="tenant-a") == 16
    assert hit(cache_salt="tenant-b") == 0  # another tenant's salt: no hit from block 0 on
    assert hit() == 8  # no salt: r2's first block (before the image) is shared, not the second
    assert hit(mm_features=image) == 16
    assert hit(mm_features=[MultiModalFeatureSpec("img-2", PlaceholderRange(9, 4))]) == 8  # another image


def test_vllm_loads_it_through_kv_connector_module_path(model, daemon):
    import importlib

    import kvtier.integrations.vllm as connector_module
    import mini_vllm as mv
    try:
        with mv.install_as_vllm():  # vLLM's module paths now resolve to the stand-in
            importlib.reload(connector_module)  # so the connector subclasses "vLLM's" base
            from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, SupportsHMA
            assert issubclass(connector_module.KvtierConnector, KVConnectorBase_V1)
            assert issubclass(connector_module.KvtierConnector, SupportsHMA)
            cfg = mv.make_vllm_config(model, kv_connector="KvtierConnector",
                                      kv_connector_module_path="kvtier.integrations.vllm",
                                      kv_connector_extra_config=dict(socket_path=daemon.socket_path,
                                                                     block_tokens=BLOCK_TOKENS))
            cfg.scheduler_config.disable_hybrid_kv_cache_manager = False  # HMA on: needs SupportsHMA
            engine = mv.MiniEngine(model, cfg, mv.make_kv_cache_config(model, 64))  # factory None: by path
            p = prompt(13, 19)
            toks, _ = run_request(engine, p, 2, "r1")
            assert type(engine.scheduler_connector).__name__ == "KvtierConnector"
            engine.shutdown()
    finally:
        importlib.reload(connector_module)  # back to the stand-in base for the other tests
    assert toks == greedy_generate(model, p, 2)


def test_lora_adapters_have_their_own_namespaces(model, daemon):
    from mini_vllm import LoRARequest
    p = prompt(14, 19)
    sql = LoRARequest("sql-lora", 1, "/adapters/sql/v3")
    a = kvtier_engine(model, daemon)
    run_request(a, p, 1, "r1", lora_request=sql)
    drain_commits(a)

    def hit(**request):
        b = kvtier_engine(model, daemon)
        run_request(b, p, 1, "r", **request)
        b.shutdown()
        return computed_at_start(b, "r")
    assert hit(lora_request=sql) == 16
    assert hit() == 0  # the base model never reads the adapter's KV
    assert hit(lora_request=LoRARequest("sql-lora", 1, "/adapters/sql/v4")) == 0  # another version
    a.shutdown()


def test_hints_come_from_every_rank_and_never_hold_the_scheduler(model, daemon):
    a = kvtier_engine(model, daemon, num_workers=2, call_timeout=30.0)
    with quiet_client(daemon, []) as c:
        before = c.stats()["engine.enqueues"]
        daemon.pause()  # no hint can be answered
        try:
            started = time.monotonic()
            for i in range(3):
                a.add_request(prompt(30 + i, 17), 1, f"r{i}")
            assert time.monotonic() - started < 2.0, "the scheduler waited for kvtierd"  # call_timeout is 30 s
        finally:
            daemon.resume()
        assert a.scheduler_connector.flush_hints(30)
        assert c.stats()["engine.enqueues"] == before + 3 * 2  # one per request and TP rank namespace
    a.run_until_done()
    a.shutdown()


@pytest.mark.parametrize("saver,loader", [
    (dict(layout="LBNHC"), dict(layout="BLHNC")),                          # current vLLM, two physical orders
    (dict(layout="LBHNC", kernel_block_size=2), dict(layout="BHLNC")),     # kernel blocks of 2 tokens
    (dict(layout="LHBNC"), dict(layout="LBNHC", kernel_block_size=2)),
    (dict(kv_cache_format="legacy_kv_first"), dict(kv_cache_format="legacy_kv_first")),  # vLLM before 0.28
    (dict(kv_cache_format="legacy_blocks_first", kv_layout="blocks_first"),
     dict(kv_cache_format="legacy_blocks_first", kv_layout="blocks_first")),
])
def test_every_kv_tensor_form_vllm_hands_out_round_trips_bit_exact(model, daemon, saver, loader):
    p = prompt(40, 19)
    a = kvtier_engine(model, daemon, **saver)
    run_request(a, p, 1, "r1")
    drain_commits(a)
    assert a.worker_connectors[0].disabled_reason is None
    b = kvtier_engine(model, daemon, **loader)
    p2 = p + [5, 6]
    toks, logits = run_request(b, p2, 2, "r2")
    assert computed_at_start(b, "r2") == 16
    ref = reference_engine(model)
    ref_toks, ref_logits = run_request(ref, p2, 2, "r2")
    assert toks == ref_toks and torch.equal(logits[0], ref_logits[0][16:])
    assert torch.equal(b.request_kv("r2", len(p2)), ref.request_kv("r2", len(p2)))
    a.shutdown()
    b.shutdown()


def test_the_older_and_current_forms_never_share_blocks(model, daemon):
    p = prompt(41, 19)
    a = kvtier_engine(model, daemon, kv_cache_format="legacy_kv_first")
    run_request(a, p, 1, "r1")
    drain_commits(a)
    b = kvtier_engine(model, daemon)  # current vLLM's views: another byte form, another namespace
    run_request(b, p + [1], 1, "r2")
    assert computed_at_start(b, "r2") == 0


def test_a_local_hit_ending_inside_a_kvtier_block(model, daemon):
    """vLLM's own prefix cache holds 3 engine blocks (12 tokens), kvtier
    blocks are 8 tokens: the load starts inside kvtier block 1 and leaves
    its first engine block, computed locally, untouched."""
    shared = prompt(50, 27)
    a = kvtier_engine(model, daemon)
    run_request(a, shared + [1], 1, "r1")
    drain_commits(a)
    b = kvtier_engine(model, daemon)
    run_request(b, shared[:13], 1, "local")  # b's prefix cache: the 3 full engine blocks of 13 tokens
    p2 = shared + [2, 3]
    so_seen = []
    build = b.scheduler_connector.build_connector_meta
    b.scheduler_connector.build_connector_meta = lambda so: so_seen.append(build(so)) or so_seen[-1]
    toks, logits = run_request(b, p2, 2, "r2")
    loads = [load for meta in so_seen for load in meta.loads if load.req_id == "r2"]
    assert len(loads) == 1 and loads[0].first == 1 and loads[0].groups[0].skip == 1
    assert computed_at_start(b, "r2") == 24
    ref = reference_engine(model)
    ref_toks, ref_logits = run_request(ref, p2, 2, "r2")
    assert toks == ref_toks and torch.equal(logits[0], ref_logits[0][24:])
    assert torch.equal(b.request_kv("r2", len(p2)), ref.request_kv("r2", len(p2)))


def test_under_vllms_default_fail_policy_a_lost_block_fails_the_request(model, daemon):
    """Why the documented command line sets "recompute": with vLLM's
    default a block evicted between lookup and load ends the request with
    an error."""
    shared = prompt(51, 17)
    a = kvtier_engine(model, daemon)
    run_request(a, shared + [1], 1, "r1")
    drain_commits(a)
    b = kvtier_engine(model, daemon, policy="fail")
    b.add_request(shared + [4, 5, 6], 3, "r2")
    so = b.schedule()
    keys, namespaces = rank_keys(b, shared)
    with quiet_client(daemon, namespaces) as c:
        assert c.erase(0, [keys[0][1]]) == 1
    b.update_from_output(so, b.execute_model(so))
    b.run_until_done()
    assert b.finish_reasons["r2"] == "error"


def test_a_load_makes_one_index_per_block_for_all_layers(model, daemon, monkeypatch):
    """The engine-block index of a loaded kvtier block is built once and used
    by every layer's scatter (on a GPU it is a device tensor queued on the
    load stream: one per block, not one per block and layer)."""
    from kvtier.integrations import _kv_layout
    shared = prompt(31, 18)
    a = kvtier_engine(model, daemon)
    run_request(a, shared + [1], 1, "r1")
    drain_commits(a)
    made, real = [], _kv_layout.block_index
    monkeypatch.setattr(_kv_layout, "block_index", lambda tensor, ids: made.append(list(ids)) or real(tensor, ids))
    scattered, real_scatter = [], _kv_layout.scatter

    def scatter(tensor, form, block_ids, skip, span, num_blocks, index=None):
        scattered.append(index)
        return real_scatter(tensor, form, block_ids, skip, span, num_blocks, index)
    monkeypatch.setattr(_kv_layout, "scatter", scatter)
    b = kvtier_engine(model, daemon)
    p2 = shared + prompt(32, 6)
    toks, _ = run_request(b, p2, 2, "r2", kv_transfer_params={"kvtier": {"save": False}})  # loads only
    assert computed_at_start(b, "r2") == 16 and toks == greedy_generate(model, p2, 2)
    loaded_blocks = 16 // BLOCK_TOKENS
    assert len(made) == loaded_blocks                                   # one index per kvtier block...
    assert len(scattered) == loaded_blocks * model.n_layers             # ...for every layer's scatter
    assert all(i is not None for i in scattered)
    a.shutdown()
    b.shutdown()
