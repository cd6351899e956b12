"""The mini vLLM harness with a recurrent (Mamba) layer, no kvtier needed:
vLLM's Mamba "align" prefix-caching mode (mini_vllm/kv_cache.py MambaManager,
the scheduler's block-aligned chunks and boundary-state offers) and the
hybrid toy TinyHybridRecurrent (sliding-window attention + a recurrent
mixer whose state lives in the layer's Mamba pages).

Pinned here: the block size raised and the state page padded as vLLM does;
the 4-D [num_blocks, 1, 1, state bytes] int8 views; greedy tokens and logits
bit-identical with prefix caching on ("align") and off ("none"), at several
chunk sizes, and after a local prefix hit that resumes from a cached state;
Mamba tables null except the state blocks; offers exactly at block
boundaries in both vLLM spellings, pinned through their step; a connector
hit's allocation (nulls, one state block) and a failed state load
recomputed from token 0."""

from dataclasses import dataclass, field

import pytest

torch = pytest.importorskip("torch")

import mini_vllm as mv  # noqa: E402
from mini_vllm import (KVConnectorBase_V1, KVConnectorMetadata, MiniEngine, make_kv_cache_config,  # noqa: E402
                       make_vllm_config, run_request)
from tiny_model import KVShard, SeqInput, TinyHybridRecurrent, greedy_generate, make_deterministic  # noqa: E402

from model_fixtures import deterministic, prompt  # noqa: E402,F401 (fixtures)

ATTN, MIXER = "model.layers.0.self_attn.attn", "model.layers.1.mixer"
BS = 8  # the raised block size: 4 tokens of attention (512 bytes) cannot hold a 640-byte state
SW, MAMBA = 0, 1  # KV cache groups


@pytest.fixture(scope="module")
def hybrid():
    make_deterministic()
    return TinyHybridRecurrent(seed=5)


def engine(m, connector=None, num_blocks=48, **cfg):
    """A MiniEngine of the hybrid model; `connector` a callable factory (run under HMA)."""
    vcfg = make_vllm_config(m, kv_connector=None if connector is None else "KVConnectorUnderTest",
                            disable_hybrid_kv_cache_manager=False, **cfg)
    mode = "align" if vcfg.cache_config.enable_prefix_caching else "none"
    kvc = make_kv_cache_config(m, num_blocks, mamba_cache_mode=mode, max_model_len=vcfg.model_config.max_model_len,
                               layout=cfg.get("kv_cache_layout") or "LBNHC")
    return MiniEngine(m, vcfg, kvc, connector)


def first_new(e, req_id):
    return next(r for h in e.history for r in h.scheduler_output.scheduled_new_reqs if r.req_id == req_id)


def steps_of(e, req_id):
    """(num_computed at the step's start, tokens scheduled, scheduler output) of each step of req_id."""
    out = []
    for h in e.history:
        so = h.scheduler_output
        if req_id in so.num_scheduled_tokens:
            new = [r for r in so.scheduled_new_reqs if r.req_id == req_id]
            cached = so.scheduled_cached_reqs
            start = new[0].num_computed_tokens if new else cached.num_computed_tokens[cached.req_ids.index(req_id)]
            out.append((start, so.num_scheduled_tokens[req_id], so))
    return out


# ---------------------------------------------------------------------------
# The model, its specs and views
# ---------------------------------------------------------------------------

def test_block_size_is_raised_and_the_state_page_padded_as_vllm_does(hybrid):
    assert mv.align_hybrid_block_size(128, 640, 4, 4) == (8, 1024)  # 4 * cdiv(640, 4 * 128)
    assert mv.align_hybrid_block_size(128, 512, 4, 4) == (4, None)  # equal pages: no padding
    assert mv.align_hybrid_block_size(128, 640, 16, 4) == (16, 2048)  # a larger configured size stays
    assert hybrid.block_size == BS and hybrid.state_bytes == 640
    specs = mv.kv_cache_specs_for(hybrid)
    sw, state = specs[ATTN], specs[MIXER]
    assert isinstance(sw, mv.SlidingWindowSpec) and sw.block_size == BS and sw.page_size_bytes == 1024
    assert isinstance(state, mv.MambaSpec) and state.block_size == BS and state.mamba_cache_mode == "align"
    assert state.shapes == ((16, 10),) and state.dtypes == (torch.float32,)
    assert state.page_size_padded == 1024 and state.page_size_bytes == sw.page_size_bytes
    none = mv.kv_cache_specs_for(hybrid, mamba_cache_mode="none", max_model_len=256)[MIXER]
    assert none.block_size == 256 and none.page_size_bytes == 1024
    assert mv.kv_cache_specs_for(hybrid, 2)[MIXER].shapes == ((8, 10),)  # TP shards the state's rows
    kvc = make_kv_cache_config(hybrid, 16)
    assert [(g.layer_names, type(g.kv_cache_spec)) for g in kvc.kv_cache_groups] == [
        ([ATTN], mv.SlidingWindowSpec), ([MIXER], mv.MambaSpec)]
    with pytest.raises(ValueError, match="unified type"):
        make_kv_cache_config(hybrid, 16, disable_hybrid_kv_cache_manager=True)


@pytest.mark.parametrize("layout", ["LBNHC", "LBHNC", "BLNHC", "BLHNC"])
def test_mamba_views_are_4d_int8_pages_overlaid_on_the_attention_pages(hybrid, layout):
    e = engine(hybrid, kv_cache_layout=layout)
    view = e.kv_caches[MIXER]
    assert view.dtype == torch.int8 and tuple(view.shape) == (48, 1, 1, 640)
    assert view.stride(0) == 1024 and view.stride(3) == 1  # one padded page per block (one layer per group)
    attn = e.kv_caches[ATTN]
    assert attn.dtype == torch.float32 and tuple(attn.shape) == (48, 2, BS, 16)
    assert view.data_ptr() == attn.data_ptr()  # block b of both groups on the same bytes
    layers = e.runner.ranks[0].vllm_config.compilation_config.static_forward_context
    assert isinstance(layers[MIXER], mv.MambaMixer) and layers[MIXER].kv_cache is view
    attn[5].fill_(1.0)
    assert bool((view[5].view(torch.float32) == 1.0).all()) and not bool(view[4].any())
    cache = e.vllm_config.cache_config
    assert (cache.mamba_cache_mode, cache.mamba_block_size, cache.mamba_page_size_padded) == ("align", BS, 1024)


def test_layouts_without_compact_blocks_and_older_formats_refuse_a_mamba_group(hybrid):
    with pytest.raises(ValueError, match="block-compact"):
        make_kv_cache_config(hybrid, 16, layout="LHBNC")
    kvc = make_kv_cache_config(hybrid, 16)
    with pytest.raises(ValueError, match="recurrent"):
        mv.allocate_kv_caches(kvc, kv_cache_format="legacy_kv_first")
    with pytest.raises(ValueError, match="hybrid KV cache manager"):
        MiniEngine(hybrid, make_vllm_config(hybrid, kv_connector=None, disable_hybrid_kv_cache_manager=True))
    # A config made for "align" runs in "align" mode without prefix caching too; "none" needs it off.
    e = MiniEngine(hybrid, make_vllm_config(hybrid, kv_connector=None, enable_prefix_caching=False), kvc)
    assert e.vllm_config.cache_config.mamba_cache_mode == "align"
    with pytest.raises(AssertionError, match="align"):
        MiniEngine(hybrid, make_vllm_config(hybrid, kv_connector=None), make_kv_cache_config(hybrid, 16,
                                                                                             mamba_cache_mode="none"))


def test_chunking_and_a_resume_from_a_stored_state_are_bit_exact(hybrid):
    m, p = hybrid, prompt(1, 29)
    caches = m.allocate_caches(6)
    table = [1, 2, 3, 4, 5]
    ref = m(p, list(range(29)), table, 0, caches)
    ref_state = m.read_state([KVShard(caches, 0, 2)], MIXER, table, 29, BS)
    assert torch.equal(ref_state, m.state_at(p, 29))
    parts_caches = m.allocate_caches(6)
    parts = [m(p[s:e], list(range(s, e)), table, s, parts_caches) for s, e in [(0, 3), (3, 16), (16, 17), (17, 29)]]
    assert torch.equal(torch.cat(parts), ref)
    # Resume at 16 in other caches and blocks from what a connector would load there: the window's
    # K/V (token 16 reads positions 5..16: blocks 0 and 1 of the table) and the state after 16
    # tokens (table entry 1): the same bits. Another state (that after 8 tokens): other logits.
    src = m.allocate_caches(6)
    m(p[:16], list(range(16)), table, 0, src)
    resumed = m.allocate_caches(8)
    resumed[ATTN][6], resumed[ATTN][7] = src[ATTN][1], src[ATTN][2]
    resumed[MIXER][5] = src[MIXER][2]
    attn_table, mixer_table = [6, 7, 3, 4], [0, 5, 0, 6]

    def resume(tables):
        return m.forward_batch([SeqInput(p[16:], list(range(16, 29)), attn_table, tables)], resumed)[0]
    assert torch.equal(resume({ATTN: attn_table, MIXER: mixer_table}), ref[16:])
    resumed[MIXER][5].reshape(-1).view(torch.float32).copy_(m.state_at(p, 8).reshape(-1))
    assert not torch.equal(resume({ATTN: attn_table, MIXER: mixer_table}), ref[16:])
    with pytest.raises(AssertionError, match="null block"):  # the recurrent layer never reads the null block
        resume({ATTN: attn_table, MIXER: [5, 0, 0, 6]})


# ---------------------------------------------------------------------------
# The engine: bit-exactness, tables, local hits
# ---------------------------------------------------------------------------

def test_prefix_caching_on_and_off_and_any_chunking_give_identical_bits(hybrid):
    p = prompt(2, 37)
    ref_toks, ref_logits = greedy_generate(hybrid, p, 6, return_logits=True)
    runs = {}
    for caching in (True, False):
        for chunk in (2048, 8, 12, 20) if caching else (2048, 5, 12):
            e = engine(hybrid, enable_prefix_caching=caching, max_num_batched_tokens=chunk)
            assert e.vllm_config.cache_config.mamba_cache_mode == ("align" if caching else "none")
            toks, logits = run_request(e, p, 6, "a")
            assert toks == ref_toks
            assert all(torch.equal(x[-1], y) for x, y in zip(logits[-6:], ref_logits))
            runs[caching, chunk] = torch.cat(logits)
            sizes = [n for _, n, _ in steps_of(e, "a")][:-5]  # the prefill chunks
            if caching:  # each chunk but the last prompt tail ends on a block boundary
                assert all(start % BS == 0 for start, _, _ in steps_of(e, "a")[:len(sizes)])
                assert sizes == {2048: [32, 5], 8: [8, 8, 8, 8, 5], 12: [8, 8, 8, 8, 5], 20: [16, 16, 5]}[chunk]
            else:  # "none" mode: one running state, table of one block
                assert len(e.finished_group_block_ids["a"][MAMBA]) == 1
                assert sizes == {2048: [37], 5: [5] * 7 + [2], 12: [12, 12, 12, 1]}[chunk]
    first = runs[True, 2048]
    assert all(torch.equal(first, other) for other in runs.values())


def test_mamba_tables_hold_nulls_but_the_state_blocks_freed_one_step_late(hybrid):
    e = engine(hybrid, max_num_batched_tokens=16)
    p = prompt(3, 45)
    e.add_request(p, 4, "a")
    pool = e.block_pool
    prev_state_block, written = None, set()
    while e.has_requests():
        so = e.schedule()
        if "a" in so.num_scheduled_tokens:
            start = e.request("a").num_computed_tokens - so.num_scheduled_tokens["a"]
            end = e.request("a").num_computed_tokens
            table = e.group_block_ids("a")[MAMBA]
            assert len(table) == -(-end // BS)
            write = table[-(-end // BS) - 1]
            real = {i for i, b in enumerate(table) if b != 0}
            expect = {-(-end // BS) - 1} | ({-(-start // BS) - 1} if start else set())
            assert real == expect, (start, end, table)  # the state written now and the one read
            assert write != 0 and pool.blocks[write].ref_cnt >= 1
            if start:
                assert table[-(-start // BS) - 1] == prev_state_block  # read what the step before wrote
            written.add(write)
            # Every state block written before and not in the table now went back to the pool.
            assert all(pool.blocks[b].ref_cnt == 0 for b in written - set(table))
            prev_state_block = write
        e.update_from_output(so, e.execute_model(so))
    sizes = [n for _, n, _ in steps_of(e, "a")]
    assert sizes == [16, 16, 8, 5, 1, 1, 1]
    toks = e.outputs["a"]
    assert toks == greedy_generate(hybrid, p, 4)
    assert pool.get_num_free_blocks() == 47  # every block back (the null block aside)


def test_a_local_hit_resumes_from_the_cached_state_bit_exact(hybrid):
    shared = prompt(4, 26)
    p1, p2 = shared + prompt(5, 7), shared + prompt(6, 9)
    ref2 = greedy_generate(hybrid, p2, 4, return_logits=True)

    def run(chunk):
        e = engine(hybrid, max_num_batched_tokens=chunk)
        run_request(e, p1, 2, "r1")
        toks, logits = run_request(e, p2, 4, "r2")
        assert toks == ref2[0] and all(torch.equal(x[-1], y) for x, y in zip(logits[-4:], ref2[1]))
        return e, logits

    # p1 in one chunk of 32 (+1): its only cached state is after 32 tokens, past the shared 26:
    # the attention group holds blocks 0..2 of the prefix, but no state at 8, 16 or 24: no hit.
    e, _ = run(2048)
    assert first_new(e, "r2").num_computed_tokens == 0
    # In chunks of 8 p1 left states at 8, 16, 24 (cached, freed one step later): a hit of 24.
    e, logits = run(8)
    new = first_new(e, "r2")
    assert new.num_computed_tokens == 24
    state_after_24 = e.history[2].scheduler_output.scheduled_cached_reqs.new_block_ids[0][MAMBA][-1]  # r1's
    table = new.block_ids[MAMBA]
    assert table == [0, 0, state_after_24, table[3]] and table[3] != 0  # nulls, the cached state, the new one
    assert new.block_ids[SW][0] == 0 and 0 not in new.block_ids[SW][1:]  # window of 24: positions 13..23
    # Only the suffix was computed, from the cached state (and bit-exact, above).
    assert sum(x.shape[0] for x in logits) == len(p2) - 24 + 3
    # An evicted state block shortens the hit to the last boundary still held.
    e = engine(hybrid, max_num_batched_tokens=8)
    run_request(e, p1, 2, "r1")
    e.scheduler.kv_cache_manager.evict_blocks([e.history[2].scheduler_output.scheduled_cached_reqs
                                               .new_block_ids[0][MAMBA][-1]])
    toks, _ = run_request(e, p2, 4, "r2")
    assert first_new(e, "r2").num_computed_tokens == 16 and toks == ref2[0]


# ---------------------------------------------------------------------------
# Offers of boundary states to a connector, connector hits and failed loads
# ---------------------------------------------------------------------------

@dataclass
class StubMeta(KVConnectorMetadata):
    loads: list = field(default_factory=list)  # (group, block id, source block index)
    async_load: bool = False
    req_ids: list = field(default_factory=list)  # the requests loaded


class StubConnector(KVConnectorBase_V1, mv.SupportsHMA):
    """Records what vLLM hands a connector; optionally reports a hit of `hit_tokens` for request
    "hit" and loads it from `source` (caches of a standalone run with table [1, 2, ...]), failing
    the state block's load when `fail_state_load`; asynchronously (finished_recving) with
    `async_load`."""

    def __init__(self, vllm_config, role, kv_cache_config, log, hit_tokens=0, source=None, fail_state_load=False,
                 async_load=False):
        super().__init__(vllm_config, role, kv_cache_config)
        self.log, self.hit_tokens, self.source, self.fail_state_load = log, hit_tokens, source, fail_state_load
        self.async_load, self.received = async_load, set()
        self.pending, self.kv_caches, self.errors, self.loaded_once = [], None, set(), False

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        if request.request_id == "hit" and self.hit_tokens > num_computed_tokens and not self.loaded_once:
            return self.hit_tokens - num_computed_tokens, self.async_load
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        ids = blocks.get_block_ids()
        self.log.append(("alloc", request.request_id, ids, num_external_tokens))
        if num_external_tokens:
            self.loaded_once = True
            n = self.hit_tokens // BS
            self.pending = [(g, ids[g][i], i + 1) for g in (SW, MAMBA) for i in range(n) if ids[g][i] != 0]

    def build_connector_meta(self, scheduler_output):
        self.log.append(("meta", scheduler_output))
        meta = StubMeta(self.pending, self.async_load, ["hit"] if self.pending else [])
        self.pending = []
        return meta

    def request_finished_all_groups(self, request, block_ids):
        return False, None

    def register_kv_caches(self, kv_caches):
        self.kv_caches = kv_caches

    def start_load_kv(self, forward_context, **kwargs):
        meta = self._get_connector_metadata()
        for g, block, src in meta.loads:
            name = (ATTN, MIXER)[g]
            self.kv_caches[name][block] = self.source[name][src]
            if g == MAMBA and self.fail_state_load:
                self.kv_caches[name][block].zero_()
                self.errors.add(block)
        if meta.async_load:
            self.received.update(meta.req_ids)

    def get_finished(self, finished_req_ids):
        received, self.received = self.received, set()
        return None, received or None

    def wait_for_layer_load(self, layer_name):
        self.log.append(("wait", layer_name))

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        self.log.append(("save", layer_name))

    def wait_for_save(self):
        pass

    def get_block_ids_with_load_errors(self):
        errors, self.errors = self.errors, set()
        return errors


def stub_engine(m, log, version="0.29", kv_role="kv_both", **kw):
    cfg = {k: kw.pop(k) for k in list(kw) if k in ("max_num_batched_tokens", "kv_load_failure_policy")}
    return engine(m, lambda c, r, k: StubConnector(c, r, k, log, **kw), vllm_version=version, kv_role=kv_role,
                  **cfg)


def offers_of(so):
    if isinstance(so, mv.SchedulerOutputV028):
        assert not hasattr(so, "kv_connector_block_state")
        return so.partial_tail_offloads or {}
    assert isinstance(so, mv.SchedulerOutputV029) and not hasattr(so, "partial_tail_offloads")
    return so.kv_connector_block_state.boundary_state_offloads if so.kv_connector_block_state else {}


@pytest.mark.parametrize("version", ["0.28", "0.29"])
def test_boundary_states_are_offered_exactly_at_block_boundaries(hybrid, version):
    log = []
    e = stub_engine(hybrid, log, version, max_num_batched_tokens=20)
    worker_outputs = []
    begin = e.runner._begin
    e.runner._begin = lambda rank, so, attn: (worker_outputs.append(so), begin(rank, so, attn))[1]
    p = prompt(7, 29)
    e.add_request(p, 14, "a")  # 29 prompt tokens, then decodes through positions 32 and 40
    seen = []
    while e.has_requests():
        so = e.schedule()
        offers = offers_of(so)
        assert set(offers) <= set(so.num_scheduled_tokens)
        if "a" in so.num_scheduled_tokens:
            end = e.request("a").num_computed_tokens
            table = e.group_block_ids("a")[MAMBA]
            if end % BS == 0:
                block = table[end // BS - 1]
                assert offers["a"] == [(MAMBA, block, end)]
                assert e.block_pool.blocks[block].ref_cnt == 2  # the table's and the offer's pin
                if version == "0.29":
                    state = so.kv_connector_block_state
                    assert state.get_block_ids("a") == e.group_block_ids("a") and state.get_block_ids("x") is None
                seen.append(end)
            else:
                assert "a" not in offers
        out = e.execute_model(so)
        if "a" in offers:  # the offered block holds the state after `end` tokens once the step ran
            (_, block, end), = offers["a"]
            assert torch.equal(e.block_state(block)[0], hybrid.state_at(list(p) + e.outputs["a"], end))
        e.update_from_output(so, out)
        if "a" in offers:
            assert e.block_pool.blocks[offers["a"][0][1]].ref_cnt == 1  # unpinned after the update
    assert seen == [16, 24, 32, 40]  # chunks 16, 8 (cut at 24), 5, then decodes; 16 needs its own chunk
    assert [n for _, n, _ in steps_of(e, "a")][:3] == [16, 8, 5]
    assert any(entry[0] == "meta" and entry[1] is e.history[0].scheduler_output for entry in log)
    assert worker_outputs and all(getattr(so, "kv_connector_block_state", None) is None for so in worker_outputs)
    assert not any(entry == ("wait", MIXER) or entry == ("save", MIXER) for entry in log)  # no hooks for the mixer
    assert ("wait", ATTN) in log


@pytest.mark.parametrize("version", ["0.28", "0.29"])
def test_no_offers_without_a_producer_and_an_aborted_request_keeps_its_offer_through_the_step(hybrid, version):
    log = []
    e = stub_engine(hybrid, log, version, kv_role="kv_consumer")
    run_request(e, prompt(8, 20), 1, "a")
    for h in e.history:
        assert getattr(h.scheduler_output, "partial_tail_offloads", None) is None
        assert getattr(h.scheduler_output, "kv_connector_block_state", None) is None
    e = stub_engine(hybrid, log, version)
    p = prompt(9, 20)
    e.add_request(p, 4, "b")
    so = e.schedule()
    ((_, block, end),) = offers_of(so)["b"]
    assert end == 16
    e.abort("b")  # between schedule and the worker pass: the table's reference is gone
    assert e.block_pool.blocks[block].ref_cnt == 1 and block not in e.block_pool.free_block_queue
    out = e.execute_model(so)
    assert torch.equal(e.block_state(block)[0], hybrid.state_at(p, 16))
    e.update_from_output(so, out)
    assert e.block_pool.blocks[block].ref_cnt == 0


def test_a_connector_hit_gets_nulls_and_one_state_block_and_is_bit_exact(hybrid):
    p = prompt(10, 30)
    source = hybrid.allocate_caches(5)
    hybrid(p[:24], list(range(24)), [1, 2, 3], 0, source)
    log = []
    e = stub_engine(hybrid, log, hit_tokens=24, source=source)
    toks, logits = run_request(e, p, 3, "hit")
    (alloc,) = [entry for entry in log if entry[0] == "alloc" and entry[1] == "hit"]
    ids, num_external = alloc[2], alloc[3]
    assert num_external == 24
    assert ids[MAMBA][:2] == [0, 0] and ids[MAMBA][2] != 0  # nulls and the block the state is loaded into
    assert ids[SW][0] == 0 and 0 not in ids[SW][1:3]  # the window of token 24: positions 13..24
    assert first_new(e, "hit").num_computed_tokens == 24
    ref_toks, ref_logits = greedy_generate(hybrid, p, 3, return_logits=True)
    assert toks == ref_toks and all(torch.equal(x[-1], y) for x, y in zip(logits[-3:], ref_logits))


def test_an_async_connector_hit_is_bit_exact(hybrid):
    p = prompt(14, 30)
    source = hybrid.allocate_caches(5)
    hybrid(p[:24], list(range(24)), [1, 2, 3], 0, source)
    e = stub_engine(hybrid, [], hit_tokens=24, source=source, async_load=True)
    toks, logits = run_request(e, p, 3, "hit")
    assert steps_of(e, "hit")[0][0] == 24
    ref_toks, ref_logits = greedy_generate(hybrid, p, 3, return_logits=True)
    assert toks == ref_toks and all(torch.equal(x[-1], y) for x, y in zip(logits[-3:], ref_logits))


@pytest.mark.parametrize("async_load", [False, True])
def test_a_failed_state_load_recomputes_the_request_from_token_zero(hybrid, async_load):
    p = prompt(11, 30)
    source = hybrid.allocate_caches(5)
    hybrid(p[:24], list(range(24)), [1, 2, 3], 0, source)
    log = []
    e = stub_engine(hybrid, log, hit_tokens=24, source=source, fail_state_load=True, async_load=async_load,
                    kv_load_failure_policy="recompute")
    toks, logits = run_request(e, p, 3, "hit")
    steps = steps_of(e, "hit")
    if async_load:  # the load ran without a forward; the request starts over once it is reported
        assert steps[0][0] == 0 and steps[0][2].scheduled_new_reqs[0].req_id == "hit"
    else:
        assert steps[0][0] == 24  # the hit, whose state load failed
        assert steps[1][0] == 0 and "hit" in steps[1][2].scheduled_cached_reqs.resumed_req_ids  # restarted
        assert "hit" in e.history[0].discarded_req_ids
    ref_toks, ref_logits = run_request(engine(hybrid), p, 3, "r")
    assert toks == ref_toks == greedy_generate(hybrid, p, 3)
    assert len(logits) == len(ref_logits) and all(torch.equal(x, y) for x, y in zip(logits, ref_logits))
    # The failed state block left the prefix cache: a request with the same prompt hits the state
    # the recompute cached (not the failed one, cached first under the same hash) and is bit-exact.
    toks, logits = run_request(e, p, 3, "again")
    assert first_new(e, "again").num_computed_tokens == 24
    assert toks == ref_toks and torch.equal(logits[-1], ref_logits[-1])


def test_async_scheduling_of_the_hybrid_model_is_bit_exact(hybrid):
    p1, p2 = prompt(12, 27), prompt(13, 19)
    e = engine(hybrid, async_scheduling=True, max_num_batched_tokens=16)
    e.add_request(p1, 5, "a")
    e.add_request(p2, 5, "b")
    e.run_until_done()
    assert e.outputs["a"] == greedy_generate(hybrid, p1, 5) and e.outputs["b"] == greedy_generate(hybrid, p2, 5)


def test_two_tp_ranks_hold_their_rows_of_the_state_bit_exact(hybrid):
    p = prompt(15, 29)
    e = MiniEngine(hybrid, make_vllm_config(hybrid, kv_connector=None, tensor_parallel_size=2,
                                            max_num_batched_tokens=16),
                   make_kv_cache_config(hybrid, 48, 2), num_workers=2)
    assert [tuple(r.kv_caches[MIXER].shape) for r in e.runner.ranks] == [(48, 1, 1, 320)] * 2
    e.add_request(p, 3, "a")
    checked = False
    while e.has_requests():
        so = e.schedule()
        out = e.execute_model(so)
        if e.request("a") is not None and e.request("a").num_computed_tokens == 24:
            state = e.mamba_state("a", 24)[0]  # both ranks' rows
            rank1 = e.runner.ranks[1].kv_caches[MIXER][e.group_block_ids("a")[MAMBA][2]].reshape(-1)
            assert torch.equal(state, hybrid.state_at(p, 24))
            assert torch.equal(rank1.clone().view(torch.float32).view(8, 10), state[8:])
            checked = True
        e.update_from_output(so, out)
    assert checked and e.outputs["a"] == greedy_generate(hybrid, p, 3)
