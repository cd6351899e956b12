"""Worker side: KVOutputAggregator, the tensor-parallel worker ranks and MiniModelRunner
(GPUModelRunner + KVConnectorModelRunnerMixin)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import pickle
from dataclasses import dataclass
from typing import Any, Optional

import torch
from tiny_model import KVShard, SeqInput, tp_head_range  # on sys.path: see the package __init__

from .config import VllmConfig
from .connector_api import KVConnectorOutput, KVConnectorRole, KVConnectorTransferResults, create_connector
from .forward_context import (Attention, FlashAttentionMetadata, MambaMetadata, MambaMixer, get_forward_context,
                              set_forward_context)
from .kv_cache_interface import KVCacheConfig, MambaSpec, allocate_kv_caches
from .parallel_state import _as_rank
from .scheduler import ModelRunnerOutput
from .scheduler_output import SchedulerOutput


# --------------------------------------------------------------------------
# Worker side: model runner state, connector lifecycle, output aggregation.
# --------------------------------------------------------------------------

class KVOutputAggregator:
    """kv_connector/utils.py @00f4240e: a request is finished_sending/recving only once
    `expected_finished_count` workers reported it; invalid block ids are unioned."""

    def __init__(self, expected_finished_count: int):
        self._recv_remaining_count: dict = {}
        self._send_remaining_count: dict = {}
        self._failed_recving_pending: set = set()
        self._expected_finished_count = expected_finished_count

    @classmethod
    def from_connector(cls, connector: Any, world_size: int) -> "KVOutputAggregator":
        count = connector.get_finished_count() if hasattr(connector, "get_finished_count") else None
        return cls(count or world_size)

    def aggregate(self, outputs: list) -> KVConnectorOutput:
        def update(req_ids, remaining: dict, finished: set) -> None:
            for req_id in req_ids or ():
                left = remaining.get(req_id, self._expected_finished_count) - 1
                remaining[req_id] = left
                if left == 0:
                    finished.add(req_id)
                    del remaining[req_id]

        sending, recving, invalid = set(), set(), set()
        stats = worker_meta = events = None
        for kv in outputs:
            if not kv:
                continue
            if kv.expected_finished_count > 0:
                self._expected_finished_count = kv.expected_finished_count
            update(kv.finished_sending, self._send_remaining_count, sending)
            update(kv.finished_recving, self._recv_remaining_count, recving)
            if stats is None:
                stats = kv.kv_connector_stats
            elif kv.kv_connector_stats:
                stats = stats.aggregate(kv.kv_connector_stats)
            if worker_meta is None:
                worker_meta = kv.kv_connector_worker_meta
            elif kv.kv_connector_worker_meta:
                worker_meta = worker_meta.aggregate(kv.kv_connector_worker_meta)
            if events is None:
                events = kv.kv_cache_events
            invalid |= set(kv.invalid_block_ids or ())
            self._failed_recving_pending |= set(kv.failed_recving or ())
        failed = self._failed_recving_pending & recving
        self._failed_recving_pending -= failed
        return KVConnectorOutput(finished_sending=sending or None, finished_recving=recving or None,
                                 kv_connector_stats=stats or None, kv_cache_events=events or None,
                                 kv_connector_worker_meta=worker_meta or None, invalid_block_ids=invalid,
                                 failed_recving=failed, expected_finished_count=self._expected_finished_count)


@dataclass
class CachedRequestState:
    """The worker's own view of a request (gpu_model_runner's CachedRequestState), kept only from
    scheduler outputs and its own samples."""
    req_id: str
    prompt_token_ids: list
    block_ids: list  # per group
    num_computed_tokens: int
    output_token_ids: list

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def token(self, i: int) -> int:
        p = len(self.prompt_token_ids)
        return self.prompt_token_ids[i] if i < p else self.output_token_ids[i - p]


class _LayerHooks:
    """vLLM's maybe_transfer_kv_layer around one rank's attention layers: skipped when the step has no
    attention metadata or the connector has no metadata bound."""

    def __init__(self, rank: "_WorkerRank", attn_metadata: dict):
        self.rank, self.attn_metadata = rank, attn_metadata

    def _active(self) -> bool:
        c = self.rank.connector
        return self.attn_metadata is not None and getattr(c, "has_connector_metadata", lambda: True)()

    def wait_for_layer_load(self, layer_name: str) -> None:
        with self.rank.active(self.attn_metadata):
            if self._active():
                self.rank.connector.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any) -> None:
        with self.rank.active(self.attn_metadata):
            if self._active():
                self.rank.connector.save_kv_layer(layer_name, kv_layer, attn_metadata)


class _WorkerRank:
    """One tensor-parallel worker: its VllmConfig copy (parallel_config.rank), KV caches, attention
    layers and worker-side connector. The caches are allocated as cache_config says
    (kv_cache_format, the resolved kv_cache_layout, kernel_block_size; see allocate_kv_caches):
    current vLLM's 4-D views of one zeroed int8 buffer per KVCacheTensor by default. The rank owns
    heads [kv_head_start, kv_head_end) (tiny_model.tp_head_range: its KV heads, or for MLA its query
    heads, the latent being replicated)."""

    def __init__(self, rank: int, world_size: int, model, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig,
                 pp_rank: int = 0):
        """`rank`, `world_size`: the tensor-parallel rank and size; `pp_rank`: the pipeline stage.
        parallel_config.rank is the global rank, pp_rank * world_size + rank, as in vLLM."""
        self.rank, self.world_size, self.pp_rank = rank, world_size, pp_rank
        self.global_rank = pp_rank * world_size + rank
        self.vllm_config = copy.deepcopy(vllm_config)
        self.vllm_config.parallel_config.rank = self.global_rank
        self.kv_cache_config = kv_cache_config
        self.layer_names = frozenset(n for g in kv_cache_config.kv_cache_groups for n in g.layer_names)
        self.kv_head_start, self.kv_head_end = tp_head_range(model, rank, world_size)
        cache = self.vllm_config.cache_config
        self.kv_format = cache.kv_cache_format
        self.kv_caches = allocate_kv_caches(kv_cache_config, kv_cache_format=cache.kv_cache_format,
                                            layout=cache.get_resolved_kv_cache_layout(),
                                            kernel_block_size=cache.kernel_block_size)
        layers = self.vllm_config.compilation_config.static_forward_context
        for name, t in self.kv_caches.items():
            spec = kv_cache_config.spec_of(name)
            if isinstance(spec, MambaSpec):
                layers[name] = MambaMixer(name, t, spec.mamba_type)
            else:
                layers[name] = Attention(name, t, spec.num_kv_heads, spec.head_size)
        self.connector = None

    @contextlib.contextmanager
    def active(self, attn_metadata: Any = None):
        """This rank's process state: TP rank globals and its forward context."""
        with _as_rank(self.rank, self.world_size), set_forward_context(attn_metadata, self.vllm_config):
            yield


class MiniModelRunner:
    """GPUModelRunner + KVConnectorModelRunnerMixin for all ranks of one engine."""

    def __init__(self, model, vllm_config: VllmConfig, kv_cache_configs: list, connector_factory: Any,
                 serialize_scheduler_output: bool, start_load_kv_before_forward: Optional[bool]):
        self.model = model
        world = len(kv_cache_configs)  # all workers: pp_rank * tp_size + tp_rank
        tp = vllm_config.parallel_config.tensor_parallel_size
        self.pp_size = vllm_config.parallel_config.pipeline_parallel_size
        assert world == tp * self.pp_size, f"{world} KV cache configs for TP {tp} x PP {self.pp_size} workers"
        self.ranks = [_WorkerRank(r % tp, tp, model, vllm_config, kv_cache_configs[r], r // tp) for r in range(world)]
        self.block_size = vllm_config.cache_config.block_size
        self.serialize = serialize_scheduler_output
        self.start_before = start_load_kv_before_forward
        self.requests: dict = {}
        if vllm_config.kv_transfer_config is not None:
            for rank in self.ranks:
                with rank.active():
                    rank.connector = create_connector(connector_factory, rank.vllm_config, KVConnectorRole.WORKER,
                                                      rank.kv_cache_config)
                    rank.connector.register_kv_caches(rank.kv_caches)

    @property
    def has_connector(self) -> bool:
        return self.ranks[0].connector is not None

    def _update_states(self, so: SchedulerOutput) -> None:
        for req_id in so.finished_req_ids:
            self.requests.pop(req_id, None)
        for new in so.scheduled_new_reqs:
            self.requests[new.req_id] = CachedRequestState(new.req_id, list(new.prompt_token_ids),
                                                           [list(g) for g in new.block_ids],
                                                           new.num_computed_tokens, [])
        cached = so.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            state = self.requests[req_id]
            state.num_computed_tokens = cached.num_computed_tokens[i]
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                state.block_ids = [list(g) for g in new_ids]
            elif new_ids is not None:
                for group, ids in zip(state.block_ids, new_ids):
                    group.extend(ids)
            if req_id in cached.all_token_ids:
                state.output_token_ids = list(cached.all_token_ids[req_id][len(state.prompt_token_ids):])
            elif cached.num_output_tokens[i] < len(state.output_token_ids):
                # Output discarded by the scheduler after a sync KV-load failure: align.
                del state.output_token_ids[cached.num_output_tokens[i]:]

    def _mamba_metadata(self, batch: list, group: int, block_size: int) -> MambaMetadata:
        """The step's metadata of a Mamba group (see MambaMetadata)."""
        qsl, seq_lens, tables, read, write = [0], [], [], [], []
        for req_id, n in batch:
            st = self.requests[req_id]
            start = st.num_computed_tokens
            qsl.append(qsl[-1] + n)
            seq_lens.append(start + n)
            tables.append(st.block_ids[group])
            read.append(-(-start // block_size) - 1)
            write.append(-(-(start + n) // block_size) - 1)
        width = max(len(t) for t in tables)
        return MambaMetadata(
            num_actual_tokens=qsl[-1], query_start_loc=torch.tensor(qsl, dtype=torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32), block_size=block_size,
            state_indices_tensor=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
            has_initial_states=torch.tensor([r >= 0 for r in read], dtype=torch.bool),
            block_idx_last_computed_token=torch.tensor(read, dtype=torch.int32),
            block_idx_last_scheduled_token=torch.tensor(write, dtype=torch.int32))

    def _attn_metadata(self, batch: list, group: int = 0) -> FlashAttentionMetadata:
        """The step's metadata of one KV cache group: its block tables and slot mapping (vLLM builds
        one per group and gives every layer of the group the same object)."""
        qsl, seq_lens, slots, tables = [0], [], [], []
        for req_id, n in batch:
            st = self.requests[req_id]
            start = st.num_computed_tokens
            qsl.append(qsl[-1] + n)
            seq_lens.append(start + n)
            table = st.block_ids[group]
            tables.append(table)
            slots += [table[p // self.block_size] * self.block_size + p % self.block_size
                      for p in range(start, start + n)]
        width = max(len(t) for t in tables)
        return FlashAttentionMetadata(
            num_actual_tokens=qsl[-1], max_query_len=max(n for _, n in batch),
            query_start_loc=torch.tensor(qsl, dtype=torch.int32), max_seq_len=max(seq_lens),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            block_table=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
            slot_mapping=torch.tensor(slots, dtype=torch.int64))

    def _begin(self, rank: _WorkerRank, so: SchedulerOutput, attn: Optional[dict]) -> None:
        """_get_kv_connector_output up to its `yield`."""
        c = rank.connector
        with rank.active(attn):
            assert so.kv_connector_metadata is not None
            c.bind_connector_metadata(so.kv_connector_metadata)
            if self._start_before(so):
                c.start_load_kv(get_forward_context())

    def _start_before(self, so: SchedulerOutput) -> bool:
        # @00f4240e: before the forward only for sync loads; older vLLM: always before.
        return so.has_sync_kv_loads if self.start_before is None else self.start_before

    def _end(self, rank: _WorkerRank, so: SchedulerOutput, attn: Optional[dict]) -> KVConnectorOutput:
        """_get_kv_connector_output's `finally`."""
        c = rank.connector
        out = KVConnectorOutput()
        with rank.active(attn):
            if not self._start_before(so):
                c.start_load_kv(get_forward_context())
            c.wait_for_save()
            if hasattr(c, "get_transfer_results"):
                results = c.get_transfer_results(so.finished_req_ids)
            else:
                sending, recving = c.get_finished(so.finished_req_ids)
                results = KVConnectorTransferResults(sending or set(), recving or set())
            out.finished_sending = results.finished_sending
            out.finished_recving = results.finished_recving
            out.failed_recving = set(getattr(results, "failed_recving", set()) or set())
            out.invalid_block_ids = set(c.get_block_ids_with_load_errors() or set())
            out.kv_connector_stats = getattr(c, "get_kv_connector_stats", lambda: None)()
            out.kv_cache_events = getattr(c, "get_kv_connector_kv_cache_events", lambda: None)()
            out.kv_connector_worker_meta = getattr(c, "build_connector_worker_meta", lambda: None)()
            c.clear_connector_metadata()
        return out

    def execute_model(self, so: SchedulerOutput) -> tuple:
        """Returns (ModelRunnerOutput with the logits extension, list of per-rank KVConnectorOutput or None)."""
        per_rank_so = [pickle.loads(pickle.dumps(so)) if self.serialize else so for _ in self.ranks]
        if getattr(so, "kv_connector_block_state", None) is not None:
            # vLLM 0.29: scheduler-local, None by the time the output reaches a worker.
            per_rank_so = [dataclasses.replace(rso, kv_connector_block_state=None) for rso in per_rank_so]
        if self.has_connector:
            for rank, rso in zip(self.ranks, per_rank_so):
                if rso.kv_connector_metadata is not None and hasattr(rank.connector, "handle_preemptions"):
                    with rank.active():
                        rank.connector.handle_preemptions(rso.kv_connector_metadata)
        self._update_states(so)
        batch = list(so.num_scheduled_tokens.items())
        out = ModelRunnerOutput([r for r, _ in batch], {r: i for i, (r, _) in enumerate(batch)}, [[] for _ in batch])
        if not batch:
            if not self.has_connector:
                return out, None
            # kv_connector_no_forward: the same lifecycle under set_forward_context(None, ...); an empty
            # KVConnectorOutput is dropped (ModelRunnerOutput.with_kv_conn_output_only).
            for rank, rso in zip(self.ranks, per_rank_so):
                self._begin(rank, rso, None)
            outs = [self._end(rank, rso, None) for rank, rso in zip(self.ranks, per_rank_so)]
            return out, [None if o.is_empty() else o for o in outs]

        # Group g of every stage reads and writes through the scheduler's block table g.
        num_groups = len(self.ranks[0].kv_cache_config.kv_cache_groups)
        layer_group = {name: g for rank in self.ranks for g, group in enumerate(rank.kv_cache_config.kv_cache_groups)
                       for name in group.layer_names}
        layer_block_size = {name: group.kv_cache_spec.block_size for rank in self.ranks
                            for group in rank.kv_cache_config.kv_cache_groups for name in group.layer_names}
        seqs = []
        for req_id, n in batch:
            st = self.requests[req_id]
            positions = list(range(st.num_computed_tokens, st.num_computed_tokens + n))
            layer_tables = layer_sizes = None
            if num_groups > 1:  # each layer reads and writes through its group's block table
                layer_tables = {name: st.block_ids[g] for name, g in layer_group.items()}
                layer_sizes = layer_block_size
            seqs.append(SeqInput([st.token(p) for p in positions], positions, st.block_ids[0], layer_tables,
                                 layer_sizes))
            out.positions[req_id] = positions
        attn = []
        for rank in self.ranks:
            groups = rank.kv_cache_config.kv_cache_groups
            metas = [self._mamba_metadata(batch, g, group.kv_cache_spec.block_size)
                     if isinstance(group.kv_cache_spec, MambaSpec) else self._attn_metadata(batch, g)
                     for g, group in enumerate(groups)]
            attn.append({name: metas[g] for g, group in enumerate(groups) for name in group.layer_names})
        shards = [KVShard(rank.kv_caches, rank.kv_head_start, rank.kv_head_end,
                          _LayerHooks(rank, attn[i]) if rank.connector is not None else None, attn[i],
                          rank.kv_format, rank.layer_names if self.pp_size > 1 else None)
                  for i, rank in enumerate(self.ranks)]
        kv_outputs = None
        workers = list(zip(self.ranks, per_rank_so, attn))
        # Pipeline stages run one after the other (vLLM: a later stage's worker starts its
        # execute_model once it has received the earlier stage's intermediate tensors): each stage's
        # workers begin right before its first layer and end right after its last.
        outputs: dict = {}
        stage_of = {name: rank.pp_rank for rank in self.ranks for name in rank.layer_names}
        current = [None]

        def end_stage() -> None:
            if current[0] is not None:
                for i, (rank, rso, a) in enumerate(workers):
                    if rank.pp_rank == current[0]:
                        outputs[i] = self._end(rank, rso, a)
                current[0] = None

        def begin_stage(stage: int) -> None:
            end_stage()
            current[0] = stage
            for rank, rso, a in workers:
                if rank.pp_rank == stage:
                    self._begin(rank, rso, a)

        def before_layer(_index: int, name: str) -> None:
            if stage_of[name] != current[0]:
                begin_stage(stage_of[name])

        try:
            if self.pp_size > 1:
                logits = self.model.forward_batch(seqs, shards, before_layer=before_layer if self.has_connector
                                                  else None)
            else:
                if self.has_connector:
                    begin_stage(0)
                logits = self.model.forward_batch(seqs, shards)
        finally:
            if self.has_connector:
                end_stage()
                # A stage the forward never reached (an exception before it) still ends its step.
                for stage in range(self.pp_size):
                    if not any(i in outputs for i, (rank, _, _) in enumerate(workers) if rank.pp_rank == stage):
                        begin_stage(stage)
                        end_stage()
                kv_outputs = [outputs.get(i) for i in range(len(workers))]
        for i, (req_id, n) in enumerate(batch):
            st = self.requests[req_id]
            out.logits[req_id] = logits[i]
            if st.num_computed_tokens + n >= st.num_tokens:  # not a partial prefill: sample
                token = int(torch.argmax(logits[i][-1]))
                st.output_token_ids.append(token)
                out.sampled_token_ids[i] = [token]
        return out, kv_outputs

