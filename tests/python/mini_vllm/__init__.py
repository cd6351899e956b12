"""A miniature vLLM v1 engine that drives a KV connector in vLLM's order.

vLLM cannot be installed here, so the kvtier connector is tested against this
package. It mirrors vLLM's KV connector v1 contract as read from the sources
below and transcribed in python/kvtier/integrations/engine_interfaces.json. Sources (vllm-project/vllm):

  base.py        vllm/distributed/kv_transfer/kv_connector/v1/base.py @00f4240e
  scheduler.py   vllm/v1/core/sched/scheduler.py @00f4240e (schedule, update_from_output,
                 finish_requests, _connector_finished, _handle_invalid_blocks,
                 _update_waiting_for_remote_kv, _make_cached_request_data)
  mixin          vllm/v1/worker/kv_connector_model_runner_mixin.py @00f4240e
  utils.py       vllm/distributed/kv_transfer/kv_connector/utils.py @00f4240e
                 (KVOutputAggregator, yield_req_data)
  output.py      vllm/v1/core/sched/output.py @00e8f1fd (NewRequestData, CachedRequestData,
                 SchedulerOutput; has_sync_kv_loads seen only through its use @00f4240e)
  outputs.py     vllm/v1/outputs.py @00f4240e (KVConnectorOutput)
  request.py     vllm/v1/request.py @003df296 (Request)
  kv_cache_manager.py / kv_cache_utils.py @003df296 (KVCacheBlocks, block hashes)
  forward_context.py @01fb6e2f (ForwardContext)
  kv_transfer.py vllm/config/kv_transfer.py @007c643b (KVTransferConfig); kv_load_failure_policy
                 Literal["recompute", "fail"] = "fail" as in current vLLM (the scheduler finishes
                 a request whose blocks failed to load with FINISHED_ERROR; "recompute" must be asked for)
  factory.py     vllm/distributed/kv_transfer/kv_connector/factory.py @a4cd9d0d
  KV caches      after vllm#51718 "Standardize KV cache layout" (vLLM v0.28/v0.29):
                 vllm/v1/kv_cache_layout.py @14f7a27c776bd0c423bbc155b25ce21ee5a839da (KVCacheLayout),
                 vllm/v1/kv_cache_interface.py, the stored version with create_kv_cache_views
                 (AttentionSpec/FullAttentionSpec/MLAAttentionSpec with head_size_v, num_head_slots,
                 state_content_bytes, tokens_per_state, page_size_padded; KVQuantMode; KVCacheTensor
                 (size, layers, layer_stride, block_stride, offset); compute_layer_kv_cache_shape_bytes,
                 compute_layout_strides, create_kv_cache_views, group_kernel_blocks) and the single-group
                 placement of get_kv_cache_config_from_groups (vllm/v1/core/kv_cache_utils.py, same
                 version). Each worker allocates one zeroed int8 backing buffer, which every KVCacheTensor
                 places its layers in (as vllm/v1/worker/utils.py allocate_kv_cache does; one
                 buffer per tensor only for hand-made configs whose tensor sizes differ), and hands
                 register_kv_caches one 4-D [B, H, N, C] view per layer (non-contiguous in general,
                 K then V packed in C, dim 0 in kernel blocks when the kernel block size is smaller).
                 CacheConfig.kv_cache_layout / get_resolved_kv_cache_layout(): None resolves to LBNHC
                 (CUDA FlashAttention's NHD). Older vLLM's per-layer tensors stay available as
                 kv_cache_format "legacy_kv_first" ([2, blocks, tokens, heads, head_size], FlashAttention)
                 and "legacy_blocks_first" ([blocks, 2, ...], FlashInfer); MLA: [blocks, tokens, head_size].

The hybrid KV cache manager ("HMA", on by default in vLLM), for full-attention and sliding-window
groups (kv_cache.py, kv_cache_interface.py; file@commit in their docstrings):
  block_pool.py        vllm/v1/core/block_pool.py @c59cb7941357443da7c5eef75cfa8697d683d228
                       (one BlockPool for all groups, prefix cache keyed by (hash, group id),
                       get_cached_block over a list of groups, null blocks never cached)
  managers             vllm/v1/core/single_type_kv_cache_manager.py
                       @129ab7c60cbb8eb11e875373e67f7e521b74aa30 (FullAttentionManager,
                       SlidingWindowManager: get_num_skipped_tokens, get_num_blocks_to_allocate,
                       allocate_new_computed_blocks, remove_skipped_blocks, find_longest_cache_hit)
  coordinator          vllm/v1/core/kv_cache_coordinator.py @00b08dc44519a82cbdd9061d92d1226985094622
                       (unitary / hybrid; the hybrid hit: full attention first, each group type
                       shortens the length until all accept it; two-phase allocation of hit and
                       external blocks)
  manager              vllm/v1/core/kv_cache_manager.py @ace980e6de0540f49b0c63248437a1a7807590c1
                       (allocate_slots calls remove_skipped_blocks(total computed tokens) before
                       counting and allocating; KVCacheBlocks and get_block_ids: one list per group)
  scheduler            _connector_finished @00f4240e: remove_skipped_blocks then
                       get_block_ids_for_computed_tokens, request_finished_all_groups for
                       SupportsHMA connectors, request_finished(block_ids[0]) otherwise (vLLM
                       @b4622cf924bc72504aed99e486062d6633fde39e: the same, on request.num_tokens)
  grouping             vllm/v1/core/kv_cache_utils.py @bbf906a88ba1a39104884c88c9811a4f968e4659
                       (get_kv_cache_config: unify_hybrid_kv_cache_specs when HMA is off, i.e.
                       SlidingWindowSpec -> FullAttentionSpec(sliding_window=W) in one group;
                       _get_kv_cache_config_uniform_page_size when on: groups by layer type of
                       group_size = the fewest layers of a type)
  placement            current vLLM (after #51718, as stored; read by id, the index names no
                       commit): vllm/v1/worker/utils.py allocate_kv_cache allocates ONE backing
                       buffer of the size every KVCacheTensor has and views each tensor's layers in
                       it; KVCacheTensor's docstring (vllm/v1/kv_cache_interface.py): "cache groups
                       overlay each other". Here one KVCacheTensor per group, placed for group_size
                       layer slots at offset 0, so layer i of every group shares the bytes of slot i
                       (vLLM @bbf906a8 had one KVCacheTensor(size, shared_by) per slot, shared by
                       layer i of every group: the same bytes per slot and block). The legacy 5-D
                       forms share one tensor per slot likewise.
  HMA switch           SchedulerConfig.disable_hybrid_kv_cache_manager: False = on, True = off, None
                       (default) = settled by MiniEngine as current vLLM's VllmConfig.__post_init__
                       does (vllm/config/vllm.py, the version asking KVConnectorFactory.
                       supports_hma_config; read by id): on, unless a connector is configured whose
                       class is not SupportsHMA (a callable factory counts as not SupportsHMA). On,
                       create_connector refuses a connector that is not SupportsHMA (factory.py
                       @a4cd9d0d; a callable factory's connector is checked once made).
  A connector sees groups as vLLM shows them: NewRequestData.block_ids, CachedRequestData.
  new_block_ids and KVCacheBlocks.get_block_ids() are tuples of one list per group (group order
  of kv_cache_config.kv_cache_groups); a sliding-window group's entries before the window are 0,
  the null block, for local hits, for connector-loaded tokens (vLLM allocates real blocks only for
  the in-window part of num_external_computed_tokens) and after remove_skipped_blocks; the worker
  is not told when a running request's blocks are nulled (its tables keep the old ids, which the
  sliding-window layer never reads). request_finished_all_groups(request, block_ids) gets one
  list per group, clipped to the computed tokens.

Async scheduling (vLLM's --async-scheduling; SchedulerConfig.async_scheduling, make_vllm_config(
async_scheduling=True); off by default, and then none of this applies):
  config               vllm/config/scheduler.py @01230b40 (async_scheduling, get_scheduler_cls: the
                       AsyncScheduler), vllm/config/vllm.py @000fc94b (max_concurrent_batches: 2 with
                       async scheduling and no pipeline parallelism, V1 model runner)
  engine core          vllm/v1/engine/core.py @00080ee1 (step_with_batch_queue: schedule into the batch
                       queue while it has room and returns at once unless it is full or nothing is left
                       to schedule, then blocks on the oldest step and runs update_from_output; has_work
                       counts the queue). MiniEngine.step does the same; the workers run the steps in
                       schedule order, step N when its output is taken (after step N+1 was scheduled),
                       or each as soon as scheduled with MiniEngine(worker_runs_ahead=True).
                       MiniEngine.queue_abort is the aborts queue, applied right before
                       update_from_output (after the step's forward, the next step in flight).
  scheduler            vllm/v1/core/sched/async_scheduler.py @014b2350 (AsyncScheduler:
                       _update_after_schedule adds a placeholder per step that samples,
                       _update_request_with_output removes them, caches the blocks of the tokens then
                       known for running requests, and drops async_tokens_to_discard stale frames) and
                       scheduler.py @00024d31 (running requests scheduled for tokens + placeholders -
                       computed; none past a step in flight that reaches max_tokens; an output for a
                       request finished meanwhile is ignored; a request preempted while its step was in
                       flight takes that step's token and may stop from the waiting queue;
                       reset_prefix_cache's forced preemption drops placeholders and discards the frames
                       in flight, which MiniEngine.preempt, a step being in flight, does too).
  Not covered: speculative decoding, structured output (deferred sampling), pipeline parallelism;
  KV-load failures under async scheduling are not tested.

Recurrent-state (Mamba/GDN) groups, vLLM's Mamba "align" prefix-caching mode (kv_cache.py
MambaManager, scheduler.py, scheduler_output.py, kv_cache_interface.py; file@commit there):
  config      CacheConfig.mamba_cache_mode "none" (vLLM's default) becomes "align" when MiniEngine
              starts a model with recurrent layers (model.mamba_layer_indices) with prefix
              caching, as vLLM's config does for models without "all" support; the hybrid KV cache
              manager is then required and "align" requires chunked prefill.
  specs       MambaSpec(shapes, dtypes, page_size_padded, mamba_cache_mode): the attention block
              size raised until an attention page holds a state (align_hybrid_block_size), the
              Mamba page padded to it; block_size the attention block size ("align") or
              max_model_len ("none").
  views       a Mamba layer's cache is [num_blocks, 1, 1, state bytes] int8 (block stride the
              padded page), "views" format only; no kernel block split.
  tables      one entry per block of tokens, null except the state block(s): the state after
              k * block_size tokens in entry k - 1; kernels read entry cdiv(n, bs) - 1 and write
              entry cdiv(n + new, bs) - 1; the previous state block is freed one step later.
  scheduler   chunks cut at block boundaries (but the prompt's last); local hits need the state
              at the hit's end (the last cached Mamba block, intersected with the attention
              groups' hits); connector hits get nulls and one block at the hit's end; offers of
              boundary states to a producer connector, spelled per VllmConfig.vllm_version
              ("0.29": kv_connector_block_state.boundary_state_offloads, scheduler-local, None in
              the workers' copies; "0.28": partial_tail_offloads); a failed load of a request with
              a Mamba group recomputes it from token 0 (see Scheduler._restart_for_recurrent_state).
  model       TinyHybridRecurrent (tiny_model.py): sliding-window attention + a recurrent mixer.

What is simplified (and therefore NOT a guarantee that real vLLM behaves the same):
hash_block_size == block_size for every group (one block size, no fine-grained partial hits),
attention groups (full attention, MLA, sliding window) and Mamba groups in "align"/"none" mode (no
"all" mode, speculative Mamba blocks or copy-on-write, no chunked-local, cross-attention or R-SWA
groups), one page size for all groups, FCFS only, no speculative decoding or EAGLE, no
multimodal encoder, pipeline parallelism in one process (stages run one after the other, see
MiniEngine; no intermediate-tensor transfer), greedy sampling, one process
(workers run one after the other in the calling thread; their scheduler outputs are pickled per
worker, as a multi-process executor would), CPU fp32 caches. The layout is not negotiated with
attention backends (cache_config.kv_cache_layout, default LBNHC) and the kernel block size is a
harness setting (cache_config.kernel_block_size), not a backend's choice; kv_quant_mode is carried
but nothing is quantized; no mixed page sizes or packed (cross-layer) groups. KV-load failures of
a hybrid request are truncated at the first failed block index of any group (vLLM reads only one
group there); recomputing after it needs the window before that point, which a sliding-window
group may have freed. `layer.kv_cache` is the tensor itself (newer vLLM); older vLLM had a list
indexed by virtual engine. The models are the toys of tiny_model.py (TinyDecoder, TinyMLA,
TinyGemma: full attention + sliding window, TinyHybridRecurrent: sliding window + recurrent state).

Layout of this package, one submodule per part (the single-file module it replaces is
re-exported here under the same names): parallel_state, config, kv_cache_layout (KVCacheLayout),
kv_cache_interface (KV cache specs, views and allocation), connector_api (connector API fakes),
request (Request and block hashing), kv_cache (block pool, per-group managers, coordinator, KV cache
manager), scheduler_output,
forward_context, scheduler, runner (worker: model runner, output aggregation), engine (MiniEngine,
run_request), vllm_paths (install_as_vllm). Module-level state lives in one submodule each: the current
TP rank in parallel_state, the current forward context in forward_context.
"""

import os
import sys

# The directory of tiny_model.py (tests/python), which runner and engine import.
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
from tiny_model import KVCache, KVShard, SeqInput, TinyGemma, TinyHybridRecurrent  # noqa: E402,F401

from . import forward_context as _forward_context_module  # noqa: E402
from .config import (CacheConfig, CompilationConfig, KVTransferConfig, ModelConfig, ParallelConfig,  # noqa: E402,F401
                     SchedulerConfig, VllmConfig, _KV_ROLES, make_vllm_config)
from .connector_api import (KVConnectorBase_V1, KVConnectorMetadata, KVConnectorOutput,  # noqa: E402,F401
                            KVConnectorRole, KVConnectorTransferResults, KVConnectorWorkerMetadata, SupportsHMA,
                            connector_class_of, create_connector, resolve_hybrid_kv_cache_manager, supports_hma)
from .engine import MiniEngine, StepRecord, run_request  # noqa: E402,F401
from .forward_context import (Attention, FlashAttentionMetadata, ForwardContext, MambaMetadata,  # noqa: E402,F401
                              MambaMixer, get_forward_context, is_forward_context_available, set_forward_context)
from .kv_cache import (BlockPool, FullAttentionManager, KVCacheBlock, KVCacheBlocks,  # noqa: E402,F401
                       KVCacheCoordinator, KVCacheManager, MambaManager, SingleTypeKVCacheManager,
                       SlidingWindowManager, cdiv, manager_class_for)
from .kv_cache_interface import (KV_CACHE_FORMATS, MAMBA_CACHE_MODES, AttentionSpec,  # noqa: E402,F401
                                 FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheSpec, KVCacheTensor,
                                 KVQuantMode, MambaSpec, MLAAttentionSpec, SlidingWindowSpec, _dtype_size,
                                 align_hybrid_block_size, allocate_kv_caches, check_kv_cache_config_layout,
                                 compute_layer_kv_cache_shape_bytes, compute_layout_strides, create_kv_cache_views,
                                 get_kv_cache_groups, group_kernel_blocks, kv_cache_config_from_groups,
                                 kv_cache_spec_for, kv_cache_specs_for, kv_cache_tensor_for, legacy_kv_cache_shape,
                                 make_kv_cache_config, mamba_layers_of, mamba_spec_for, merge_full_attention_specs,
                                 get_pp_indices, pp_stage_layer_names, sliding_window_layers_of,
                                 unify_hybrid_kv_cache_specs)
from .kv_cache_layout import DEFAULT_KV_CACHE_LAYOUT, KVCacheLayout, resolve_kv_cache_layout  # noqa: E402,F401
from .parallel_state import (_PARALLEL, _ParallelState, _as_rank, get_tensor_model_parallel_rank,  # noqa: E402,F401
                             get_tensor_model_parallel_world_size)
from .request import (_FINISH_REASON, BlockHash, ConstantList, LoRARequest, MultiModalFeatureSpec,  # noqa: E402,F401
                      PlaceholderRange, Request, RequestStatus, SamplingParams, generate_block_hash_extra_keys,
                      get_request_block_hasher, hash_block_tokens, init_none_hash, sha256_hash)
from .runner import (CachedRequestState, KVOutputAggregator, MiniModelRunner, _LayerHooks,  # noqa: E402,F401
                     _WorkerRank)
from .scheduler import AsyncScheduler, EngineCoreOutput, ModelRunnerOutput, Scheduler, check_stop  # noqa: E402,F401
from .scheduler_output import (VLLM_VERSIONS, CachedRequestData, KVConnectorBlockState,  # noqa: E402,F401
                               NewRequestData, SchedulerOutput, SchedulerOutputV028, SchedulerOutputV029,
                               scheduler_output_class, yield_req_data)
from .vllm_paths import _VLLM_MODULES, install_as_vllm  # noqa: E402,F401


def __getattr__(name: str):
    # `_forward_context` is rebound by set_forward_context: read it from its own module, never a copy.
    if name == "_forward_context":
        return _forward_context_module._forward_context
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
