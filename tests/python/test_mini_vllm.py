"""Tests of the tiny models and of the mini vLLM engine (no kvtier needed).

The mini engine is the stand-in for vLLM when testing the kvtier connector, so
these tests pin the properties the connector tests rely on: bit-exact model
outputs, vLLM's call order (scheduler.py and the worker mixin @00f4240e, see mini_vllm/__init__.py), and a
working store/load round trip through a reference in-memory connector; and, for the hybrid
toy TinyGemma (full attention + sliding window), vLLM's hybrid KV cache manager: per-group
block tables, out-of-window blocks nulled, local prefix hits every group accepts, HMA on and
off bit-identical, and a round trip of every group's blocks through the SupportsHMA path; and vLLM's
async scheduling (a batch queue of two steps, the AsyncScheduler's placeholders): the tokens and
logits of sync scheduling, with several requests, chunked prefill and preemptions, and the
connector call order it changes (build_connector_meta of step N+1 before update_connector_output
of step N).
"""

import hashlib
import struct
from dataclasses import dataclass, field

import pytest

torch = pytest.importorskip("torch")

import mini_vllm as mv  # noqa: E402
from mini_vllm import (KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole, MiniEngine,  # noqa: E402
                       make_kv_cache_config, make_vllm_config, run_request, yield_req_data)
from mini_vllm import KVCacheLayout  # noqa: E402
from tiny_model import KVCache, KVShard, SeqInput, TinyDecoder, TinyGemma, TinyHybrid, greedy_generate  # noqa: E402

from model_fixtures import deterministic, gemma_model, mla_model, model, prompt  # noqa: E402,F401 (fixtures)

BS = 4
L = [f"model.layers.{i}.self_attn.attn" for i in range(3)]


# ---------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------

def test_model_is_deterministic_and_seeded():
    a, b, c = TinyDecoder(seed=0), TinyDecoder(seed=0), TinyDecoder(seed=1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["embed"], sc["embed"])
    p = prompt(1, 21)
    runs = []
    for m in (a, a, b):
        caches = KVCache.allocate(m, 8)
        runs.append((m(p, list(range(21)), list(range(1, 7)), 0, caches), caches))
    for logits, caches in runs[1:]:
        assert torch.equal(logits, runs[0][0])
        assert all(torch.equal(caches[n], runs[0][1][n]) for n in L)


def test_cache_layout_is_vllm_flash_attention(model):
    caches = KVCache.allocate(model, 7)
    assert list(caches) == L
    assert all(t.shape == (2, 7, BS, 2, 8) and t.dtype == torch.float32 for t in caches.values())
    spec = make_kv_cache_config(model, 7, tensor_parallel_size=2).kv_cache_groups[0].kv_cache_spec
    assert (spec.num_kv_heads, spec.page_size_bytes) == (1, 2 * BS * 1 * 8 * 4)


def test_outputs_and_kv_do_not_depend_on_chunking_batching_or_tp(model):
    p, q = prompt(2, 23), prompt(3, 9)
    table = [5, 2, 7, 1, 3, 6]
    ref_caches = KVCache.allocate(model, 12)
    ref = model(p, list(range(23)), table, 0, ref_caches)

    chunked = KVCache.allocate(model, 12)
    parts = [model(p[s:e], list(range(s, e)), table, s, chunked) for s, e in [(0, 1), (1, 8), (8, 9), (9, 23)]]
    assert torch.equal(torch.cat(parts), ref)
    assert all(torch.equal(chunked[n], ref_caches[n]) for n in L)

    # Batched with another request (its own blocks), and sharded over two TP ranks.
    shards = KVCache.shards(model, 12, 2)
    out = model.forward_batch([SeqInput(q, list(range(9)), [8, 9, 10]), SeqInput(p, list(range(23)), table)], shards)
    assert torch.equal(out[1], ref)
    merged = {n: torch.cat([s.kv_caches[n] for s in shards], dim=3) for n in L}
    assert torch.equal(KVCache.gather_tokens(merged, table, 23, BS), KVCache.gather_tokens(ref_caches, table, 23, BS))


def test_position_matters(model):
    """K/V carry RoPE'd positions: a block placed at the wrong position changes the outputs."""
    p = prompt(4, 17)
    caches = KVCache.allocate(model, 8)
    table = [1, 2, 3, 4, 5]
    ref = model(p, list(range(17)), table, 0, caches)[-1]
    swapped = [2, 1, 3, 4, 5]  # blocks 0 and 1 exchanged: same bytes, wrong positions
    again = model([p[16]], [16], swapped, 16, caches)[-1]
    assert not torch.equal(again, ref)
    assert torch.equal(model([p[16]], [16], table, 16, caches)[-1], ref)


def test_hooks_wait_before_read_and_save_after_write(model):
    calls = []

    class Hooks:
        def wait_for_layer_load(self, name):
            calls.append(("wait", name))

        def save_kv_layer(self, name, kv, meta):
            calls.append(("save", name, kv is caches[name], meta.slot_mapping.tolist()))

    caches = KVCache.allocate(model, 8)
    model(prompt(5, 6), list(range(6)), [3, 1], 0, caches, hooks=Hooks())
    slots = [12, 13, 14, 15, 4, 5]
    assert calls == [c for n in L for c in (("wait", n), ("save", n, True, slots))]


def test_greedy_generate_is_full_recompute_reference(model):
    p = prompt(6, 13)
    toks, logits = greedy_generate(model, p, 5, return_logits=True)
    assert len(set(toks)) > 1
    for i, t in enumerate(toks):
        assert int(torch.argmax(logits[i])) == t


# ---------------------------------------------------------------------------
# The engine without a connector
# ---------------------------------------------------------------------------

def test_engine_greedy_equals_full_recompute(model):
    engine = MiniEngine(model)
    prompts = [prompt(10 + i, n) for i, n in enumerate([5, 13, 22])]
    reqs = [engine.add_request(p, 6) for p in prompts]
    engine.run_until_done()
    for p, r in zip(prompts, reqs):
        ref, ref_logits = greedy_generate(model, p, 6, return_logits=True)
        assert engine.outputs[r.request_id] == ref
        # Bit-identical too: the model's per-token computation does not depend on batching.
        assert all(torch.equal(a[-1], b) for a, b in zip(engine.logits[r.request_id], ref_logits))
    assert engine.finish_reasons == {r.request_id: "length" for r in reqs}
    assert engine.block_pool.get_num_free_blocks() == 63  # all freed (block 0 is the null block)


def test_chunked_prefill_is_bit_exact(model):
    p = prompt(11, 30)
    cfg = make_vllm_config(model, kv_connector=None, max_num_batched_tokens=8)
    engine = MiniEngine(model, cfg)
    toks, logits = run_request(engine, p, 3)
    assert [h.scheduler_output.total_num_scheduled_tokens for h in engine.history[:4]] == [8, 8, 8, 6]
    full = MiniEngine(model)
    ftoks, flogits = run_request(full, p, 3)
    assert toks == ftoks == greedy_generate(model, p, 3)
    assert torch.equal(torch.cat(logits[:4]), flogits[0])


def test_local_prefix_cache_computes_only_the_suffix(model):
    shared = prompt(12, 18)
    p1, p2 = shared + prompt(13, 5), shared + prompt(14, 7)
    engine = MiniEngine(model)
    run_request(engine, p1, 4, "r1")
    toks, logits = run_request(engine, p2, 4, "r2")
    first = next(h.scheduler_output for h in engine.history if "r2" in h.scheduler_output.num_scheduled_tokens)
    assert first.scheduled_new_reqs[0].num_computed_tokens == 16  # 4 retained full blocks of r1
    assert first.num_scheduled_tokens["r2"] == len(p2) - 16

    # A fresh engine that retained the same blocks gives the same bits.
    other = MiniEngine(model)
    run_request(other, p1, 4, "r1")
    toks_b, logits_b = run_request(other, p2, 4, "r2")
    assert toks == toks_b == greedy_generate(model, p2, 4)
    assert all(torch.equal(a, b) for a, b in zip(logits, logits_b))
    # And without prefix caching (full prefill) the suffix logits are bit-identical as well.
    off = MiniEngine(model, make_vllm_config(model, kv_connector=None, enable_prefix_caching=False))
    toks_c, logits_c = run_request(off, p2, 4, "r2")
    assert toks_c == toks and torch.equal(logits_c[0][16:], logits[0])
    assert torch.equal(engine.request_kv("r2", len(p2)), off.request_kv("r2", len(p2)))


def test_retained_blocks_are_evicted_lru_when_the_pool_is_full(model):
    engine = MiniEngine(model, kv_cache_config=make_kv_cache_config(model, 10))
    a, b = prompt(15, 20), prompt(16, 20)
    run_request(engine, a, 2)  # blocks 1-6, blocks 1-5 full and hashed; freed tail first
    run_request(engine, b, 2)  # 6 of the 9 usable blocks: 7, 8, 9, then a's 6, 5, 4 (LRU = a's tail)
    assert engine.block_pool.num_evictions == 2
    toks, _ = run_request(engine, a, 2, "again")
    first = next(h.scheduler_output for h in engine.history if "again" in h.scheduler_output.num_scheduled_tokens)
    assert first.scheduled_new_reqs[0].num_computed_tokens == 12  # a's blocks 1-3 survived
    assert toks == greedy_generate(model, a, 2)


def test_natural_preemption_recomputes_correctly(model):
    engine = MiniEngine(model, kv_cache_config=make_kv_cache_config(model, 9))
    prompts = [prompt(17, 11), prompt(18, 10)]
    reqs = [engine.add_request(p, 9) for p in prompts]
    engine.run_until_done()
    assert any(h.scheduler_output.preempted_req_ids for h in engine.history)
    for p, r in zip(prompts, reqs):
        assert engine.outputs[r.request_id] == greedy_generate(model, p, 9)


# ---------------------------------------------------------------------------
# A recording connector: vLLM's call order
# ---------------------------------------------------------------------------

@dataclass
class RecMeta(KVConnectorMetadata):
    new_req_ids: list
    cached_req_ids: list
    resumed_req_ids: set
    preempted_req_ids: set
    finished_req_ids: set
    loads: dict  # req_id -> num_external_tokens


@dataclass
class Script:
    """What the recording connectors answer. matched(request, num_computed, n_call) -> (int|None, bool)."""
    matched: object = None
    delay_free: set = field(default_factory=set)
    send_delay_steps: dict = field(default_factory=dict)  # rank -> worker passes to wait before finished_sending
    calls: dict = field(default_factory=dict)


class RecordingConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config, log, script):
        super().__init__(vllm_config, role, kv_cache_config)
        self.log, self.script = log, script
        self.rank = vllm_config.parallel_config.rank
        self.who = "S" if role == KVConnectorRole.SCHEDULER else f"W{self.rank}"
        self.pending = {}
        self.recv_now, self.sending = set(), {}
        self.kv_caches = None

    def rec(self, *entry):
        if self.role == KVConnectorRole.WORKER:
            assert mv.get_tensor_model_parallel_rank() == self.rank
        self.log.append((self.who,) + entry)

    # scheduler side
    def bind_kv_cache_manager(self, kv_cache_manager):
        self.rec("bind_kv_cache_manager")
        super().bind_kv_cache_manager(kv_cache_manager)

    def on_new_request(self, request):
        self.rec("on_new_request", request.request_id)

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        n = self.script.calls[request.request_id] = self.script.calls.get(request.request_id, 0) + 1
        self.rec("get_num_new_matched_tokens", request.request_id, num_computed_tokens)
        return self.script.matched(request, num_computed_tokens, n) if self.script.matched else (0, False)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self.rec("update_state_after_alloc", request.request_id, blocks.get_block_ids(), num_external_tokens)
        if num_external_tokens:
            self.pending[request.request_id] = num_external_tokens

    def build_connector_meta(self, scheduler_output):
        so = scheduler_output
        self.rec("build_connector_meta")
        meta = RecMeta([r.req_id for r in so.scheduled_new_reqs], list(so.scheduled_cached_reqs.req_ids),
                       set(so.scheduled_cached_reqs.resumed_req_ids), set(so.preempted_req_ids or ()),
                       set(so.finished_req_ids), dict(self.pending))
        self.pending.clear()
        return meta

    def update_connector_output(self, connector_output):
        self.rec("update_connector_output", connector_output.finished_sending, connector_output.finished_recving)

    def request_finished(self, request, block_ids):
        self.rec("request_finished", request.request_id, list(block_ids))
        if request.request_id in self.script.delay_free:
            return True, {"delayed": request.request_id}
        return False, None

    # worker side
    def register_kv_caches(self, kv_caches):
        self.kv_caches = kv_caches
        self.rec("register_kv_caches", {n: tuple(t.shape) for n, t in kv_caches.items()})

    def handle_preemptions(self, kv_connector_metadata):
        self.rec("handle_preemptions", set(kv_connector_metadata.preempted_req_ids))

    def bind_connector_metadata(self, connector_metadata):
        self.rec("bind_connector_metadata")
        super().bind_connector_metadata(connector_metadata)

    def clear_connector_metadata(self):
        self.rec("clear_connector_metadata")
        super().clear_connector_metadata()

    def start_load_kv(self, forward_context, **kwargs):
        meta = self._get_connector_metadata()
        self.rec("start_load_kv", forward_context.attn_metadata is None)
        assert all(forward_context.no_compile_layers[n].kv_cache is self.kv_caches[n] for n in self.kv_caches)
        self.recv_now |= {r for r in meta.loads if r not in meta.new_req_ids + meta.cached_req_ids}

    def wait_for_layer_load(self, layer_name):
        self.rec("wait_for_layer_load", layer_name)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        assert kv_layer is self.kv_caches[layer_name]
        self.rec("save_kv_layer", layer_name, tuple(attn_metadata.slot_mapping.tolist()))

    def wait_for_save(self):
        self.rec("wait_for_save")

    def get_finished(self, finished_req_ids):
        self.rec("get_finished", set(finished_req_ids))
        for r in finished_req_ids:
            if r in self.script.delay_free:
                self.sending[r] = self.script.send_delay_steps.get(self.rank, 0)
        done = {r for r, left in self.sending.items() if left == 0}
        self.sending = {r: left - 1 for r, left in self.sending.items() if left > 0}
        recv, self.recv_now = self.recv_now, set()
        return done or None, recv or None

    def get_block_ids_with_load_errors(self):
        self.rec("get_block_ids_with_load_errors")
        return set()


def recording_engine(model, log, script=None, num_workers=1, num_blocks=64, ahead=False, **cfg):
    script = script or Script()
    vcfg = make_vllm_config(model, tensor_parallel_size=num_workers, **cfg)
    engine = MiniEngine(model, vcfg, make_kv_cache_config(model, num_blocks, num_workers),
                        lambda c, role, kvc: RecordingConnector(c, role, kvc, log, script), num_workers=num_workers,
                        worker_runs_ahead=ahead)
    return engine, script


def worker_pass(w, layers=True, slots=None, start_before=False, finished=frozenset()):
    """The worker calls of one step, in vLLM @00f4240e's order."""
    seq = [(w, "handle_preemptions", set()), (w, "bind_connector_metadata")]
    start = [(w, "start_load_kv", not layers)]
    seq += start if start_before else []
    if layers:
        seq += [c for n in L for c in ((w, "wait_for_layer_load", n), (w, "save_kv_layer", n, slots))]
    seq += [] if start_before else start
    return seq + [(w, "wait_for_save"), (w, "get_finished", set(finished)), (w, "get_block_ids_with_load_errors"),
                  (w, "clear_connector_metadata")]


def test_call_order_of_one_request(model):
    log = []
    engine, _ = recording_engine(model, log)
    p = prompt(20, 10)
    engine.add_request(p, 2, "a")
    engine.run_until_done()
    expected = [
        ("W0", "register_kv_caches", {n: (64, 2, BS, 16) for n in L}),  # [B, H, N, K|V] views
        ("S", "bind_kv_cache_manager"),
        ("S", "on_new_request", "a"),
        # step 1: prefill of 10 tokens into blocks 1, 2, 3
        ("S", "get_num_new_matched_tokens", "a", 0),
        ("S", "update_state_after_alloc", "a", ([1, 2, 3],), 0),
        ("S", "build_connector_meta"),
        *worker_pass("W0", slots=tuple(range(4, 14))),
        # one worker: its KVConnectorOutput passes through unaggregated (empty sets, not None)
        ("S", "update_connector_output", set(), set()),
        # step 2: one decode token at position 10, then the request is finished (max_tokens=2)
        ("S", "build_connector_meta"),
        *worker_pass("W0", slots=(14,)),
        ("S", "request_finished", "a", [1, 2, 3]),
        ("S", "update_connector_output", set(), set()),
        # step 3: no forward; the workers learn that "a" finished. Nothing to report: with one
        # worker the empty KVConnectorOutput is dropped, so no update_connector_output.
        ("S", "build_connector_meta"),
        *worker_pass("W0", layers=False, finished={"a"}),
    ]
    assert log == expected
    assert engine.outputs["a"] == greedy_generate(model, p, 2)


def test_none_from_get_num_new_matched_tokens_retries_next_step(model):
    log = []
    script = Script(matched=lambda req, n, call: (None, False) if call == 1 else (0, False))
    engine, _ = recording_engine(model, log, script)
    p = prompt(21, 6)
    engine.add_request(p, 1, "a")
    engine.step()
    assert engine.history[-1].scheduler_output.num_scheduled_tokens == {}
    assert log[3:] == [("S", "get_num_new_matched_tokens", "a", 0), ("S", "build_connector_meta"),
                       *worker_pass("W0", layers=False)]
    del log[:]
    engine.step()
    assert log[:3] == [("S", "get_num_new_matched_tokens", "a", 0),
                       ("S", "update_state_after_alloc", "a", ([1, 2],), 0), ("S", "build_connector_meta")]
    assert engine.history[-1].scheduler_output.num_scheduled_tokens == {"a": 6}
    engine.run_until_done()
    assert engine.outputs["a"] == greedy_generate(model, p, 1)


def test_sync_hit_loads_before_the_forward_and_must_leave_one_token(model):
    log = []
    script = Script(matched=lambda req, n, call: (8, False) if req.request_id == "a" else (req.num_tokens, False))
    engine, _ = recording_engine(model, log, script)
    engine.add_request(prompt(22, 10), 1, "a")
    engine.step()
    so = engine.history[-1].scheduler_output
    assert so.has_sync_kv_loads and so.scheduled_new_reqs[0].num_computed_tokens == 8
    assert so.num_scheduled_tokens == {"a": 2}
    worker = [e for e in log if e[0] == "W0"][1:]
    assert worker == worker_pass("W0", slots=(12, 13), start_before=True)
    engine.run_until_done()
    engine.add_request(prompt(23, 8), 1, "full")  # a sync hit of every token
    with pytest.raises(AssertionError):
        engine.step()


def test_async_load_waits_for_finished_recving_from_every_worker(model):
    log = []
    script = Script(matched=lambda req, n, call: (8, True))
    engine, _ = recording_engine(model, log, script, num_workers=2)
    engine.add_request(prompt(24, 10), 1, "a")
    engine.step()
    assert engine.request("a").status == mv.RequestStatus.WAITING_FOR_REMOTE_KVS
    assert engine.history[-1].scheduler_output.num_scheduled_tokens == {}
    assert ("S", "update_state_after_alloc", "a", ([1, 2],), 8) in log
    assert ("S", "update_connector_output", None, {"a"}) == log[-1]
    del log[:]
    engine.step()
    so = engine.history[-1].scheduler_output
    assert not any(e[1] == "get_num_new_matched_tokens" for e in log)
    assert so.scheduled_new_reqs[0].num_computed_tokens == 8 and so.num_scheduled_tokens == {"a": 2}
    assert so.scheduled_new_reqs[0].block_ids == ([1, 2, 3],)
    engine.run_until_done()


def test_abort_while_waiting_for_remote_kvs_frees_on_finished_recving(model):
    log = []
    engine, _ = recording_engine(model, log, Script(matched=lambda req, n, call: (8, True)))
    engine.add_request(prompt(36, 10), 1, "a")
    so = engine.schedule()
    assert engine.request("a").status == mv.RequestStatus.WAITING_FOR_REMOTE_KVS
    engine.abort("a")
    assert log[-1] == ("S", "request_finished", "a", [1, 2])
    assert engine.block_pool.get_num_free_blocks() == 61  # held: the load may still write them
    engine.update_from_output(so, engine.execute_model(so))  # the worker reports finished_recving
    assert engine.block_pool.get_num_free_blocks() == 63 and "a" not in engine.scheduler.requests


def test_preemption_and_resume(model):
    log = []
    engine, _ = recording_engine(model, log, enable_prefix_caching=False)  # else the resume hits locally
    p = prompt(25, 9)
    engine.add_request(p, 6, "a")
    engine.step()
    engine.step()
    engine.preempt("a")
    assert engine.request("a").num_computed_tokens == 0
    del log[:]
    engine.step()
    so = engine.history[-1].scheduler_output
    assert so.preempted_req_ids == {"a"}
    assert so.scheduled_cached_reqs.resumed_req_ids == {"a"}
    assert so.scheduled_cached_reqs.num_computed_tokens == [0]
    # The full (new) block list, not an append: freed blocks went to the LRU tail, so 4-6 now.
    assert so.scheduled_cached_reqs.new_block_ids == [([4, 5, 6],)]
    assert so.scheduled_cached_reqs.all_token_ids["a"] == p + engine.outputs["a"][:2]  # as scheduled
    assert log[0] == ("S", "get_num_new_matched_tokens", "a", 0)
    assert ("W0", "handle_preemptions", {"a"}) in log
    engine.run_until_done()
    assert engine.outputs["a"] == greedy_generate(model, p, 6)


def test_resume_after_preemption_asks_the_connector_with_the_local_hit(model):
    log = []
    engine, _ = recording_engine(model, log)
    engine.add_request(prompt(25, 9), 3, "a")
    engine.step()
    engine.step()
    engine.preempt("a")
    del log[:]
    engine.step()
    # 9 prompt + 2 output tokens: the 2 full blocks freed by the preemption are still cached locally.
    assert log[:2] == [("S", "get_num_new_matched_tokens", "a", 8),
                       ("S", "update_state_after_alloc", "a", ([1, 2, 4],), 0)]
    assert engine.history[-1].scheduler_output.scheduled_cached_reqs.num_computed_tokens == [8]
    engine.run_until_done()
    assert engine.outputs["a"] == greedy_generate(model, prompt(25, 9), 3)


def test_abort_between_schedule_and_worker_pass(model):
    log = []
    engine, _ = recording_engine(model, log)
    engine.add_request(prompt(26, 7), 4, "a")
    so = engine.schedule()
    engine.abort("a")
    # num_computed_tokens already counts the scheduled (in-flight) tokens, so the blocks being
    # written by this step are handed to request_finished before the worker pass runs.
    assert log[-1] == ("S", "request_finished", "a", [1, 2])
    assert engine.block_pool.get_num_free_blocks() == 63
    out = engine.execute_model(so)  # the worker still runs the step it was given
    assert ("W0", "save_kv_layer", L[0], tuple(range(4, 11))) in log
    record = engine.update_from_output(so, out)
    assert record.outputs == [] and engine.outputs["a"] == []
    engine.step()
    assert ("W0", "get_finished", {"a"}) in log
    assert not engine.has_requests()


def test_delayed_free_needs_finished_sending_from_both_tp_workers(model):
    log = []
    script = Script(delay_free={"a"}, send_delay_steps={1: 2})
    engine, _ = recording_engine(model, log, script, num_workers=2)
    assert ("W0", "register_kv_caches", {n: (64, 1, BS, 16) for n in L}) in log
    assert ("W1", "register_kv_caches", {n: (64, 1, BS, 16) for n in L}) in log
    p = prompt(27, 9)
    engine.add_request(p, 2, "a")
    engine.step()
    # Both workers see the same calls; each runs its own lifecycle in vLLM's order.
    steps = [e[1:] for e in log if e[0] == "W0"][-14:]
    assert steps == [e[1:] for e in log if e[0] == "W1"][-14:]
    engine.step()
    assert engine.kv_transfer_params["a"] == {"delayed": "a"}
    held = engine.block_pool.get_num_free_blocks()
    assert held == 63 - 3 and "a" in engine.scheduler.requests
    engine.step()  # W0 reports finished_sending; W1 not yet
    engine.step()
    assert engine.block_pool.get_num_free_blocks() == held and "a" in engine.scheduler.requests
    engine.step()  # now W1 reports it too
    assert ("S", "update_connector_output", {"a"}, None) == log[-1]
    assert engine.block_pool.get_num_free_blocks() == 63 and not engine.has_requests()
    assert engine.outputs["a"] == greedy_generate(model, p, 2)


def test_chunked_prefill_through_the_connector(model):
    log = []
    engine, _ = recording_engine(model, log, max_num_batched_tokens=8)
    p = prompt(28, 19)
    engine.add_request(p, 2, "a")
    engine.run_until_done()
    sos = [h.scheduler_output for h in engine.history]
    assert [so.num_scheduled_tokens.get("a") for so in sos[:4]] == [8, 8, 3, 1]
    assert sos[0].scheduled_new_reqs[0].block_ids == ([1, 2],)
    cached = [so.scheduled_cached_reqs for so in sos[1:4]]
    assert [c.num_computed_tokens for c in cached] == [[8], [16], [19]]
    assert [c.new_block_ids for c in cached] == [[([3, 4],)], [([5],)], [None]]
    assert [c.resumed_req_ids for c in cached] == [set(), set(), set()]
    assert list(yield_req_data(sos[1])) == [("a", ([3, 4],), False)]
    assert engine.outputs["a"] == greedy_generate(model, p, 2)


def test_start_load_kv_always_first_in_older_vllm_mode(model):
    log = []
    vcfg = make_vllm_config(model)
    script = Script()
    engine = MiniEngine(model, vcfg, None, lambda c, r, k: RecordingConnector(c, r, k, log, script),
                        start_load_kv_before_forward=True)
    engine.add_request(prompt(29, 5), 1, "a")
    engine.step()
    assert [e for e in log if e[0] == "W0"][1:] == worker_pass("W0", slots=(4, 5, 6, 7, 8), start_before=True)


# ---------------------------------------------------------------------------
# A reference connector that really stores and loads KV (ExampleConnector-style,
# keyed by a process-independent chain of token hashes), to check the engine's
# plumbing end to end.
# ---------------------------------------------------------------------------

def chain_keys(tokens, block_size, num_blocks):
    keys, parent = [], b""
    for i in range(num_blocks):
        blk = tokens[i * block_size:(i + 1) * block_size]
        parent = hashlib.sha256(parent + struct.pack(f"<{len(blk)}I", *blk)).digest()
        keys.append(parent)
    return keys


@dataclass
class Transfer:
    req_id: str
    block_ids: list
    keys: list


@dataclass
class MemMeta(KVConnectorMetadata):
    loads: list
    stores: list
    async_loads: bool


class InMemoryConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config, store, async_load=False, fail_first_load_block=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self.store, self.async_load, self.fail = store, async_load, fail_first_load_block
        self.bs = vllm_config.cache_config.block_size
        self.num_blocks = kv_cache_config.num_blocks
        self.rank = vllm_config.parallel_config.rank
        self.world = vllm_config.parallel_config.tensor_parallel_size
        self.local_hit, self.loads, self.reqs, self.block_ids, self.stored = {}, {}, {}, {}, {}
        self.kv_caches, self.received, self.errors, self.failed_reqs = None, set(), set(), set()

    def _complete(self, key):
        return all(("done", r, key) in self.store for r in range(self.world))

    # scheduler side
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        keys = chain_keys(request.all_token_ids, self.bs, (request.num_tokens - 1) // self.bs)
        hit = next((i for i, k in enumerate(keys) if not self._complete(k)), len(keys))
        ext = max(0, hit * self.bs - num_computed_tokens)
        self.local_hit[request.request_id] = num_computed_tokens
        return ext, self.async_load and ext > 0

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        rid = request.request_id
        self.reqs[rid] = request
        (ids,) = blocks.get_block_ids()
        self.block_ids[rid] = list(ids)
        self.stored[rid] = 0
        if num_external_tokens > 0:
            first = self.local_hit[rid] // self.bs
            last = first + num_external_tokens // self.bs
            keys = chain_keys(request.all_token_ids, self.bs, last)
            self.loads[rid] = Transfer(rid, ids[first:last], keys[first:last])

    def build_connector_meta(self, scheduler_output):
        for rid, new_ids, resumed in yield_req_data(scheduler_output):
            if rid in self.reqs and new_ids is not None:
                if resumed or rid in [r.req_id for r in scheduler_output.scheduled_new_reqs]:
                    self.block_ids[rid] = list(new_ids[0])
                else:
                    self.block_ids[rid].extend(new_ids[0])
        stores = []
        for rid, n in scheduler_output.num_scheduled_tokens.items():
            req = self.reqs[rid]
            full = min(req.num_computed_tokens + n, req.num_tokens) // self.bs
            keys = chain_keys(req.all_token_ids, self.bs, full)
            todo = [i for i in range(self.stored[rid], full) if not self._complete(keys[i])]
            if todo:
                stores.append(Transfer(rid, [self.block_ids[rid][i] for i in todo], [keys[i] for i in todo]))
            self.stored[rid] = full
        meta = MemMeta(list(self.loads.values()), stores, self.async_load)
        self.loads.clear()
        return meta

    def request_finished(self, request, block_ids):
        for d in (self.reqs, self.block_ids, self.stored, self.local_hit):
            d.pop(request.request_id, None)
        return False, None

    # worker side
    def register_kv_caches(self, kv_caches):
        self.kv_caches = kv_caches

    def blocks(self, kv):
        """A layer's 4-D view with manager blocks as dim 0 (current vLLM's views)."""
        return mv.group_kernel_blocks(kv, self.num_blocks)

    def start_load_kv(self, forward_context, **kwargs):
        meta = self._get_connector_metadata()
        layers = {n: l.kv_cache for n, l in forward_context.no_compile_layers.items() if hasattr(l, "kv_cache")}
        for t in meta.loads:
            for i, (bid, key) in enumerate(zip(t.block_ids, t.keys)):
                for name, kv in layers.items():
                    if self.fail is not None and i == self.fail:
                        self.blocks(kv)[bid] = float("nan")  # the "failed" load leaves garbage behind
                    else:
                        self.blocks(kv)[bid] = self.store[(self.rank, key, name)]
                if self.fail is not None and i == self.fail:
                    self.errors.add(bid)
                    self.failed_reqs.add(t.req_id)
            if meta.async_loads:
                self.received.add(t.req_id)
            self.fail = None  # fail only the first load

    def wait_for_layer_load(self, layer_name):
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass

    def wait_for_save(self):
        for t in self._get_connector_metadata().stores:
            if t.req_id in self.failed_reqs:
                continue  # never store blocks computed over a failed load
            for bid, key in zip(t.block_ids, t.keys):
                for name, kv in self.kv_caches.items():
                    self.store[(self.rank, key, name)] = self.blocks(kv)[bid].clone()
                self.store[("done", self.rank, key)] = True
        self.failed_reqs.clear()

    def get_finished(self, finished_req_ids):
        received, self.received = self.received, set()
        return None, received or None

    def get_block_ids_with_load_errors(self):
        errors, self.errors = self.errors, set()
        return errors


def mem_engine(model, store, num_workers=1, kv_load_failure_policy="fail", layout=None, kernel_block_size=None,
               async_scheduling=False, ahead=False, **kw):
    vcfg = make_vllm_config(model, tensor_parallel_size=num_workers, kv_load_failure_policy=kv_load_failure_policy,
                            kv_cache_layout=layout, kernel_block_size=kernel_block_size,
                            async_scheduling=async_scheduling)
    return MiniEngine(model, vcfg, make_kv_cache_config(model, 64, num_workers, layout=layout),
                      lambda c, role, kvc: InMemoryConnector(c, role, kvc, store, **kw), num_workers=num_workers,
                      worker_runs_ahead=ahead)


@pytest.mark.parametrize("async_load", [False, True])
@pytest.mark.parametrize("num_workers", [1, 2])
def test_store_then_load_is_bit_exact(model, async_load, num_workers):
    store = {}
    shared = prompt(30, 14)
    p1, p2 = shared + prompt(31, 3), shared + prompt(32, 6)
    run_request(mem_engine(model, store, num_workers), p1, 2, "r1")
    assert sum(1 for k in store if k[0] == "done") == 4 * num_workers  # 4 full blocks of p1 (+1 token)

    b = mem_engine(model, store, num_workers, async_load=async_load)
    toks, logits = run_request(b, p2, 3, "r2")
    first = next(h.scheduler_output for h in b.history if h.scheduler_output.num_scheduled_tokens)
    assert first.scheduled_new_reqs[0].num_computed_tokens == 12  # 3 blocks loaded
    assert first.has_sync_kv_loads == (not async_load)
    ref = MiniEngine(model, make_vllm_config(model, kv_connector=None, enable_prefix_caching=False))
    ref_toks, ref_logits = run_request(ref, p2, 3, "r2")
    assert toks == ref_toks == greedy_generate(model, p2, 3)
    assert torch.equal(logits[0], ref_logits[0][12:])
    assert all(torch.equal(x, y) for x, y in zip(logits[1:], ref_logits[1:]))
    assert torch.equal(b.request_kv("r2", len(p2)), ref.request_kv("r2", len(p2)))


@pytest.mark.parametrize("async_load", [False, True])
def test_failed_block_is_recomputed(model, async_load):
    store = {}
    shared = prompt(33, 16)
    run_request(mem_engine(model, store), shared + [1, 2], 1, "r1")
    b = mem_engine(model, store, async_load=async_load, fail_first_load_block=1, kv_load_failure_policy="recompute")
    p2 = shared + [7, 8, 9]
    toks, logits = run_request(b, p2, 3, "r2")
    assert toks == greedy_generate(model, p2, 3)
    if not async_load:
        assert any("r2" in h.discarded_req_ids for h in b.history)  # the poisoned step's output was dropped
    computed = [h.scheduler_output for h in b.history if "r2" in h.scheduler_output.num_scheduled_tokens]
    starts = [(so.scheduled_new_reqs[0].num_computed_tokens if so.scheduled_new_reqs else
               so.scheduled_cached_reqs.num_computed_tokens[0]) for so in computed]
    assert 4 in starts  # truncated at the failed block (index 1) and recomputed from there
    assert not any(torch.isnan(x).any() for x in logits)
    assert not any(torch.isnan(v).any() for k, v in store.items() if k[0] != "done")


def test_connector_module_path_and_vllm_import_paths(model, tmp_path, monkeypatch):
    (tmp_path / "my_kv_connector.py").write_text(
        "from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole\n"
        "from vllm.v1.core.sched.output import SchedulerOutput\n"
        "from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata\n"
        "class Meta(KVConnectorMetadata):\n"
        "    pass\n"
        "class MyConnector(KVConnectorBase_V1):\n"
        "    roles = []\n"
        "    def __init__(self, vllm_config, role, kv_cache_config):\n"
        "        super().__init__(vllm_config, role, kv_cache_config)\n"
        "        MyConnector.roles.append((role, vllm_config.parallel_config.rank))\n"
        "    def get_num_new_matched_tokens(self, request, num_computed_tokens): return 0, False\n"
        "    def update_state_after_alloc(self, request, blocks, num_external_tokens): pass\n"
        "    def build_connector_meta(self, scheduler_output):\n"
        "        assert isinstance(scheduler_output, SchedulerOutput)\n"
        "        return Meta()\n"
        "    def start_load_kv(self, forward_context, **kwargs): pass\n"
        "    def wait_for_layer_load(self, layer_name): pass\n"
        "    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs): pass\n"
        "    def wait_for_save(self): pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with mv.install_as_vllm():
        from vllm.forward_context import get_forward_context
        from vllm.v1.kv_cache_interface import MLAAttentionSpec, create_kv_cache_views
        from vllm.v1.kv_cache_layout import KVCacheLayout as VllmKVCacheLayout
        assert get_forward_context is mv.get_forward_context
        assert (MLAAttentionSpec, create_kv_cache_views) == (mv.MLAAttentionSpec, mv.create_kv_cache_views)
        assert VllmKVCacheLayout is KVCacheLayout
        cfg = make_vllm_config(model, kv_connector="MyConnector", kv_connector_module_path="my_kv_connector")
        engine = MiniEngine(model, cfg, make_kv_cache_config(model, 32, 2), num_workers=2)
        toks, _ = run_request(engine, prompt(34, 6), 2)
        import my_kv_connector
        assert my_kv_connector.MyConnector.roles == [(KVConnectorRole.SCHEDULER, 0), (KVConnectorRole.WORKER, 0),
                                                     (KVConnectorRole.WORKER, 1)]
    assert toks == greedy_generate(model, prompt(34, 6), 2)
    import sys
    assert "vllm" not in sys.modules
    sys.modules.pop("my_kv_connector", None)


def test_hma_enabled_refuses_a_connector_without_supports_hma(model):
    cfg = make_vllm_config(model)
    cfg.scheduler_config.disable_hybrid_kv_cache_manager = False
    with pytest.raises(ValueError, match="HMA"):
        MiniEngine(model, cfg, None, InMemoryConnector)


def test_block_hashes_differ_between_engines_unless_seeded(model, monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    p = prompt(35, 9)
    a, b = MiniEngine(model).make_request(p), MiniEngine(model).make_request(p)
    assert len(a.block_hashes) == 2 and a.block_hashes != b.block_hashes
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    assert MiniEngine(model).make_request(p).block_hashes == MiniEngine(model).make_request(p).block_hashes
    salted = MiniEngine(model, none_hash=b"x").make_request(p, cache_salt="s")
    assert salted.block_hashes != MiniEngine(model, none_hash=b"x").make_request(p).block_hashes


# ---------------------------------------------------------------------------
# The hybrid toy model
# ---------------------------------------------------------------------------

def test_hybrid_resume_from_boundary_state_and_window_is_bit_exact():
    m = TinyHybrid(seed=0)
    p = prompt(40, 30)
    table = [3, 9, 1, 7, 2, 8, 4, 6]
    full_cache = KVCache.allocate(m, 10)
    full = m.forward(p, list(range(30)), table, full_cache)
    assert sorted(full.boundary_states) == [4, 8, 12, 16, 20, 24, 28]
    for k in (4, 16, 20):
        cache = KVCache.allocate(m, 10, fill=float("nan"))  # everything not restored is poison
        needed = [table[i] for i in m.blocks_needed_to_resume(k)]
        KVCache.copy_blocks(full_cache, cache, needed, needed)
        resumed = m.forward(p[k:], list(range(k, 30)), table, cache, state=full.boundary_states[k])
        assert torch.equal(resumed.logits, full.logits[k:])
        assert torch.equal(resumed.state, full.state)
        assert torch.equal(m.state_at(p, k), full.boundary_states[k])


def test_hybrid_needs_the_state_of_that_exact_boundary():
    m = TinyHybrid(seed=0)
    p = prompt(41, 24)
    table = list(range(6))
    cache = KVCache.allocate(m, 6)
    full = m.forward(p, list(range(24)), table, cache)
    for wrong in (full.boundary_states[20], m.initial_state()):
        again = m.forward(p[16:], list(range(16, 24)), table, cache, state=wrong)
        assert not torch.equal(again.logits, full.logits[16:])
    with pytest.raises(AssertionError):
        m.forward(p[16:], list(range(16, 24)), table, cache)  # a resume without a state is refused


# ---------------------------------------------------------------------------
# KV cache forms: current vLLM's 4-D views (every KVCacheLayout, kernel block
# splitting, padded pages), older vLLM's 5-D tensors; the same numerics in all
# ---------------------------------------------------------------------------

NB = 8  # blocks of the small engines below
PAGE = BS * 2 * 16  # TinyDecoder's page in floats: N x H x (K|V = 16 floats), 512 bytes

# Per layout, by hand (floats): the 4-D view's strides [B, H, N, C] and the distance between two
# consecutive layers' views, for TinyDecoder (3 layers, 2 KV heads, 8 + 8 floats a cell) and NB blocks.
HAND_STRIDES = {
    KVCacheLayout.LBHNC: ((PAGE, 64, 16, 1), PAGE * NB),
    KVCacheLayout.LBNHC: ((PAGE, 16, 32, 1), PAGE * NB),
    KVCacheLayout.LHBNC: ((64, 64 * NB, 16, 1), PAGE * NB),
    KVCacheLayout.BLHNC: ((3 * PAGE, 64, 16, 1), PAGE),
    KVCacheLayout.BLNHC: ((3 * PAGE, 16, 32, 1), PAGE),
    KVCacheLayout.BHLNC: ((3 * PAGE, 3 * 64, 16, 1), 64),
}


def test_kv_cache_layout_enum_and_resolution():
    assert {m.name: m.value for m in KVCacheLayout} == {
        "LBHNC": (0, 1, 2, 3, 4), "LBNHC": (0, 1, 3, 2, 4), "LHBNC": (0, 2, 1, 3, 4),
        "BLHNC": (1, 0, 2, 3, 4), "BLNHC": (1, 0, 3, 2, 4), "BHLNC": (1, 2, 0, 3, 4)}
    assert [m.is_layer_compact for m in KVCacheLayout] == [True, True, True, False, False, False]
    assert [m.is_block_compact for m in KVCacheLayout] == [True, True, False, True, True, False]
    assert KVCacheLayout.BLNHC.layer_view_order == (0, 2, 1, 3)
    assert mv.CacheConfig().get_resolved_kv_cache_layout() is KVCacheLayout.LBNHC  # FlashAttention's NHD
    assert mv.CacheConfig(kv_cache_layout="BHLNC").get_resolved_kv_cache_layout() is KVCacheLayout.BHLNC
    assert mv.resolve_kv_cache_layout("HND") is KVCacheLayout.LBHNC
    with pytest.raises(ValueError):
        mv.resolve_kv_cache_layout("NHCB")


def test_specs_are_kw_only_and_size_pages_like_vllm():
    with pytest.raises(TypeError):
        mv.FullAttentionSpec(4, 2, 8, torch.float32)
    full = mv.FullAttentionSpec(block_size=4, num_kv_heads=2, head_size=8, dtype=torch.float32)
    assert (full.head_size_v, full.num_heads, full.state_content_size_bytes, full.num_states) == (8, 2, 64, 4)
    assert full.page_size_bytes == full.real_page_size_bytes == 512 and full.kv_quant_mode == mv.KVQuantMode.NONE
    assert mv.FullAttentionSpec(block_size=4, num_kv_heads=2, head_size=8, head_size_v=4,
                                dtype=torch.float32).page_size_bytes == 2 * 4 * 12 * 4
    padded = mv.FullAttentionSpec(block_size=4, num_kv_heads=2, head_size=8, dtype=torch.float32,
                                  page_size_padded=576)
    assert (padded.page_size_bytes, padded.real_page_size_bytes) == (576, 512)
    mla = mv.MLAAttentionSpec(block_size=4, num_kv_heads=1, head_size=16, dtype=torch.float32)
    assert (mla.head_size_v, mla.page_size_bytes) == (0, 4 * 16 * 4)
    assert mv.MLAAttentionSpec(block_size=4, num_kv_heads=1, head_size=16, dtype=torch.float32,
                               alignment=384).page_size_bytes == 384
    assert [int(m) for m in (mv.KVQuantMode.FP8_PER_TENSOR, mv.KVQuantMode.FP8_PER_TOKEN_HEAD)] == [1, 3]
    assert mv.compute_layer_kv_cache_shape_bytes(full, NB) == (NB, 2, 4, 64)
    assert mv.compute_layer_kv_cache_shape_bytes(full, NB, kernel_block_size=2) == (2 * NB, 2, 2, 64)
    assert mv.KVTransferConfig().kv_load_failure_policy == "fail"


def mirror_views(kv_cache_config, layout, kernel_block_size=None):
    """What vLLM's create_kv_cache_views (mirrored in kv_cache_interface) gives for this config."""
    (tensor,) = kv_cache_config.kv_cache_tensors
    raw = torch.zeros(tensor.size, dtype=torch.int8)
    spec = kv_cache_config.kv_cache_groups[0].kv_cache_spec
    return raw, mv.create_kv_cache_views(raw, spec, kv_cache_config.num_blocks, layout, tensor, kernel_block_size)


@pytest.mark.parametrize("layout", list(KVCacheLayout), ids=lambda m: m.name)
def test_engine_registers_vllm_views_for_every_layout(model, layout):
    kvc = make_kv_cache_config(model, NB, layout=layout)
    (tensor,) = kvc.kv_cache_tensors
    assert tensor.layers == L and tensor.size == 3 * NB * 512 and tensor.offset == 0
    strides, layer_distance = HAND_STRIDES[layout]
    assert (tensor.layer_stride, tensor.block_stride) == (4 * layer_distance, 4 * strides[0])
    log = []
    engine = MiniEngine(model, make_vllm_config(model, kv_cache_layout=layout.name), kvc,
                        lambda c, r, k: RecordingConnector(c, r, k, log, Script()))
    caches = engine.kv_caches
    assert log[0] == ("W0", "register_kv_caches", {n: (NB, 2, BS, 16) for n in L})
    raw, ref = mirror_views(kvc, layout)
    base = caches[L[0]].data_ptr()
    for i, (name, view) in enumerate(caches.items()):
        assert view.dtype == torch.float32 and view.shape == ref[i].shape == (NB, 2, BS, 16)
        assert view.stride() == ref[i].stride() == strides
        assert view.is_contiguous() == ref[i].is_contiguous() == (layout is KVCacheLayout.LBHNC)
        assert view.data_ptr() - base == ref[i].data_ptr() - raw.data_ptr() == 4 * i * layer_distance
        assert engine.runner.ranks[0].vllm_config.compilation_config.static_forward_context[name].kv_cache is view
    # The model wrote through the views: a cell holds K (the first head_size floats) then V, the
    # very values older vLLM's [2, blocks, tokens, heads, head_size] tensor holds at [0] and [1].
    legacy = MiniEngine(model, make_vllm_config(model, kv_connector=None, kv_cache_format="legacy_kv_first"))
    for e in (engine, legacy):
        assert run_request(e, prompt(50, 6), 1)[0] == greedy_generate(model, prompt(50, 6), 1)
    block = engine.finished_block_ids["req-0"][1]  # token 5 is token 1 of the request's second block
    assert block == legacy.finished_block_ids["req-0"][1]
    for name in L:
        assert torch.equal(caches[name][block, :, 1, :8], legacy.kv_caches[name][0, block, 1])
        assert torch.equal(caches[name][block, :, 1, 8:], legacy.kv_caches[name][1, block, 1])


def test_tp_ranks_get_views_of_their_own_heads(model):
    engine = MiniEngine(model, make_vllm_config(model, kv_connector=None, kv_cache_layout="BLNHC"),
                        make_kv_cache_config(model, NB, 2, layout="BLNHC"), num_workers=2)
    for caches in engine.worker_kv_caches:
        assert all(t.shape == (NB, 1, BS, 16) and t.stride() == (3 * BS * 16, 16, 16, 1) for t in caches.values())
    assert engine.worker_kv_caches[0][L[0]].data_ptr() != engine.worker_kv_caches[1][L[0]].data_ptr()


@pytest.mark.parametrize("layout,strides", [(KVCacheLayout.LBNHC, (64, 16, 32, 1)),
                                            (KVCacheLayout.LBHNC, (64, 32, 16, 1))], ids=["LBNHC", "LBHNC"])
def test_kernel_block_split_views(model, layout, strides):
    kvc = make_kv_cache_config(model, NB, layout=layout)
    engine = MiniEngine(model, make_vllm_config(model, kv_connector=None, kv_cache_layout=layout.name,
                                                kernel_block_size=2), kvc)
    raw, ref = mirror_views(kvc, layout, kernel_block_size=2)
    for view, mirror in zip(engine.kv_caches.values(), ref):
        assert view.shape == mirror.shape == (2 * NB, 2, 2, 16)  # dim 0 counts kernel blocks
        assert view.stride() == mirror.stride() == strides
        grouped = mv.group_kernel_blocks(view, NB)
        assert grouped.shape == (NB, 2, 2, 2, 16)
        assert grouped[3, 1].data_ptr() == view[7].data_ptr()  # block b = kernel blocks 2b, 2b + 1
    assert mv.group_kernel_blocks(engine.kv_caches[L[0]][:NB], NB).shape == (NB, 2, 2, 16)


@pytest.mark.parametrize("layout", [m for m in KVCacheLayout if m.name not in ("LBNHC", "LBHNC")],
                         ids=lambda m: m.name)
def test_kernel_split_needs_blocks_that_are_dense_pages(model, layout):
    cfg = make_vllm_config(model, kv_connector=None, kv_cache_layout=layout.name, kernel_block_size=2)
    with pytest.raises(ValueError, match="layer-compact"):
        MiniEngine(model, cfg, make_kv_cache_config(model, NB, layout=layout))
    padded = make_kv_cache_config(model, NB, layout="LBNHC", page_size_padded=576)
    with pytest.raises(ValueError, match="dense page"):
        MiniEngine(model, make_vllm_config(model, kv_connector=None, kernel_block_size=2), padded)


def test_a_kv_cache_config_of_another_layout_is_refused(model):
    with pytest.raises(ValueError, match="layout BLNHC"):
        MiniEngine(model, make_vllm_config(model, kv_connector=None, kv_cache_layout="BLNHC"),
                   make_kv_cache_config(model, NB))


def test_padded_pages_raise_the_page_stride(model):
    for layout, block_floats, layer_floats in [("LBNHC", 144, 144 * NB), ("BLNHC", 3 * 144, 144)]:
        engine = MiniEngine(model, make_vllm_config(model, kv_connector=None, kv_cache_layout=layout),
                            make_kv_cache_config(model, NB, layout=layout, page_size_padded=576))
        views = list(engine.kv_caches.values())
        assert views[0].stride() == (block_floats, 16, 32, 1)
        assert views[1].data_ptr() - views[0].data_ptr() == 4 * layer_floats
    with pytest.raises(ValueError, match="pad"):
        make_kv_cache_config(model, NB, layout="LHBNC", page_size_padded=576)


def test_legacy_forms_are_older_vllms_5d_tensors(model):
    for fmt, shape in [("legacy_kv_first", (2, NB, BS, 2, 8)), ("legacy_blocks_first", (NB, 2, BS, 2, 8))]:
        engine = MiniEngine(model, make_vllm_config(model, kv_connector=None, kv_cache_format=fmt),
                            make_kv_cache_config(model, NB))
        assert all(t.shape == shape and t.is_contiguous() for t in engine.kv_caches.values())
    split = MiniEngine(model, make_vllm_config(model, kv_connector=None, kv_cache_format="legacy_kv_first",
                                               kernel_block_size=2), make_kv_cache_config(model, NB))
    assert split.kv_caches[L[0]].shape == (2, 2 * NB, 2, 2, 8)
    with pytest.raises(ValueError):
        MiniEngine(model, make_vllm_config(model, kv_connector=None, kv_cache_format="5d"))


CACHE_FORMS = {  # id -> (num_workers, make_vllm_config kwargs, make_kv_cache_config kwargs)
    **{m.name: (1, dict(kv_cache_layout=m.name), dict(layout=m)) for m in KVCacheLayout},
    "LBNHC-kernel2": (1, dict(kernel_block_size=2), {}),
    "LBHNC-kernel1": (1, dict(kv_cache_layout="LBHNC", kernel_block_size=1), dict(layout="LBHNC")),
    "BLNHC-padded": (1, dict(kv_cache_layout="BLNHC"), dict(layout="BLNHC", page_size_padded=576)),
    "legacy_kv_first": (1, dict(kv_cache_format="legacy_kv_first"), {}),
    "legacy_blocks_first-kernel2": (1, dict(kv_cache_format="legacy_blocks_first", kernel_block_size=2), {}),
    "tp2-LBNHC": (2, {}, {}),
    "tp2-BHLNC": (2, dict(kv_cache_layout="BHLNC"), dict(layout="BHLNC")),
    "tp2-legacy_blocks_first": (2, dict(kv_cache_format="legacy_blocks_first"), {}),
}


def run_two_sharing_a_prefix(model, num_workers=1, cfg=None, kvc=None):
    """Two requests sharing 3 blocks (the second reads the first's retained blocks), chunked by 8."""
    engine = MiniEngine(model, make_vllm_config(model, kv_connector=None, max_num_batched_tokens=8,
                                                tensor_parallel_size=num_workers, **(cfg or {})),
                        make_kv_cache_config(model, 24, num_workers, **(kvc or {})), num_workers=num_workers)
    shared = prompt(51, 12)
    p1, p2 = shared + prompt(52, 3), shared + prompt(53, 5)
    out = [run_request(engine, p, 3, rid) for p, rid in ((p1, "a"), (p2, "b"))]
    assert next(h.scheduler_output for h in engine.history
                if "b" in h.scheduler_output.num_scheduled_tokens).scheduled_new_reqs[0].num_computed_tokens == 12
    return engine, (p1, p2), out


@pytest.fixture(scope="module")
def reference_run(model):
    """The default form (one worker, LBNHC views) and a full recompute of each prompt."""
    engine, prompts, out = run_two_sharing_a_prefix(model)
    full = [greedy_generate(model, p, 3, return_logits=True) for p in prompts]
    return engine, prompts, out, full


@pytest.mark.parametrize("form", list(CACHE_FORMS))
def test_outputs_are_bit_identical_in_every_cache_form(model, reference_run, form):
    num_workers, cfg, kvc = CACHE_FORMS[form]
    ref_engine, prompts, ref_out, full = reference_run
    engine, _, out = run_two_sharing_a_prefix(model, num_workers, cfg, kvc)
    for (toks, logits), (ref_toks, ref_logits), (full_toks, full_logits) in zip(out, ref_out, full):
        assert toks == ref_toks == full_toks
        assert all(torch.equal(a, b) for a, b in zip(logits, ref_logits))
        assert all(torch.equal(a[-1], b) for a, b in zip(logits[-3:], full_logits))  # the sampling steps
    for rid, p in zip("ab", prompts):  # the same float values, read back through each form
        assert torch.equal(engine.request_kv(rid, len(p)), ref_engine.request_kv(rid, len(p)))


@pytest.mark.parametrize("form", [dict(), dict(kv_format="legacy_blocks_first"),
                                  dict(kv_format="views", layout="BHLNC"),
                                  dict(kv_format="views", layout="LBHNC", kernel_block_size=2)],
                         ids=["legacy_kv_first", "legacy_blocks_first", "views-BHLNC", "views-LBHNC-kernel2"])
def test_model_reads_and_writes_every_form_and_the_helpers_follow(model, form):
    p, table = prompt(54, 19), [5, 2, 7, 1, 3]
    ref_caches = KVCache.allocate(model, 9)
    ref = model(p, list(range(19)), table, 0, ref_caches)
    caches = KVCache.allocate(model, 9, **form)
    kv_format = form.get("kv_format", "legacy_kv_first")
    parts = [model(p[s:e], list(range(s, e)), table, s, KVShard(caches, 0, 2, kv_format=kv_format))
             for s, e in [(0, 6), (6, 19)]]
    assert torch.equal(torch.cat(parts), ref)
    gathered = KVCache.gather_tokens(caches, table, 19, BS, head_size=8, kv_format=kv_format)
    assert torch.equal(gathered, KVCache.gather_tokens(ref_caches, table, 19, BS))
    # Restore the first 4 blocks into a poisoned cache of the same form and resume at token 16.
    fresh = KVCache.allocate(model, 9, fill=float("nan"), **form)
    KVCache.copy_blocks(caches, fresh, table[:4], table[:4], block_size=BS, kv_format=kv_format)
    again = model(p[16:], [16, 17, 18], table, 16, KVShard(fresh, 0, 2, kv_format=kv_format))
    assert torch.equal(again, ref[16:])
    shards = KVCache.shards(model, 9, 2, **form)
    assert torch.equal(model.forward_batch([SeqInput(p, list(range(19)), table)], shards)[0], ref)


def test_head_size_v_may_differ_from_head_size_in_views(model):
    m = TinyDecoder(seed=2, head_size_v=4)
    spec = make_kv_cache_config(m, NB).kv_cache_groups[0].kv_cache_spec
    assert (spec.head_size, spec.head_size_v, spec.page_size_bytes) == (8, 4, BS * 2 * 12 * 4)
    engine = MiniEngine(m, make_vllm_config(m, kv_connector=None, max_num_batched_tokens=8))
    assert engine.kv_caches[L[0]].shape == (64, 2, BS, 12)
    p = prompt(55, 13)
    toks, logits = run_request(engine, p, 3)
    ref_toks, ref_logits = greedy_generate(m, p, 3, return_logits=True)
    assert toks == ref_toks and all(torch.equal(a[-1], b) for a, b in zip(logits[-3:], ref_logits))
    with pytest.raises(ValueError, match="head_size_v"):
        MiniEngine(m, make_vllm_config(m, kv_connector=None, kv_cache_format="legacy_kv_first"))


# ---------------------------------------------------------------------------
# The MLA toy model
# ---------------------------------------------------------------------------

ML = [f"model.layers.{i}.self_attn.attn" for i in range(2)]


def test_mla_caches_one_replicated_latent(mla_model):
    m = mla_model
    spec = make_kv_cache_config(m, NB, 2).kv_cache_groups[0].kv_cache_spec
    assert isinstance(spec, mv.MLAAttentionSpec)
    assert (spec.num_kv_heads, spec.head_size, spec.head_size_v, spec.page_size_bytes) == (1, 16, 0, BS * 16 * 4)
    cfg = make_vllm_config(m, kv_connector=None, tensor_parallel_size=2)
    assert cfg.model_config.use_mla and cfg.model_config.get_num_kv_heads(cfg.parallel_config) == 1
    engine = MiniEngine(m, cfg, make_kv_cache_config(m, NB, 2), num_workers=2)
    assert [(r.kv_head_start, r.kv_head_end) for r in engine.runner.ranks] == [(0, 2), (2, 4)]  # query heads
    for caches in engine.worker_kv_caches:
        assert list(caches) == ML and all(t.shape == (NB, 1, BS, 16) for t in caches.values())
    legacy = MiniEngine(m, make_vllm_config(m, kv_connector=None, kv_cache_format="legacy_blocks_first"))
    assert legacy.kv_caches[ML[0]].shape == (64, BS, 16)


def test_mla_is_bit_exact_and_reads_every_cached_byte(mla_model):
    m = mla_model
    p, q, table = prompt(56, 17), prompt(57, 6), [4, 1, 6, 2, 5]
    ref_caches = KVCache.allocate(m, 10)
    ref = m(p, list(range(17)), table, 0, ref_caches)
    chunked = KVCache.allocate(m, 10, kv_format="views", layout="BHLNC")
    parts = [m(p[s:e], list(range(s, e)), table, s, chunked) for s, e in [(0, 1), (1, 9), (9, 17)]]
    assert torch.equal(torch.cat(parts), ref)
    shards = KVCache.shards(m, 10, 2, kv_format="views")
    out = m.forward_batch([SeqInput(q, list(range(6)), [7, 8]), SeqInput(p, list(range(17)), table)], shards)
    assert torch.equal(out[1], ref)
    latents = KVCache.gather_tokens(ref_caches, table, 17, BS)
    assert latents.shape == (2, 1, 17, 1, 16)
    for shard in shards:  # every rank holds the whole latent
        assert torch.equal(KVCache.gather_tokens(shard.kv_caches, table, 17, BS, head_size=16), latents)
    for part in (slice(0, 8), slice(8, 16)):  # the compressed KV and the rotary key both matter
        caches = KVCache.allocate(m, 10)
        m(p[:16], list(range(16)), table, 0, caches)
        caches[ML[1]][table[1], 2, part] += 0.5  # position 6 of layer 1
        assert not torch.equal(m([p[16]], [16], table, 16, caches)[-1], ref[-1])


MLA_FORMS = {
    "LBNHC": (1, {}, {}),
    "tp2-LBNHC": (2, {}, {}),
    "tp2-BLNHC": (2, dict(kv_cache_layout="BLNHC"), dict(layout="BLNHC")),
    "kernel2": (1, dict(kernel_block_size=2), {}),
    "legacy": (1, dict(kv_cache_format="legacy_kv_first"), {}),
}


@pytest.mark.parametrize("form", list(MLA_FORMS))
def test_mla_in_the_engine_equals_a_full_recompute(mla_model, form):
    num_workers, cfg, kvc = MLA_FORMS[form]
    engine, prompts, out = run_two_sharing_a_prefix(mla_model, num_workers, cfg, kvc)
    for p, (toks, logits) in zip(prompts, out):
        ref_toks, ref_logits = greedy_generate(mla_model, p, 3, return_logits=True)
        assert toks == ref_toks and all(torch.equal(a[-1], b) for a, b in zip(logits[-3:], ref_logits))
    if num_workers == 2:
        r0, r1 = engine.worker_kv_caches
        assert all(torch.equal(r0[n], r1[n]) for n in ML)  # replicas


def test_mla_store_then_load_over_two_ranks_is_bit_exact(mla_model):
    store = {}
    shared = prompt(58, 13)
    run_request(mem_engine(mla_model, store, 2), shared + prompt(59, 2), 1, "r1")
    b = mem_engine(mla_model, store, 2, async_load=True)
    p2 = shared + prompt(60, 4)
    toks, logits = run_request(b, p2, 3, "r2")
    first = next(h.scheduler_output for h in b.history if h.scheduler_output.num_scheduled_tokens)
    assert first.scheduled_new_reqs[0].num_computed_tokens == 12
    ref_toks, ref_logits = greedy_generate(mla_model, p2, 3, return_logits=True)
    assert toks == ref_toks and all(torch.equal(a[-1], c) for a, c in zip(logits[-3:], ref_logits))


# ---------------------------------------------------------------------------
# kv_load_failure_policy: vLLM's default "fail"
# ---------------------------------------------------------------------------

def test_default_failure_policy_is_fail(model):
    cfg = make_vllm_config(model)
    assert cfg.kv_transfer_config.kv_load_failure_policy == mv.KVTransferConfig().kv_load_failure_policy == "fail"
    assert not mem_engine(model, {}).scheduler.recompute_kv_load_failures  # read with a connector, as in vLLM
    assert mem_engine(model, {}, kv_load_failure_policy="recompute").scheduler.recompute_kv_load_failures


@pytest.mark.parametrize("async_load", [False, True])
def test_failed_load_under_fail_finishes_the_request_with_an_error(model, async_load):
    store = {}
    shared = prompt(33, 16)
    run_request(mem_engine(model, store), shared + [1, 2], 1, "r1")
    b = mem_engine(model, store, async_load=async_load, fail_first_load_block=1)  # default policy
    p2 = shared + [7, 8, 9]
    toks, logits = run_request(b, p2, 3, "r2")
    assert b.finish_reasons["r2"] == "error" and toks == [] and logits == []
    assert any("r2" in h.discarded_req_ids for h in b.history)
    assert not b.has_requests() and b.block_pool.get_num_free_blocks() == 63  # its blocks were freed
    assert run_request(b, p2, 2, "again")[0] == greedy_generate(model, p2, 2)  # the engine goes on


# ---------------------------------------------------------------------------
# The hybrid KV cache manager (HMA): TinyGemma's full-attention group and
# sliding-window group, one block pool, per-group block tables (see kv_cache.py)
# ---------------------------------------------------------------------------

GL = [f"model.layers.{i}.self_attn.attn" for i in range(2)]  # layer 0 full, layer 1 window 8
W = 8


def gemma_engine(m, hma=True, num_blocks=32, connector=None, num_workers=1, **cfg):
    vcfg = make_vllm_config(m, kv_connector=None if connector is None else "KVConnectorUnderTest",
                            disable_hybrid_kv_cache_manager=not hma, tensor_parallel_size=num_workers, **cfg)
    kvc = make_kv_cache_config(m, num_blocks, num_workers, disable_hybrid_kv_cache_manager=not hma,
                               layout=cfg.get("kv_cache_layout") or KVCacheLayout.LBNHC)
    return MiniEngine(m, vcfg, kvc, connector, num_workers=num_workers)


def first_new(engine, req_id):
    return next(h.scheduler_output.scheduled_new_reqs[0] for h in engine.history
                if any(r.req_id == req_id for r in h.scheduler_output.scheduled_new_reqs))


def test_tiny_gemma_reads_only_the_window(gemma_model):
    m = gemma_model
    assert m.sliding_window_layers == {1: W} and m.attention_layer_names == GL
    p, table = prompt(70, 21), [5, 2, 7, 1, 3, 6]
    ref_caches = KVCache.allocate(m, 9)
    ref = m(p, list(range(21)), table, 0, ref_caches)
    parts_caches = KVCache.allocate(m, 9, kv_format="views")
    parts = [m(p[s:e], list(range(s, e)), table, s, parts_caches) for s, e in [(0, 3), (3, 12), (12, 21)]]
    assert torch.equal(torch.cat(parts), ref)
    assert m.blocks_needed_to_resume(1, 20) == range(3, 5) and m.blocks_needed_to_resume(0, 20) == range(0, 5)
    # Token 20 reads positions 13..20 in layer 1: poison the rest of layer 1 (and nothing of layer 0).
    for poison, same in [(range(0, 13), True), (range(13, 14), False)]:
        caches = KVCache.allocate(m, 9)
        m(p[:20], list(range(20)), table, 0, caches)
        for pos in poison:
            caches[GL[1]][:, table[pos // BS], pos % BS] = float("nan")
        assert torch.equal(m([p[20]], [20], table, 20, caches), ref[20:]) == same
    # Resuming at 20 with the window layer's own block table (null blocks before the window, its
    # window's K/V in other blocks; the null block poisoned) gives the same bits.
    caches = KVCache.allocate(m, 10)
    m(p[:20], list(range(20)), table, 0, caches)
    other = [0, 0, 0, 8, 4, 9]
    KVCache.copy_blocks({GL[1]: caches[GL[1]]}, {GL[1]: caches[GL[1]]}, table[3:5], other[3:5])
    caches[GL[1]][:, 0] = float("nan")
    out = m.forward_batch([SeqInput([p[20]], [20], table, {GL[1]: other})], caches)[0]
    assert torch.equal(out, ref[20:])


def test_hybrid_kv_cache_config_groups_and_overlay(gemma_model):
    m = gemma_model
    kvc = make_kv_cache_config(m, NB)
    (full, sw) = kvc.kv_cache_groups
    assert (full.layer_names, sw.layer_names) == ([GL[0]], [GL[1]])
    assert type(full.kv_cache_spec) is mv.FullAttentionSpec and full.kv_cache_spec.sliding_window is None
    assert isinstance(sw.kv_cache_spec, mv.SlidingWindowSpec) and sw.kv_cache_spec.sliding_window == W
    assert [t.layers for t in kvc.kv_cache_tensors] == [[GL[0]], [GL[1]]]
    assert len({(t.size, t.offset, t.layer_stride, t.block_stride) for t in kvc.kv_cache_tensors}) == 1
    # One backing allocation: layer 0 of both groups on the same bytes (a block id has one owner).
    engine = MiniEngine(m, make_vllm_config(m, kv_connector=None), kvc)
    a, b = engine.kv_caches[GL[0]], engine.kv_caches[GL[1]]
    assert a.data_ptr() == b.data_ptr() and a.stride() == b.stride()
    a[3].fill_(7.0)
    assert bool((b[3] == 7.0).all()) and not bool((b[2] == 7.0).any())
    # HMA off: one group, the window recorded in a FullAttentionSpec; layers side by side.
    off = make_kv_cache_config(m, NB, disable_hybrid_kv_cache_manager=True)
    (group,) = off.kv_cache_groups
    assert group.layer_names == GL and type(group.kv_cache_spec) is mv.FullAttentionSpec
    assert group.kv_cache_spec.sliding_window == W
    # Block-outermost layouts: the block stride is one slot's page (one layer per group).
    blnhc = make_kv_cache_config(m, NB, layout="BLNHC")
    assert {t.block_stride for t in blnhc.kv_cache_tensors} == {PAGE * 4}
    legacy = MiniEngine(m, make_vllm_config(m, kv_connector=None, kv_cache_format="legacy_kv_first"), kvc)
    assert legacy.kv_caches[GL[0]] is legacy.kv_caches[GL[1]]
    with pytest.raises(ValueError, match="hybrid KV cache manager is disabled"):
        MiniEngine(m, make_vllm_config(m, kv_connector=None, disable_hybrid_kv_cache_manager=True), kvc)
    # 1 full + 2 sliding layers: group_size 1, three groups (two of one spec, looked up together),
    # all three overlaid on one layer slot.
    m3 = TinyGemma(seed=3, n_layers=3, sliding_window_layers={1: W, 2: W})
    kvc3 = make_kv_cache_config(m3, 24)
    assert [g.layer_names for g in kvc3.kv_cache_groups] == [[f"model.layers.{i}.self_attn.attn"] for i in range(3)]
    engine = MiniEngine(m3, make_vllm_config(m3, kv_connector=None, max_num_batched_tokens=8), kvc3)
    assert len({t.data_ptr() for t in engine.kv_caches.values()}) == 1
    shared = prompt(81, 13)
    for i, rid in enumerate("ab"):
        p = shared + prompt(82 + i, 3)
        assert run_request(engine, p, 3, rid)[0] == greedy_generate(m3, p, 3)
    assert hybrid_hit(engine, "b") == 12


def test_hybrid_per_group_block_tables_and_out_of_window_nulls(gemma_model):
    m = gemma_model
    p = prompt(71, 22)
    engine = gemma_engine(m, max_num_batched_tokens=8)
    toks, logits = run_request(engine, p, 4, "a")
    ref_toks, ref_logits = greedy_generate(m, p, 4, return_logits=True)
    assert toks == ref_toks and all(torch.equal(x[-1], y) for x, y in zip(logits[-4:], ref_logits))
    sos = [h.scheduler_output for h in engine.history]
    assert sos[0].scheduled_new_reqs[0].block_ids == ([1, 2], [3, 4])  # one list per group
    assert [so.scheduled_cached_reqs.new_block_ids for so in sos[1:3]] == [[([5, 6], [7, 8])],
                                                                          [([9, 10], [11, 12])]]
    assert list(yield_req_data(sos[1])) == [("a", ([5, 6], [7, 8]), False)]
    # Step 3 starts at 16 computed tokens: the window of token 16 is 9..16, so the SW group's
    # blocks of tokens 0..7 went back to the pool (before step 3 allocated) and the null block
    # took their place; in the last step (24 computed: window 17..24) the first four.
    assert [h.scheduler_output.scheduled_cached_reqs.num_computed_tokens for h in engine.history[2:3]] == [[16]]
    held = engine.finished_group_block_ids["a"]
    assert held == ([1, 2, 5, 6, 9, 10, 13], [0, 0, 0, 0, 11, 12, 14])
    assert engine.block_pool.blocks[3].ref_cnt == 0 and engine.block_pool.blocks[3].block_hash is not None
    assert engine.block_pool.get_num_free_blocks() == 31 and not engine.has_requests()


def test_hybrid_chunked_and_hma_off_give_identical_bits(gemma_model):
    m = gemma_model
    p = prompt(72, 27)
    runs = {}
    for hma in (True, False):
        for chunk in (2048, 8, 5):
            engine = gemma_engine(m, hma=hma, max_num_batched_tokens=chunk)
            runs[hma, chunk] = run_request(engine, p, 4, "a")
            if not hma:  # all blocks of both layers kept: one block table
                assert engine.kv_cache_config.kv_cache_groups[0].layer_names == GL
    ref_toks, ref_logits = runs[True, 2048]
    assert ref_toks == greedy_generate(m, p, 4)
    for (hma, chunk), (toks, logits) in runs.items():
        assert toks == ref_toks
        assert torch.equal(torch.cat(logits[:-3]), ref_logits[0]) and all(
            torch.equal(x, y) for x, y in zip(logits[-3:], ref_logits[1:]))


def hybrid_hit(engine, req_id):
    return first_new(engine, req_id).num_computed_tokens


@pytest.mark.parametrize("hma", [True, False])
def test_hybrid_local_prefix_hit_needs_every_group(gemma_model, hma):
    m = gemma_model
    shared = prompt(73, 18)
    p1, p2 = shared + prompt(74, 3), shared + prompt(75, 6)

    def run(evict=None):
        engine = gemma_engine(m, hma=hma)
        run_request(engine, p1, 2, "r1")
        groups = engine.finished_group_block_ids["r1"]
        if evict is not None:
            group, index = evict
            engine.scheduler.kv_cache_manager.evict_blocks([groups[group][index]])
        toks, logits = run_request(engine, p2, 3, "r2")
        assert toks == greedy_generate(m, p2, 3)
        return hybrid_hit(engine, "r2"), engine

    hit, engine = run()
    assert hit == 16  # 4 full blocks of the shared prefix in every group
    new = first_new(engine, "r2")
    if hma:
        assert new.block_ids[1][:2] == [0, 0] and 0 not in new.block_ids[1][2:]  # window of token 16: 9..15
        assert run(evict=(1, 3))[0] == 12  # a block of the window before 16 gone: the hit shrinks
        assert run(evict=(1, 1))[0] == 16  # the window before 16 starts at block 2: not needed
        assert run(evict=(0, 1))[0] == 4   # full attention needs every block
    else:
        assert run(evict=(0, 3))[0] == 12 and run(evict=(0, 1))[0] == 4


def test_hybrid_hma_needs_supports_hma_and_is_settled_like_vllm(gemma_model):
    m = gemma_model

    class HMAConnector(RecordingConnector, mv.SupportsHMA):
        def request_finished_all_groups(self, request, block_ids):
            self.rec("request_finished_all_groups", request.request_id, tuple(list(g) for g in block_ids))
            return False, None

    log = []
    plain = lambda c, r, k: RecordingConnector(c, r, k, log, Script())  # noqa: E731
    with pytest.raises(ValueError, match="HMA"):  # a callable factory: its connector is checked
        gemma_engine(m, connector=plain)
    with pytest.raises(ValueError, match="HMA"):
        gemma_engine(m, connector=InMemoryConnector)
    # Unset (None): HMA on without a connector, off with one that is not SupportsHMA (a class, or
    # any callable), on with a SupportsHMA class.
    assert len(MiniEngine(m).kv_cache_config.kv_cache_groups) == 2
    auto = MiniEngine(m, make_vllm_config(m), None, plain)
    assert auto.vllm_config.scheduler_config.disable_hybrid_kv_cache_manager is True
    assert len(auto.kv_cache_config.kv_cache_groups) == 1
    cls = type("HMAClass", (HMAConnector,), {"__init__": lambda self, c, r, kv_cache_config: HMAConnector.__init__(
        self, c, r, kv_cache_config, log, Script())})
    on = MiniEngine(m, make_vllm_config(m), None, cls)
    assert on.vllm_config.scheduler_config.disable_hybrid_kv_cache_manager is False
    del log[:]
    run_request(on, prompt(76, 13), 2, "a")
    alloc = next(e for e in log if e[1] == "update_state_after_alloc")
    assert alloc[3] == ([1, 2, 3, 4], [5, 6, 7, 8])  # KVCacheBlocks.get_block_ids(): one list per group
    (finished,) = [e for e in log if e[1] == "request_finished_all_groups"]
    full_ids, sw_ids = finished[3]
    # 14 computed tokens: the window of token 14 is 7..14, block 0 of the SW group was freed.
    assert len(full_ids) == len(sw_ids) == 4 and sw_ids[0] == 0 and 0 not in full_ids + sw_ids[1:]
    assert not any(e[1] == "request_finished" for e in log)


# A stand-in connector of every group's blocks through the HMA path: it saves each group's
# non-null blocks under (group, chain key) and, for a hit at n tokens, loads each group's blocks
# at or after the local hit that vLLM allocated real blocks for (the window's only, for the
# sliding-window group), never writing the null block.

@dataclass
class GroupTransfer:
    req_id: str
    items: list  # (group, block id, key)


class HMAInMemoryConnector(KVConnectorBase_V1, mv.SupportsHMA):
    def __init__(self, vllm_config, role, kv_cache_config, store, async_load=False, log=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self.store, self.async_load, self.log = store, async_load, log if log is not None else []
        self.bs = vllm_config.cache_config.block_size
        self.num_blocks = kv_cache_config.num_blocks
        self.rank = vllm_config.parallel_config.rank
        self.world = vllm_config.parallel_config.tensor_parallel_size
        self.groups = kv_cache_config.kv_cache_groups
        self.windows = [getattr(g.kv_cache_spec, "sliding_window", None)
                        if isinstance(g.kv_cache_spec, mv.SlidingWindowSpec) else None for g in self.groups]
        self.local_hit, self.loads, self.reqs, self.block_ids, self.stored = {}, {}, {}, {}, {}
        self.kv_caches, self.received = None, set()

    def _done(self, group, key):
        return all(("done", r, group, key) in self.store for r in range(self.world))

    def _first_needed(self, group, n):
        """The first block index group `group` holds real blocks for at a hit of n tokens."""
        window = self.windows[group]
        return 0 if window is None else max(0, n - window + 1) // self.bs

    # scheduler side
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        max_blocks = (request.num_tokens - 1) // self.bs
        keys = chain_keys(request.all_token_ids, self.bs, max_blocks)
        local = num_computed_tokens // self.bs
        self.local_hit[request.request_id] = num_computed_tokens
        for k in range(max_blocks, local, -1):
            n = k * self.bs
            if all(self._done(g, keys[i]) for g in range(len(self.groups))
                   for i in range(max(local, self._first_needed(g, n)), k)):
                return n - num_computed_tokens, self.async_load
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        rid = request.request_id
        self.reqs[rid] = request
        ids = blocks.get_block_ids()
        assert len(ids) == len(self.groups)
        self.block_ids[rid] = [list(g) for g in ids]
        self.stored[rid] = 0
        if num_external_tokens > 0:
            first, last = self.local_hit[rid] // self.bs, (self.local_hit[rid] + num_external_tokens) // self.bs
            keys = chain_keys(request.all_token_ids, self.bs, last)
            items = [(g, ids[g][i], keys[i]) for g in range(len(self.groups)) for i in range(first, last)
                     if ids[g][i] != 0]
            for g in range(len(self.groups)):  # exactly the blocks vLLM gave real ids
                assert all(ids[g][i] != 0 for i in range(max(first, self._first_needed(g, last * self.bs)), last))
            self.loads[rid] = GroupTransfer(rid, items)
            self.log.append(("load", rid, [(g, i) for g in range(len(self.groups)) for i in range(first, last)
                                          if ids[g][i] != 0]))

    def build_connector_meta(self, scheduler_output):
        new_ids = {r.req_id for r in scheduler_output.scheduled_new_reqs}
        for rid, groups, resumed in yield_req_data(scheduler_output):
            if rid in self.reqs and groups is not None:
                if resumed or rid in new_ids:
                    self.block_ids[rid] = [list(g) for g in groups]
                else:
                    for mine, more in zip(self.block_ids[rid], groups):
                        mine.extend(more)
        stores = []
        for rid, n in scheduler_output.num_scheduled_tokens.items():
            req = self.reqs[rid]
            full = min(req.num_computed_tokens + n, req.num_tokens) // self.bs
            keys = chain_keys(req.all_token_ids, self.bs, full)
            items = [(g, self.block_ids[rid][g][i], keys[i]) for i in range(self.stored[rid], full)
                     for g in range(len(self.groups)) if not self._done(g, keys[i])]
            assert all(bid != 0 for _, bid, _ in items), "a newly full block is never out of the window"
            if items:
                stores.append(GroupTransfer(rid, items))
            self.stored[rid] = full
        meta = MemMeta(list(self.loads.values()), stores, self.async_load)
        self.loads.clear()
        return meta

    def request_finished_all_groups(self, request, block_ids):
        self.log.append(("finished", request.request_id, tuple(list(g) for g in block_ids)))
        for d in (self.reqs, self.block_ids, self.stored, self.local_hit):
            d.pop(request.request_id, None)
        return False, None

    # worker side
    def register_kv_caches(self, kv_caches):
        self.kv_caches = kv_caches

    def _layers(self, group):
        return self.groups[group].layer_names

    def start_load_kv(self, forward_context, **kwargs):
        meta = self._get_connector_metadata()
        for t in meta.loads:
            for g, bid, key in t.items:
                assert bid != 0, "never write the null block"
                for name in self._layers(g):
                    mv.group_kernel_blocks(self.kv_caches[name], self.num_blocks)[bid] = \
                        self.store[(self.rank, g, key, name)]
            if meta.async_loads:
                self.received.add(t.req_id)

    def wait_for_layer_load(self, layer_name):
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass

    def wait_for_save(self):
        for t in self._get_connector_metadata().stores:
            for g, bid, key in t.items:
                for name in self._layers(g):
                    self.store[(self.rank, g, key, name)] = mv.group_kernel_blocks(
                        self.kv_caches[name], self.num_blocks)[bid].clone()
                self.store[("done", self.rank, g, key)] = True

    def get_finished(self, finished_req_ids):
        received, self.received = self.received, set()
        return None, received or None


def hma_mem_engine(m, store, num_workers=1, log=None, **kw):
    return gemma_engine(m, num_workers=num_workers,
                        connector=lambda c, r, k: HMAInMemoryConnector(c, r, k, store, log=log, **kw))


@pytest.mark.parametrize("async_load,num_workers,local", [(False, 1, False), (True, 1, True), (False, 2, False)],
                         ids=["sync", "async-after-local-hit", "sync-tp2"])
def test_hma_connector_round_trip_of_every_group_is_bit_exact(gemma_model, async_load, num_workers, local):
    m = gemma_model
    store, log = {}, []
    shared = prompt(77, 21)
    p1, p2 = shared + prompt(78, 2), shared + prompt(79, 5)
    a = hma_mem_engine(m, store, num_workers, log)
    assert a.vllm_config.scheduler_config.disable_hybrid_kv_cache_manager is False
    run_request(a, p1, 2, "r1")
    assert {k[2] for k in store if k[0] == "done"} == {0, 1}  # both groups' blocks saved
    (finished,) = [e for e in log if e[0] == "finished"]
    assert finished[2][1][:3] == [0, 0, 0]  # the SW group's blocks before the window: null

    b = hma_mem_engine(m, store, num_workers, log, async_load=async_load)
    if local:  # b holds the first 2 blocks of the prefix in both groups: a local hit of 8 tokens
        run_request(b, shared[:9] + prompt(80, 3), 1, "local")
    toks, logits = run_request(b, p2, 3, "r2")
    assert hybrid_hit(b, "r2") == 20  # 5 blocks computed, those after the local hit loaded
    (load,) = [e for e in log if e[0] == "load" and e[1] == "r2"]
    # Token 20's window is 13..20: of the SW group only blocks 3 and 4 are real (and loaded); its
    # local hit blocks 0 and 1 are before the window, so not even taken (null blocks instead).
    first = 2 if local else 0
    assert load[2] == [(0, i) for i in range(first, 5)] + [(1, 3), (1, 4)]
    assert first_new(b, "r2").block_ids[1][:3] == [0, 0, 0]
    ref_toks, ref_logits = greedy_generate(m, p2, 3, return_logits=True)
    assert toks == ref_toks and all(torch.equal(x[-1], y) for x, y in zip(logits[-3:], ref_logits))
    ref = gemma_engine(m, enable_prefix_caching=False, num_workers=num_workers)
    assert torch.equal(logits[0], run_request(ref, p2, 3, "r2")[1][0][20:])
    # 28 tokens computed, the last at 27 (window 20..27): both groups' K/V, read through their tables.
    assert b.finished_group_block_ids["r2"][1][:5] == [0] * 5
    assert torch.equal(b.group_kv("r2", 1, range(20, 28)), ref.group_kv("r2", 1, range(20, 28)))
    assert torch.equal(b.group_kv("r2", 0, range(28)), ref.group_kv("r2", 0, range(28)))


# ---------------------------------------------------------------------------
# Async scheduling (vLLM's --async-scheduling): EngineCore's batch queue of two
# steps and the AsyncScheduler's placeholders (see mini_vllm/__init__.py)
# ---------------------------------------------------------------------------

AHEAD = pytest.mark.parametrize("ahead", [False, True], ids=["workers-after-next-schedule", "workers-run-ahead"])


def engine_of(model, async_scheduling, ahead=False, num_blocks=64, num_workers=1, **cfg):
    vcfg = make_vllm_config(model, kv_connector=None, async_scheduling=async_scheduling,
                            tensor_parallel_size=num_workers, **cfg)
    return MiniEngine(model, vcfg, make_kv_cache_config(model, num_blocks, num_workers), num_workers=num_workers,
                      worker_runs_ahead=ahead)


def token_rows(engine, req_id):
    """The logits row each of the request's output tokens was sampled from (whatever the chunking)."""
    return [h.model_runner_output.logits[req_id][-1] for h in engine.history
            for o in h.outputs if o.request_id == req_id and o.new_token_ids]


def steps_of(engine, req_id):
    return sum(1 for h in engine.history if req_id in h.scheduler_output.num_scheduled_tokens)


def same_tensors(xs, ys):
    return len(xs) == len(ys) and all(torch.equal(x, y) for x, y in zip(xs, ys))


def test_async_scheduling_is_off_by_default_and_schedules_a_step_ahead(model):
    sync = MiniEngine(model)
    assert type(sync.scheduler) is mv.Scheduler and sync.batch_queue is None
    assert sync.vllm_config.scheduler_config.async_scheduling is False and sync.vllm_config.max_concurrent_batches == 1
    cfg = make_vllm_config(model, kv_connector=None, async_scheduling=True)
    assert cfg.scheduler_config.get_scheduler_cls() is mv.AsyncScheduler and cfg.max_concurrent_batches == 2
    engine = MiniEngine(model, cfg)
    assert isinstance(engine.scheduler, mv.AsyncScheduler) and engine.batch_queue_size == 2
    p = prompt(90, 6)
    engine.add_request(p, 3, "a")
    assert engine.step() is None and len(engine.in_flight) == 1  # step 1 queued, no output taken
    record = engine.step()  # step 2 scheduled, then step 1's output taken
    assert record.scheduler_output.num_scheduled_tokens == {"a": 6} and len(engine.outputs["a"]) == 1
    (step2,) = engine.in_flight
    # Step 2 decodes the token step 1 was sampling: a placeholder when it was scheduled.
    assert step2.num_scheduled_tokens == {"a": 1}
    cached = step2.scheduled_cached_reqs
    assert (cached.num_computed_tokens, cached.num_output_tokens, cached.all_token_ids) == ([6], [1], {})
    request = engine.request("a")
    assert (request.num_output_tokens, request.num_output_placeholders, request.num_computed_tokens) == (1, 1, 7)
    engine.step()  # step 3 scheduled (the third token), step 2 taken
    assert engine.in_flight[0].num_scheduled_tokens == {"a": 1}
    engine.step()  # step 3 in flight reaches max_tokens: step 4 schedules nothing for "a"
    assert engine.in_flight[0].num_scheduled_tokens == {} and engine.finish_reasons == {"a": "length"}
    engine.run_until_done()
    assert engine.outputs["a"] == greedy_generate(model, p, 3) and steps_of(engine, "a") == 3
    assert not engine.has_requests() and not engine.in_flight and request.num_output_placeholders == 0
    assert engine.block_pool.get_num_free_blocks() == 63


@AHEAD
@pytest.mark.parametrize("num_workers", [1, 2])
def test_async_scheduling_gives_the_tokens_and_logits_of_sync_scheduling(model, ahead, num_workers):
    prompts = {f"r{i}": prompt(91 + i, n) for i, n in enumerate([5, 13, 22, 9])}
    max_tokens = {"r0": 6, "r1": 1, "r2": 4, "r3": 7}
    stop = greedy_generate(model, prompts["r3"], 7)[2]  # r3 stops at its third token
    runs = {}
    for async_scheduling in (False, True):
        engine = engine_of(model, async_scheduling, ahead, num_workers=num_workers)
        for rid, p in prompts.items():
            engine.add_request(p, max_tokens[rid], rid, stop_token_ids=[stop] if rid == "r3" else None)
        engine.run_until_done()
        runs[async_scheduling] = engine
    s, a = runs[False], runs[True]
    assert a.outputs == s.outputs and a.finish_reasons == s.finish_reasons
    assert s.finish_reasons["r3"] == "stop" and len(s.outputs["r3"]) == 3
    for rid, p in prompts.items():
        ref, ref_logits = greedy_generate(model, p, max_tokens[rid], return_logits=True)
        assert s.outputs[rid] == ref[:len(s.outputs[rid])]
        assert same_tensors(a.logits[rid], s.logits[rid])  # every accepted step, bit for bit
        assert same_tensors(token_rows(a, rid), ref_logits[:len(ref)][:len(s.outputs[rid])])
    # No step past max_tokens; r3's stop arrives while its next step is in flight, whose output is ignored.
    assert all(steps_of(a, r) == steps_of(s, r) == max_tokens[r] for r in ("r0", "r1", "r2"))
    assert steps_of(a, "r3") == steps_of(s, "r3") + 1
    assert [h.ignored_req_ids for h in a.history if h.ignored_req_ids] == [{"r3"}]
    assert a.block_pool.get_num_free_blocks() == s.block_pool.get_num_free_blocks() == 63
    assert not a.has_requests() and all(r.num_output_placeholders == 0 for r in a.scheduler.requests.values())


@AHEAD
def test_async_scheduling_with_chunked_prefill_is_bit_exact(model, ahead):
    prompts = {"a": prompt(95, 19), "b": prompt(96, 10), "c": prompt(97, 5)}
    runs = {}
    for async_scheduling in (False, True):
        engine = engine_of(model, async_scheduling, ahead, max_num_batched_tokens=8)
        for rid, p in prompts.items():
            engine.add_request(p, 4, rid)
        engine.run_until_done()
        runs[async_scheduling] = engine
    s, a = runs[False], runs[True]
    # The same chunks in the same steps (async adds only empty steps at the end).
    chunks = [[h.scheduler_output.num_scheduled_tokens for h in e.history if h.scheduler_output.num_scheduled_tokens]
              for e in (s, a)]
    assert chunks[0] == chunks[1] and chunks[0][:3] == [{"a": 8}, {"a": 8}, {"a": 3, "b": 5}]
    # A partial prefill samples nothing: no placeholder until the step that ends the prefill.
    seen = [(c.num_computed_tokens[i], c.num_output_tokens[i]) for h in a.history
            for c in [h.scheduler_output.scheduled_cached_reqs] for i, r in enumerate(c.req_ids) if r == "a"]
    assert seen[:3] == [(8, 0), (16, 0), (19, 1)]
    full = MiniEngine(model)
    for rid, p in prompts.items():
        toks, logits = run_request(full, p, 4, rid)
        assert a.outputs[rid] == s.outputs[rid] == toks == greedy_generate(model, p, 4)
        assert same_tensors(a.logits[rid], s.logits[rid])
        assert torch.equal(torch.cat(a.logits[rid]), torch.cat(logits))


@AHEAD
def test_async_scheduling_with_preemption_is_bit_exact(model, ahead):
    # 6 usable blocks for two requests: preemptions. One of them, "b", is preempted by the schedule
    # of step N+1 while its last step N is in flight: step N's token comes back to a waiting
    # request, which stops there (vLLM's stopped_preempted_reqs).
    prompts, max_tokens = {"a": prompt(17, 5), "b": prompt(18, 10)}, {"a": 5, "b": 4}
    runs = {}
    for async_scheduling in (False, True):
        engine = engine_of(model, async_scheduling, ahead, num_blocks=7)
        for rid, p in prompts.items():
            engine.add_request(p, max_tokens[rid], rid)
        engine.run_until_done()
        runs[async_scheduling] = engine
    s, a = runs[False], runs[True]
    assert any(h.scheduler_output.preempted_req_ids for h in a.history)
    h = a.history
    stopped_waiting = [o.request_id for i in range(len(h) - 1) for o in h[i].outputs
                       if o.finish_reason and o.request_id in (h[i + 1].scheduler_output.preempted_req_ids or ())]
    assert stopped_waiting == ["b"]
    for rid, p in prompts.items():
        ref, ref_logits = greedy_generate(model, p, max_tokens[rid], return_logits=True)
        assert a.outputs[rid] == s.outputs[rid] == ref
        assert same_tensors(token_rows(a, rid), ref_logits) and same_tensors(token_rows(s, rid), ref_logits)
    assert a.block_pool.get_num_free_blocks() == 6 and not a.scheduler.waiting and not a.has_requests()


@AHEAD
@pytest.mark.parametrize("prefix_caching", [False, True])
def test_preempt_with_a_step_in_flight_discards_its_output(model, ahead, prefix_caching):
    """MiniEngine.preempt between steps: with async scheduling a step is in flight and the next
    schedule() resumes the request at once, as reset_prefix_cache(reset_running_requests=True)
    does in vLLM: the in-flight frame is dropped and the resumed request recomputes it."""
    p = prompt(25, 9)
    runs = {}
    for async_scheduling in (False, True):
        engine = engine_of(model, async_scheduling, ahead, enable_prefix_caching=prefix_caching)
        engine.add_request(p, 6, "a")
        while len(engine.outputs["a"]) < 2:
            engine.step()
        if async_scheduling:
            assert "a" in engine.in_flight[0].num_scheduled_tokens  # its third token is in flight
        engine.preempt("a")
        if async_scheduling:
            request = engine.request("a")
            assert (request.async_tokens_to_discard, request.num_output_placeholders) == (1, 0)
        engine.run_until_done()
        runs[async_scheduling] = engine
    s, a = runs[False], runs[True]
    ref, ref_logits = greedy_generate(model, p, 6, return_logits=True)
    assert a.outputs["a"] == s.outputs["a"] == ref
    assert [h.ignored_req_ids for h in a.history if h.ignored_req_ids] == [{"a"}]
    (resumed,) = [h.scheduler_output for h in a.history if h.scheduler_output.scheduled_cached_reqs.resumed_req_ids]
    assert resumed.scheduled_cached_reqs.all_token_ids["a"] == p + ref[:2]
    assert same_tensors(token_rows(a, "a"), ref_logits)
    if not prefix_caching:  # the resume recomputes from 0 in both: the same steps
        assert same_tensors(a.logits["a"], s.logits["a"])


def test_async_scheduling_call_order_of_one_request(model):
    """test_call_order_of_one_request under async scheduling: step N+1 is scheduled (and its
    metadata built) before step N's output reaches update_connector_output; the workers run
    step N after that schedule (default) or as soon as N is scheduled (worker_runs_ahead)."""
    p = prompt(20, 10)
    head = [("W0", "register_kv_caches", {n: (64, 2, BS, 16) for n in L}), ("S", "bind_kv_cache_manager"),
            ("S", "on_new_request", "a"),
            ("S", "get_num_new_matched_tokens", "a", 0), ("S", "update_state_after_alloc", "a", ([1, 2, 3],), 0)]
    w1, w2 = worker_pass("W0", slots=tuple(range(4, 14))), worker_pass("W0", slots=(14,))
    w3, w4 = worker_pass("W0", layers=False), worker_pass("W0", layers=False, finished={"a"})
    done = [("S", "request_finished", "a", [1, 2, 3]), ("S", "update_connector_output", set(), set())]
    meta, out = ("S", "build_connector_meta"), ("S", "update_connector_output", set(), set())
    expected = {
        False: head + [meta,                      # step 1: the prefill
                       meta, *w1, out,            # step 2 (the decode of step 1's token), then step 1 runs
                       meta, *w2, *done,          # step 3: nothing ("a" reaches max_tokens in step 2)
                       meta, *w3,                 # step 4 tells the workers "a" finished; step 3 empty
                       *w4],                      # nothing left to schedule: step 4 runs
        True: head + [meta, *w1,
                      meta, *w2, out,
                      meta, *w3, *done,
                      meta, *w4],
    }
    for ahead, want in expected.items():
        log = []
        engine, _ = recording_engine(model, log, ahead=ahead, async_scheduling=True)
        engine.add_request(p, 2, "a")
        engine.run_until_done()
        assert log == want, ahead
        assert engine.outputs["a"] == greedy_generate(model, p, 2)
    # Sync scheduling builds step N+1's metadata only after step N's update_connector_output.
    sync_log = []
    sync, _ = recording_engine(model, sync_log)
    sync.add_request(p, 2, "a")
    sync.run_until_done()
    first_update = sync_log.index(out)
    assert sync_log.index(meta) < first_update and sync_log[first_update + 1] == meta


@AHEAD
def test_abort_with_its_step_in_flight(model, ahead):
    log = []
    engine, _ = recording_engine(model, log, ahead=ahead, async_scheduling=True)
    pa, pb = prompt(26, 7), prompt(27, 6)
    engine.add_request(pa, 4, "a")
    engine.add_request(pb, 3, "b")
    engine.step()
    engine.step()  # step 1's output taken; step 2 (both decodes) in flight
    assert engine.outputs["a"] and set(engine.in_flight[0].num_scheduled_tokens) == {"a", "b"}
    engine.abort("a")
    # The blocks step 2 writes into are the request's: counted in num_computed_tokens already.
    assert log[-1] == ("S", "request_finished", "a", [1, 2])
    engine.run_until_done()
    assert engine.history[1].ignored_req_ids == {"a"}  # step 2 ran, its output for "a" ignored
    assert engine.outputs["a"] == greedy_generate(model, pa, 1) and engine.finish_reasons["a"] == "abort"
    assert len(engine.logits["a"]) == 1
    assert engine.outputs["b"] == greedy_generate(model, pb, 3)
    assert [e for e in log if e[:2] == ("W0", "get_finished") and e[2]] == [("W0", "get_finished", {"a"}),
                                                                            ("W0", "get_finished", {"b"})]
    assert engine.block_pool.get_num_free_blocks() == 63 and not engine.has_requests()


@AHEAD
@pytest.mark.parametrize("async_load", [False, True])
def test_store_then_load_under_async_scheduling_is_bit_exact(model, ahead, async_load):
    store = {}
    shared = prompt(30, 14)
    p1, p2 = shared + prompt(31, 3), shared + prompt(32, 6)
    run_request(mem_engine(model, store, async_scheduling=True, ahead=ahead), p1, 2, "r1")
    assert sum(1 for k in store if k[0] == "done") == 4
    b = mem_engine(model, store, async_scheduling=True, ahead=ahead, async_load=async_load)
    toks, logits = run_request(b, p2, 3, "r2")
    first = next(h.scheduler_output for h in b.history if h.scheduler_output.num_scheduled_tokens)
    assert first.scheduled_new_reqs[0].num_computed_tokens == 12 and first.has_sync_kv_loads == (not async_load)
    ref = MiniEngine(model, make_vllm_config(model, kv_connector=None, enable_prefix_caching=False))
    ref_toks, ref_logits = run_request(ref, p2, 3, "r2")
    assert toks == ref_toks == greedy_generate(model, p2, 3)
    assert torch.equal(logits[0], ref_logits[0][12:]) and same_tensors(logits[1:], ref_logits[1:])
    assert torch.equal(b.request_kv("r2", len(p2)), ref.request_kv("r2", len(p2)))


def test_async_scheduling_of_the_hybrid_model_is_bit_exact(gemma_model):
    m = gemma_model
    shared = prompt(98, 13)
    prompts = {"a": shared + prompt(99, 9), "b": shared + prompt(100, 4)}
    runs = {}
    for async_scheduling in (False, True):
        engine = gemma_engine(m, max_num_batched_tokens=8, async_scheduling=async_scheduling)
        for rid, p in prompts.items():
            engine.add_request(p, 5, rid)
        engine.run_until_done()
        runs[async_scheduling] = engine
    s, a = runs[False], runs[True]
    assert isinstance(a.scheduler, mv.AsyncScheduler) and len(a.kv_cache_config.kv_cache_groups) == 2
    for rid, p in prompts.items():
        ref, ref_logits = greedy_generate(m, p, 5, return_logits=True)
        assert a.outputs[rid] == s.outputs[rid] == ref
        assert same_tensors(token_rows(a, rid), ref_logits) and same_tensors(a.logits[rid], s.logits[rid])
    assert a.block_pool.get_num_free_blocks() == s.block_pool.get_num_free_blocks() == 31


def test_blocks_filled_by_generated_tokens_are_cached_when_the_tokens_come_back(model):
    """allocate_slots cannot hash a block whose tokens are still placeholders; the AsyncScheduler
    caches it once the tokens are back, so a later request hits it as under sync scheduling."""
    pa = prompt(101, 6)
    hits = {}
    for async_scheduling in (False, True):
        engine = engine_of(model, async_scheduling)
        out = run_request(engine, pa, 7, "a")[0]
        pb = pa + out[:6] + [5]  # positions 0..11 computed by "a" (its 7th token never was)
        toks, logits = run_request(engine, pb, 2, "b")
        first = next(h.scheduler_output for h in engine.history if "b" in h.scheduler_output.num_scheduled_tokens)
        hits[async_scheduling] = first.scheduled_new_reqs[0].num_computed_tokens
        ref, ref_logits = greedy_generate(model, pb, 2, return_logits=True)
        assert toks == ref and same_tensors(token_rows(engine, "b"), ref_logits)
    assert hits == {False: 12, True: 12}


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_queued_abort_lands_before_the_update_of_the_step_that_ran(model, async_scheduling):
    """EngineCore's aborts queue: an abort that came while step N ran is applied after its forward,
    right before update_from_output(N); with async scheduling step N+1 is then in flight."""
    log = []
    engine, _ = recording_engine(model, log, async_scheduling=async_scheduling)
    p = prompt(28, 7)
    engine.add_request(p, 4, "a")
    engine.step()
    engine.queue_abort("a")
    del log[:]
    engine.step()
    finished = log.index(("S", "request_finished", "a", [1, 2]))
    assert log[finished - 1] == ("W0", "clear_connector_metadata") and log[finished + 1][1] == "update_connector_output"
    engine.run_until_done()
    assert engine.finish_reasons["a"] == "abort" and engine.block_pool.get_num_free_blocks() == 63
    if async_scheduling:  # step 1 was taken after step 2 was scheduled: the abort ignores both outputs
        assert log[0] == ("S", "build_connector_meta") and engine.outputs["a"] == []
        assert [h.ignored_req_ids for h in engine.history[:2]] == [{"a"}, {"a"}]
    else:
        assert engine.outputs["a"] == greedy_generate(model, p, 1) and engine.history[1].ignored_req_ids == {"a"}


# ---------------------------------------------------------------------------
# Pipeline parallelism
# ---------------------------------------------------------------------------

def test_pp_stages_split_the_layers_as_vllm_get_pp_indices(model, monkeypatch):
    assert [mv.get_pp_indices(3, p, 2) for p in range(2)] == [(0, 2), (2, 3)]  # remainder to the second to last
    assert [mv.get_pp_indices(7, p, 3) for p in range(3)] == [(0, 2), (2, 5), (5, 7)]
    assert [mv.get_pp_indices(8, p, 3) for p in range(3)] == [(0, 3), (3, 6), (6, 8)]
    assert [mv.get_pp_indices(4, p, 2) for p in range(2)] == [(0, 2), (2, 4)]
    assert mv.pp_stage_layer_names(model, 2) == [L[:2], L[2:]]
    monkeypatch.setenv("VLLM_PP_LAYER_PARTITION", "1,2")
    assert mv.pp_stage_layer_names(model, 2) == [L[:1], L[1:]]
    monkeypatch.delenv("VLLM_PP_LAYER_PARTITION")
    config = make_kv_cache_config(model, 16, 2, layer_names=L[2:])
    assert config.kv_cache_groups[0].layer_names == L[2:] and [t.layers for t in config.kv_cache_tensors] == [L[2:]]
    with pytest.raises(ValueError, match="one KVCacheConfig per stage"):
        MiniEngine(model, kv_cache_config=make_kv_cache_config(model, 16), pipeline_parallel_size=2)


def _pp_run(model, tp, pp, prompts, max_tokens, **cfg):
    vcfg = make_vllm_config(model, kv_connector=None, tensor_parallel_size=tp, pipeline_parallel_size=pp, **cfg)
    engine = MiniEngine(model, vcfg, None, num_workers=tp)
    reqs = [engine.add_request(p, max_tokens) for p in prompts]
    engine.run_until_done()
    return engine, [(engine.outputs[r.request_id], engine.logits[r.request_id]) for r in reqs]


@pytest.mark.parametrize("tp", [1, 2])
def test_pp_outputs_and_kv_are_bit_identical_to_one_stage(model, tp):
    prompts = [prompt(91, 23), prompt(92, 9), prompt(93, 14)]
    ref_engine, ref = _pp_run(model, 1, 1, prompts, 6, max_num_batched_tokens=16)  # chunked and batched
    engine, got = _pp_run(model, tp, 2, prompts, 6, max_num_batched_tokens=16)
    assert engine.world_size == 2 * tp and engine.pipeline_parallel_size == 2
    for (toks, logits), (ref_toks, ref_logits) in zip(got, ref):
        assert toks == ref_toks == greedy_generate(model, prompts[got.index((toks, logits))], 6)
        assert len(logits) == len(ref_logits) and all(torch.equal(a, b) for a, b in zip(logits, ref_logits))
    # Each worker holds its stage's layers and its TP rank's heads; parallel_config.rank is global.
    ranks = engine.runner.ranks
    assert [r.vllm_config.parallel_config.rank for r in ranks] == list(range(2 * tp))
    assert [(r.pp_rank, r.rank) for r in ranks] == [(p, t) for p in range(2) for t in range(tp)]
    assert [sorted(c) for c in engine.worker_kv_caches] == [L[:2]] * tp + [L[2:]] * tp
    assert engine.scheduler.kv_cache_config is engine.stage_kv_cache_configs[0]
    # The same K/V as one stage, read through the same block table (the same blocks were allocated).
    e1, _ = _pp_run(model, 1, 1, prompts[:1], 1)
    e2, _ = _pp_run(model, tp, 2, prompts[:1], 1)
    assert e1.finished_block_ids["req-0"] == e2.finished_block_ids["req-0"]
    table = e1.finished_block_ids["req-0"]
    assert torch.equal(e2.token_kv(table, 23), e1.token_kv(table, 23))


class PPRecordingConnector(RecordingConnector):
    def rec(self, *entry):
        if self.role == KVConnectorRole.WORKER:  # the TP rank of global rank pp_rank * tp + tp_rank
            tp = self._vllm_config.parallel_config.tensor_parallel_size
            assert mv.get_tensor_model_parallel_rank() == self.rank % tp
        self.log.append((self.who,) + entry)


@pytest.mark.parametrize("tp", [1, 2])
def test_pp_workers_get_their_stage_and_call_the_connector_stage_by_stage(model, tp):
    log = []
    script = Script(delay_free={"a"}, send_delay_steps={2 * tp - 1: 1})  # the last worker reports late
    vcfg = make_vllm_config(model, tensor_parallel_size=tp, pipeline_parallel_size=2)
    configs = [make_kv_cache_config(model, 32, tp, layer_names=names) for names in mv.pp_stage_layer_names(model, 2)]
    engine = MiniEngine(model, vcfg, configs, lambda c, role, kvc: PPRecordingConnector(c, role, kvc, log, script),
                        num_workers=tp)
    workers = [f"W{r}" for r in range(2 * tp)]
    heads = 2 // tp
    stage_layers = [L[:2]] * tp + [L[2:]] * tp
    for w, names in zip(workers, stage_layers):
        assert (w, "register_kv_caches", {n: (32, heads, BS, 16) for n in names}) in log
    assert [c._kv_cache_config for c in engine.worker_connectors] == [configs[0]] * tp + [configs[1]] * tp
    assert engine.scheduler_connector._kv_cache_config is configs[0]
    assert engine.aggregator._expected_finished_count == 2 * tp
    p = prompt(94, 9)
    engine.add_request(p, 2, "a")
    del log[:]
    engine.run_until_done()
    assert engine.outputs["a"] == greedy_generate(model, p, 2)
    # The first (prefill) step: stage 0's workers run their whole pass on layers 0 and 1, then
    # stage 1's on layer 2 (it gets the intermediate tensors after stage 0's execute_model).
    first = log[:log.index(("S", "update_connector_output", None, None))]
    worker_calls = [e for e in first if e[0] != "S"]
    stage_of = {w: i // tp for i, w in enumerate(workers)}
    assert [stage_of[e[0]] for e in worker_calls if e[1] != "handle_preemptions"] == sorted(
        stage_of[e[0]] for e in worker_calls if e[1] != "handle_preemptions")
    for w, names in zip(workers, stage_layers):
        mine = [e[1:] for e in worker_calls if e[0] == w]
        assert [e[1] for e in mine if e[0] in ("wait_for_layer_load", "save_kv_layer")] == [
            n for n in names for _ in range(2)]
        assert [e[0] for e in mine if e[0] not in ("wait_for_layer_load", "save_kv_layer")] == [
            "handle_preemptions", "bind_connector_metadata", "start_load_kv", "wait_for_save", "get_finished",
            "get_block_ids_with_load_errors", "clear_connector_metadata"]
    # Every worker (all stages, all TP ranks) runs every step, forward or not.
    binds = {w: sum(1 for e in log if e[:2] == (w, "bind_connector_metadata")) for w in workers}
    assert len(set(binds.values())) == 1
    # The delayed free waits for finished_sending from all 2 * tp workers: the last one is late.
    # The workers are told of "a"'s finish in one step: all but the last report finished_sending
    # then, the last one a step later, and only then is "a" finished_sending for the scheduler.
    told = [i for i, e in enumerate(log) if e[:2] == (workers[-1], "get_finished") and e[2] == {"a"}]
    assert len(told) == 1
    updates = [e[2] for e in log[told[0]:] if e[:2] == ("S", "update_connector_output")]
    assert updates[:2] == [None, {"a"}] and all(u is None for u in updates[2:])
    assert engine.block_pool.get_num_free_blocks() == 31


def test_a_streaming_input_session_keeps_its_blocks_between_chunks(model):
    """Streaming input (scheduler.py @6cf7b26b): a resumable request parks
    after each chunk with its blocks and computed tokens; a chunk sent while
    it runs waits in its queue; the next chunk joins the computed output to
    the prompt (the last sampled token is dropped) and the request is
    scheduled as new, from its computed tokens, without a prefix lookup; an
    empty request ends the session."""
    e = MiniEngine(model, make_vllm_config(model, kv_connector=None), make_kv_cache_config(model, 32))
    first, second, third = prompt(41, 10), prompt(42, 7), prompt(43, 5)
    e.add_request(e.make_request(first, 2, "s", resumable=True))
    e.step()  # the prompt: one token sampled
    e.add_request(e.make_request(second, 2, "s", resumable=True))  # arrives while the first chunk runs
    e.run_until_done()
    s = e.request("s")
    out1 = e.outputs["s"][:2]
    assert s.prompt_token_ids == first + out1[:1] + second and s.num_computed_tokens == 19
    blocks = e.block_ids("s")
    assert s.status.name == "WAITING_FOR_STREAMING_REQ" and len(e.outputs["s"]) == 4
    assert e.outputs["s"][2:] == greedy_generate(model, first + out1[:1] + second, 2)
    assert not e.scheduler.has_requests() and e.block_ids("s") == blocks  # parked, holding its blocks
    e.add_request(e.make_request(third, 2, "s", resumable=True))
    so = e.schedule()
    new = so.scheduled_new_reqs[0]
    session = first + out1[:1] + second + e.outputs["s"][2:3] + third
    assert new.req_id == "s" and new.num_computed_tokens == 19 and new.prompt_token_ids == session
    assert new.block_ids[0][:len(blocks)] == blocks
    e.update_from_output(so, e.execute_model(so))
    e.run_until_done()
    assert e.outputs["s"][4:] == greedy_generate(model, session, 2)
    e.add_request(mv.Request("s", []))  # the end of the session
    assert e.request("s") is None and e.scheduler.get_num_unfinished_requests() == 0
