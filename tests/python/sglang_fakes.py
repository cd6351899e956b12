"""Stand-ins for the parts of SGLang a HiCache storage backend touches,
mirroring the shapes in SGLang's sources (hicache_storage.py @00fe477f,
storage/backend_factory.py @001067ff, pool_host/mha.py @0047d999,
pool_host/mla.py @01c0ede3): the config, the HiCacheStorage ABC, the
dynamic factory path, MHA/MLA host pools and the page-key chain."""

import abc
import ctypes
import hashlib
import importlib
import random
import sys
import types
from dataclasses import dataclass, field
from typing import List, Optional

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


class HiCacheStorage(abc.ABC):
    """The ABC: five abstract methods, the rest with SGLang's defaults."""

    def register_mem_pool_host(self, mem_pool_host):
        self.mem_pool_host = mem_pool_host

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


def install_fake_sglang(monkeypatch):
    """Puts sglang.srt.mem_cache.hicache_storage and sglang.srt.metrics.collector
    (these classes) into sys.modules for the test's duration."""
    modules = {
        "sglang": {}, "sglang.srt": {}, "sglang.srt.mem_cache": {}, "sglang.srt.metrics": {},
        "sglang.srt.mem_cache.hicache_storage": dict(
            HiCacheStorage=HiCacheStorage, HiCacheStorageConfig=HiCacheStorageConfig,
            HiCacheStorageExtraInfo=HiCacheStorageExtraInfo),
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


class MHAHostPool(_HostPool):
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


class MLAHostPool(_HostPool):
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
