"""install_as_vllm: the fakes of this package under vLLM's module paths."""

from __future__ import annotations

import contextlib
import sys
import types


# --------------------------------------------------------------------------
# Optional: expose these fakes under vLLM's module paths, so a connector written
# as `from vllm.distributed.kv_transfer.kv_connector.v1.base import ...` imports.
# --------------------------------------------------------------------------

_VLLM_MODULES = {
    "vllm": {},
    "vllm.config": ["VllmConfig", "ModelConfig", "CacheConfig", "ParallelConfig", "SchedulerConfig",
                    "KVTransferConfig", "CompilationConfig"],
    "vllm.distributed": ["get_tensor_model_parallel_rank", "get_tensor_model_parallel_world_size"],
    "vllm.distributed.parallel_state": ["get_tensor_model_parallel_rank", "get_tensor_model_parallel_world_size"],
    "vllm.distributed.kv_transfer": {},
    "vllm.distributed.kv_transfer.kv_connector": {},
    "vllm.distributed.kv_transfer.kv_connector.v1": ["KVConnectorBase_V1", "KVConnectorRole", "SupportsHMA",
                                                     "supports_hma"],
    "vllm.distributed.kv_transfer.kv_connector.v1.base": [
        "KVConnectorBase_V1", "KVConnectorRole", "KVConnectorMetadata", "KVConnectorWorkerMetadata",
        "KVConnectorTransferResults", "SupportsHMA", "supports_hma"],
    "vllm.distributed.kv_transfer.kv_connector.utils": ["KVOutputAggregator", "yield_req_data"],
    "vllm.forward_context": ["ForwardContext", "get_forward_context", "set_forward_context",
                             "is_forward_context_available"],
    "vllm.v1": {},
    "vllm.v1.outputs": ["KVConnectorOutput", "ModelRunnerOutput"],
    "vllm.v1.request": ["Request", "RequestStatus"],
    "vllm.v1.core": {},
    "vllm.v1.core.sched": {},
    "vllm.v1.core.sched.output": ["SchedulerOutput", "NewRequestData", "CachedRequestData", "KVConnectorBlockState"],
    "vllm.v1.core.kv_cache_manager": ["KVCacheBlocks", "KVCacheManager"],
    "vllm.v1.core.kv_cache_utils": ["KVCacheBlock", "BlockHash", "hash_block_tokens", "init_none_hash"],
    "vllm.v1.core.block_pool": ["BlockPool"],
    "vllm.v1.core.single_type_kv_cache_manager": ["SingleTypeKVCacheManager", "FullAttentionManager",
                                                  "SlidingWindowManager", "MambaManager"],
    "vllm.v1.core.kv_cache_coordinator": ["KVCacheCoordinator"],
    "vllm.v1.kv_cache_interface": ["KVCacheConfig", "KVCacheGroupSpec", "KVCacheTensor", "KVCacheSpec",
                                   "AttentionSpec", "FullAttentionSpec", "MLAAttentionSpec", "SlidingWindowSpec",
                                   "MambaSpec", "KVQuantMode", "KVCacheLayout", "compute_layer_kv_cache_shape_bytes",
                                   "compute_layout_strides", "create_kv_cache_views", "group_kernel_blocks"],
    "vllm.v1.kv_cache_layout": ["KVCacheLayout"],
    "vllm.v1.attention": {},
    "vllm.v1.attention.backends": {},
    "vllm.v1.attention.backends.flash_attn": ["FlashAttentionMetadata"],
    "vllm.sampling_params": ["SamplingParams"],
    "vllm.lora": {},
    "vllm.lora.request": ["LoRARequest"],
}


@contextlib.contextmanager
def install_as_vllm():
    """Registers these fakes in sys.modules under vLLM's module paths for the duration of the block
    (refuses if a real `vllm` is already imported). Not done on import: opt in per test."""
    if "vllm" in sys.modules:
        raise RuntimeError("a module named vllm is already imported")
    me = sys.modules[__package__]  # the package, which re-exports every name below
    added = []
    try:
        for name, attrs in _VLLM_MODULES.items():
            mod = types.ModuleType(name)
            mod.__dict__["__mini_vllm__"] = True
            for attr in attrs:
                setattr(mod, attr, getattr(me, attr))
            sys.modules[name] = mod
            added.append(name)
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(sys.modules[parent], child, mod)
        yield
    finally:
        for name in added:
            sys.modules.pop(name, None)
