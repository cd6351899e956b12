"""KV cache specs and the per-worker KVCacheConfig (vllm/v1/kv_cache_interface.py @001cabc1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


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
