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
                 version). Each worker allocates one zeroed int8 buffer per KVCacheTensor and hands
                 register_kv_caches one 4-D [B, H, N, C] view per layer (non-contiguous in general,
                 K then V packed in C, dim 0 in kernel blocks when the kernel block size is smaller).
                 CacheConfig.kv_cache_layout / get_resolved_kv_cache_layout(): None resolves to LBNHC
                 (CUDA FlashAttention's NHD). Older vLLM's per-layer tensors stay available as
                 kv_cache_format "legacy_kv_first" ([2, blocks, tokens, heads, head_size], FlashAttention)
                 and "legacy_blocks_first" ([blocks, 2, ...], FlashInfer); MLA: [blocks, tokens, head_size].

What is simplified (and therefore NOT a guarantee that real vLLM behaves the same):
one KV-cache group (full attention or MLA) and one KVCacheTensor for it, hash_block_size ==
block_size, FCFS only, no speculative decoding, no multimodal encoder, no async scheduling or
pipeline parallelism, greedy sampling, one process (workers run one after the other in
the calling thread; their scheduler outputs are pickled per worker, as a
multi-process executor would), CPU fp32 caches. The layout is not negotiated with attention
backends (cache_config.kv_cache_layout, default LBNHC) and the kernel block size is a harness
setting (cache_config.kernel_block_size), not a backend's choice; kv_quant_mode is carried but
nothing is quantized; no mixed page sizes or packed hybrid groups. `layer.kv_cache` is the tensor
itself (newer vLLM); older vLLM had a list indexed by virtual engine. The models are the toys
of tiny_model.py (TinyDecoder, TinyMLA).

Layout of this package, one submodule per part (the single-file module it replaces is
re-exported here under the same names): parallel_state, config, kv_cache_layout (KVCacheLayout),
kv_cache_interface (KV cache specs, views and allocation), connector_api (connector API fakes),
request (Request and block hashing), kv_cache (block pool and KV cache manager), scheduler_output,
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
from tiny_model import KVCache, KVShard, SeqInput  # noqa: E402,F401

from . import forward_context as _forward_context_module  # noqa: E402
from .config import (CacheConfig, CompilationConfig, KVTransferConfig, ModelConfig, ParallelConfig,  # noqa: E402,F401
                     SchedulerConfig, VllmConfig, _KV_ROLES, make_vllm_config)
from .connector_api import (KVConnectorBase_V1, KVConnectorMetadata, KVConnectorOutput,  # noqa: E402,F401
                            KVConnectorRole, KVConnectorTransferResults, KVConnectorWorkerMetadata, SupportsHMA,
                            create_connector, supports_hma)
from .engine import MiniEngine, StepRecord, run_request  # noqa: E402,F401
from .forward_context import (Attention, FlashAttentionMetadata, ForwardContext, get_forward_context,  # noqa: E402,F401
                              is_forward_context_available, set_forward_context)
from .kv_cache import BlockPool, KVCacheBlock, KVCacheBlocks, KVCacheManager, cdiv  # noqa: E402,F401
from .kv_cache_interface import (KV_CACHE_FORMATS, AttentionSpec, FullAttentionSpec, KVCacheConfig,  # noqa: E402,F401
                                 KVCacheGroupSpec, KVCacheSpec, KVCacheTensor, KVQuantMode, MambaSpec,
                                 MLAAttentionSpec, SlidingWindowSpec, _dtype_size, allocate_kv_caches,
                                 check_kv_cache_config_layout, compute_layer_kv_cache_shape_bytes,
                                 compute_layout_strides, create_kv_cache_views, group_kernel_blocks,
                                 kv_cache_spec_for, kv_cache_tensor_for, legacy_kv_cache_shape,
                                 make_kv_cache_config)
from .kv_cache_layout import DEFAULT_KV_CACHE_LAYOUT, KVCacheLayout, resolve_kv_cache_layout  # noqa: E402,F401
from .parallel_state import (_PARALLEL, _ParallelState, _as_rank, get_tensor_model_parallel_rank,  # noqa: E402,F401
                             get_tensor_model_parallel_world_size)
from .request import (_FINISH_REASON, BlockHash, ConstantList, LoRARequest, MultiModalFeatureSpec,  # noqa: E402,F401
                      PlaceholderRange, Request, RequestStatus, SamplingParams, generate_block_hash_extra_keys,
                      get_request_block_hasher, hash_block_tokens, init_none_hash, sha256_hash)
from .runner import (CachedRequestState, KVOutputAggregator, MiniModelRunner, _LayerHooks,  # noqa: E402,F401
                     _WorkerRank)
from .scheduler import EngineCoreOutput, ModelRunnerOutput, Scheduler, check_stop  # noqa: E402,F401
from .scheduler_output import (CachedRequestData, NewRequestData, SchedulerOutput,  # noqa: E402,F401
                               yield_req_data)
from .vllm_paths import _VLLM_MODULES, install_as_vllm  # noqa: E402,F401


def __getattr__(name: str):
    # `_forward_context` is rebound by set_forward_context: read it from its own module, never a copy.
    if name == "_forward_context":
        return _forward_context_module._forward_context
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
