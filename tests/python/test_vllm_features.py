"""What the kvtier vLLM connector gives users beyond loads and saves, in
the mini vLLM engine against a real kvtierd: reset_cache after a weight
update, KV events, stats and Prometheus counters, the per-request
opt-out, whole-block mode for full CUDA graphs, a request preempted and
resumed in one step, and pipeline stages of uneven size."""

import time

import pytest
import torch

from kvtier.integrations import _vllm_geometry
from kvtier.integrations._kv_layout import Unsupported
from kvtier.integrations.vllm import KvtierConnector
from mini_vllm import KVConnectorRole, make_kv_cache_config, make_vllm_config
from model_fixtures import mla_model  # noqa: F401 (fixture)
from vllm_harness import (deterministic, model,  # noqa: F401 (fixtures)
                          BLOCK_TOKENS, computed_at_start, drain_commits, greedy_generate, kvtier_engine, prompt,
                          rank_keys, quiet_client, reference_engine, run_request)


def saved(model, daemon, p, **kwargs):
    a = kvtier_engine(model, daemon, **kwargs)
    run_request(a, p, 1, "saver")
    drain_commits(a)
    return a


def hit_of(model, daemon, p, **request):
    b = kvtier_engine(model, daemon)
    run_request(b, p, 1, "r", **request)
    b.shutdown()
    return computed_at_start(b, "r")


def test_reset_cache_after_a_weight_update_stops_serving_old_blocks(model, daemon):
    p = prompt(1, 19)
    a = saved(model, daemon, p)
    assert hit_of(model, daemon, p + [1]) == 16
    assert a.scheduler_connector.reset_cache() is True  # reset_prefix_cache(reset_connector=True)
    assert hit_of(model, daemon, p + [1]) == 0  # the same revision, but nothing from before the update
    run_request(a, p, 1, "after")  # blocks computed with the new weights are stored again
    drain_commits(a)
    assert hit_of(model, daemon, p + [1]) == 16
    a.shutdown()


def test_events_say_what_was_stored_with_vllms_block_hashes_and_the_medium(model, daemon):
    p = prompt(2, 21)
    # The connector's own events; kvtierd's, forwarded: test_vllm_tier_events.py.
    a = kvtier_engine(model, daemon, event_medium="KVTIER", forward_tier_events=False)
    connector, events = a.scheduler_connector, []
    take = connector.take_events
    connector.take_events = lambda: events.extend(taken := list(take())) or taken  # what vLLM publishes
    request = a.add_request(p, 1, "r1")
    a.run_until_done()
    assert events, "no BlockStored"
    engine_blocks = 2 * BLOCK_TOKENS // model.block_size  # two whole kvtier blocks
    assert [h for e in events for h in e.block_hashes] == list(request.block_hashes[:engine_blocks])
    assert all(e.medium == "KVTIER" and e.block_size == model.block_size for e in events)
    assert [t for e in events for t in e.token_ids] == p[:2 * BLOCK_TOKENS]
    assert list(take()) == []  # taken once
    connector.reset_cache()
    assert [type(e).__name__.lstrip("_") for e in take()] == ["AllBlocksCleared"]
    a.shutdown()


def test_stats_count_loads_saves_and_hits_and_feed_prometheus(model, daemon):
    p = prompt(3, 19)
    a = saved(model, daemon, p)
    saves = a.worker_connectors[0].get_kv_connector_stats()
    assert saves is None or saves.data.get("save_blocks", 0) == 0  # the mini engine took them every step
    b = kvtier_engine(model, daemon)
    seen = []  # what vLLM collects every step, from the workers and from the scheduler side
    for c in [b.scheduler_connector] + b.worker_connectors:
        c.get_kv_connector_stats = (lambda original: lambda: seen.append(original()) or seen[-1])(
            c.get_kv_connector_stats)
    run_request(b, p + [1], 1, "r")
    total = KvtierConnector.build_kv_connector_stats({})
    for s in seen:
        total = total.aggregate(s)
    assert total.data["load_blocks"] == 2 and total.data["load_bytes"] == 2 * 8 * 3 * 2 * 2 * 8 * 4
    assert total.data["lookups"] == 1 and total.data["hit_tokens"] == 16
    assert total.reduce()["avg_load_ms_per_block"] >= 0

    class Counter:
        made = {}

        def __init__(self, name, documentation, labelnames):
            self.name, self.values = name, {}
            Counter.made[name] = self

        def labels(self, *values):
            counter = self

            class Child:
                def inc(self, n):
                    counter.values[values] = counter.values.get(values, 0) + n
            return Child()

    class Histogram:
        made = {}

        def __init__(self, name, documentation, buckets, labelnames):
            self.samples = []
            Histogram.made[name] = self

        def labels(self, *values):
            return type("Child", (), {"observe": lambda _, v, h=self: h.samples.append(v)})()

    assert len(total.data["load_seconds"]) == 1 and total.reduce()["load_seconds_max"] >= 0
    prom = KvtierConnector.build_prom_metrics(b.vllm_config, {Counter: Counter, Histogram: Histogram}, ["engine"],
                                              {0: ["0"]})
    prom.observe(total.data, 0)
    assert Counter.made["vllm:kvtier_load_blocks"].values[("0",)] == 2
    assert Histogram.made["vllm:kvtier_load_seconds"].samples == total.data["load_seconds"]
    a.shutdown()
    b.shutdown()


def test_a_request_can_opt_out_of_loading_saving_or_both(model, daemon):
    p = prompt(4, 19)
    a = kvtier_engine(model, daemon)
    run_request(a, p, 1, "no-save", kv_transfer_params={"kvtier": {"save": False}})
    drain_commits(a)
    assert hit_of(model, daemon, p + [1]) == 0  # nothing was saved
    run_request(a, p, 1, "saves")
    drain_commits(a)
    assert hit_of(model, daemon, p + [1]) == 16
    assert hit_of(model, daemon, p + [1], kv_transfer_params={"kvtier": False}) == 0
    assert hit_of(model, daemon, p + [1], kv_transfer_params={"kvtier": {"load": False}}) == 0
    assert hit_of(model, daemon, p + [1], skip_reading_prefix_cache=True) == 0
    a.shutdown()


def test_whole_block_mode_needs_no_per_layer_hook_and_allows_full_cuda_graphs(model, daemon):
    assert KvtierConnector.requires_piecewise_for_cudagraph({}) is True
    assert KvtierConnector.requires_piecewise_for_cudagraph({"layerwise": False}) is False
    p = prompt(5, 19)
    a = kvtier_engine(model, daemon, layerwise=False)
    for w in a.worker_connectors:  # full CUDA graph replay skips the per-layer hooks
        w.wait_for_layer_load = lambda name: None
        w.save_kv_layer = lambda *args, **kwargs: None
    run_request(a, p, 1, "r1")
    drain_commits(a)
    b = kvtier_engine(model, daemon, layerwise=False)
    for w in b.worker_connectors:
        w.wait_for_layer_load = lambda name: None
        w.save_kv_layer = lambda *args, **kwargs: None
    p2 = p + [7, 8]
    toks, logits = run_request(b, p2, 2, "r2")
    assert computed_at_start(b, "r2") == 16
    ref = reference_engine(model)
    ref_toks, ref_logits = run_request(ref, p2, 2, "r2")
    assert toks == ref_toks and torch.equal(logits[0], ref_logits[0][16:])
    a.shutdown()
    b.shutdown()


def test_a_request_preempted_and_resumed_in_one_step_keeps_its_block_table(model, daemon):
    from mini_vllm import CachedRequestData, SchedulerOutput
    a = kvtier_engine(model, daemon)
    sched = a.scheduler_connector
    request = a.make_request(prompt(6, 19), 1, "r1")
    sched.get_num_new_matched_tokens(request, 0)
    state = sched._scheduler._requests["r1"]
    cached = CachedRequestData.make_empty()
    cached.req_ids, cached.resumed_req_ids = ["r1"], {"r1"}
    cached.new_block_ids, cached.num_computed_tokens, cached.num_output_tokens = [([5, 6, 7, 8, 9],)], [0], [0]
    # Preempted (reset_prefix_cache) and resumed within one schedule() call.
    so = SchedulerOutput([], cached, {"r1": 19}, 19, {}, {}, [], set(), [], preempted_req_ids={"r1"})
    meta = sched.build_connector_meta(so)
    assert state.block_ids == [[5, 6, 7, 8, 9]]  # one table per KV cache group
    assert [s.req_id for s in meta.saves] == ["r1"] and meta.saves[0].groups[0].block_ids == [[5, 6], [7, 8]]
    a.shutdown()


def _pp_config(model, daemon, pp, **extra):
    cfg = make_vllm_config(model, kv_connector="KvtierConnector", kv_connector_module_path="kvtier.integrations.vllm",
                           kv_connector_extra_config=dict(socket_path=daemon.socket_path, block_tokens=8, **extra),
                           kv_load_failure_policy="recompute")
    cfg.parallel_config.pipeline_parallel_size = pp
    return cfg


def test_pipeline_stages_of_uneven_size_key_the_same_on_both_sides(model, daemon, monkeypatch):
    assert _vllm_geometry.pp_partition(7, 2) == [4, 3]
    assert _vllm_geometry.pp_partition(10, 4) == [2, 3, 3, 2]  # the remainder goes to the middle stages
    monkeypatch.setenv("VLLM_PP_LAYER_PARTITION", "1,6")
    assert _vllm_geometry.pp_partition(7, 2) == [1, 6]
    monkeypatch.delenv("VLLM_PP_LAYER_PARTITION")
    with pytest.raises(Unsupported):
        monkeypatch.setenv("VLLM_PP_LAYER_PARTITION", "3,3")
        _vllm_geometry.pp_partition(7, 2)
    monkeypatch.delenv("VLLM_PP_LAYER_PARTITION")

    # The tiny model's 3 layers over 2 stages: 2 + 1. The scheduler sees stage 0's config only.
    cfg = _pp_config(model, daemon, 2)
    full = make_kv_cache_config(model, 32)
    names = list(model.attention_layer_names)
    stage0 = make_kv_cache_config(model, 32)
    stage0.kv_cache_groups[0].layer_names = names[:2]
    scheduler = KvtierConnector(cfg, KVConnectorRole.SCHEDULER, stage0)
    assert scheduler.disabled_reason is None
    namespaces = scheduler._scheduler.base_scope.namespaces
    assert [ns.layer_count for ns in namespaces] == [2, 1]
    stage1 = make_kv_cache_config(model, 32)
    stage1.kv_cache_groups[0].layer_names = names[2:]
    cfg1 = _pp_config(model, daemon, 2)
    cfg1.parallel_config.rank = 1  # TP 1, PP rank 1
    worker = KvtierConnector(cfg1, KVConnectorRole.WORKER, stage1)
    from mini_vllm.kv_cache_interface import allocate_kv_caches
    caches = allocate_kv_caches(full)
    worker.register_kv_caches({n: caches[n] for n in names[2:]})
    assert worker.disabled_reason is None
    assert worker._worker.client.fingerprints == [scheduler._scheduler.base_scope.client.fingerprints[1]]
    # A stage whose layer count differs from the scheduler's expectation (a model whose stages are not
    # alike) is refused at the first step's metadata, not silently missed.
    from mini_vllm import CachedRequestData, SchedulerOutput
    empty = SchedulerOutput([], CachedRequestData.make_empty(), {}, 0, {}, {}, [], set(), [])
    meta = scheduler.build_connector_meta(empty)
    worker.bind_connector_metadata(meta)
    assert worker.disabled_reason is None
    unlike = make_kv_cache_config(model, 32)
    unlike.kv_cache_groups[0].layer_names = names[1:]
    wrong = KvtierConnector(cfg1, KVConnectorRole.WORKER, unlike)
    wrong.register_kv_caches({n: caches[n] for n in names[1:]})
    wrong.bind_connector_metadata(meta)
    assert "pp_layer_counts" in wrong.disabled_reason
    explicit = KvtierConnector(_pp_config(model, daemon, 2, pp_layer_counts=[1, 2]), KVConnectorRole.SCHEDULER,
                               stage0)
    assert [ns.layer_count for ns in explicit._scheduler.base_scope.namespaces] == [1, 2]
    for c in (scheduler, worker, wrong, explicit):
        c.shutdown()
    del full


@pytest.mark.parametrize("num_workers", [1, 2])
def test_mla_stores_one_latent_copy_and_every_rank_loads_it(mla_model, daemon, num_workers):
    p = prompt(7, 19)
    a = kvtier_engine(mla_model, daemon, num_workers=num_workers)
    counted = []
    for w in a.worker_connectors:
        w.get_kv_connector_stats = (lambda original: lambda: counted.append(original()) or counted[-1])(
            w.get_kv_connector_stats)
    run_request(a, p, 1, "r1")
    drain_commits(a)
    keys, namespaces = rank_keys(a, p)
    assert len(namespaces) == 1 and namespaces[0].tp_size == 1  # one namespace whatever the TP size
    saves = sum(s.data.get("save_blocks", 0) for s in counted if s is not None)
    assert saves == 2  # rank 0 only
    b = kvtier_engine(mla_model, daemon, num_workers=num_workers)
    p2 = p + [3, 4]
    toks, logits = run_request(b, p2, 2, "r2")
    assert computed_at_start(b, "r2") == 16
    ref = reference_engine(mla_model, num_workers)
    ref_toks, ref_logits = run_request(ref, p2, 2, "r2")
    assert toks == ref_toks
    assert torch.equal(logits[0], ref_logits[0][16:])
    for rank in range(num_workers):  # every rank's latent cache holds the loaded prefix
        ids_b, ids_ref = b.block_ids("r2"), ref.block_ids("r2")
        cache_b, cache_ref = b.worker_kv_caches[rank], ref.worker_kv_caches[rank]
        for name in cache_b:
            for i in range(4):
                assert torch.equal(cache_b[name][ids_b[i]], cache_ref[name][ids_ref[i]])
    a.shutdown()
    b.shutdown()


def test_events_stay_vllms_own_when_vllm_needs_more_fields_and_fall_back_when_it_refuses(monkeypatch):
    """A field vLLM requires that the connector does not pass is None (vLLM
    at 0181ea3173e5 requires lora_name); a class that refuses even that
    gets the stand-in, with the same fields."""
    from kvtier.integrations import _vllm_events

    class Strict:
        __struct_fields__ = ("block_hashes", "medium", "lora_name")

        def __init__(self, block_hashes, medium, lora_name):  # lora_name has no default
            self.block_hashes, self.medium, self.lora_name = block_hashes, medium, lora_name

    class Refusing:
        __struct_fields__ = ("block_hashes", "medium", "shape")

        def __init__(self, block_hashes, medium, shape):
            if shape is None:
                raise TypeError("shape is required")
    monkeypatch.setattr(_vllm_events, "_vllm_events", type("events", (), {"BlockRemoved": Strict,
                                                                          "BlockStored": Refusing}))
    event = _vllm_events.BlockRemoved(block_hashes=[b"h"], medium="CPU")
    assert isinstance(event, Strict) and event.block_hashes == [b"h"] and event.lora_name is None
    stored = _vllm_events.BlockStored(block_hashes=[b"h"], medium="CPU")
    assert not isinstance(stored, Refusing) and stored.block_hashes == [b"h"] and stored.medium == "CPU"


def test_mla_fails_under_a_changed_byte_and_another_revision(mla_model, daemon):
    p = prompt(8, 19)
    a = kvtier_engine(mla_model, daemon, num_workers=2)
    run_request(a, p, 1, "r1")
    drain_commits(a)
    keys, namespaces = rank_keys(a, p)
    ns = namespaces[0]
    with quiet_client(daemon, [ns]) as c:
        data = bytearray(ns.block_bytes)
        assert c.get(0, keys[0][1], data) == ns.block_bytes
        assert c.erase(0, [keys[0][1]]) == 1
        data[-1] ^= 0x40  # the exponent of the last token's last latent float
        c.put(0, keys[0][1], data)
    p2 = p + [3, 4]
    b = kvtier_engine(mla_model, daemon, num_workers=2)
    _, logits = run_request(b, p2, 1, "r2")
    assert computed_at_start(b, "r2") == 16
    ref_logits = run_request(reference_engine(mla_model, 2), p2, 1, "r2")[1]
    assert not torch.equal(logits[0], ref_logits[0][16:])  # the loaded latent is what attention used
    c2 = kvtier_engine(mla_model, daemon, num_workers=2, revision="another")
    run_request(c2, p2, 1, "r3")
    assert computed_at_start(c2, "r3") == 0
    for e in (a, b, c2):
        e.shutdown()


def test_mla_fails_under_a_changed_layer_order(mla_model, daemon):
    """Layer l of a stored MLA block is the latent layer l of the model
    attends to: with two stored layers swapped, the hit is served and the
    logits differ from a recompute, while the untouched copy equals it."""
    p = prompt(15, 19)
    a = kvtier_engine(mla_model, daemon)
    run_request(a, p, 1, "r1")
    drain_commits(a)
    keys, namespaces = rank_keys(a, p)
    ns = namespaces[0]
    assert ns.layer_count >= 2
    p2 = p + [3, 4]
    ref_logits = run_request(reference_engine(mla_model), p2, 1, "r2")[1]
    b = kvtier_engine(mla_model, daemon)
    _, logits = run_request(b, p2, 1, "r2")
    assert computed_at_start(b, "r2") == 16 and torch.equal(logits[0], ref_logits[0][16:])
    with quiet_client(daemon, [ns]) as c:
        data = bytearray(ns.block_bytes)
        assert c.get(0, keys[0][1], data) == ns.block_bytes
        assert c.erase(0, [keys[0][1]]) == 1
        n = ns.block_bytes // ns.layer_count
        data[0:n], data[n:2 * n] = data[n:2 * n], data[0:n]
        c.put(0, keys[0][1], data)
    c2 = kvtier_engine(mla_model, daemon)
    _, logits = run_request(c2, p2, 1, "r3")
    assert computed_at_start(c2, "r3") == 16
    assert not torch.equal(logits[0], ref_logits[0][16:])
    for e in (a, b, c2):
        e.shutdown()


def test_a_streaming_input_session_keys_its_longer_prompt(model, daemon):
    """vLLM's streaming input reuses one request for the next chunk with the
    prompt grown (earlier input + output + new input): the connector keys
    the new prompt, keeps what it saved of the old one, and looks up again."""
    a = kvtier_engine(model, daemon)
    sched = a.scheduler_connector
    first = prompt(9, 10)
    request = a.make_request(first, 1, "s1")
    sched.get_num_new_matched_tokens(request, 0)
    state = sched._scheduler._requests["s1"]
    assert len(state.keys[0]) == 1
    state.saved = 1  # its first kvtier block was saved
    request.prompt_token_ids.extend(prompt(10, 9))  # the next chunk of the session
    sched.get_num_new_matched_tokens(request, 0)
    assert len(state.tokens) == 19 and len(state.keys[0]) == 2 and state.saved == 1
    grown = rank_keys(a, list(request.prompt_token_ids))[0][0]
    assert state.keys[0] == grown
    a.shutdown()


def test_a_resumed_streaming_session_saves_its_next_chunk(model, daemon):
    """vLLM parks a finished chunk of a streaming-input session (no
    request_finished, blocks kept) and, with the next chunk, grows the same
    Request's prompt and schedules it as a new request with its computed
    tokens and no lookup. The connector must key the grown prompt there, or
    nothing after the first chunk is ever saved."""
    from mini_vllm.scheduler_output import CachedRequestData, NewRequestData, SchedulerOutput
    a = kvtier_engine(model, daemon)
    sched = a.scheduler_connector
    first = prompt(11, 13)  # one whole kvtier block (8 tokens)
    request = a.make_request(first, 1, "s1")
    while sched.get_num_new_matched_tokens(request, 0)[0] is None:
        time.sleep(0.005)

    def step(computed, scheduled, table):
        out = SchedulerOutput([NewRequestData("s1", list(request.prompt_token_ids), [], None, None, (table,),
                                              computed, None)],
                              CachedRequestData.make_empty(), {"s1": scheduled}, scheduled, {}, {}, [0], set(), [])
        return sched.build_connector_meta(out)
    meta = step(0, 13, [1, 2, 3, 4])
    assert [(s.first, len(s.keys[0])) for s in meta.saves] == [(0, 1)]
    # The session's next chunk: the computed output token and 12 new tokens.
    request.prompt_token_ids.extend([7] + prompt(12, 12))
    meta = step(14, 12, [1, 2, 3, 4, 5, 6, 7])
    grown = rank_keys(a, list(request.prompt_token_ids))[0][0]
    assert [(s.first, s.keys[0]) for s in meta.saves] == [(1, grown[1:3])]
    a.shutdown()


def test_a_streaming_input_session_is_saved_across_its_chunks_and_loads_bit_exact(model, daemon):
    """vLLM's streaming input in the engine's order: a resumable request
    runs its first chunk, parks with its blocks, takes its next chunk as a
    longer prompt (the computed output token kept, the last sampled one
    dropped) and is scheduled again without a lookup. The connector saves
    the grown prompt's blocks; another engine loads them bit-exact."""
    a = kvtier_engine(model, daemon)
    first, second = prompt(13, 13), prompt(14, 12)
    a.add_request(a.make_request(first, 2, "s1", resumable=True))
    a.run_until_done()
    assert a.request("s1").status.name == "WAITING_FOR_STREAMING_REQ" and len(a.outputs["s1"]) == 2
    a.add_request(a.make_request(second, 3, "s1"))  # the last chunk (not resumable)
    a.run_until_done()
    assert a.request("s1") is None and a.finish_reasons["s1"] == "length"
    session = first + a.outputs["s1"][:1] + second  # 26 tokens: the first output's KV was computed
    assert a.outputs["s1"][2:] == greedy_generate(model, session, 3)
    drain_commits(a)
    keys, namespaces = rank_keys(a, session)
    with quiet_client(daemon, namespaces) as c:
        assert c.lookup(0, keys[0]).prefix_blocks == 3  # every whole block of the grown prompt
    b = kvtier_engine(model, daemon)
    p2 = session + [5, 9]
    toks, logits = run_request(b, p2, 2, "r2")
    assert computed_at_start(b, "r2") == 24
    ref_toks, ref_logits = run_request(reference_engine(model), p2, 2, "r2")
    assert toks == ref_toks and torch.equal(logits[0], ref_logits[0][24:])
    a.shutdown()
    b.shutdown()
