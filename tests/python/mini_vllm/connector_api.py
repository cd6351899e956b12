"""Fakes of vLLM's KV connector v1 API (base.py @00f4240e) and KVConnectorFactory.create_connector."""

from __future__ import annotations

import enum
import importlib
import inspect
import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Optional

import torch

from .config import VllmConfig
from .kv_cache_interface import KVCacheConfig

if TYPE_CHECKING:
    from .forward_context import ForwardContext
    from .kv_cache import BlockPool, KVCacheBlocks, KVCacheManager
    from .request import Request
    from .scheduler_output import SchedulerOutput


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


def connector_class_of(factory: Any, config: VllmConfig) -> Optional[type]:
    """The connector class a factory stands for: the class itself, the class named by
    kv_transfer_config (kv_connector in kv_connector_module_path) when factory is None, else None
    (a callable: its class is known only once it is called)."""
    if isinstance(factory, type):
        return factory
    ktc = config.kv_transfer_config
    if factory is None and ktc is not None and ktc.kv_connector_module_path:
        return getattr(importlib.import_module(ktc.kv_connector_module_path), ktc.kv_connector)
    return None


def resolve_hybrid_kv_cache_manager(config: VllmConfig, factory: Any = None) -> bool:
    """Settles scheduler_config.disable_hybrid_kv_cache_manager when it is None, as current vLLM's
    VllmConfig.__post_init__ does (vllm/config/vllm.py, the version that asks
    KVConnectorFactory.supports_hma_config): the hybrid KV cache manager stays on unless a connector
    is configured whose class is not SupportsHMA. A callable factory (no class to ask) counts as not
    SupportsHMA: pass disable_hybrid_kv_cache_manager=False to run its connector under HMA (the
    factory then checks the connector it made). Returns the settled value."""
    sched = config.scheduler_config
    if sched.disable_hybrid_kv_cache_manager is None:
        disable = False
        if config.kv_transfer_config is not None:
            cls = connector_class_of(factory, config)
            disable = cls is None or not supports_hma(cls)
        sched.disable_hybrid_kv_cache_manager = disable
    return sched.disable_hybrid_kv_cache_manager


def _refuse_without_hma(config: VllmConfig, connector: Any, name: str) -> None:
    # None: not settled yet, so HMA would be turned off for a connector without SupportsHMA.
    if config.scheduler_config.disable_hybrid_kv_cache_manager is False and not supports_hma(connector):
        raise ValueError(f"Connector {name} does not support HMA but HMA is enabled. "
                         "Please set `--disable-hybrid-kv-cache-manager`.")


def create_connector(factory: Any, config: VllmConfig, role: KVConnectorRole,
                     kv_cache_config: KVCacheConfig) -> Any:
    """vLLM's KVConnectorFactory.create_connector (factory.py @a4cd9d0d): `factory` None resolves
    kv_transfer_config.kv_connector in kv_connector_module_path; a class is checked for SupportsHMA when
    the hybrid KV cache manager is on and called as (config, role, kv_cache_config), or (config, role)
    when its __init__ has no kv_cache_config parameter; any other callable is called as
    (config, role, kv_cache_config) and the connector it returns is checked for SupportsHMA."""
    if factory is None:
        factory = connector_class_of(None, config)
        if factory is None:
            raise ValueError("no connector factory and no kv_connector_module_path")
    if isinstance(factory, type):
        _refuse_without_hma(config, factory, factory.__name__)
        if "kv_cache_config" not in inspect.signature(factory.__init__).parameters:
            warnings.warn(f"Connector {factory.__name__} uses the deprecated signature (config, role)")
            return factory(config, role)
    connector = factory(config, role, kv_cache_config)
    _refuse_without_hma(config, connector, type(connector).__name__)
    return connector
