"""A miniature vLLM v1 engine that drives a KV connector in vLLM's order.

vLLM cannot be installed here, so the kvtier connector is tested against this
file. It mirrors vLLM's KV connector v1 contract as transcribed in
/tmp/notes/engine_reading.md section 1 and in
python/kvtier/integrations/engine_interfaces.json. Sources (vllm-project/vllm):

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
  kv_transfer.py vllm/config/kv_transfer.py @007c643b (KVTransferConfig)
  factory.py     vllm/distributed/kv_transfer/kv_connector/factory.py @a4cd9d0d

What is simplified (and therefore NOT a guarantee that real vLLM behaves the same):
one KV-cache group (full attention), hash_block_size == block_size, FCFS only, no
speculative decoding, no multimodal encoder, no async scheduling or pipeline
parallelism, greedy sampling, one process (workers run one after the other in
the calling thread; their scheduler outputs are pickled per worker, as a
multi-process executor would). `layer.kv_cache` is the tensor itself (newer
vLLM); older vLLM had a list indexed by virtual engine.

Layout of this file: parallel state, configs, KV cache specs, connector API
fakes, Request and block hashing, block pool and KV cache manager, scheduler
output, forward context, Scheduler, worker (model runner), MiniEngine,
helpers (run_request, install_as_vllm).
"""

from __future__ import annotations

import contextlib
import copy
import enum
import hashlib
import importlib
import inspect
import os
import pickle
import sys
import types
import uuid
import warnings
from abc import ABC, abstractmethod
from collections import OrderedDict, defaultdict, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
from tiny_model import KVCache, KVShard, SeqInput  # noqa: E402


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --------------------------------------------------------------------------
# Parallel state (vllm.distributed.parallel_state). In vLLM each worker is its
# own process; here the engine sets the "current" rank around every call it
# makes on a worker-side connector (construction included).
# --------------------------------------------------------------------------

class _ParallelState:
    rank = 0
    world_size = 1


_PARALLEL = _ParallelState()


def get_tensor_model_parallel_rank() -> int:
    return _PARALLEL.rank


def get_tensor_model_parallel_world_size() -> int:
    return _PARALLEL.world_size


@contextlib.contextmanager
def _as_rank(rank: int, world_size: int):
    saved = (_PARALLEL.rank, _PARALLEL.world_size)
    _PARALLEL.rank, _PARALLEL.world_size = rank, world_size
    try:
        yield
    finally:
        _PARALLEL.rank, _PARALLEL.world_size = saved


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
    # Shape facts vLLM derives from hf_config; here copied from the tiny model.
    num_layers: int = 3
    total_num_kv_heads: int = 2
    head_size: int = 8

    def get_num_layers(self, parallel_config: "ParallelConfig" = None) -> int:
        return self.num_layers

    def get_total_num_kv_heads(self) -> int:
        return self.total_num_kv_heads

    def get_num_kv_heads(self, parallel_config: "ParallelConfig") -> int:
        return max(1, self.total_num_kv_heads // parallel_config.tensor_parallel_size)

    def get_head_size(self) -> int:
        return self.head_size


@dataclass
class CacheConfig:
    block_size: int = 4
    cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    num_gpu_blocks: Optional[int] = None
    prefix_caching_hash_algo: str = "sha256"


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
    # The connector factory refuses non-SupportsHMA connectors when this is False (factory.py @a4cd9d0d).
    disable_hybrid_kv_cache_manager: bool = True
    policy: str = "fcfs"


_KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")


@dataclass
class KVTransferConfig:
    """vllm/config/kv_transfer.py @007c643b, plus kv_load_failure_policy read by the scheduler @00f4240e."""
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
    kv_load_failure_policy: str = "recompute"  # "recompute" or anything else (= fail the request)

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


def make_vllm_config(model, *, kv_connector: Optional[str] = "KVConnectorUnderTest", kv_role: str = "kv_both",
                     kv_connector_module_path: Optional[str] = None, kv_connector_extra_config: Optional[dict] = None,
                     kv_load_failure_policy: str = "recompute", tensor_parallel_size: int = 1,
                     enable_prefix_caching: bool = True, max_num_batched_tokens: int = 2048, max_num_seqs: int = 64,
                     long_prefill_token_threshold: int = 0, enable_chunked_prefill: bool = True,
                     max_model_len: Optional[int] = None, model_name: str = "kvtier-test/tiny-decoder",
                     revision: Optional[str] = None) -> VllmConfig:
    """A VllmConfig for `model`. kv_connector=None gives kv_transfer_config=None (no connector)."""
    ktc = None
    if kv_connector is not None:
        ktc = KVTransferConfig(kv_connector=kv_connector, kv_role=kv_role,
                               kv_connector_module_path=kv_connector_module_path,
                               kv_connector_extra_config=dict(kv_connector_extra_config or {}),
                               kv_load_failure_policy=kv_load_failure_policy)
    return VllmConfig(
        model_config=ModelConfig(model=model_name, revision=revision or f"seed-{getattr(model, 'seed', 0)}",
                                 dtype=torch.float32, max_model_len=max_model_len or model.max_positions,
                                 num_layers=len(model.attention_layer_names), total_num_kv_heads=model.n_kv_heads,
                                 head_size=model.head_size),
        cache_config=CacheConfig(block_size=model.block_size, enable_prefix_caching=enable_prefix_caching),
        parallel_config=ParallelConfig(tensor_parallel_size=tensor_parallel_size),
        scheduler_config=SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                                         enable_chunked_prefill=enable_chunked_prefill,
                                         long_prefill_token_threshold=long_prefill_token_threshold),
        kv_transfer_config=ktc)


# --------------------------------------------------------------------------
# KV cache specs (vllm/v1/kv_cache_interface.py @001cabc1). One spec and one
# KVCacheConfig per worker: num_kv_heads is the rank's share under TP.
# --------------------------------------------------------------------------

def _dtype_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class KVCacheSpec:
    block_size: int

    @property
    def page_size_bytes(self) -> int:
        raise NotImplementedError


@dataclass(frozen=True)
class AttentionSpec(KVCacheSpec):
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype

    @property
    def real_page_size_bytes(self) -> int:
        # 2 (K and V) * block_size * num_kv_heads * head_size * dtype size; MLA would drop the 2.
        return 2 * self.block_size * self.num_kv_heads * self.head_size * _dtype_size(self.dtype)

    @property
    def page_size_bytes(self) -> int:
        return self.real_page_size_bytes


@dataclass(frozen=True)
class FullAttentionSpec(AttentionSpec):
    sliding_window: Optional[int] = None
    attention_chunk_size: Optional[int] = None


@dataclass(frozen=True)
class SlidingWindowSpec(AttentionSpec):
    sliding_window: int = 0


@dataclass(frozen=True)
class MambaSpec(KVCacheSpec):
    shapes: tuple = ()
    dtypes: tuple = ()
    mamba_type: str = "mamba2"

    @property
    def page_size_bytes(self) -> int:
        return sum(int(torch.Size(s).numel()) * _dtype_size(d) for s, d in zip(self.shapes, self.dtypes))


@dataclass
class KVCacheTensor:
    size: int
    shared_by: list


@dataclass
class KVCacheGroupSpec:
    layer_names: list
    kv_cache_spec: KVCacheSpec


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list
    kv_cache_groups: list


def make_kv_cache_config(model, num_blocks: int, tensor_parallel_size: int = 1) -> KVCacheConfig:
    """The per-worker KVCacheConfig of `model`'s attention layers (one group, FullAttentionSpec)."""
    assert model.n_kv_heads % tensor_parallel_size == 0
    spec = FullAttentionSpec(block_size=model.block_size, num_kv_heads=model.n_kv_heads // tensor_parallel_size,
                             head_size=model.head_size, dtype=torch.float32)
    names = list(model.attention_layer_names)
    return KVCacheConfig(num_blocks=num_blocks,
                         kv_cache_tensors=[KVCacheTensor(spec.page_size_bytes * num_blocks, [n]) for n in names],
                         kv_cache_groups=[KVCacheGroupSpec(names, spec)])


# --------------------------------------------------------------------------
# Connector API (base.py @00f4240e, member set and defaults per
# engine_interfaces.json). A connector under test may subclass these fakes or
# be any object with the same methods: the engine calls optional methods only
# when they exist.
# --------------------------------------------------------------------------

class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorMetadata(ABC):  # noqa: B024 - empty marker, as in vLLM
    """Scheduler connector -> worker connectors, once per step. Must be picklable."""


class KVConnectorWorkerMetadata(ABC):
    """Worker -> scheduler side channel, aggregated across workers."""

    @abstractmethod
    def aggregate(self, other: "KVConnectorWorkerMetadata") -> "KVConnectorWorkerMetadata":
        ...


@dataclass
class KVConnectorTransferResults:
    finished_sending: set = field(default_factory=set)
    finished_recving: set = field(default_factory=set)
    failed_recving: set = field(default_factory=set)  # failed receives also appear in finished_recving
    prefix_replay_checkpoints: dict = field(default_factory=dict)


@dataclass
class KVConnectorOutput:
    """vllm/v1/outputs.py @00f4240e."""
    finished_sending: Optional[set] = None
    finished_recving: Optional[set] = None
    kv_connector_stats: Any = None
    kv_cache_events: Any = None
    kv_connector_worker_meta: Any = None
    invalid_block_ids: set = field(default_factory=set)
    failed_recving: set = field(default_factory=set)
    expected_finished_count: int = 0
    prefix_replay_checkpoints: dict = field(default_factory=dict)

    def is_empty(self) -> bool:
        return (not self.finished_sending and not self.finished_recving and not self.kv_connector_stats
                and not self.kv_cache_events and not self.invalid_block_ids and not self.failed_recving
                and not self.kv_connector_worker_meta)


class SupportsHMA(ABC):
    """Mixin for connectors that handle several KV-cache groups."""

    @abstractmethod
    def request_finished_all_groups(self, request: "Request", block_ids: tuple) -> tuple:
        ...


def supports_hma(connector: Any) -> bool:
    if isinstance(connector, type):
        return issubclass(connector, SupportsHMA)
    return isinstance(connector, SupportsHMA)


class KVConnectorBase_V1(ABC):
    """Fake of vLLM's KVConnectorBase_V1 @00f4240e: same constructor, the 7 abstract methods,
    and the defaults of the optional ones."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig):
        self._connector_metadata: Optional[KVConnectorMetadata] = None
        self._vllm_config = vllm_config
        if vllm_config.kv_transfer_config is None:
            raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._kv_cache_config = kv_cache_config
        self._kv_cache_manager = None
        self._role = role

    @property
    def role(self) -> KVConnectorRole:
        return self._role

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        return False

    @property
    def requires_kv_delivery(self) -> bool:
        """Best-effort caches return False, as a dropped save is just a future cache miss."""
        return self._kv_transfer_config.is_kv_producer

    # ---- worker side ----
    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self) -> None:
        self._connector_metadata = None

    def _get_connector_metadata(self) -> KVConnectorMetadata:
        assert self._connector_metadata is not None
        return self._connector_metadata

    def has_connector_metadata(self) -> bool:
        return self._connector_metadata is not None

    def register_kv_caches(self, kv_caches: dict) -> None:
        return

    def set_host_xfer_buffer_ops(self, copy_operation) -> None:
        return

    def get_mem_pool_context(self):
        return None

    def finish_forward(self) -> None:
        return

    def reset_capture_state(self) -> None:
        return

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        return

    @abstractmethod
    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        ...

    @abstractmethod
    def wait_for_layer_load(self, layer_name: str) -> None:
        ...

    @abstractmethod
    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        ...

    @abstractmethod
    def wait_for_save(self) -> None:
        ...

    def get_finished(self, finished_req_ids: set) -> tuple:
        return None, None

    def get_transfer_results(self, finished_req_ids: set) -> KVConnectorTransferResults:
        finished_sending, finished_recving = self.get_finished(finished_req_ids)
        return KVConnectorTransferResults(finished_sending=finished_sending or set(),
                                          finished_recving=finished_recving or set())

    def get_block_ids_with_load_errors(self) -> set:
        return set()

    def shutdown(self) -> None:
        return None

    def get_kv_connector_stats(self):
        return None

    def get_kv_connector_kv_cache_events(self):
        return None

    def get_handshake_metadata(self):
        return None

    def build_connector_worker_meta(self):
        return None

    # ---- scheduler side ----
    def bind_kv_cache_manager(self, kv_cache_manager: "KVCacheManager") -> None:
        self._kv_cache_manager = kv_cache_manager
        self.bind_gpu_block_pool(kv_cache_manager.block_pool)

    def bind_gpu_block_pool(self, gpu_block_pool: "BlockPool") -> None:
        return

    @abstractmethod
    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple:
        ...

    @abstractmethod
    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int):
        ...

    @abstractmethod
    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        ...

    def on_new_request(self, request: "Request") -> None:
        return

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        return

    def can_load_prefix_replay_checkpoint(self, request, num_local_tokens: int, num_external_tokens: int) -> bool:
        return False

    def consume_prefix_replay_checkpoint(self, request, num_hit_tokens: int) -> bool:
        return False

    def request_finished(self, request: "Request", block_ids: list) -> tuple:
        return False, None

    def register_finished_partial_tail(self, request, block_ids, partial_tail_offloads) -> bool:
        return False

    def take_events(self) -> Iterable:
        return ()

    def has_pending_block_frees(self) -> bool:
        return False

    def has_pending_push_work(self) -> bool:
        return False

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> Optional[str]:
        if cls is KVConnectorBase_V1:
            raise TypeError("get_required_kvcache_layout should not be called on the abstract base class")
        return None

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict) -> bool:
        return False

    def get_finished_count(self) -> Optional[int]:
        return None

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return None

    def set_xfer_handshake_metadata(self, metadata) -> None:
        return None

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return None

    def reset_cache(self) -> Optional[bool]:
        return None


def create_connector(factory: Any, config: VllmConfig, role: KVConnectorRole,
                     kv_cache_config: KVCacheConfig) -> Any:
    """vLLM's KVConnectorFactory.create_connector (factory.py @a4cd9d0d): `factory` None resolves
    kv_transfer_config.kv_connector in kv_connector_module_path; a class is checked for SupportsHMA when
    the hybrid KV cache manager is on and called as (config, role, kv_cache_config), or (config, role)
    when its __init__ has no kv_cache_config parameter; any other callable is called as
    (config, role, kv_cache_config)."""
    ktc = config.kv_transfer_config
    if factory is None:
        if ktc is None or not ktc.kv_connector_module_path:
            raise ValueError("no connector factory and no kv_connector_module_path")
        factory = getattr(importlib.import_module(ktc.kv_connector_module_path), ktc.kv_connector)
    if isinstance(factory, type):
        if not config.scheduler_config.disable_hybrid_kv_cache_manager and not supports_hma(factory):
            raise ValueError(f"Connector {factory.__name__} does not support HMA but HMA is enabled. "
                             "Please set `--disable-hybrid-kv-cache-manager`.")
        if "kv_cache_config" not in inspect.signature(factory.__init__).parameters:
            warnings.warn(f"Connector {factory.__name__} uses the deprecated signature (config, role)")
            return factory(config, role)
    return factory(config, role, kv_cache_config)


# --------------------------------------------------------------------------
# Request (vllm/v1/request.py @003df296) and block hashing
# (vllm/v1/core/kv_cache_utils.py @003df296).
# --------------------------------------------------------------------------

class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    # Everything after PREEMPTED is a finished state.
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()

    @staticmethod
    def is_finished(status: "RequestStatus") -> bool:
        return status > RequestStatus.PREEMPTED


_FINISH_REASON = {RequestStatus.FINISHED_STOPPED: "stop", RequestStatus.FINISHED_LENGTH_CAPPED: "length",
                  RequestStatus.FINISHED_ABORTED: "abort", RequestStatus.FINISHED_IGNORED: "length",
                  RequestStatus.FINISHED_ERROR: "error"}


class ConstantList(Sequence):
    """Read-only view of a list (vllm.utils.ConstantList)."""

    def __init__(self, x: list):
        self._x = x

    def __getitem__(self, item):
        return self._x[item]

    def __len__(self):
        return len(self._x)

    def __iter__(self):
        return iter(self._x)

    def __contains__(self, item):
        return item in self._x

    def index(self, item, *args):
        return self._x.index(item, *args)

    def copy(self) -> list:
        return list(self._x)

    def __eq__(self, other):
        return list(self._x) == list(other)

    def __repr__(self):
        return f"ConstantList({self._x!r})"

    def _refuse(self, *args, **kwargs):
        raise TypeError("Cannot modify a ConstantList")

    append = extend = insert = pop = remove = clear = sort = reverse = __setitem__ = __delitem__ = _refuse


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0
    stop_token_ids: list = field(default_factory=list)
    prompt_logprobs: Optional[int] = None
    skip_reading_prefix_cache: Optional[bool] = None
    extra_args: Optional[dict] = None


@dataclass
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""


@dataclass
class PlaceholderRange:
    offset: int
    length: int


@dataclass
class MultiModalFeatureSpec:
    identifier: str
    mm_position: PlaceholderRange
    modality: str = "image"
    data: Any = None


BlockHash = bytes  # vLLM: NewType("BlockHash", bytes)


def sha256_hash(obj: Any) -> bytes:
    """vLLM's "sha256" prefix-caching hash: sha256 over a pickle of the object."""
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def init_none_hash(hash_fn: Callable = sha256_hash) -> bytes:
    """NONE_HASH (the parent of a request's first block): os.urandom(32) unless PYTHONHASHSEED is set.
    In vLLM it is one per process, so `request.block_hashes` differ between engine instances unless
    PYTHONHASHSEED is fixed; here each MiniEngine draws its own (or takes `none_hash=`)."""
    seed = os.environ.get("PYTHONHASHSEED")
    return os.urandom(32) if seed is None else hash_fn(seed)


def hash_block_tokens(hash_fn: Callable, parent_block_hash: Optional[bytes], curr_block_token_ids: Sequence[int],
                      extra_keys: Optional[tuple] = None, none_hash: bytes = b"") -> BlockHash:
    if not parent_block_hash:
        parent_block_hash = none_hash
    return hash_fn((parent_block_hash, tuple(curr_block_token_ids), extra_keys))


def generate_block_hash_extra_keys(request: "Request", start_token_idx: int, end_token_idx: int) -> Optional[tuple]:
    """LoRA name, (mm identifier, offset - block start) of overlapping mm items, cache_salt on block 0."""
    keys: list = []
    if request.lora_request is not None:
        keys.append(request.lora_request.lora_name)
    for f in request.mm_features:
        off, n = f.mm_position.offset, f.mm_position.length
        if off < end_token_idx and off + n > start_token_idx:
            keys.append((f.identifier, off - start_token_idx))
    if start_token_idx == 0 and request.cache_salt:
        keys.append(request.cache_salt)
    return tuple(keys) if keys else None


def get_request_block_hasher(block_size: int, hash_fn: Callable, none_hash: bytes) -> Callable:
    """Returns f(request) -> the hashes of the request's full blocks not hashed yet."""
    def request_block_hasher(request: "Request") -> list:
        start = len(request.block_hashes) * block_size
        parent = request.block_hashes[-1] if request.block_hashes else None
        new = []
        while start + block_size <= request.num_tokens:
            end = start + block_size
            extra = generate_block_hash_extra_keys(request, start, end)
            parent = hash_block_tokens(hash_fn, parent, request.all_token_ids[start:end], extra, none_hash)
            new.append(parent)
            start = end
        return new
    return request_block_hasher


class Request:
    """vllm/v1/request.py @003df296: the attributes a connector reads."""

    def __init__(self, request_id: str, prompt_token_ids: Sequence[int],
                 sampling_params: Optional[SamplingParams] = None, *, cache_salt: Optional[str] = None,
                 lora_request: Optional[LoRARequest] = None, mm_features: Optional[list] = None,
                 block_hasher: Optional[Callable] = None, priority: int = 0, arrival_time: float = 0.0,
                 eos_token_id: Optional[int] = None, client_index: int = 0):
        self.request_id = request_id
        self.client_index = client_index
        self.priority = priority
        self.arrival_time = arrival_time
        self.sampling_params = sampling_params or SamplingParams()
        self.pooling_params = None
        self.eos_token_id = eos_token_id
        self.lora_request = lora_request
        self.structured_output_request = None
        self.use_structured_output = False
        self.status = RequestStatus.WAITING
        self.stop_reason = None
        self.max_tokens = self.sampling_params.max_tokens
        extra = self.sampling_params.extra_args or {}
        self.kv_transfer_params: Optional[dict] = extra.get("kv_transfer_params")
        self.prompt_token_ids: list = list(prompt_token_ids)
        self.prompt_embeds = None
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self._output_token_ids: list = []
        self._all_token_ids: list = list(self.prompt_token_ids)
        self.num_output_placeholders = 0
        self.spec_token_ids: list = []
        self.num_computed_tokens = 0
        self.cache_salt = cache_salt
        self.mm_features: list = list(mm_features or [])
        self.has_encoder_inputs = False
        self.num_preemptions = 0
        self.block_hashes: list = []
        self._block_hasher = block_hasher
        self.skip_reading_prefix_cache = bool(self.sampling_params.skip_reading_prefix_cache) or (
            self.sampling_params.prompt_logprobs is not None)
        self.update_block_hashes()

    @property
    def output_token_ids(self) -> ConstantList:
        return ConstantList(self._output_token_ids)

    @property
    def all_token_ids(self) -> ConstantList:
        return ConstantList(self._all_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self._all_token_ids) + len(self.spec_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_token_ids)

    def update_block_hashes(self) -> None:
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))

    def append_output_token_ids(self, token_ids) -> None:
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        self._output_token_ids.extend(token_ids)
        self._all_token_ids.extend(token_ids)
        self.update_block_hashes()

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finished_reason(self) -> Optional[str]:
        return _FINISH_REASON.get(self.status)

    def __repr__(self):
        return f"Request({self.request_id!r}, status={self.status.name}, computed={self.num_computed_tokens})"


# --------------------------------------------------------------------------
# Block pool and KV cache manager (vllm/v1/core/block_pool.py,
# kv_cache_manager.py, one group). Block 0 is the null block, never handed out.
# Freed blocks keep their hash ("retained") until evicted by a new allocation,
# LRU first; a request's blocks are freed tail first so they evict first.
# --------------------------------------------------------------------------

class KVCacheBlock:
    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self._block_hash: Optional[bytes] = None
        self.is_null = False

    @property
    def block_hash(self) -> Optional[bytes]:
        return self._block_hash

    @block_hash.setter
    def block_hash(self, value: bytes) -> None:
        assert self._block_hash is None, "the block already has a hash"
        self._block_hash = value

    def reset_hash(self) -> None:
        self._block_hash = None

    def __repr__(self):
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, hashed={self._block_hash is not None})"


class BlockPool:
    def __init__(self, num_gpu_blocks: int, enable_caching: bool):
        assert num_gpu_blocks >= 2
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue: "OrderedDict[int, KVCacheBlock]" = OrderedDict((b.block_id, b) for b in self.blocks)
        self.cached_block_hash_to_block: dict = {}  # hash -> {block_id: block}
        _, self.null_block = self.free_block_queue.popitem(last=False)
        self.null_block.is_null = True
        self.num_evictions = 0

    def get_num_free_blocks(self) -> int:
        return len(self.free_block_queue)

    def get_cached_block(self, block_hash: bytes) -> Optional[KVCacheBlock]:
        blocks = self.cached_block_hash_to_block.get(block_hash)
        return next(iter(blocks.values())) if blocks else None

    def cache_full_blocks(self, request: Request, blocks: list, num_cached_blocks: int, num_full_blocks: int) -> None:
        for i in range(num_cached_blocks, num_full_blocks):
            blk = blocks[i]
            if blk.block_hash is None:
                blk.block_hash = request.block_hashes[i]
            self.cached_block_hash_to_block.setdefault(blk.block_hash, {})[blk.block_id] = blk

    def _maybe_evict_cached_block(self, blk: KVCacheBlock) -> None:
        h = blk.block_hash
        if h is None:
            return
        group = self.cached_block_hash_to_block.get(h)
        if group is not None:
            group.pop(blk.block_id, None)
            if not group:
                del self.cached_block_hash_to_block[h]
        blk.reset_hash()
        self.num_evictions += 1

    def get_new_blocks(self, num_blocks: int) -> list:
        assert num_blocks <= self.get_num_free_blocks(), "not enough free blocks"
        out = []
        for _ in range(num_blocks):
            _, blk = self.free_block_queue.popitem(last=False)
            self._maybe_evict_cached_block(blk)
            assert blk.ref_cnt == 0
            blk.ref_cnt = 1
            out.append(blk)
        return out

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        for blk in blocks:
            if blk.ref_cnt == 0 and not blk.is_null:
                del self.free_block_queue[blk.block_id]
            blk.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        for blk in ordered_blocks:
            blk.ref_cnt -= 1
            assert blk.ref_cnt >= 0
            if blk.ref_cnt == 0 and not blk.is_null:
                self.free_block_queue[blk.block_id] = blk

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        for bid in block_ids:
            self._maybe_evict_cached_block(self.blocks[bid])

    def reset_prefix_cache(self) -> bool:
        if self.get_num_free_blocks() != self.num_gpu_blocks - 1:
            return False
        for blk in self.blocks:
            blk.reset_hash()
        self.cached_block_hash_to_block.clear()
        return True

    @property
    def usage(self) -> float:
        return 1.0 - self.get_num_free_blocks() / (self.num_gpu_blocks - 1)


@dataclass
class KVCacheBlocks:
    """vllm/v1/core/kv_cache_manager.py: blocks[group] is a list of KVCacheBlock."""
    blocks: tuple

    def get_block_ids(self, allow_none: bool = False) -> Optional[tuple]:
        if allow_none and all(len(g) == 0 for g in self.blocks):
            return None
        return tuple([b.block_id for b in g] for g in self.blocks)

    def get_unhashed_block_ids(self) -> list:
        assert len(self.blocks) == 1
        return [b.block_id for b in self.blocks[0] if b.block_hash is None]

    def __add__(self, other: "KVCacheBlocks") -> "KVCacheBlocks":
        return KVCacheBlocks(tuple(list(a) + list(b) for a, b in zip(self.blocks, other.blocks)))

    def new_empty(self) -> "KVCacheBlocks":
        return KVCacheBlocks(tuple([] for _ in self.blocks))


class KVCacheManager:
    def __init__(self, kv_cache_config: KVCacheConfig, max_model_len: int, enable_caching: bool):
        assert len(kv_cache_config.kv_cache_groups) == 1, "the mini engine has one KV-cache group"
        self.kv_cache_config = kv_cache_config
        self.block_size = kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(kv_cache_config.num_blocks, enable_caching)
        self.req_to_blocks: dict = defaultdict(list)
        self.num_cached_block: dict = {}
        self.empty_kv_cache_blocks = KVCacheBlocks(([],))

    def get_computed_blocks(self, request: Request) -> tuple:
        """Longest locally cached prefix of full blocks, at most num_tokens - 1 tokens."""
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return self.empty_kv_cache_blocks, 0
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hits = []
        for h in request.block_hashes[:max_hit_blocks]:
            blk = self.block_pool.get_cached_block(h)
            if blk is None:
                break
            hits.append(blk)
        return KVCacheBlocks((hits,)), len(hits) * self.block_size

    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: Optional[KVCacheBlocks] = None, num_lookahead_tokens: int = 0,
                       num_external_computed_tokens: int = 0, delay_cache_blocks: bool = False
                       ) -> Optional[KVCacheBlocks]:
        computed = list(new_computed_blocks.blocks[0]) if new_computed_blocks is not None else []
        num_local_computed = request.num_computed_tokens + num_new_computed_tokens
        total_computed = min(num_local_computed + num_external_computed_tokens, self.max_model_len)
        need_slots = min(total_computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        req_blocks = self.req_to_blocks[request.request_id]
        to_allocate = max(0, cdiv(need_slots, self.block_size) - len(req_blocks) - len(computed))
        evictable_computed = sum(1 for b in computed if b.ref_cnt == 0 and not b.is_null)
        if to_allocate > self.block_pool.get_num_free_blocks() - evictable_computed:
            return None
        if computed:
            assert not req_blocks, "computed blocks are only added to a request without blocks"
            self.block_pool.touch(computed)
            req_blocks.extend(computed)
            self.num_cached_block[request.request_id] = len(computed)
        new_blocks = self.block_pool.get_new_blocks(to_allocate)
        req_blocks.extend(new_blocks)
        if self.enable_caching and not delay_cache_blocks:
            self.cache_blocks(request, min(total_computed + num_new_tokens, request.num_tokens))
        return KVCacheBlocks((new_blocks,))

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        if not self.enable_caching:
            return
        num_full = num_computed_tokens // self.block_size
        num_cached = self.num_cached_block.get(request.request_id, 0)
        if num_cached >= num_full:
            return
        self.block_pool.cache_full_blocks(request, self.req_to_blocks[request.request_id], num_cached, num_full)
        self.num_cached_block[request.request_id] = num_full

    def free(self, request: Request) -> None:
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.block_pool.free_blocks(reversed(blocks))
        self.num_cached_block.pop(request.request_id, None)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks((list(self.req_to_blocks.get(request_id, [])),))

    def get_block_ids(self, request_id: str) -> tuple:
        return self.get_blocks(request_id).get_block_ids()

    def get_block_ids_for_computed_tokens(self, request_id: str, num_computed_tokens: int) -> tuple:
        (ids,) = self.get_block_ids(request_id)
        return (ids[:cdiv(num_computed_tokens, self.block_size)],)

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int) -> None:
        return  # full attention skips nothing

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    @property
    def usage(self) -> float:
        return self.block_pool.usage


# --------------------------------------------------------------------------
# Scheduler output (vllm/v1/core/sched/output.py @00e8f1fd).
# --------------------------------------------------------------------------

@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: Optional[list]
    mm_features: list
    sampling_params: Optional[SamplingParams]
    pooling_params: Any
    block_ids: tuple  # one list per KV-cache group; ALL blocks of the request (local hit + new)
    num_computed_tokens: int  # before this step (local + external hit)
    lora_request: Optional[LoRARequest]
    prompt_embeds: Any = None
    prefill_token_ids: Optional[list] = None

    @classmethod
    def from_request(cls, request: Request, block_ids: tuple) -> "NewRequestData":
        return cls(req_id=request.request_id, prompt_token_ids=list(request.prompt_token_ids),
                   mm_features=list(request.mm_features), sampling_params=request.sampling_params,
                   pooling_params=request.pooling_params, block_ids=block_ids,
                   num_computed_tokens=request.num_computed_tokens, lora_request=request.lora_request)


@dataclass
class CachedRequestData:
    req_ids: list
    resumed_req_ids: set  # for these, new_block_ids is the full block list (replace, not append)
    new_token_ids: list  # pipeline parallel only: empty here
    all_token_ids: dict  # req_id -> all tokens, only for requests not scheduled in the prior step
    new_block_ids: list  # per req: tuple of lists, or None when no new blocks
    num_computed_tokens: list  # before this step
    num_output_tokens: list

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    @classmethod
    def make_empty(cls) -> "CachedRequestData":
        return cls([], set(), [], {}, [], [], [])


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict
    scheduled_encoder_inputs: dict
    num_common_prefix_blocks: list
    finished_req_ids: set  # finished since the previous step (abort, stop, length)
    free_encoder_mm_hashes: list
    preempted_req_ids: Optional[set] = None
    has_sync_kv_loads: bool = False
    has_structured_output_requests: bool = False
    new_block_ids_to_zero: Optional[list] = None
    kv_connector_metadata: Optional[KVConnectorMetadata] = None


def yield_req_data(scheduler_output: SchedulerOutput) -> Iterator[tuple]:
    """kv_connector/utils.py @00f4240e: (req_id, new_block_id_groups, preempted) for every scheduled request."""
    for req_data in scheduler_output.scheduled_new_reqs:
        yield req_data.req_id, req_data.block_ids, False
    cached = scheduler_output.scheduled_cached_reqs
    yield from zip(cached.req_ids, cached.new_block_ids, (r in cached.resumed_req_ids for r in cached.req_ids))


# --------------------------------------------------------------------------
# Forward context (vllm/forward_context.py @01fb6e2f) and attention stand-ins.
# --------------------------------------------------------------------------

class Attention(torch.nn.Module):
    """Stand-in for a vLLM attention layer in static_forward_context: `.kv_cache` is the layer's
    paged tensor [2, num_blocks, block_size, num_kv_heads(rank), head_size]."""

    def __init__(self, layer_name: str, kv_cache: torch.Tensor, num_kv_heads: int, head_size: int):
        super().__init__()
        self.layer_name = layer_name
        self.kv_cache = kv_cache
        self.num_kv_heads = num_kv_heads
        self.head_size = head_size
        self.kv_cache_dtype = "auto"


@dataclass
class FlashAttentionMetadata:
    """The fields of vLLM's FlashAttentionMetadata a connector may read; one object per step and
    KV-cache group, shared by the group's layers (forward_context.attn_metadata[layer_name])."""
    num_actual_tokens: int
    max_query_len: int
    query_start_loc: torch.Tensor  # int32 [num_reqs + 1]
    max_seq_len: int
    seq_lens: torch.Tensor  # int32 [num_reqs]
    block_table: torch.Tensor  # int32 [num_reqs, max_blocks], padded with 0 (the null block)
    slot_mapping: torch.Tensor  # int64 [num_actual_tokens]
    causal: bool = True


@dataclass
class ForwardContext:
    no_compile_layers: dict
    attn_metadata: Any  # dict layer_name -> metadata, or None in a step without forward
    virtual_engine: int = 0
    slot_mapping: Any = None
    dp_metadata: Any = None
    additional_kwargs: dict = field(default_factory=dict)


_forward_context: Optional[ForwardContext] = None


def get_forward_context() -> ForwardContext:
    assert _forward_context is not None, "Forward context is not set. Please use `set_forward_context`."
    return _forward_context


def is_forward_context_available() -> bool:
    return _forward_context is not None


@contextlib.contextmanager
def set_forward_context(attn_metadata: Any, vllm_config: VllmConfig, virtual_engine: int = 0,
                        slot_mapping: Any = None):
    global _forward_context
    prev = _forward_context
    _forward_context = ForwardContext(no_compile_layers=vllm_config.compilation_config.static_forward_context,
                                      attn_metadata=attn_metadata, virtual_engine=virtual_engine,
                                      slot_mapping=slot_mapping)
    try:
        yield
    finally:
        _forward_context = prev


# --------------------------------------------------------------------------
# Scheduler (scheduler.py @00f4240e, reduced to one group, FCFS).
# --------------------------------------------------------------------------

@dataclass
class ModelRunnerOutput:
    req_ids: list
    req_id_to_index: dict
    sampled_token_ids: list  # per request: [token] or [] (partial prefill)
    kv_connector_output: Optional[KVConnectorOutput] = None
    # Mini-engine extensions (not in vLLM): logits [n_new, vocab] and positions of each request.
    logits: dict = field(default_factory=dict)
    positions: dict = field(default_factory=dict)


@dataclass
class EngineCoreOutput:
    request_id: str
    new_token_ids: list
    finish_reason: Optional[str] = None
    kv_transfer_params: Optional[dict] = None


def check_stop(request: Request, max_model_len: int) -> bool:
    if request.num_tokens >= max_model_len or request.num_output_tokens >= request.max_tokens:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    last = request.output_token_ids[-1]
    if request.eos_token_id is not None and last == request.eos_token_id:
        request.status = RequestStatus.FINISHED_STOPPED
        return True
    if last in (request.sampling_params.stop_token_ids or ()):
        request.status = RequestStatus.FINISHED_STOPPED
        request.stop_reason = last
        return True
    return False


class Scheduler:
    def __init__(self, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig, connector: Any = None):
        self.vllm_config = vllm_config
        self.scheduler_config = vllm_config.scheduler_config
        self.kv_cache_config = kv_cache_config
        self.block_size = vllm_config.cache_config.block_size
        self.max_model_len = vllm_config.model_config.max_model_len
        self.max_num_running_reqs = self.scheduler_config.max_num_seqs
        self.max_num_scheduled_tokens = self.scheduler_config.max_num_batched_tokens
        self.connector = connector
        self.recompute_kv_load_failures = True
        self.requires_kv_delivery = False
        if connector is not None:
            ktc = vllm_config.kv_transfer_config
            self.recompute_kv_load_failures = ktc.kv_load_failure_policy == "recompute"
            self.requires_kv_delivery = bool(getattr(connector, "requires_kv_delivery", False))
        self.requests: dict = {}
        self.waiting: deque = deque()
        self.running: list = []
        self.finished_req_ids: set = set()
        self.reset_preempted_req_ids: set = set()
        self.prev_step_scheduled_req_ids: set = set()
        self.finished_recving_kv_req_ids: set = set()
        self.failed_recving_kv_req_ids: set = set()
        self.kv_cache_manager = KVCacheManager(kv_cache_config, self.max_model_len,
                                               vllm_config.cache_config.enable_prefix_caching)
        if connector is not None:
            if hasattr(connector, "bind_kv_cache_manager"):
                connector.bind_kv_cache_manager(self.kv_cache_manager)
            elif hasattr(connector, "bind_gpu_block_pool"):
                connector.bind_gpu_block_pool(self.kv_cache_manager.block_pool)

    # ---- requests in and out ----
    def add_request(self, request: Request) -> None:
        assert request.request_id not in self.requests, "duplicate request id"
        self.waiting.append(request)
        self.requests[request.request_id] = request
        if self.connector is not None and hasattr(self.connector, "on_new_request"):
            self.connector.on_new_request(request)

    def finish_requests(self, request_ids, finished_status: RequestStatus) -> list:
        """Abort path (EngineCore.abort_requests -> finish_requests), callable at any time."""
        assert RequestStatus.is_finished(finished_status)
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        valid = []
        for req_id in request_ids:
            request = self.requests.get(req_id)
            if request is None or request.is_finished():
                continue
            valid.append(request)
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
        for request in valid:
            delay_free_blocks = False
            if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                delay_free_blocks = request.request_id not in self.finished_recving_kv_req_ids
                self.finished_recving_kv_req_ids.discard(request.request_id)
                self.failed_recving_kv_req_ids.discard(request.request_id)
            request.status = finished_status
            self._free_request(request, delay_free_blocks=delay_free_blocks)
        return valid

    def preempt_request(self, req_id: str) -> None:
        """Forces the preemption the scheduler does when allocation fails (test hook, between steps)."""
        request = self.requests[req_id]
        assert request.status == RequestStatus.RUNNING, "Only running requests can be preempted"
        self.running.remove(request)
        self._preempt_request(request)
        # Resumed requests must then be sent with all_token_ids (as after reset_prefix_cache).
        self.prev_step_scheduled_req_ids.discard(req_id)

    def _preempt_request(self, request: Request) -> None:
        assert request.status == RequestStatus.RUNNING, "Only running requests can be preempted"
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        request.num_preemptions += 1
        self.waiting.appendleft(request)
        self.reset_preempted_req_ids.add(request.request_id)

    def _free_request(self, request: Request, delay_free_blocks: bool = False) -> Optional[dict]:
        assert request.is_finished()
        connector_delay_free, kv_xfer_params = self._connector_finished(request)
        self.finished_req_ids.add(request.request_id)
        if not (delay_free_blocks or connector_delay_free):
            self._free_blocks(request)
        return kv_xfer_params

    def _free_blocks(self, request: Request) -> None:
        assert request.is_finished()
        self.kv_cache_manager.free(request)
        del self.requests[request.request_id]

    def _connector_finished(self, request: Request) -> tuple:
        if self.connector is None:
            return False, None
        self.kv_cache_manager.remove_skipped_blocks(request.request_id, request.num_computed_tokens,
                                                    request.num_prompt_tokens)
        block_ids = self.kv_cache_manager.get_block_ids_for_computed_tokens(request.request_id,
                                                                            request.num_computed_tokens)
        if not supports_hma(self.connector):
            assert len(self.kv_cache_config.kv_cache_groups) == 1
            return self.connector.request_finished(request, block_ids[0])
        return self.connector.request_finished_all_groups(request, block_ids)

    # ---- schedule ----
    def schedule(self) -> SchedulerOutput:
        kvm = self.kv_cache_manager
        scheduled_new, scheduled_resumed, scheduled_running, preempted = [], [], [], []
        req_to_new_blocks: dict = {}
        num_scheduled: dict = {}
        token_budget = self.max_num_scheduled_tokens
        has_sync_kv_loads = False
        threshold = self.scheduler_config.long_prefill_token_threshold

        # First, the RUNNING requests.
        req_index = 0
        while req_index < len(self.running) and token_budget > 0:
            request = self.running[req_index]
            num_new = request.num_tokens_with_spec - request.num_computed_tokens
            if 0 < threshold < num_new:
                num_new = threshold
            num_new = min(num_new, token_budget, self.max_model_len - request.num_computed_tokens - 1)
            if num_new <= 0:
                req_index += 1
                continue
            while True:
                new_blocks = kvm.allocate_slots(request, num_new)
                if new_blocks is not None:
                    break
                if self.connector is not None and getattr(self.connector, "has_pending_block_frees", lambda: False)():
                    break
                preempted_req = self.running.pop()
                self._preempt_request(preempted_req)
                preempted.append(preempted_req)
                if preempted_req is request:
                    break
            if new_blocks is None:
                break
            scheduled_running.append(request)
            req_to_new_blocks[request.request_id] = new_blocks
            num_scheduled[request.request_id] = num_new
            token_budget -= num_new
            req_index += 1

        # Next, the WAITING requests (not in a step that preempted).
        if not preempted:
            skipped: deque = deque()
            while self.waiting and token_budget > 0:
                if len(self.running) >= self.max_num_running_reqs:
                    break
                request = self.waiting[0]
                if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                    if request.request_id not in self.finished_recving_kv_req_ids:
                        skipped.append(self.waiting.popleft())
                        continue
                    self._update_waiting_for_remote_kv(request)
                    request.status = RequestStatus.PREEMPTED if request.num_preemptions else RequestStatus.WAITING

                num_external = 0
                load_kv_async = False
                if request.num_computed_tokens == 0:
                    new_computed_blocks, num_local = kvm.get_computed_blocks(request)
                    if self.connector is not None:
                        block_aligned_local = num_local - num_local % self.block_size
                        ext_tokens, load_kv_async = self.connector.get_num_new_matched_tokens(
                            request, block_aligned_local)
                        if request.skip_reading_prefix_cache:
                            ext_tokens, load_kv_async = 0, False
                        if ext_tokens is None:
                            # The connector could not tell yet: ask again in a later step.
                            skipped.append(self.waiting.popleft())
                            continue
                        num_external = ext_tokens
                    num_computed = num_local + num_external
                    assert num_computed <= request.num_tokens
                else:
                    new_computed_blocks, num_local = kvm.empty_kv_cache_blocks, 0
                    num_computed = request.num_computed_tokens

                if load_kv_async:
                    assert num_external > 0
                    num_new = 0
                else:
                    num_new = request.num_tokens - num_computed
                    if 0 < threshold < num_new:
                        num_new = threshold
                    if not self.scheduler_config.enable_chunked_prefill and num_new > token_budget:
                        break
                    num_new = min(num_new, token_budget)
                    # A sync hit must leave at least one token to compute (vLLM asserts the same).
                    assert num_new > 0

                new_blocks = kvm.allocate_slots(request, num_new, num_new_computed_tokens=num_local,
                                                new_computed_blocks=new_computed_blocks,
                                                num_external_computed_tokens=num_external,
                                                delay_cache_blocks=load_kv_async)
                if new_blocks is None:
                    break
                if self.connector is not None:
                    self.connector.update_state_after_alloc(request, kvm.get_blocks(request.request_id), num_external)
                if load_kv_async:
                    request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                    request.num_computed_tokens = num_computed
                    skipped.append(self.waiting.popleft())
                    continue

                self.waiting.popleft()
                self.running.append(request)
                if num_external > 0:
                    has_sync_kv_loads = True
                if request.status == RequestStatus.WAITING:
                    scheduled_new.append(request)
                elif request.status == RequestStatus.PREEMPTED:
                    scheduled_resumed.append(request)
                else:
                    raise RuntimeError(f"Invalid request status: {request.status}")
                req_to_new_blocks[request.request_id] = kvm.get_blocks(request.request_id)
                num_scheduled[request.request_id] = num_new
                token_budget -= num_new
                request.status = RequestStatus.RUNNING
                request.num_computed_tokens = num_computed
            self.waiting.extendleft(reversed(skipped))

        total = sum(num_scheduled.values())
        assert total <= self.max_num_scheduled_tokens and token_budget >= 0
        so = SchedulerOutput(
            scheduled_new_reqs=[NewRequestData.from_request(r, req_to_new_blocks[r.request_id].get_block_ids())
                                for r in scheduled_new],
            scheduled_cached_reqs=self._make_cached_request_data(scheduled_running, scheduled_resumed,
                                                                 req_to_new_blocks),
            num_scheduled_tokens=num_scheduled, total_num_scheduled_tokens=total, scheduled_spec_decode_tokens={},
            scheduled_encoder_inputs={}, num_common_prefix_blocks=[0], preempted_req_ids=self.reset_preempted_req_ids,
            finished_req_ids=self.finished_req_ids, free_encoder_mm_hashes=[], has_sync_kv_loads=has_sync_kv_loads)
        self.prev_step_scheduled_req_ids = set(num_scheduled)
        if self.connector is not None:
            so.kv_connector_metadata = self.connector.build_connector_meta(so)
        self._update_after_schedule(so)
        return so

    def _make_cached_request_data(self, running_reqs: list, resumed_reqs: list, req_to_new_blocks: dict):
        data = CachedRequestData.make_empty()
        for idx, req in enumerate(list(running_reqs) + list(resumed_reqs)):
            req_id = req.request_id
            data.req_ids.append(req_id)
            if idx >= len(running_reqs):
                data.resumed_req_ids.add(req_id)
            if req_id not in self.prev_step_scheduled_req_ids:
                data.all_token_ids[req_id] = req.all_token_ids.copy()
            data.new_block_ids.append(req_to_new_blocks[req_id].get_block_ids(allow_none=True))
            data.num_computed_tokens.append(req.num_computed_tokens)
            data.num_output_tokens.append(req.num_output_tokens + req.num_output_placeholders)
        return data

    def _update_after_schedule(self, so: SchedulerOutput) -> None:
        for req_id, n in so.num_scheduled_tokens.items():
            self.requests[req_id].num_computed_tokens += n
        # New sets, not clear(): the scheduler output keeps the old ones.
        self.finished_req_ids = set()
        self.reset_preempted_req_ids = set()

    def _update_waiting_for_remote_kv(self, request: Request) -> None:
        if request.request_id in self.failed_recving_kv_req_ids:
            if request.num_computed_tokens:
                self.kv_cache_manager.cache_blocks(request, request.num_computed_tokens)
            else:
                self.kv_cache_manager.free(request)
            self.failed_recving_kv_req_ids.remove(request.request_id)
        else:
            self.kv_cache_manager.cache_blocks(request, request.num_computed_tokens)
        if request.num_computed_tokens == request.num_tokens:
            request.num_computed_tokens = request.num_tokens - 1
        self.finished_recving_kv_req_ids.remove(request.request_id)

    # ---- outputs ----
    def update_from_output(self, so: SchedulerOutput, out: ModelRunnerOutput) -> tuple:
        """Returns (list of EngineCoreOutput, set of req ids whose step output was discarded)."""
        kv_out = out.kv_connector_output
        failed: set = set()
        if kv_out and kv_out.failed_recving:
            failed |= self._handle_failed_recving(kv_out.failed_recving)
        if kv_out and kv_out.invalid_block_ids:
            failed |= self._handle_invalid_blocks(kv_out.invalid_block_ids, so.num_scheduled_tokens)
        outputs = []
        stopped = set()
        for req_id, n in so.num_scheduled_tokens.items():
            assert n > 0
            request = self.requests.get(req_id)
            if req_id in failed:
                continue
            if request is None or request.is_finished():
                continue  # e.g. aborted between schedule() and the worker pass
            new_token_ids = list(out.sampled_token_ids[out.req_id_to_index[req_id]])
            kv_transfer_params, is_stopped = None, False
            if new_token_ids:
                for i, tok in enumerate(new_token_ids, 1):
                    request.append_output_token_ids(tok)
                    if check_stop(request, self.max_model_len):
                        del new_token_ids[i:]
                        is_stopped = True
                        break
            if is_stopped:
                kv_transfer_params = self._free_request(request)
                stopped.add(request)
            if new_token_ids or is_stopped:
                outputs.append(EngineCoreOutput(req_id, new_token_ids, request.get_finished_reason(),
                                                kv_transfer_params))
        if stopped:
            self.running = [r for r in self.running if r not in stopped]
        if failed and not self.recompute_kv_load_failures:
            for request in self.finish_requests(failed, RequestStatus.FINISHED_ERROR):
                outputs.append(EngineCoreOutput(request.request_id, [], request.get_finished_reason()))
        if kv_out:
            self._update_from_kv_xfer_finished(kv_out)
        if self.connector is not None:
            if hasattr(self.connector, "get_kv_connector_stats"):
                self.connector.get_kv_connector_stats()
            if hasattr(self.connector, "take_events"):
                list(self.connector.take_events() or ())
        return outputs, failed

    def _update_from_kv_xfer_finished(self, kv_out: KVConnectorOutput) -> None:
        if self.connector is not None and hasattr(self.connector, "update_connector_output"):
            self.connector.update_connector_output(kv_out)
        for req_id in kv_out.finished_recving or ():
            assert req_id in self.requests, f"finished_recving for unknown request {req_id}"
            req = self.requests[req_id]
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                self.finished_recving_kv_req_ids.add(req_id)
            else:
                assert RequestStatus.is_finished(req.status)
                self._free_blocks(req)
        for req_id in kv_out.finished_sending or ():
            assert req_id in self.requests, f"finished_sending for unknown request {req_id}"
            self._free_blocks(self.requests[req_id])

    def _handle_failed_recving(self, failed_req_ids: set) -> set:
        affected = set()
        for req_id in failed_req_ids:
            request = self.requests.get(req_id)
            if request is not None and request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                affected.add(req_id)
                if self.recompute_kv_load_failures:
                    request.num_computed_tokens = 0
                    self.failed_recving_kv_req_ids.add(req_id)
        return set() if self.recompute_kv_load_failures else affected

    def _update_requests_with_invalid_blocks(self, requests: Iterable[Request], invalid_block_ids: set,
                                             num_scheduled_tokens: dict, evict_blocks: bool) -> tuple:
        affected, marked, to_evict = set(), set(), set()
        for request in requests:
            is_affected = marked_here = False
            (req_block_ids,) = self.kv_cache_manager.get_block_ids(request.request_id)
            req_num_computed = request.num_computed_tokens - num_scheduled_tokens.get(request.request_id, 0)
            for idx, block_id in zip(range(cdiv(req_num_computed, self.block_size)), req_block_ids):
                if block_id not in invalid_block_ids:
                    continue
                is_affected = True
                if block_id in marked:
                    continue
                marked.add(block_id)
                if marked_here:
                    continue
                marked_here = True
                request.num_computed_tokens = idx * self.block_size  # truncate at the first failed block
                if evict_blocks:
                    to_evict.update(req_block_ids[idx:])
            if is_affected:
                if not marked_here:
                    request.num_computed_tokens = req_num_computed
                affected.add(request.request_id)
        return affected, to_evict

    def _handle_invalid_blocks(self, invalid_block_ids: set, num_scheduled_tokens: dict) -> set:
        async_reqs = [r for r in self.waiting if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS]
        async_failed, _ = self._update_requests_with_invalid_blocks(async_reqs, invalid_block_ids,
                                                                    num_scheduled_tokens, evict_blocks=False)
        sync_failed, to_evict = self._update_requests_with_invalid_blocks(list(self.running), invalid_block_ids,
                                                                          num_scheduled_tokens, evict_blocks=True)
        if not (async_failed or sync_failed):
            return set()
        if to_evict and not self.recompute_kv_load_failures:
            self.kv_cache_manager.evict_blocks(to_evict)
        if not self.recompute_kv_load_failures:
            return async_failed | sync_failed
        self.failed_recving_kv_req_ids |= async_failed
        return sync_failed

    # ---- liveness ----
    def get_num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running)

    def has_finished_requests(self) -> bool:
        if self.finished_req_ids:
            return True
        return self.connector is not None and len(self.requests) > len(self.waiting) + len(self.running)

    def has_requests(self) -> bool:
        return bool(self.get_num_unfinished_requests() or self.has_finished_requests() or (
            self.connector is not None and getattr(self.connector, "has_pending_push_work", lambda: False)()))


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
    """One tensor-parallel worker: its VllmConfig copy (parallel_config.rank), KV caches holding KV heads
    [kv_head_start, kv_head_end), attention layers and worker-side connector."""

    def __init__(self, rank: int, world_size: int, model, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig):
        self.rank, self.world_size = rank, world_size
        self.vllm_config = copy.deepcopy(vllm_config)
        self.vllm_config.parallel_config.rank = rank
        self.kv_cache_config = kv_cache_config
        per = model.n_kv_heads // world_size
        self.kv_head_start, self.kv_head_end = rank * per, (rank + 1) * per
        self.kv_caches = KVCache.allocate(model, kv_cache_config.num_blocks, (self.kv_head_start, self.kv_head_end))
        layers = self.vllm_config.compilation_config.static_forward_context
        for name, t in self.kv_caches.items():
            layers[name] = Attention(name, t, per, model.head_size)
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
        world = len(kv_cache_configs)
        self.ranks = [_WorkerRank(r, world, model, vllm_config, kv_cache_configs[r]) for r in range(world)]
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

    def _attn_metadata(self, batch: list) -> FlashAttentionMetadata:
        qsl, seq_lens, slots, tables = [0], [], [], []
        for req_id, n in batch:
            st = self.requests[req_id]
            start = st.num_computed_tokens
            qsl.append(qsl[-1] + n)
            seq_lens.append(start + n)
            table = st.block_ids[0]
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

        seqs = []
        for req_id, n in batch:
            st = self.requests[req_id]
            positions = list(range(st.num_computed_tokens, st.num_computed_tokens + n))
            seqs.append(SeqInput([st.token(p) for p in positions], positions, st.block_ids[0]))
            out.positions[req_id] = positions
        layer_names = list(self.ranks[0].kv_caches)
        attn = [{name: meta for name in layer_names} for meta in (self._attn_metadata(batch) for _ in self.ranks)]
        shards = [KVShard(rank.kv_caches, rank.kv_head_start, rank.kv_head_end,
                          _LayerHooks(rank, attn[i]) if rank.connector is not None else None, attn[i])
                  for i, rank in enumerate(self.ranks)]
        kv_outputs = None
        if self.has_connector:
            for rank, rso, a in zip(self.ranks, per_rank_so, attn):
                self._begin(rank, rso, a)
        try:
            logits = self.model.forward_batch(seqs, shards)
        finally:
            if self.has_connector:
                kv_outputs = [self._end(rank, rso, a) for rank, rso, a in zip(self.ranks, per_rank_so, attn)]
        for i, (req_id, n) in enumerate(batch):
            st = self.requests[req_id]
            out.logits[req_id] = logits[i]
            if st.num_computed_tokens + n >= st.num_tokens:  # not a partial prefill: sample
                token = int(torch.argmax(logits[i][-1]))
                st.output_token_ids.append(token)
                out.sampled_token_ids[i] = [token]
        return out, kv_outputs


# --------------------------------------------------------------------------
# The engine.
# --------------------------------------------------------------------------

@dataclass
class StepRecord:
    scheduler_output: SchedulerOutput
    model_runner_output: ModelRunnerOutput
    outputs: list
    discarded_req_ids: set


class MiniEngine:
    """EngineCore in one process: Scheduler + `num_workers` tensor-parallel workers.

    connector_factory: None (no connector when vllm_config.kv_transfer_config is None, otherwise
    the class named by kv_connector in kv_connector_module_path), a connector class, or a callable
    (vllm_config, role, kv_cache_config) -> connector. One scheduler-side instance and one
    worker-side instance per rank are created, as vLLM does.
    kv_cache_config: the per-worker config (see make_kv_cache_config(model, n, num_workers)); default
    64 blocks. start_load_kv_before_forward: None = vLLM @00f4240e (before the forward only when the
    step has sync loads, else after it), True = older vLLM (always before).
    """

    def __init__(self, model, vllm_config: Optional[VllmConfig] = None, kv_cache_config: Optional[KVCacheConfig] = None,
                 connector_factory: Any = None, num_workers: int = 1, *, none_hash: Optional[bytes] = None,
                 serialize_scheduler_output: bool = True, start_load_kv_before_forward: Optional[bool] = None):
        if vllm_config is None:
            vllm_config = make_vllm_config(model, kv_connector=None, tensor_parallel_size=num_workers)
        vllm_config.parallel_config.tensor_parallel_size = num_workers
        if kv_cache_config is None:
            kv_cache_config = make_kv_cache_config(model, 64, num_workers)
        spec = kv_cache_config.kv_cache_groups[0].kv_cache_spec
        assert spec.num_kv_heads * num_workers == model.n_kv_heads, "kv_cache_config must be per worker"
        assert spec.block_size == model.block_size == vllm_config.cache_config.block_size
        vllm_config.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
        self.model = model
        self.vllm_config = vllm_config
        self.kv_cache_config = kv_cache_config
        self.num_workers = num_workers
        self.block_size = model.block_size
        self.none_hash = none_hash if none_hash is not None else init_none_hash()
        self._block_hasher = get_request_block_hasher(self.block_size, sha256_hash, self.none_hash)
        scheduler_connector = None
        if vllm_config.kv_transfer_config is not None:
            scheduler_connector = create_connector(connector_factory, vllm_config, KVConnectorRole.SCHEDULER,
                                                   kv_cache_config)
        self.runner = MiniModelRunner(model, vllm_config, [kv_cache_config] * num_workers, connector_factory,
                                      serialize_scheduler_output, start_load_kv_before_forward)
        self.scheduler = Scheduler(vllm_config, kv_cache_config, scheduler_connector)
        self.aggregator = (KVOutputAggregator.from_connector(scheduler_connector, num_workers)
                           if scheduler_connector is not None else None)
        self.history: list = []
        self.outputs: dict = defaultdict(list)  # req_id -> generated tokens
        self.logits: dict = defaultdict(list)  # req_id -> [logits [n_new, vocab]] of accepted steps
        self.finish_reasons: dict = {}
        self.kv_transfer_params: dict = {}
        self.finished_block_ids: dict = {}  # req_id -> block ids when it finished (blocks may be retained)
        self._next_id = 0

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
        if req_id in self.scheduler.kv_cache_manager.req_to_blocks:
            return list(self.scheduler.kv_cache_manager.get_block_ids(req_id)[0])
        return list(self.finished_block_ids.get(req_id, []))

    def token_kv(self, block_table: Sequence[int], num_tokens: int) -> torch.Tensor:
        """K/V of positions [0, num_tokens) through `block_table`, all ranks' heads concatenated:
        [num_layers, 2, num_tokens, num_kv_heads, head_size]."""
        parts = [KVCache.gather_tokens(r.kv_caches, block_table, num_tokens, self.block_size)
                 for r in self.runner.ranks]
        return torch.cat(parts, dim=3)

    def request_kv(self, req_id: str, num_tokens: Optional[int] = None) -> torch.Tensor:
        ids = self.block_ids(req_id)
        return self.token_kv(ids, num_tokens if num_tokens is not None else len(ids) * self.block_size)

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
        blocks = self.block_ids(req_id)
        for request in self.scheduler.finish_requests(req_id, RequestStatus.FINISHED_ABORTED):
            self.finish_reasons[request.request_id] = request.get_finished_reason()
            self.finished_block_ids[request.request_id] = blocks

    def preempt(self, req_id: str) -> None:
        """Preempts a RUNNING request between steps: its blocks are freed and it restarts from 0
        (a later schedule resumes it through resumed_req_ids with its full block list)."""
        self.scheduler.preempt_request(req_id)

    # ---- one step = schedule, execute_model, update_from_output ----
    def has_requests(self) -> bool:
        return self.scheduler.has_requests()

    def schedule(self) -> SchedulerOutput:
        return self.scheduler.schedule()

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        out, kv_outputs = self.runner.execute_model(so)
        if kv_outputs is not None:
            # One worker: its output passes through (UniProcExecutor); several: KVOutputAggregator,
            # which always returns a KVConnectorOutput (MultiprocExecutor).
            out.kv_connector_output = kv_outputs[0] if self.num_workers == 1 else self.aggregator.aggregate(kv_outputs)
        return out

    def update_from_output(self, so: SchedulerOutput, out: ModelRunnerOutput) -> StepRecord:
        # Capture block ids of requests that may finish in this update.
        live_blocks = {r: list(self.scheduler.kv_cache_manager.get_block_ids(r)[0]) for r in self.scheduler.requests}
        outputs, discarded = self.scheduler.update_from_output(so, out)
        for req_id, logits in out.logits.items():
            if req_id not in discarded:
                self.logits[req_id].append(logits)
        for o in outputs:
            self.outputs[o.request_id].extend(o.new_token_ids)
            if o.finish_reason is not None:
                self.finish_reasons[o.request_id] = o.finish_reason
                self.kv_transfer_params[o.request_id] = o.kv_transfer_params
                self.finished_block_ids[o.request_id] = live_blocks.get(o.request_id, [])
        record = StepRecord(so, out, outputs, discarded)
        self.history.append(record)
        return record

    def step(self) -> Optional[StepRecord]:
        if not self.has_requests():
            return None
        so = self.schedule()
        return self.update_from_output(so, self.execute_model(so))

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
    "vllm.v1.core.sched.output": ["SchedulerOutput", "NewRequestData", "CachedRequestData"],
    "vllm.v1.core.kv_cache_manager": ["KVCacheBlocks", "KVCacheManager"],
    "vllm.v1.core.kv_cache_utils": ["KVCacheBlock", "BlockHash", "hash_block_tokens", "init_none_hash"],
    "vllm.v1.core.block_pool": ["BlockPool"],
    "vllm.v1.kv_cache_interface": ["KVCacheConfig", "KVCacheGroupSpec", "KVCacheTensor", "KVCacheSpec",
                                   "AttentionSpec", "FullAttentionSpec", "SlidingWindowSpec", "MambaSpec"],
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
    me = sys.modules[__name__]
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
