"""Configs (vllm/config) of the mini vLLM engine and make_vllm_config."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from .kv_cache_layout import KVCacheLayout, resolve_kv_cache_layout


# --------------------------------------------------------------------------
# Configs (vllm/config). Only the fields a connector or this engine reads.
# --------------------------------------------------------------------------

@dataclass
class ModelConfig:
    model: str = "kvtier-test/tiny-decoder"
    revision: Optional[str] = "seed-0"
    dtype: torch.dtype = torch.float32
    max_model_len: int = 512
    use_mla: bool = False
    # Shape facts vLLM derives from hf_config; here copied from the tiny model (MLA: one KV "head",
    # head_size = the latent's width).
    num_layers: int = 3
    total_num_kv_heads: int = 2
    head_size: int = 8

    def get_num_layers(self, parallel_config: "ParallelConfig" = None) -> int:
        return self.num_layers

    def get_total_num_hidden_layers(self) -> int:
        """All decoder layers of the model, whatever the pipeline split (vllm/config/model.py)."""
        return self.num_layers

    def get_total_num_kv_heads(self) -> int:
        return 1 if self.use_mla else self.total_num_kv_heads

    def get_num_kv_heads(self, parallel_config: "ParallelConfig") -> int:
        if self.use_mla:
            return 1  # the latent is replicated on every rank
        return max(1, self.total_num_kv_heads // parallel_config.tensor_parallel_size)

    def get_head_size(self) -> int:
        return self.head_size


@dataclass
class CacheConfig:
    """vllm/config/cache.py, the fields read here. kv_cache_layout: a KVCacheLayout name (or "NHD"/
    "HND"), None = resolved by the engine (CUDA FlashAttention: NHD = LBNHC), as after vllm#51718.
    Harness-only (real vLLM has no such fields): kernel_block_size, the attention kernel's tokens
    per block (real vLLM takes it from the backend; None = block_size), and kv_cache_format, what
    the workers allocate: "views" (current vLLM) or "legacy_kv_first"/"legacy_blocks_first"
    (older vLLM's per-layer tensors, see kv_cache_interface.py)."""
    block_size: int = 4
    cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    num_gpu_blocks: Optional[int] = None
    prefix_caching_hash_algo: str = "sha256"
    kv_cache_layout: Optional[str] = None
    kernel_block_size: Optional[int] = None
    kv_cache_format: str = "views"
    # Recurrent (Mamba/GDN) layers: "none" (vLLM's default: one running state per request),
    # "align" (a state kept at block boundaries; what vLLM sets when prefix caching is on, and
    # MiniEngine settles likewise), "all" (not modelled). mamba_block_size and
    # mamba_page_size_padded are set by MiniEngine from the KV cache config, as vLLM sets them.
    mamba_cache_mode: str = "none"
    mamba_block_size: Optional[int] = None
    mamba_page_size_padded: Optional[int] = None

    def get_resolved_kv_cache_layout(self) -> KVCacheLayout:
        return resolve_kv_cache_layout(self.kv_cache_layout)


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    decode_context_parallel_size: int = 1
    rank: int = 0  # the worker's global rank; each worker's copy of VllmConfig has its own

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


@dataclass
class SchedulerConfig:
    max_num_batched_tokens: int = 2048  # the per-step token budget (chunked prefill splits above it)
    max_num_seqs: int = 64
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    # The hybrid KV cache manager (HMA): False = on (several KV cache groups for a hybrid model),
    # True = off (one group, sliding-window layers as full attention), None = decided when the
    # engine starts (current vLLM's VllmConfig.__post_init__: on, unless a connector is configured
    # whose class is not SupportsHMA; see connector_api.resolve_hybrid_kv_cache_manager). With it
    # on, the connector factory refuses non-SupportsHMA connectors (factory.py @a4cd9d0d).
    disable_hybrid_kv_cache_manager: Optional[bool] = None
    policy: str = "fcfs"
    # vLLM's --async-scheduling (vllm/config/scheduler.py @01230b40): the engine core schedules step
    # N+1 before step N's output is back, through a batch queue of max_concurrent_batches (2) and
    # the AsyncScheduler, which counts the in-flight steps' tokens as placeholders. False (the
    # default) = one step at a time, Scheduler.
    async_scheduling: bool = False

    def get_scheduler_cls(self) -> type:
        """The scheduler class, as SchedulerConfig.get_scheduler_cls picks it (no custom classes)."""
        from .scheduler import AsyncScheduler, Scheduler
        return AsyncScheduler if self.async_scheduling else Scheduler


_KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")


@dataclass
class KVTransferConfig:
    """vllm/config/kv_transfer.py @007c643b, plus kv_load_failure_policy (read by the scheduler @00f4240e):
    "fail", vLLM's default, finishes a request whose blocks failed to load with FINISHED_ERROR;
    "recompute" recomputes from the first failed block."""
    kv_connector: Optional[str] = None
    engine_id: Optional[str] = None
    kv_buffer_device: str = "cpu"
    kv_buffer_size: float = 1e9
    kv_role: Optional[str] = None
    kv_rank: Optional[int] = None
    kv_parallel_size: int = 1
    kv_ip: str = "127.0.0.1"
    kv_port: int = 14579
    kv_connector_extra_config: dict = field(default_factory=dict)
    kv_connector_module_path: Optional[str] = None
    kv_load_failure_policy: str = "fail"  # Literal["recompute", "fail"]

    def __post_init__(self):
        if self.engine_id is None:
            self.engine_id = str(uuid.uuid4())
        if self.kv_connector is not None and self.kv_role not in _KV_ROLES:
            raise ValueError(f"Unsupported kv_role: {self.kv_role}. Supported roles are {_KV_ROLES}")

    @property
    def is_kv_transfer_instance(self) -> bool:
        return self.kv_connector is not None and self.kv_role in _KV_ROLES

    @property
    def is_kv_producer(self) -> bool:
        return self.kv_connector is not None and self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_kv_consumer(self) -> bool:
        return self.kv_connector is not None and self.kv_role in ("kv_consumer", "kv_both")

    def get_from_extra_config(self, key, default) -> Any:
        return self.kv_connector_extra_config.get(key, default)


@dataclass
class CompilationConfig:
    # layer_name -> attention layer (with .kv_cache); becomes ForwardContext.no_compile_layers.
    static_forward_context: dict = field(default_factory=dict)


@dataclass
class VllmConfig:
    model_config: ModelConfig = field(default_factory=ModelConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    kv_transfer_config: Optional[KVTransferConfig] = None
    compilation_config: CompilationConfig = field(default_factory=CompilationConfig)
    additional_config: dict = field(default_factory=dict)
    # Harness-only: the vLLM version whose SchedulerOutput spelling of the Mamba boundary-state
    # offers the scheduler produces: "0.29" (kv_connector_block_state.boundary_state_offloads) or
    # "0.28" (partial_tail_offloads); see scheduler_output.py. Nothing else switches on it.
    vllm_version: str = "0.29"

    @property
    def max_concurrent_batches(self) -> int:
        """Steps in flight at once (vllm/config/vllm.py @000fc94b, V1 model runner): 2 with async
        scheduling and no pipeline parallelism, else the pipeline depth (1 here)."""
        pp_size = self.parallel_config.pipeline_parallel_size
        if self.scheduler_config.async_scheduling and pp_size <= 1:
            return 2
        return pp_size


def make_vllm_config(model, *, kv_connector: Optional[str] = "KVConnectorUnderTest", kv_role: str = "kv_both",
                     kv_connector_module_path: Optional[str] = None, kv_connector_extra_config: Optional[dict] = None,
                     kv_load_failure_policy: str = "fail", tensor_parallel_size: int = 1,
                     enable_prefix_caching: bool = True, max_num_batched_tokens: int = 2048, max_num_seqs: int = 64,
                     long_prefill_token_threshold: int = 0, enable_chunked_prefill: bool = True,
                     max_model_len: Optional[int] = None, model_name: str = "kvtier-test/tiny-decoder",
                     revision: Optional[str] = None, kv_cache_layout: Optional[str] = None,
                     kernel_block_size: Optional[int] = None, kv_cache_format: str = "views",
                     disable_hybrid_kv_cache_manager: Optional[bool] = None,
                     async_scheduling: bool = False, pipeline_parallel_size: int = 1,
                     mamba_cache_mode: str = "none", vllm_version: str = "0.29") -> VllmConfig:
    """A VllmConfig for `model`. kv_connector=None gives kv_transfer_config=None (no connector).
    kv_cache_layout, kernel_block_size and kv_cache_format go to CacheConfig (see there),
    disable_hybrid_kv_cache_manager to SchedulerConfig (None: decided by MiniEngine, as vLLM does),
    async_scheduling too (vLLM's --async-scheduling; False: one step at a time);
    pipeline_parallel_size to ParallelConfig (the decoder layers split into that many stages, see
    MiniEngine); mamba_cache_mode to CacheConfig ("none", vLLM's default, becomes "align" with
    prefix caching when MiniEngine starts a model with recurrent layers); vllm_version to
    VllmConfig (the spelling of the boundary-state offers)."""
    ktc = None
    if kv_connector is not None:
        ktc = KVTransferConfig(kv_connector=kv_connector, kv_role=kv_role,
                               kv_connector_module_path=kv_connector_module_path,
                               kv_connector_extra_config=dict(kv_connector_extra_config or {}),
                               kv_load_failure_policy=kv_load_failure_policy)
    use_mla = bool(getattr(model, "use_mla", False))
    return VllmConfig(
        model_config=ModelConfig(model=model_name, revision=revision or f"seed-{getattr(model, 'seed', 0)}",
                                 dtype=torch.float32, max_model_len=max_model_len or model.max_positions,
                                 use_mla=use_mla, num_layers=len(model.attention_layer_names),
                                 total_num_kv_heads=model.n_kv_heads, head_size=model.head_size),
        cache_config=CacheConfig(block_size=model.block_size, enable_prefix_caching=enable_prefix_caching,
                                 kv_cache_layout=kv_cache_layout, kernel_block_size=kernel_block_size,
                                 kv_cache_format=kv_cache_format, mamba_cache_mode=mamba_cache_mode),
        parallel_config=ParallelConfig(tensor_parallel_size=tensor_parallel_size,
                                       pipeline_parallel_size=pipeline_parallel_size),
        scheduler_config=SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                                         enable_chunked_prefill=enable_chunked_prefill,
                                         long_prefill_token_threshold=long_prefill_token_threshold,
                                         disable_hybrid_kv_cache_manager=disable_hybrid_kv_cache_manager,
                                         async_scheduling=async_scheduling),
        kv_transfer_config=ktc, vllm_version=vllm_version)
