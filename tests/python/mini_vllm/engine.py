"""MiniEngine (EngineCore in one process) and run_request."""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import torch
from tiny_model import KVCache  # on sys.path: see the package __init__

from .config import VllmConfig, make_vllm_config
from .connector_api import KVConnectorRole, create_connector, resolve_hybrid_kv_cache_manager
from .kv_cache import BlockPool
from .kv_cache_interface import (KV_CACHE_FORMATS, MAMBA_CACHE_MODES, KVCacheConfig, MambaSpec, MLAAttentionSpec,
                                 _dtype_size, check_kv_cache_config_layout, make_kv_cache_config, mamba_layers_of,
                                 pp_stage_layer_names)
from .request import Request, RequestStatus, SamplingParams, get_request_block_hasher, init_none_hash, sha256_hash
from .runner import KVOutputAggregator, MiniModelRunner
from .scheduler import ModelRunnerOutput
from .scheduler_output import SchedulerOutput


# --------------------------------------------------------------------------
# The engine.
# --------------------------------------------------------------------------

@dataclass
class StepRecord:
    scheduler_output: SchedulerOutput
    model_runner_output: ModelRunnerOutput
    outputs: list
    discarded_req_ids: set
    # Requests scheduled in the step whose output the scheduler ignored: finished before it came back
    # (an abort; with async scheduling also a stop in the step before), or a stale async frame.
    ignored_req_ids: set = field(default_factory=set)


class _Batch:
    """A scheduled step in the batch queue: its scheduler output and, once the workers ran it,
    its ModelRunnerOutput (the future of vLLM's non-blocking execute_model)."""

    def __init__(self, scheduler_output: SchedulerOutput):
        self.scheduler_output = scheduler_output
        self.output: Optional[ModelRunnerOutput] = None


class MiniEngine:
    """EngineCore in one process: Scheduler + `num_workers` tensor-parallel workers per pipeline stage.

    Pipeline parallelism (pipeline_parallel_size, or vllm_config.parallel_config.
    pipeline_parallel_size; default 1): the attention layers are split into P contiguous stages as
    vLLM's get_pp_indices splits decoder layers (pp_stage_layer_names); worker global rank
    pp_rank * num_workers + tp_rank holds only its stage's layers (its own KVCacheConfig, its
    register_kv_caches gets only those layers) and the TP rank's heads. kv_cache_config is then a
    list of one config per stage (make_kv_cache_config(..., layer_names=stage's layers)); the
    scheduler (and its connector) gets stage 0's. A step runs stage by stage as vLLM's workers do
    (a later stage receives the intermediate tensors after the earlier stage's execute_model):
    each stage's workers bind the metadata (and start_load_kv when before the forward), the
    stage's layers run (its workers' wait_for_layer_load / save_kv_layer), then its workers'
    wait_for_save / get_finished, then the next stage. KVOutputAggregator expects finished counts
    from all P * num_workers workers. The batch queue is max_concurrent_batches (P) deep, as in
    vLLM (the scheduler schedules the next step while one is in flight).

    connector_factory: None (no connector when vllm_config.kv_transfer_config is None, otherwise
    the class named by kv_connector in kv_connector_module_path), a connector class, or a callable
    (vllm_config, role, kv_cache_config) -> connector. One scheduler-side instance and one
    worker-side instance per rank are created, as vLLM does.
    kv_cache_config: the per-worker config (see make_kv_cache_config(model, n, num_workers, layout=...));
    default 64 blocks in the engine's layout. start_load_kv_before_forward: None = vLLM @00f4240e
    (before the forward only when the step has sync loads, else after it), True = older vLLM
    (always before).
    KV cache groups: a hybrid model (model.sliding_window_layers) gets one group per layer type
    with the hybrid KV cache manager on (vllm_config.scheduler_config.disable_hybrid_kv_cache_manager
    False; None is settled here as vLLM does, see connector_api.resolve_hybrid_kv_cache_manager), one
    group of FullAttentionSpec(sliding_window=W) with it off.
    KV cache form (vllm_config.cache_config, see CacheConfig; the keyword arguments, when not None,
    override it): kv_cache_layout (a KVCacheLayout or its name; None = LBNHC), kernel_block_size
    (None = the block size; must divide it) and kv_cache_format ("views", current vLLM, or
    "legacy_kv_first"/"legacy_blocks_first", older vLLM's per-layer tensors).
    Recurrent layers (model.mamba_layer_indices, e.g. TinyHybridRecurrent): a MambaSpec group
    beside the attention groups, which needs the hybrid KV cache manager (ValueError when it is
    off), the "views" format, one pipeline stage. cache_config.mamba_cache_mode is settled as vLLM
    settles it: "none" becomes "align" with prefix caching (the model does not support "all");
    "align" needs chunked prefill. A kv_cache_config of "align" Mamba groups given to an engine
    without prefix caching runs in "align" mode (make_kv_cache_config's default; vLLM would use
    "none", whose tokens and logits are the same). cache_config.mamba_block_size /
    mamba_page_size_padded are then the Mamba group's. See kv_cache.MambaManager and the scheduler
    for what "align" does.
    Async scheduling (vllm_config.scheduler_config.async_scheduling, vLLM's --async-scheduling):
    step() is EngineCore.step_with_batch_queue (vllm/v1/engine/core.py @00080ee1) over a batch
    queue of vllm_config.max_concurrent_batches (2) steps, with the AsyncScheduler. Each call
    schedules a step (while the queue has room and there is work) and, once the queue is full or
    nothing is left to schedule, takes the oldest step's output and hands it to
    update_from_output: the scheduler and its connector see schedule() / build_connector_meta of
    step N+1 before update_from_output / update_connector_output of step N. The workers run the
    steps one after the other in schedule order, as vLLM's workers do; when is the harness's
    choice: worker_runs_ahead False (default) runs step N when its output is taken, i.e. after
    step N+1 was scheduled; True runs each step as soon as it is scheduled (so the workers have
    run step N+1 before the scheduler sees step N's output). Both are orders real vLLM can show.
    abort() and preempt() between step() calls then act while a step is in flight.
    """

    def __init__(self, model, vllm_config: Optional[VllmConfig] = None, kv_cache_config: Optional[KVCacheConfig] = None,
                 connector_factory: Any = None, num_workers: int = 1, *, none_hash: Optional[bytes] = None,
                 serialize_scheduler_output: bool = True, start_load_kv_before_forward: Optional[bool] = None,
                 kv_cache_layout: Any = None, kernel_block_size: Optional[int] = None,
                 kv_cache_format: Optional[str] = None, worker_runs_ahead: bool = False,
                 pipeline_parallel_size: Optional[int] = None):
        if vllm_config is None:
            vllm_config = make_vllm_config(model, kv_connector=None, tensor_parallel_size=num_workers,
                                           pipeline_parallel_size=pipeline_parallel_size or 1)
        vllm_config.parallel_config.tensor_parallel_size = num_workers
        if pipeline_parallel_size is not None:
            vllm_config.parallel_config.pipeline_parallel_size = pipeline_parallel_size
        pp_size = vllm_config.parallel_config.pipeline_parallel_size
        assert pp_size >= 1 and len(model.attention_layer_names) >= pp_size, "a pipeline stage without layers"
        cache = vllm_config.cache_config
        if kv_cache_layout is not None:
            cache.kv_cache_layout = getattr(kv_cache_layout, "name", kv_cache_layout)
        if kernel_block_size is not None:
            cache.kernel_block_size = kernel_block_size
        if kv_cache_format is not None:
            cache.kv_cache_format = kv_cache_format
        disable_hma = resolve_hybrid_kv_cache_manager(vllm_config, connector_factory)
        if mamba_layers_of(model):
            self._settle_mamba_cache_mode(vllm_config, disable_hma)
        self.stage_layer_names = pp_stage_layer_names(model, pp_size)
        if kv_cache_config is None:
            kv_cache_config = [make_kv_cache_config(model, 64, num_workers, layout=cache.get_resolved_kv_cache_layout(),
                                                    disable_hybrid_kv_cache_manager=disable_hma,
                                                    layer_names=names if pp_size > 1 else None,
                                                    mamba_cache_mode=cache.mamba_cache_mode,
                                                    max_model_len=vllm_config.model_config.max_model_len)
                               for names in self.stage_layer_names]
        stage_configs = list(kv_cache_config) if isinstance(kv_cache_config, (list, tuple)) else [kv_cache_config]
        given_modes = {g.kv_cache_spec.mamba_cache_mode for c in stage_configs for g in c.kv_cache_groups
                       if isinstance(g.kv_cache_spec, MambaSpec)}
        if len(given_modes) == 1 and given_modes != {cache.mamba_cache_mode}:
            # A config made for another mode is taken as asked for, e.g. make_kv_cache_config's default
            # "align" in an engine without prefix caching ("align" without caching works the same,
            # bit for bit); "none" with prefix caching stays refused (_check_kv_cache_config).
            cache.mamba_cache_mode = given_modes.pop()
            if cache.mamba_cache_mode == "align":
                self._settle_mamba_cache_mode(vllm_config, disable_hma)
        if len(stage_configs) != pp_size:
            raise ValueError(f"pipeline_parallel_size {pp_size} needs one KVCacheConfig per stage, got "
                             f"{len(stage_configs)} (make_kv_cache_config(..., layer_names=stage's layers), "
                             "see pp_stage_layer_names)")
        for stage, (config, names) in enumerate(zip(stage_configs, self.stage_layer_names)):
            if disable_hma and len(config.kv_cache_groups) > 1:
                raise ValueError(f"kv_cache_config has {len(config.kv_cache_groups)} KV cache groups but the "
                                 "hybrid KV cache manager is disabled (make_kv_cache_config(..., "
                                 "disable_hybrid_kv_cache_manager=True) gives one group)")
            self._check_kv_cache_config(model, cache, config, num_workers, names,
                                        vllm_config.model_config.max_model_len)
            assert config.num_blocks == stage_configs[0].num_blocks, "every stage has the scheduler's block count"
            assert len(config.kv_cache_groups) == len(stage_configs[0].kv_cache_groups), \
                f"stage {stage} has other KV cache groups than stage 0"
        kv_cache_config = stage_configs[0]  # the scheduler's: stage 0's (worker 0's)
        cache.num_gpu_blocks = kv_cache_config.num_blocks
        for group in kv_cache_config.kv_cache_groups:
            if isinstance(group.kv_cache_spec, MambaSpec):
                cache.mamba_block_size = group.kv_cache_spec.block_size
                cache.mamba_page_size_padded = group.kv_cache_spec.page_size_padded
        self.model = model
        self.vllm_config = vllm_config
        self.kv_cache_config = kv_cache_config
        self.stage_kv_cache_configs = stage_configs
        self.num_workers = num_workers  # tensor-parallel size
        self.pipeline_parallel_size = pp_size
        self.world_size = num_workers * pp_size
        self.block_size = model.block_size
        self.none_hash = none_hash if none_hash is not None else init_none_hash()
        self._block_hasher = get_request_block_hasher(self.block_size, sha256_hash, self.none_hash)
        scheduler_connector = None
        if vllm_config.kv_transfer_config is not None:
            scheduler_connector = create_connector(connector_factory, vllm_config, KVConnectorRole.SCHEDULER,
                                                   kv_cache_config)
        # Global rank = pp_rank * tp_size + tp_rank; each worker gets its stage's config.
        self.runner = MiniModelRunner(model, vllm_config, [stage_configs[r // num_workers]
                                                           for r in range(self.world_size)], connector_factory,
                                      serialize_scheduler_output, start_load_kv_before_forward)
        self.scheduler = vllm_config.scheduler_config.get_scheduler_cls()(vllm_config, kv_cache_config,
                                                                          scheduler_connector)
        self.async_scheduling = bool(vllm_config.scheduler_config.async_scheduling)
        self.batch_queue_size = vllm_config.max_concurrent_batches
        # EngineCore: a batch queue only when more than one step may be in flight; newest on the left.
        self.batch_queue: Optional[deque] = deque() if self.batch_queue_size > 1 else None
        self._not_run: deque = deque()  # queued steps the workers have not run yet, oldest first
        self._aborts_queue: list = []  # EngineCore.aborts_queue: see queue_abort
        self.worker_runs_ahead = worker_runs_ahead
        self.aggregator = (KVOutputAggregator.from_connector(scheduler_connector, self.world_size)
                           if scheduler_connector is not None else None)
        self.history: list = []
        self.outputs: dict = defaultdict(list)  # req_id -> generated tokens
        self.logits: dict = defaultdict(list)  # req_id -> [logits [n_new, vocab]] of accepted steps
        self.finish_reasons: dict = {}
        self.kv_transfer_params: dict = {}
        self.finished_block_ids: dict = {}  # req_id -> group-0 block ids when it finished (may be retained)
        self.finished_group_block_ids: dict = {}  # req_id -> one list per group when it finished
        self._next_id = 0

    @staticmethod
    def _settle_mamba_cache_mode(vllm_config: VllmConfig, disable_hma: bool) -> None:
        """A model with recurrent layers, as vLLM's config checks take it (vllm/config/vllm.py as
        stored, read by id: "none" becomes "all" or, for models that do not support it, "align"
        when prefix caching is on; "align" asserts chunked prefill)."""
        cache = vllm_config.cache_config
        if disable_hma:
            raise ValueError("a model with recurrent (Mamba) layers needs the hybrid KV cache manager: vLLM cannot "
                             "unify its KV cache specs (a connector must be SupportsHMA)")
        if vllm_config.parallel_config.pipeline_parallel_size > 1:
            raise NotImplementedError("pipeline parallelism of a model with recurrent layers is not modelled")
        if cache.kv_cache_format != "views":
            raise ValueError(f"kv_cache_format {cache.kv_cache_format!r} has no form for recurrent layers")
        if cache.mamba_cache_mode == "none" and cache.enable_prefix_caching:
            cache.mamba_cache_mode = "align"
        if cache.mamba_cache_mode not in MAMBA_CACHE_MODES:
            raise NotImplementedError(f"mamba_cache_mode {cache.mamba_cache_mode!r} is not modelled")
        if cache.mamba_cache_mode == "align" and not vllm_config.scheduler_config.enable_chunked_prefill:
            raise ValueError("Chunked prefill is required for mamba cache mode 'align'.")

    @staticmethod
    def _check_kv_cache_config(model, cache, kv_cache_config: KVCacheConfig, num_workers: int,
                               layer_names: Optional[list] = None, max_model_len: Optional[int] = None) -> None:
        for group in kv_cache_config.kv_cache_groups:
            spec = group.kv_cache_spec
            if isinstance(spec, MambaSpec):
                assert spec.mamba_cache_mode == cache.mamba_cache_mode, \
                    f"the Mamba group's mamba_cache_mode {spec.mamba_cache_mode!r} is not the engine's " \
                    f"{cache.mamba_cache_mode!r} (make_kv_cache_config(..., mamba_cache_mode=...))"
                want = model.block_size if spec.mamba_cache_mode == "align" else max_model_len
                assert spec.block_size == want, f"a {spec.mamba_cache_mode!r} Mamba group has blocks of {want} tokens"
                continue
            if isinstance(spec, MLAAttentionSpec):
                assert spec.num_kv_heads == 1 and model.num_tp_heads % num_workers == 0, "MLA: one latent per rank"
            else:
                assert spec.num_kv_heads * num_workers == model.n_kv_heads, "kv_cache_config must be per worker"
            assert spec.block_size == model.block_size == cache.block_size
        names = [n for g in kv_cache_config.kv_cache_groups for n in g.layer_names]
        want = model.attention_layer_names if layer_names is None else layer_names
        assert sorted(names) == sorted(want), "every attention layer (of the stage) in exactly one group"
        kbs = cache.kernel_block_size
        assert kbs is None or (kbs > 0 and model.block_size % kbs == 0), "kernel block size must divide the block size"
        if cache.kv_cache_format not in KV_CACHE_FORMATS:
            raise ValueError(f"kv_cache_format {cache.kv_cache_format!r} is not one of {KV_CACHE_FORMATS}")
        if cache.kv_cache_format == "views":
            check_kv_cache_config_layout(kv_cache_config, cache.get_resolved_kv_cache_layout())

    # ---- accessors ----
    @property
    def scheduler_connector(self):
        return self.scheduler.connector

    @property
    def worker_connectors(self) -> list:
        return [r.connector for r in self.runner.ranks]

    @property
    def worker_kv_caches(self) -> list:
        """Per rank: dict layer_name -> cache tensor (what register_kv_caches received)."""
        return [r.kv_caches for r in self.runner.ranks]

    @property
    def kv_caches(self) -> dict:
        return self.runner.ranks[0].kv_caches

    @property
    def block_pool(self) -> BlockPool:
        return self.scheduler.kv_cache_manager.block_pool

    def request(self, req_id: str) -> Optional[Request]:
        return self.scheduler.requests.get(req_id)

    def block_ids(self, req_id: str) -> list:
        """Group-0 block ids of a live request, or those it held when it finished."""
        return list(self.group_block_ids(req_id)[0])

    def group_block_ids(self, req_id: str) -> tuple:
        """One list of block ids per KV cache group (0 = the null block) of a live request, or those
        it held in its last step when it finished."""
        kvm = self.scheduler.kv_cache_manager
        if kvm.has_blocks(req_id):
            return tuple(list(ids) for ids in kvm.get_block_ids(req_id))
        held = self.finished_group_block_ids.get(req_id)
        if held is None:
            return tuple([] for _ in range(kvm.num_kv_cache_groups))
        return tuple(list(ids) for ids in held)

    def token_kv(self, block_table: Sequence[int], num_tokens: int) -> torch.Tensor:
        """K/V of positions [0, num_tokens) through `block_table`, whatever the cache form, all ranks'
        heads concatenated: [num_layers, 2, num_tokens, num_kv_heads, head_size]. MLA: rank 0's
        latents (every rank holds a replica): [num_layers, 1, num_tokens, 1, head_size]."""
        stages = []
        for ranks in self._stage_ranks():
            parts = [KVCache.gather_tokens(r.kv_caches, block_table, num_tokens, self.block_size,
                                           head_size=self.model.head_size, kv_format=r.kv_format) for r in ranks]
            stages.append(torch.cat(parts, dim=3))
        return torch.cat(stages, dim=0)  # pipeline stages' layers in model order

    def _stage_ranks(self) -> list:
        """Per pipeline stage, its TP ranks (MLA: the first only, every rank holding the latent)."""
        mla = getattr(self.model, "use_mla", False)
        ranks = self.runner.ranks
        tp = self.num_workers
        return [ranks[p * tp:p * tp + (1 if mla else tp)] for p in range(self.pipeline_parallel_size)]

    def request_kv(self, req_id: str, num_tokens: Optional[int] = None) -> torch.Tensor:
        """token_kv through the request's group-0 block table, for every layer (one group; for a
        hybrid config's other groups use group_kv)."""
        ids = self.block_ids(req_id)
        return self.token_kv(ids, num_tokens if num_tokens is not None else len(ids) * self.block_size)

    def group_kv(self, req_id: str, group: int, positions: Sequence[int]) -> torch.Tensor:
        """K/V of `positions` of group `group`'s layers read through that group's block table,
        all ranks' heads concatenated: [group's layers, 2, len(positions), heads, head_size]."""
        table = self.group_block_ids(req_id)[group]
        positions = list(positions)
        assert all(table[p // self.block_size] != 0 for p in positions), "a position in a null block"
        stages = []
        for p in range(self.pipeline_parallel_size):
            names = self.stage_kv_cache_configs[p].kv_cache_groups[group].layer_names
            parts = []
            for r in self.runner.ranks[p * self.num_workers:(p + 1) * self.num_workers]:
                caches = {n: r.kv_caches[n] for n in names}
                kv = KVCache.gather_tokens(caches, table, max(positions) + 1, self.block_size,
                                           head_size=self.model.head_size, kv_format=r.kv_format)
                parts.append(kv[:, :, positions])
            stages.append(torch.cat(parts, dim=3))
        return torch.cat(stages, dim=0)

    @property
    def mamba_group_ids(self) -> list:
        """Indices of the Mamba (recurrent-state) KV cache groups."""
        return [g for g, group in enumerate(self.kv_cache_config.kv_cache_groups)
                if isinstance(group.kv_cache_spec, MambaSpec)]

    def block_state(self, block_id: int, layer_name: Optional[str] = None) -> tuple:
        """The recurrent state held by block `block_id` of a Mamba layer (default: the first Mamba
        group's first layer): one tensor per MambaSpec shape, decoded from the bytes of the
        layer's [num_blocks, 1, 1, state bytes] view (padding left out), every TP rank's shard
        concatenated along dim 0. Copies; whatever the block holds now."""
        if layer_name is None:
            layer_name = self.kv_cache_config.kv_cache_groups[self.mamba_group_ids[0]].layer_names[0]
        parts = []
        for rank in self.runner.ranks:
            spec = rank.kv_cache_config.spec_of(layer_name)
            raw = rank.kv_caches[layer_name][block_id].reshape(-1)
            offset, tensors = 0, []
            for shape, dtype in zip(spec.shapes, spec.dtypes):
                n = int(torch.Size(shape).numel()) * _dtype_size(dtype)
                tensors.append(raw[offset:offset + n].clone().view(dtype).reshape(shape))
                offset += n
            parts.append(tensors)
        return tuple(torch.cat(shards, dim=0) for shards in zip(*parts))

    def mamba_state(self, req_id: str, num_tokens: int, layer_name: Optional[str] = None) -> tuple:
        """block_state of the block a live request's Mamba table holds the state after
        `num_tokens` tokens in (entry cdiv(num_tokens, block_size) - 1: in "align" mode a block
        boundary the request's chunks ended on and not yet freed, or its running state)."""
        group = self.mamba_group_ids[0]
        if layer_name is not None:
            group = next(g for g, grp in enumerate(self.kv_cache_config.kv_cache_groups)
                         if layer_name in grp.layer_names)
        bs = self.kv_cache_config.kv_cache_groups[group].kv_cache_spec.block_size
        block_id = self.group_block_ids(req_id)[group][-(-num_tokens // bs) - 1]
        assert block_id != 0, f"{req_id} holds no state after {num_tokens} tokens (a null block)"
        return self.block_state(block_id, layer_name or self.kv_cache_config.kv_cache_groups[group].layer_names[0])

    # ---- requests ----
    def make_request(self, prompt: Sequence[int], max_tokens: int = 8, request_id: Optional[str] = None,
                     *, stop_token_ids: Optional[list] = None, kv_transfer_params: Optional[dict] = None,
                     skip_reading_prefix_cache: Optional[bool] = None, **kwargs) -> Request:
        if request_id is None:
            request_id = f"req-{self._next_id}"
            self._next_id += 1
        extra = {"kv_transfer_params": kv_transfer_params} if kv_transfer_params is not None else None
        params = SamplingParams(max_tokens=max_tokens, stop_token_ids=list(stop_token_ids or []), extra_args=extra,
                                skip_reading_prefix_cache=skip_reading_prefix_cache)
        return Request(request_id, list(prompt), params, block_hasher=self._block_hasher, **kwargs)

    def add_request(self, prompt_or_request, max_tokens: int = 8, request_id: Optional[str] = None,
                    **kwargs) -> Request:
        request = prompt_or_request
        if not isinstance(request, Request):
            request = self.make_request(prompt_or_request, max_tokens, request_id, **kwargs)
        self.scheduler.add_request(request)
        return request

    def abort(self, req_id: str) -> None:
        """EngineCore.abort_requests: allowed at any time, also between schedule() and execute_model()."""
        blocks = self.group_block_ids(req_id)
        for request in self.scheduler.finish_requests(req_id, RequestStatus.FINISHED_ABORTED):
            self.finish_reasons[request.request_id] = request.get_finished_reason()
            self.finished_block_ids[request.request_id] = list(blocks[0])
            self.finished_group_block_ids[request.request_id] = blocks

    def queue_abort(self, req_id: str) -> None:
        """EngineCore's aborts queue (core.py @00080ee1): an abort that arrives while a step executes
        is applied (as abort()) right before that step's update_from_output, after its forward.
        With async scheduling the next step is in flight then."""
        self._aborts_queue.append(req_id)

    def _process_aborts_queue(self) -> None:
        aborts, self._aborts_queue = self._aborts_queue, []
        for req_id in aborts:
            self.abort(req_id)

    def preempt(self, req_id: str) -> None:
        """Preempts a RUNNING request between steps: its blocks are freed and it restarts from 0
        (a later schedule resumes it through resumed_req_ids with its full block list)."""
        self.scheduler.preempt_request(req_id)

    # ---- one step = schedule, execute_model, update_from_output ----
    def has_requests(self) -> bool:
        """EngineCore.has_work: the scheduler has requests, or steps are in flight."""
        return self.scheduler.has_requests() or bool(self.batch_queue)

    @property
    def in_flight(self) -> list:
        """Scheduler outputs of the steps in the batch queue whose output was not taken, oldest first."""
        return [b.scheduler_output for b in reversed(self.batch_queue or ())]

    def schedule(self) -> SchedulerOutput:
        return self.scheduler.schedule()

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        out, kv_outputs = self.runner.execute_model(so)
        if kv_outputs is not None:
            # One worker: its output passes through (UniProcExecutor); several: KVOutputAggregator,
            # which always returns a KVConnectorOutput (MultiprocExecutor).
            out.kv_connector_output = kv_outputs[0] if self.world_size == 1 else self.aggregator.aggregate(kv_outputs)
        return out

    def update_from_output(self, so: SchedulerOutput, out: ModelRunnerOutput) -> StepRecord:
        # Capture block ids of requests that may finish in this update.
        live_blocks = {r: self.group_block_ids(r) for r in self.scheduler.requests}
        outputs, discarded = self.scheduler.update_from_output(so, out)
        # Async scheduling: a step's output for a request that finished meanwhile, or a frame
        # dropped after a forced preemption, is not the request's (sync keeps its old bookkeeping).
        ignored = self.scheduler.ignored_req_ids if self.async_scheduling else set()
        for req_id, logits in out.logits.items():
            if req_id not in discarded and req_id not in ignored:
                self.logits[req_id].append(logits)
        for o in outputs:
            self.outputs[o.request_id].extend(o.new_token_ids)
            if o.finish_reason is not None:
                self.finish_reasons[o.request_id] = o.finish_reason
                self.kv_transfer_params[o.request_id] = o.kv_transfer_params
                held = live_blocks.get(o.request_id, ())
                self.finished_block_ids[o.request_id] = list(held[0]) if held else []
                self.finished_group_block_ids[o.request_id] = held
        record = StepRecord(so, out, outputs, discarded, set(self.scheduler.ignored_req_ids))
        self.history.append(record)
        return record

    def step(self) -> Optional[StepRecord]:
        """One engine step: EngineCore.step (schedule, execute, update), or with async scheduling
        step_with_batch_queue. Returns the record of the update it made, or None (nothing to do, or
        async scheduling filled the queue without taking an output)."""
        if self.batch_queue is not None:
            return self.step_with_batch_queue()
        if not self.has_requests():
            return None
        so = self.schedule()
        out = self.execute_model(so)
        self._process_aborts_queue()
        return self.update_from_output(so, out)

    def step_with_batch_queue(self) -> Optional[StepRecord]:
        """EngineCore.step_with_batch_queue (core.py @00080ee1): schedule into the queue while it
        has room (returning at once unless it is now full or nothing is left to schedule), then
        block on the oldest step and update the scheduler from its output."""
        queue = self.batch_queue
        assert queue is not None and len(queue) < self.batch_queue_size
        if self.scheduler.has_requests():
            batch = _Batch(self.schedule())
            self._not_run.append(batch)
            if self.worker_runs_ahead:
                self._run_workers(batch)
            queue.appendleft(batch)
            model_executed = batch.scheduler_output.total_num_scheduled_tokens > 0
            if len(queue) < self.batch_queue_size and (model_executed or self.scheduler.has_requests()):
                return None
        elif not queue:
            return None
        batch = queue.pop()
        self._run_workers(batch)
        self._process_aborts_queue()
        return self.update_from_output(batch.scheduler_output, batch.output)

    def _run_workers(self, batch: _Batch) -> None:
        """The workers run queued steps in schedule order, up to and including `batch`."""
        while batch.output is None:
            first = self._not_run.popleft()
            first.output = self.execute_model(first.scheduler_output)

    def run_until_done(self, max_steps: int = 10000) -> int:
        steps = 0
        while self.has_requests():
            assert steps < max_steps, "engine did not drain (a delayed free never reported finished_sending?)"
            self.step()
            steps += 1
        return steps

    def shutdown(self) -> None:
        for c in [self.scheduler_connector] + self.worker_connectors:
            if c is not None and hasattr(c, "shutdown"):
                c.shutdown()


def run_request(engine: MiniEngine, prompt: Sequence[int], max_new_tokens: int, request_id: Optional[str] = None,
                **kwargs) -> tuple:
    """Adds one request, runs the engine until it is idle, returns (generated tokens, logits per step),
    logits per step being the [n_new, vocab] tensors of the steps whose output the scheduler accepted."""
    request = engine.add_request(prompt, max_new_tokens, request_id, **kwargs)
    engine.run_until_done()
    return list(engine.outputs[request.request_id]), list(engine.logits[request.request_id])
