"""Stand-ins for the parts of SGLang a HiCache storage backend touches,
mirroring the shapes in SGLang's sources (hicache_storage.py @00fe477f,
storage/backend_factory.py @001067ff, pool_host/mha.py @0047d999,
pool_host/mla.py @01c0ede3, pool_host/mamba.py @02f0c2a0,
hybrid_cache/hybrid_cache_controller.py @00343773,
hi_mamba_radix_cache.py @00df707e): the config, the HiCacheStorage ABC
with its v2 types, the dynamic factory path, MHA/MLA/Mamba host pools
(named as SGLang names them: the backend checks the class), the hybrid
controller's call order and the page-key chain."""

import abc
import ctypes
import hashlib
import importlib
import random
import sys
import types
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, List, Optional

import torch


@dataclass
class HiCacheStorageConfig:
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    attn_cp_rank: int
    attn_cp_size: int
    is_mla_model: bool
    enable_storage_metrics: bool
    is_page_first_layout: bool
    model_name: Optional[str]
    tp_lcm_size: Optional[int] = None
    should_split_heads: bool = False
    extra_config: Optional[dict] = None
    dp_rank: Optional[int] = None


@dataclass
class HiCacheStorageExtraInfo:
    prefix_keys: Optional[List[str]] = None
    extra_info: Optional[dict] = None


@dataclass
class StorageMetrics:  # sglang.srt.metrics.collector
    prefetch_pgs: List[int] = field(default_factory=list)
    backup_pgs: List[int] = field(default_factory=list)
    prefetch_bandwidth: List[float] = field(default_factory=list)
    backup_bandwidth: List[float] = field(default_factory=list)


class PoolName(str, Enum):
    KV = "kv"
    MAMBA = "mamba"
    SWA = "swa"
    INDEXER = "indexer"
    DEEPSEEK_V4_C4 = "deepseek_v4_c4"
    DEEPSEEK_V4_C4_INDEXER = "deepseek_v4_c4_indexer"
    DEEPSEEK_V4_C4_INDEXER_SCALE = "deepseek_v4_c4_indexer_scale"
    DEEPSEEK_V4_C128 = "deepseek_v4_c128"
    DEEPSEEK_V4_C4_STATE = "deepseek_v4_c4_state"
    DEEPSEEK_V4_C4_INDEXER_STATE = "deepseek_v4_c4_indexer_state"
    DEEPSEEK_V4_C128_STATE = "deepseek_v4_c128_state"
    DRAFT = "draft"
    DRAFT_INDEXER = "draft_indexer"
    DRAFT_SWA = "draft_swa"

    def __str__(self) -> str:
        return self.value


class PoolHitPolicy(str, Enum):
    ALL_PAGES = "all_pages"
    TRAILING_PAGES = "trailing_pages"


@dataclass
class PoolTransfer:
    name: PoolName
    host_indices: Optional[torch.Tensor] = None
    device_indices: Optional[torch.Tensor] = None
    keys: Optional[List[str]] = None
    hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES
    nodes_to_load: Optional[List[Any]] = None
    indices_from_pool: Optional[PoolName] = None


@dataclass
class PoolTransferResult:
    kv_hit_pages: int
    extra_pool_hit_pages: dict
    restorable_prefix_pages: Optional[List[int]] = None


def count_pool_hits(results):
    return {name: (rs.index(False) if False in rs else len(rs)) for name, rs in results.items()}


class HiCacheStorage(abc.ABC):
    """The ABC: five abstract methods, the rest with SGLang's defaults (the
    v2 methods raise NotImplementedError, as SGLang's do)."""

    def register_mem_pool_host(self, mem_pool_host):
        self.mem_pool_host = mem_pool_host

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        if not hasattr(self, "registered_pools"):
            self.registered_pools = {}
        self.registered_pools[host_pool_name] = host_pool

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        raise NotImplementedError()

    def batch_get_v2(self, transfers, extra_info=None):
        raise NotImplementedError()

    def batch_set_v2(self, transfers, extra_info=None):
        raise NotImplementedError()

    @abc.abstractmethod
    def get(self, key, target_location=None, target_sizes=None): ...

    @abc.abstractmethod
    def batch_get(self, keys, target_locations=None, target_sizes=None): ...

    @abc.abstractmethod
    def set(self, key, value=None, target_location=None, target_sizes=None): ...

    @abc.abstractmethod
    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None): ...

    @abc.abstractmethod
    def exists(self, key): ...

    def batch_exists(self, keys, extra_info=None):
        for i, k in enumerate(keys):
            if not self.exists(k):
                return i
        return len(keys)

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        pass

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        pass

    def clear(self):
        pass

    def get_stats(self):
        return None


def fresh_adapter(monkeypatch, module="kvtier.integrations.sglang"):
    """A generator for a pytest fixture: fake SGLang modules installed and
    the adapter imported afresh, so it subclasses the fake HiCacheStorage
    ABC; sys.modules is restored afterwards."""
    install_fake_sglang(monkeypatch)
    package = importlib.import_module("kvtier.integrations")
    saved = sys.modules.pop(module, None)
    monkeypatch.setattr(package, "sglang", saved, raising=False)
    yield
    sys.modules.pop(module, None)
    if saved is not None:
        sys.modules[module] = saved


def install_fake_sglang(monkeypatch):
    """Puts sglang.srt.mem_cache.hicache_storage and sglang.srt.metrics.collector
    (these classes) into sys.modules for the test's duration."""
    modules = {
        "sglang": {}, "sglang.srt": {}, "sglang.srt.mem_cache": {}, "sglang.srt.metrics": {},
        "sglang.srt.mem_cache.hicache_storage": dict(
            HiCacheStorage=HiCacheStorage, HiCacheStorageConfig=HiCacheStorageConfig,
            HiCacheStorageExtraInfo=HiCacheStorageExtraInfo, PoolName=PoolName, PoolHitPolicy=PoolHitPolicy,
            PoolTransfer=PoolTransfer, PoolTransferResult=PoolTransferResult, count_pool_hits=count_pool_hits),
        "sglang.srt.metrics.collector": dict(StorageMetrics=StorageMetrics),
    }
    for name, attrs in modules.items():
        module = types.ModuleType(name)
        module.__path__ = []  # a package, so submodules resolve
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)


def storage_config(extra_config, tp_rank=0, tp_size=1, is_mla=False, layout="page_first", model="org/model"):
    """What HiCacheController._generate_storage_config builds."""
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=is_mla, enable_storage_metrics=False, is_page_first_layout=layout == "page_first",
        model_name=model, extra_config=dict(extra_config))


def load_dynamic_backend(extra_config, storage_config, mem_pool_host):
    """StorageBackendFactory._create_dynamic_backend, then attach_storage_backend's
    register_mem_pool_host."""
    for name in ("backend_name", "module_path", "class_name"):
        if name not in extra_config:
            raise ValueError(f"Missing required key '{name}' in extra_config for dynamic backend")
    module = importlib.import_module(extra_config["module_path"])
    backend_class = getattr(module, extra_config["class_name"])
    base = getattr(sys.modules.get("sglang.srt.mem_cache.hicache_storage"), "HiCacheStorage", None)
    if base is not None and not issubclass(backend_class, base):
        raise TypeError(f"{backend_class} is not a subclass of HiCacheStorage")
    backend = backend_class(storage_config, {})
    backend.register_mem_pool_host(mem_pool_host)
    return backend


def page_keys(tokens, page_size):
    """SGLang's page hash chain: sha256(prior digest bytes + each token as u32 LE)."""
    keys, prior = [], None
    for start in range(0, len(tokens) - page_size + 1, page_size):
        h = hashlib.sha256(bytes.fromhex(prior) if prior else b"")
        for t in tokens[start:start + page_size]:
            h.update(int(t).to_bytes(4, "little", signed=False))
        prior = h.hexdigest()
        keys.append(prior)
    return keys


def host_indices(slots, page_size):
    """The token slots of pool pages `slots`, as SGLang passes them."""
    return torch.tensor([s * page_size + t for s in slots for t in range(page_size)], dtype=torch.int64)


class _HostPool:
    """What both pools share: buffer bytes and page access for the tests."""

    def fill_random(self, seed):
        rng = random.Random(seed)
        n = self.kv_buffer.numel() * self.kv_buffer.element_size()
        ctypes.memmove(self.kv_buffer.data_ptr(), rng.randbytes(n), n)

    def page_bytes(self, slot) -> bytes:
        page = self.get_data_page(slot * self.page_size).contiguous()
        return ctypes.string_at(page.data_ptr(), page.numel() * page.element_size())

    def component_bytes(self, slot, component) -> bytes:
        """MHA: the K (0) or V (1) half of a page, its layer_first pieces in order."""
        part = self.get_data_page(slot * self.page_size, flat=False)[component].contiguous()
        return ctypes.string_at(part.data_ptr(), part.numel() * part.element_size())

    def get_dummy_flat_data_page(self):
        return torch.zeros(self.page_shape, dtype=self.dtype).flatten()

    def get_data_page(self, index, flat=True):
        page = self.kv_buffer[self._page_slice(index)]
        return page.flatten() if flat else page

    def set_from_flat_data_page(self, index, data_page):
        target = self.kv_buffer[self._page_slice(index)]
        target.copy_(data_page.reshape(target.shape))


class MHATokenToKVPoolHost(_HostPool):
    """MHATokenToKVPoolHost: kv_buffer dims by layout, V half after the K half."""

    def __init__(self, layout="page_first", page_num=8, page_size=4, layer_num=3, head_num=2, head_dim=8,
                 dtype=torch.bfloat16):
        self.layout, self.page_size, self.layer_num = layout, page_size, layer_num
        self.head_num, self.head_dim, self.dtype = head_num, head_dim, dtype
        self.size = page_num * page_size
        dims = {"layer_first": (2, layer_num, self.size, head_num, head_dim),
                "page_first": (2, self.size, layer_num, head_num, head_dim),
                "page_first_direct": (2, page_num, layer_num, page_size, head_num, head_dim)}[layout]
        self.kv_buffer = torch.zeros(dims, dtype=dtype)
        self.page_shape = (2, layer_num, page_size, head_num, head_dim)

    def _item(self):
        return torch.empty((), dtype=self.dtype).element_size()

    def get_size_per_token(self):
        return self.head_dim * self.head_num * self.layer_num * self._item() * 2

    def _page_slice(self, index):
        if self.layout == "layer_first":
            return (slice(None), slice(None), slice(index, index + self.page_size))
        if self.layout == "page_first":
            return (slice(None), slice(index, index + self.page_size))
        return (slice(None), slice(index // self.page_size, index // self.page_size + 1))

    def get_page_buffer_meta(self, indices):
        ptr_list = []
        base = self.kv_buffer.data_ptr()
        row = self.head_num * self.head_dim * self._item()  # one token of one layer
        v_offset = self.layer_num * self.size * row
        indices = indices.tolist()
        if self.layout == "layer_first":
            for index in range(0, len(indices), self.page_size):
                for layer_id in range(self.layer_num):
                    k_ptr = base + indices[index] * row + layer_id * self.size * row
                    ptr_list += [k_ptr, k_ptr + v_offset]
            element_size = self.page_size * row
        else:
            for index in range(0, len(indices), self.page_size):
                k_ptr = base + indices[index] * self.layer_num * row
                ptr_list += [k_ptr, k_ptr + v_offset]
            element_size = self.layer_num * self.page_size * row
        return ptr_list, [element_size] * len(ptr_list)


class MLATokenToKVPoolHost(_HostPool):
    """MLATokenToKVPoolHost in page_first: one latent buffer per page."""

    def __init__(self, page_num=8, page_size=4, layer_num=3, kv_lora_rank=12, qk_rope_head_dim=4,
                 dtype=torch.bfloat16):
        self.layout, self.page_size, self.layer_num, self.dtype = "page_first", page_size, layer_num, dtype
        self.kv_lora_rank, self.qk_rope_head_dim = kv_lora_rank, qk_rope_head_dim
        self.kv_cache_dim = kv_lora_rank + qk_rope_head_dim
        self.size = page_num * page_size
        self.kv_buffer = torch.zeros((self.size, layer_num, 1, self.kv_cache_dim), dtype=dtype)
        self.page_shape = (page_size, layer_num, 1, self.kv_cache_dim)

    def get_size_per_token(self):
        return self.kv_cache_dim * 1 * torch.empty((), dtype=self.dtype).element_size() * self.layer_num

    def _page_slice(self, index):
        return (slice(index, index + self.page_size),)

    def get_page_buffer_meta(self, indices):
        item = torch.empty((), dtype=self.dtype).element_size()
        indices = indices.tolist()
        ptrs = [self.kv_buffer.data_ptr() + indices[i] * self.layer_num * self.kv_cache_dim * item
                for i in range(0, len(indices), self.page_size)]
        return ptrs, [self.layer_num * self.page_size * self.kv_cache_dim * item] * len(ptrs)


MHAHostPool, MLAHostPool = MHATokenToKVPoolHost, MLATokenToKVPoolHost  # the names the older tests use


def _itemsize(dtype):
    return torch.empty((), dtype=dtype).element_size()  # dtype.itemsize is newer than this torch


class MambaPoolHost:
    """MambaPoolHost (pool_host/mamba.py @02f0c2a0) in page_first: page_size
    1 (a slot is one state), temporal_buffer [size, layers, 1, *temporal]
    and conv_buffer[i] [size, layers, 1, *conv_i]; get_page_buffer_meta
    gives per slot the temporal pointer (dropped when the temporal state is
    empty: conv-only models), then conv_0..conv_n."""

    def __init__(self, size=6, layers=2, temporal_shape=(2, 3), conv_shapes=((4, 2), (3,)),
                 temporal_dtype=torch.float32, conv_dtype=torch.bfloat16, layout="page_first"):
        assert layout in ("page_first", "page_first_direct")
        self.layout, self.page_size, self.size, self.num_mamba_layers = layout, 1, size, layers
        self.temporal_state_shape, self.conv_state_shapes = tuple(temporal_shape), [tuple(c) for c in conv_shapes]
        self.temporal_state_elem_size = int(torch.Size(self.temporal_state_shape).numel())
        self.conv_state_elem_sizes = [int(torch.Size(c).numel()) for c in self.conv_state_shapes]
        self.temporal_dtype, self.conv_dtype = temporal_dtype, conv_dtype
        self.dtype = conv_dtype
        self.temporal_buffer = torch.zeros((size, layers, 1) + self.temporal_state_shape, dtype=temporal_dtype)
        self.conv_buffer = [torch.zeros((size, layers, 1) + c, dtype=conv_dtype) for c in self.conv_state_shapes]

    def get_size_per_token(self):
        conv = sum(n * _itemsize(self.conv_dtype) for n in self.conv_state_elem_sizes)
        return (conv + self.temporal_state_elem_size * _itemsize(self.temporal_dtype)) * self.num_mamba_layers

    def _tensors(self):
        return [self.temporal_buffer, *self.conv_buffer]

    def fill_random(self, seed):
        rng = random.Random(seed)
        for t in self._tensors():
            n = t.numel() * t.element_size()
            ctypes.memmove(t.data_ptr(), rng.randbytes(n), n)

    def state_bytes(self, slot) -> bytes:
        return b"".join(ctypes.string_at(t[slot].data_ptr(), t[slot].numel() * t.element_size())
                        for t in self._tensors())

    def get_page_buffer_meta(self, indices):
        indices = indices.tolist()
        ptr_list, size_list = [], []
        t_item = self.temporal_state_elem_size * _itemsize(self.temporal_dtype) * self.num_mamba_layers
        c_items = [n * _itemsize(self.conv_dtype) * self.num_mamba_layers for n in self.conv_state_elem_sizes]
        for i in range(0, len(indices), self.page_size):
            if self.temporal_state_elem_size > 0:
                ptr_list.append(self.temporal_buffer.data_ptr() + indices[i] * t_item)
                size_list.append(self.page_size * t_item)
            for buf, item in zip(self.conv_buffer, c_items):
                ptr_list.append(buf.data_ptr() + indices[i] * item)
                size_list.append(self.page_size * item)
        return ptr_list, size_list


class MHATokenToKVPoolFP4Host(MHATokenToKVPoolHost):
    """pool_host/mha_fp4.py: packed-FP4 KV with separate block-scale buffers
    (a subclass of the MHA pool whose pages are more than K and V)."""


class _Entry:
    def __init__(self, name, host_pool, is_primary_index_anchor=False):
        self.name, self.host_pool, self.is_primary_index_anchor = name, host_pool, is_primary_index_anchor


class HybridController:
    """The storage calls of HybridCacheController (hybrid_cache_controller.py
    @00343773) and of its base class for the KV pages, in their order, with
    the zero-copy KV path (interface_v1) and one Mamba sidecar whose
    transfers are built as hi_mamba_radix_cache.py @00df707e builds them
    (one state slot, keys = [the node's last page hash], TRAILING_PAGES)."""

    STORAGE_BATCH_SIZE = 128

    def __init__(self, backend, kv_pool, sidecars=(), tp_rank=0, is_mla=False):
        self.backend, self.kv_pool, self.page_size = backend, kv_pool, kv_pool.page_size
        self.entries = [_Entry(PoolName.KV, kv_pool, True)] + [_Entry(n, p) for n, p in sidecars]
        self.entry_map = {e.name: e for e in self.entries}
        self.backup_skip = is_mla and tp_rank != 0

    def attach(self):
        """attach_storage_backend: the base registration, then every entry."""
        self.backend.register_mem_pool_host(self.kv_pool)
        for entry in self.entries:
            self.backend.register_mem_host_pool_v2(entry.host_pool, entry.name)

    def backup(self, hashes, kv_slots, mamba_slot=None):
        """_page_backup: the sidecar transfers (batch_set_v2; on an MLA rank >
        0 only the TP-sharded Mamba pool), then the KV pages in batches
        (skipped on an MLA rank > 0). Returns (pool hits, KV pages stored)."""
        transfers = []
        if mamba_slot is not None:
            transfers.append(PoolTransfer(name=PoolName.MAMBA, host_indices=torch.tensor([mamba_slot]),
                                          keys=[hashes[-1]], hit_policy=PoolHitPolicy.TRAILING_PAGES))
        hits = count_pool_hits(self.backend.batch_set_v2(transfers)) if transfers else {}
        stored = 0
        if not self.backup_skip:
            idx = host_indices(kv_slots, self.page_size)
            for i in range(0, len(hashes), self.STORAGE_BATCH_SIZE):
                batch = hashes[i:i + self.STORAGE_BATCH_SIZE]
                if not all(self.backend.batch_set_v1(
                        batch, idx[i * self.page_size:(i + len(batch)) * self.page_size],
                        HiCacheStorageExtraInfo())):
                    break
                stored += len(batch)
        return hits, stored

    def prefetch(self, hashes, kv_slots, mamba_slot=None):
        """_storage_hit_query (batch_exists_v2 with the placeholder transfer),
        the KV batches (batch_get_v1), _sync_trailing_keys, then
        batch_get_v2 for the sidecar. Returns (exists result, KV pages read,
        sidecar hits)."""
        transfers = []
        if mamba_slot is not None:
            transfers.append(PoolTransfer(name=PoolName.MAMBA, host_indices=torch.tensor([mamba_slot]),
                                          keys=["__placeholder__"], hit_policy=PoolHitPolicy.TRAILING_PAGES))
        extra = HiCacheStorageExtraInfo()
        if transfers:
            result = self.backend.batch_exists_v2(hashes, transfers, extra)
        else:
            result = PoolTransferResult(self.backend.batch_exists(hashes, extra), {})
        hit = hashes[:result.kv_hit_pages]
        idx = host_indices(kv_slots[:len(hit)], self.page_size)
        done = 0
        for i in range(0, len(hit), self.STORAGE_BATCH_SIZE):
            batch = hit[i:i + self.STORAGE_BATCH_SIZE]
            got = self.backend.batch_get_v1(batch, idx[i * self.page_size:(i + len(batch)) * self.page_size], extra)
            n = next((j for j, ok in enumerate(got) if not ok), len(batch))
            done += n
            if n != len(batch):
                break
        pool_hits = {}
        if transfers and hit and done == len(hit):
            for t in transfers:
                t.keys = hit[max(0, done - len(t.keys)):done]
            pool_hits = count_pool_hits(self.backend.batch_get_v2([replace(t) for t in transfers]))
        return result, done, pool_hits
