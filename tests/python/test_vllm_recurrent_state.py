"""The kvtier vLLM connector with a recurrent-state (Mamba/GDN) KV cache
group beside attention, as vLLM's hybrid KV cache manager runs hybrid
models in its Mamba "align" prefix-caching mode, driven hook by hook with
the scheduler outputs vLLM builds:

- the state group gets its own namespace (object_kind "recurrent_state");
- states are saved only from vLLM's boundary-state offers (either
  spelling: 0.29's kv_connector_block_state.boundary_state_offloads, 0.28's
  partial_tail_offloads), never from positions in the block table, and only
  at whole kvtier blocks of the prompt;
- a hit ends where every group holds what it reads: the attention blocks
  and the state after the hit's last block;
- a load writes the stored state into the one block vLLM allocated at the
  end of the hit, and a state that went missing makes vLLM recompute.

The whole engine (scheduler, runner and a tiny hybrid model) runs in
test_vllm_hybrid_recurrent.py; this file checks the connector's contract."""

import dataclasses
import time
from types import SimpleNamespace

import pytest
import torch

from kvtier.integrations.vllm import KvtierConnector
from mini_vllm import KVCacheGroupSpec, KVConnectorRole, MambaSpec, MiniEngine, make_kv_cache_config, make_vllm_config
from mini_vllm.scheduler_output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm_harness import deterministic, model, prompt, quiet_client  # noqa: F401 (fixtures)

MIXER = "model.layers.9.mixer"
STATE_SHAPES = ((3, 5), (7,))  # two state tensors of fp32: 88 bytes, less than a kvtier block's span
NUM_BLOCKS = 32


def _config(model, daemon, mode="align", **extra):
    cfg = make_vllm_config(model, kv_connector="KvtierConnector", kv_connector_module_path="kvtier.integrations.vllm",
                           kv_connector_extra_config=dict(socket_path=daemon.socket_path, block_tokens=8, **extra),
                           kv_load_failure_policy="recompute")
    cfg.cache_config.mamba_cache_mode = mode
    kv_config = make_kv_cache_config(model, NUM_BLOCKS)
    block_size = kv_config.kv_cache_groups[0].kv_cache_spec.block_size
    state = MambaSpec(block_size=block_size, shapes=STATE_SHAPES, dtypes=(torch.float32, torch.float32))
    kv_config.kv_cache_groups.append(KVCacheGroupSpec([MIXER], state))
    return cfg, kv_config


class Node:
    """One engine's connectors (scheduler and worker) and KV tensors: the
    attention layers' views as the harness allocates them, and the mixer's
    [num_blocks, 1, 1, state bytes] view."""

    def __init__(self, model, daemon, **extra):
        self.cfg, self.kv_config = _config(model, daemon, **extra)
        self.scheduler = KvtierConnector(self.cfg, KVConnectorRole.SCHEDULER, self.kv_config)
        self.worker = KvtierConnector(self.cfg, KVConnectorRole.WORKER, self.kv_config)
        self.engine = MiniEngine(model, make_vllm_config(model, kv_connector=None),
                                 make_kv_cache_config(model, NUM_BLOCKS))
        self.kv_caches = dict(self.engine.kv_caches)
        state_bytes = sum(torch.Size(s).numel() * 4 for s in STATE_SHAPES)
        self.kv_caches[MIXER] = torch.zeros(NUM_BLOCKS, 1, 1, state_bytes, dtype=torch.int8)  # vLLM: int8 views
        self.worker.register_kv_caches(self.kv_caches)
        assert self.scheduler.disabled_reason is None and self.worker.disabled_reason is None

    def matched(self, request, computed=0):
        """get_num_new_matched_tokens, asked again while it answers None."""
        deadline = time.monotonic() + 10
        while True:
            answer = self.scheduler.get_num_new_matched_tokens(request, computed)
            if answer[0] is not None or time.monotonic() > deadline:
                return answer
            time.sleep(0.005)

    def step(self, output):
        """build_connector_meta, then the worker's hooks in vLLM's order."""
        meta = self.scheduler.build_connector_meta(output)
        self.worker.bind_connector_metadata(meta)
        self.worker.start_load_kv(None)
        for name in self.engine.kv_caches:
            self.worker.wait_for_layer_load(name)
            self.worker.save_kv_layer(name, self.kv_caches[name], None)
        self.worker.wait_for_save()
        self.worker.clear_connector_metadata()
        self.worker._worker.committer.submit(lambda: None).result(10)  # commits done
        return meta

    def shutdown(self):
        self.scheduler.shutdown()
        self.worker.shutdown()


def output(req_id, tokens, tables, computed, scheduled, offers=None, spelling="0.29"):
    """The SchedulerOutput of a step that schedules one new request."""
    out = SchedulerOutput(
        scheduled_new_reqs=[NewRequestData(req_id, list(tokens), [], None, None, tables, computed, None)],
        scheduled_cached_reqs=CachedRequestData.make_empty(), num_scheduled_tokens={req_id: scheduled},
        total_num_scheduled_tokens=scheduled, scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={},
        num_common_prefix_blocks=[0, 0], finished_req_ids=set(), free_encoder_mm_hashes=[])
    if spelling == "0.29":
        out.kv_connector_block_state = SimpleNamespace(boundary_state_offloads=offers or {}, block_ids={})
    else:
        out.partial_tail_offloads = offers
    return out


def fill(node, tables, seed):
    """Random bytes in every block of `tables` (attention group, state group)."""
    g = torch.Generator().manual_seed(seed)
    for name in node.engine.kv_caches:
        t = node.kv_caches[name]
        t.copy_(torch.randn(t.shape, generator=g, dtype=torch.float32).to(t.dtype))
    state = node.kv_caches[MIXER]
    for block in tables[1]:
        if block:
            state[block].copy_(torch.randint(-128, 128, state[block].shape, generator=g, dtype=torch.int8))


@pytest.fixture
def nodes(model, daemon):
    made = []

    def make(**extra):
        made.append(Node(model, daemon, **extra))
        return made[-1]
    yield make
    for n in made:
        n.shutdown()


def save_prompt(node, tokens, offers, spelling="0.29", req_id="r1"):
    """Runs a request's prompt through one step (5 engine blocks of 4
    tokens; the state group's table holds a state block only where vLLM
    keeps one) and saves it; returns the tables."""
    request = node.engine.make_request(tokens, 1, req_id)
    assert node.matched(request) == (0, False)
    tables = ([1, 2, 3, 4, 5], [0, 7, 0, 9, 0])  # states after 8 tokens (block 7) and 16 tokens (block 9)
    fill(node, tables, seed=11)
    node.step(output(req_id, tokens, tables, 0, len(tokens), {req_id: offers}, spelling))
    return tables


def saved_elsewhere(nodes, seed, offers):
    """Node a saves a prompt of 20 tokens with `offers`; returns a, a fresh
    node b, the tokens and b's request for them."""
    a = nodes()
    tokens = prompt(seed, 20)
    save_prompt(a, tokens, offers)
    b = nodes()
    return a, b, tokens, b.engine.make_request(tokens, 1, "r2")


def test_a_state_group_gets_a_recurrent_state_namespace(nodes):
    node = nodes()
    namespaces = node.scheduler._scheduler.base_scope.namespaces
    assert [ns.object_kind for ns in namespaces] == ["kv", "recurrent_state"]
    assert [ns.kv_layout for ns in namespaces] == ["vllm_nhc_g0of2", "vllm_state_g1of2"]
    state = namespaces[1]
    assert state.layer_count == 1 and state.block_tokens == 8
    assert state.bytes_per_token_per_layer * state.block_tokens >= 88  # the state fits one layer's span


@pytest.mark.parametrize("spelling", ["0.29", "0.28"])
def test_only_offered_states_at_kvtier_boundaries_are_saved(nodes, daemon, spelling):
    node = nodes()
    tokens = prompt(1, 20)
    # vLLM offers the state after 16 tokens in block 9; an offer at 12
    # tokens (no kvtier boundary), one of an attention group and a null
    # block are not states kvtier can key.
    offers = [(1, 9, 16), (1, 5, 12), (0, 3, 8), (1, 0, 8)]
    save_prompt(node, tokens, offers, spelling)
    keys_of = node.scheduler._scheduler.base_scope.hashers
    namespaces = node.scheduler._scheduler.base_scope.namespaces
    kv_keys, state_keys = (h.keys(tokens) for h in keys_of)
    with quiet_client(daemon, namespaces) as c:
        assert c.lookup(0, kv_keys).prefix_blocks == 2
        assert c.lookup(1, state_keys[1:2]).prefix_blocks == 1  # after 16 tokens
        assert c.lookup(1, state_keys[0:1]).prefix_blocks == 0  # block 7 (after 8 tokens) was never offered
        got = bytearray(namespaces[1].block_bytes)
        c.get(1, state_keys[1], got)
    stored = node.kv_caches[MIXER][9].reshape(-1).view(torch.uint8)
    assert bytes(got[:stored.numel()]) == bytes(stored.numpy())
    assert not any(got[stored.numel():])  # the rest of the span is zeros


def test_a_hit_loads_the_state_into_the_block_vllm_allocated(nodes):
    a, b, tokens, request = saved_elsewhere(nodes, 2, [(1, 9, 16)])
    assert b.matched(request) == (16, False)
    tables = ([11, 12, 13, 14, 15], [0, 0, 0, 21, 0])  # vLLM: nulls, then one block for the loaded state
    b.scheduler.update_state_after_alloc(request, SimpleNamespace(get_block_ids=lambda: tables), 16)
    meta = b.step(output("r2", tokens, tables, 16, 4))
    assert len(meta.loads) == 1 and meta.loads[0].groups[1].block_ids == [[0, 21]]
    assert b.worker.get_block_ids_with_load_errors() == set()
    assert torch.equal(b.kv_caches[MIXER][21], a.kv_caches[MIXER][9])
    assert not b.kv_caches[MIXER][[i for i in range(NUM_BLOCKS) if i != 21]].any()  # nothing else written
    for name in b.engine.kv_caches:  # the attention blocks too, bit-exact
        for src, dst in zip([1, 2, 3, 4], [11, 12, 13, 14]):
            assert torch.equal(b.kv_caches[name][dst], a.kv_caches[name][src]), name


def test_a_hit_ends_at_the_last_stored_state(nodes):
    """The attention blocks of 16 tokens are stored but only the state
    after 8: the hit is 8 tokens, never 16 from the attention chain alone."""
    a, b, tokens, request = saved_elsewhere(nodes, 3, [(1, 7, 8)])
    assert b.matched(request) == (8, False)


def test_no_stored_state_is_no_hit(nodes):
    a, b, tokens, request = saved_elsewhere(nodes, 4, [])
    assert b.matched(request) == (0, False)


def test_a_state_gone_before_the_load_is_recomputed(nodes, daemon):
    a, b, tokens, request = saved_elsewhere(nodes, 5, [(1, 9, 16)])
    assert b.matched(request) == (16, False)
    namespaces = b.scheduler._scheduler.base_scope.namespaces
    state_keys = b.scheduler._scheduler.base_scope.hashers[1].keys(tokens)
    with quiet_client(daemon, namespaces) as c:
        assert c.erase(1, state_keys[1:2]) == 1
    tables = ([11, 12, 13, 14, 15], [0, 0, 0, 21, 0])
    b.scheduler.update_state_after_alloc(request, SimpleNamespace(get_block_ids=lambda: tables), 16)
    b.step(output("r2", tokens, tables, 16, 4))
    # Every block of the load comes back: vLLM recomputes both groups from token 0.
    assert b.worker.get_block_ids_with_load_errors() == {11, 12, 13, 14, 21}
    assert not b.kv_caches[MIXER].any()


def test_recurrent_state_needs_align_mode(nodes, model, daemon):
    cfg, kv_config = _config(model, daemon, mode="none")
    scheduler = KvtierConnector(cfg, KVConnectorRole.SCHEDULER, kv_config)
    assert "mamba_cache_mode 'align'" in scheduler.disabled_reason


def test_a_state_view_of_another_form_is_refused_at_registration(nodes, model, daemon):
    cfg, kv_config = _config(model, daemon)
    worker = KvtierConnector(cfg, KVConnectorRole.WORKER, kv_config)
    engine = MiniEngine(model, make_vllm_config(model, kv_connector=None), make_kv_cache_config(model, NUM_BLOCKS))
    caches = dict(engine.kv_caches)
    caches[MIXER] = [torch.zeros(NUM_BLOCKS, 3, 5), torch.zeros(NUM_BLOCKS, 7)]  # older vLLM: conv and SSM tensors
    worker.register_kv_caches(caches)
    assert "recurrent-state cache" in worker.disabled_reason
    worker.shutdown()


def test_opted_out_requests_save_no_state(nodes, daemon):
    node = nodes()
    tokens = prompt(6, 20)
    request = node.engine.make_request(tokens, 1, "r1")
    request.kv_transfer_params = {"kvtier": {"save": False}}
    node.matched(request)
    tables = ([1, 2, 3, 4, 5], [0, 7, 0, 9, 0])
    fill(node, tables, seed=5)
    meta = node.step(output("r1", tokens, tables, 0, 20, {"r1": [(1, 9, 16)]}))
    assert meta.state_saves == [] and meta.saves == []


def test_layer_counts_and_dataclass_round_trip(nodes):
    """The plan crosses processes in vLLM: it must survive pickling."""
    import pickle
    node = nodes()
    tokens = prompt(7, 20)
    request = node.engine.make_request(tokens, 1, "r1")
    node.matched(request)
    meta = node.scheduler.build_connector_meta(output("r1", tokens, ([1, 2, 3, 4, 5], [0, 7, 0, 9, 0]), 0, 20,
                                                      {"r1": [(1, 9, 16)]}))
    again = pickle.loads(pickle.dumps(meta))
    assert [dataclasses.asdict(s) for s in again.state_saves] == [dataclasses.asdict(s) for s in meta.state_saves]
    assert again.state_saves[0].boundary == 2 and again.state_saves[0].block_id == 9
