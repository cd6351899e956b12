"""KV cache specs, KVCacheTensor/KVCacheConfig and the per-layer cache views a worker allocates.

Mirrors, rewritten here, vllm/v1/kv_cache_interface.py after vllm#51718 "Standardize KV cache
layout" (vLLM v0.28/v0.29; the stored version holding create_kv_cache_views), with the layout enum
of vllm/v1/kv_cache_layout.py @14f7a27c776bd0c423bbc155b25ce21ee5a839da (kv_cache_layout.py here)
and the KVCacheTensor placement of get_kv_cache_config_from_groups (vllm/v1/core/kv_cache_utils.py,
same vLLM version). What current vLLM hands a connector's register_kv_caches, per layer, is a 4-D
view [B, H, N, C] (C in elements of spec.dtype, K then V packed in C; for MLA the latent) of one
flat int8 allocation shared by all layers (the KV cache groups of a hybrid model overlay each other
in it: layer i of every group on the same bytes), non-contiguous in general.

Older vLLM (before #51718) allocated one 5-D tensor per layer instead: FlashAttention
[2, num_blocks, block_size, heads, head_size] ("legacy_kv_first"), FlashInfer
[num_blocks, 2, block_size, heads, head_size] ("legacy_blocks_first"), MLA
[num_blocks, block_size, head_size]; allocate_kv_caches builds those too.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from math import prod
from typing import Optional, Sequence

import torch

from .kv_cache_layout import DIM_B, DIM_L, KVCacheLayout, resolve_kv_cache_layout

# What a worker may allocate: current vLLM's views, or older vLLM's per-layer tensors.
KV_CACHE_FORMATS = ("views", "legacy_kv_first", "legacy_blocks_first")


def _dtype_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


class KVQuantMode(enum.IntEnum):
    """How the KV cache is quantized (the harness only carries the value; it quantizes nothing)."""
    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4
    NVFP4 = 5

    @property
    def is_per_token_head(self) -> bool:
        return self in (KVQuantMode.INT8_PER_TOKEN_HEAD, KVQuantMode.FP8_PER_TOKEN_HEAD,
                        KVQuantMode.INT4_PER_TOKEN_HEAD)


# --------------------------------------------------------------------------
# Specs. One spec and one KVCacheConfig per worker: num_kv_heads is the rank's share under TP
# (MLA: 1, the latent, replicated on every rank).
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class KVCacheSpec:
    """The KV cache format of one layer; block_size = tokens per (manager) block."""
    block_size: int

    @property
    def page_size_bytes(self) -> int:
        raise NotImplementedError

    def get_num_kernel_states(self, kernel_block_size: int) -> int:
        """Stored states (the N axis) in a block of `kernel_block_size` tokens."""
        per_state = self.tokens_per_state
        return kernel_block_size // per_state if per_state > 0 else 1

    @property
    def num_states(self) -> int:
        return self.get_num_kernel_states(self.block_size)


@dataclass(frozen=True, kw_only=True)
class AttentionSpec(KVCacheSpec):
    """An attention layer's page: H head slots x N states x C content bytes.

    head_size_v None means head_size (set in __post_init__); num_head_slots None means one slot per
    KV head; state_content_bytes None means dense K then V: (head_size + head_size_v) * dtype size;
    tokens_per_state > 1 packs several tokens into one state; page_size_padded pads each page."""
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype
    head_size_v: Optional[int] = None
    kv_quant_mode: KVQuantMode = KVQuantMode.NONE
    page_size_padded: Optional[int] = None
    num_head_slots: Optional[int] = None
    state_content_bytes: Optional[int] = None
    tokens_per_state: int = 1

    def __post_init__(self):
        if self.head_size_v is None:
            object.__setattr__(self, "head_size_v", self.head_size)

    @property
    def num_heads(self) -> int:
        """H of the page."""
        return self.num_head_slots if self.num_head_slots is not None else self.num_kv_heads

    @property
    def state_content_size_bytes(self) -> int:
        """C of the page, in bytes."""
        if self.state_content_bytes is not None:
            return self.state_content_bytes
        return (self.head_size + self.head_size_v) * _dtype_size(self.dtype)

    @property
    def unpadded_page_size_bytes(self) -> int:
        return self.num_heads * self.num_states * self.state_content_size_bytes

    @property
    def page_size_bytes(self) -> int:
        if self.page_size_padded is not None:
            assert self.page_size_padded >= self.unpadded_page_size_bytes
            return self.page_size_padded
        return self.unpadded_page_size_bytes

    @property
    def real_page_size_bytes(self) -> int:
        return self.unpadded_page_size_bytes


@dataclass(frozen=True, kw_only=True)
class FullAttentionSpec(AttentionSpec):
    sliding_window: Optional[int] = None
    attention_chunk_size: Optional[int] = None


@dataclass(frozen=True, kw_only=True)
class MLAAttentionSpec(FullAttentionSpec):
    """Multi-head latent attention: one latent vector of head_size elements per token and no V
    (head_size_v = 0), num_kv_heads = 1. `alignment` rounds the page up (sets page_size_padded)."""
    cache_dtype_str: Optional[str] = None
    alignment: Optional[int] = None
    head_size_v: int = 0

    def __post_init__(self):
        super().__post_init__()
        if self.alignment is not None:
            padded = _round_up(self.unpadded_page_size_bytes, self.alignment)
            if padded != self.unpadded_page_size_bytes:
                object.__setattr__(self, "page_size_padded", padded)


@dataclass(frozen=True, kw_only=True)
class SlidingWindowSpec(AttentionSpec):
    sliding_window: int


@dataclass(frozen=True)
class MambaSpec(KVCacheSpec):
    """A recurrent (Mamba/GDN) layer's page: one state of `shapes`/`dtypes` per block, the page
    padded to page_size_padded (vLLM pads it to the attention page). mamba_cache_mode as
    CacheConfig.mamba_cache_mode: "align" keeps the state after each block boundary a chunk ended
    on (block_size = the attention block size), "none" one running state per request (block_size
    = max_model_len). The view a worker gets is [num_blocks, 1, 1, state bytes] of int8
    (num_heads 1, one state per block, no dtype: the layer splits the bytes into its tensors)."""
    shapes: tuple = ()
    dtypes: tuple = ()
    page_size_padded: Optional[int] = None
    mamba_type: str = "mamba2"
    mamba_cache_mode: str = "none"
    num_speculative_blocks: int = 0
    num_heads: int = 1
    tokens_per_state: int = -1  # one state per block

    @property
    def state_content_size_bytes(self) -> int:
        return sum(int(torch.Size(s).numel()) * _dtype_size(d) for s, d in zip(self.shapes, self.dtypes))

    @property
    def page_size_bytes(self) -> int:
        if self.page_size_padded is not None:
            assert self.page_size_padded >= self.state_content_size_bytes
            return self.page_size_padded
        return self.state_content_size_bytes


MAMBA_CACHE_MODES = ("none", "align")  # vLLM's "all" (a state per block, all kept) is not modelled


def align_hybrid_block_size(attn_page_size_1_token: int, mamba_page_size: int, block_size: int,
                            kernel_block_alignment_size: int) -> tuple:
    """(attention block size, Mamba page_size_padded or None) of a hybrid attention + Mamba model,
    as vLLM sets them (HybridAttentionMambaModelConfig.verify_and_update_config, later
    Platform._align_hybrid_block_size; read through stored copies, no upstream commit named): the
    smallest multiple of the kernel block alignment whose attention page holds a Mamba page,
    unless `block_size` (the configured one) is already larger; the Mamba page is then padded to
    exactly the attention page (None when they are equal)."""
    aligned = kernel_block_alignment_size * -(-mamba_page_size // (kernel_block_alignment_size
                                                                    * attn_page_size_1_token))
    block_size = max(block_size, aligned)
    attn_page_size = block_size * attn_page_size_1_token
    assert attn_page_size >= mamba_page_size
    return block_size, (attn_page_size if attn_page_size != mamba_page_size else None)


# --------------------------------------------------------------------------
# Placement of a group's layers in one allocation, and the config.
# --------------------------------------------------------------------------

@dataclass
class KVCacheTensor:
    """One backing allocation of `size` bytes for same-shaped layers: the page of block b of
    layer layers[l] starts at byte offset + l * layer_stride + b * block_stride.
    Layer-outermost layouts: layer_stride = page * num_blocks, block_stride = page (LBHNC, LBNHC;
    LHBNC puts the heads outside the blocks, so its block stride is one head's share of a page).
    Block-outermost layouts: block_stride = page * num_layers, layer_stride = page (BLHNC,
    BLNHC; BHLNC: one head's share). Older vLLM had (size, shared_by); `shared_by` reads `layers`."""
    size: int
    layers: list
    layer_stride: int
    block_stride: int
    offset: int = 0

    @property
    def shared_by(self) -> list:
        return self.layers


@dataclass
class KVCacheGroupSpec:
    layer_names: list
    kv_cache_spec: KVCacheSpec


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list
    kv_cache_groups: list = field(default_factory=list)

    def spec_of(self, layer_name: str) -> KVCacheSpec:
        return next(g.kv_cache_spec for g in self.kv_cache_groups if layer_name in g.layer_names)


# --------------------------------------------------------------------------
# Shapes, strides and views (create_kv_cache_views and its helpers).
# --------------------------------------------------------------------------

def compute_layer_kv_cache_shape_bytes(spec: KVCacheSpec, num_blocks: int,
                                       kernel_block_size: Optional[int] = None) -> tuple:
    """One layer's logical shape (B, H, N, C_bytes). With a kernel block size kbs dividing the
    block size, B counts kernel blocks (num_blocks * block_size // kbs) and N = kbs // tokens_per_state."""
    kbs = kernel_block_size if kernel_block_size is not None else spec.block_size
    if kbs <= 0 or spec.block_size % kbs:
        raise ValueError(f"kernel block size {kbs} does not divide the KV cache block size {spec.block_size}")
    return (num_blocks * (spec.block_size // kbs), spec.num_heads, spec.get_num_kernel_states(kbs),
            spec.state_content_size_bytes)


def _page_axis(spec: KVCacheSpec, shape: tuple, layout: KVCacheLayout, kernel_block_size: Optional[int]):
    """The physical position where a padded page ends (the inner of L and B), or None if unpadded.
    Padding needs every axis outside it to be L, B or of size 1, and no kernel split."""
    if getattr(spec, "page_size_padded", None) is None:
        return None
    if kernel_block_size not in (None, spec.block_size):
        raise ValueError("padded KV cache pages cannot be split into kernel blocks")
    order = layout.stride_order
    axis = max(order.index(DIM_L), order.index(DIM_B))
    if prod(shape[d] for d in order[:axis + 1]) != shape[DIM_L] * shape[DIM_B]:
        raise ValueError(f"layout {layout.name} cannot pad pages: an axis of size > 1 lies outside the page")
    return axis


def compute_layout_strides(spec: KVCacheSpec, num_blocks: int, num_layers: int, layout: KVCacheLayout,
                           kernel_block_size: Optional[int] = None,
                           fixed_strides: tuple = (None,) * 5) -> tuple:
    """Byte strides of the logical axes [L, B, H, N, C] (returned in that order).

    Walking the physical axes from the innermost (stride 1) outwards, each axis's stride is the
    previous axis's stride times its size; at the page boundary of a padded spec the running stride
    is raised to page_size_padded; a non-None fixed_strides[axis] replaces that axis's stride (and
    the walk continues from it)."""
    assert len(fixed_strides) == 5 and all(s is None or s > 0 for s in fixed_strides)
    layout = resolve_kv_cache_layout(layout)
    shape = (num_layers, *compute_layer_kv_cache_shape_bytes(spec, num_blocks, kernel_block_size))
    page_axis = _page_axis(spec, shape, layout, kernel_block_size)
    strides = [0] * 5
    running = 1
    for position in reversed(range(5)):
        axis = layout.stride_order[position]
        if position == page_axis:
            running = max(running, spec.page_size_padded)
            assert running % spec.page_size_padded == 0
        strides[axis] = fixed_strides[axis] or running
        running = strides[axis] * shape[axis]
    return tuple(strides)


def create_kv_cache_views(raw: torch.Tensor, spec: KVCacheSpec, num_blocks: int, layout: KVCacheLayout,
                          kv_cache_tensor: KVCacheTensor, kernel_block_size: Optional[int] = None) -> list:
    """One 4-D [B', H, N', C] view of the flat int8 buffer `raw` per layer of kv_cache_tensor, in
    its `layers` order (C in elements of spec.dtype). With a kernel block size, B' = num_blocks *
    ratio and manager block b is kernel blocks b*ratio .. b*ratio+ratio-1: that needs each block to
    be one dense unpadded page (block_stride == the page), else ValueError."""
    layout = resolve_kv_cache_layout(layout)
    num_layers = len(kv_cache_tensor.layers)
    shape = compute_layer_kv_cache_shape_bytes(spec, num_blocks, kernel_block_size)
    ratio = shape[0] // num_blocks
    block_stride = kv_cache_tensor.block_stride
    if ratio > 1:
        dense_page = prod(compute_layer_kv_cache_shape_bytes(spec, 1)[1:])
        if block_stride != dense_page:
            raise ValueError(
                f"KV cache layout {layout.name} does not keep a block as one dense page (block stride "
                f"{block_stride}, page {dense_page} bytes): a block of {spec.block_size} tokens cannot be "
                f"split into {ratio} kernel blocks of {kernel_block_size}. Use a block size of "
                f"{kernel_block_size}, or a layer-compact layout such as LBNHC.")
        assert block_stride % ratio == 0
        block_stride //= ratio
    strides = compute_layout_strides(spec, num_blocks, num_layers, layout, kernel_block_size,
                                     (kv_cache_tensor.layer_stride, block_stride, None, None, None))
    all_layers = torch.as_strided(raw, (num_layers, *shape), strides,
                                  raw.storage_offset() + kv_cache_tensor.offset)
    dtype = getattr(spec, "dtype", None)
    return [all_layers[i].view(dtype) if dtype is not None else all_layers[i] for i in range(num_layers)]


def group_kernel_blocks(cache: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """A layer's view with manager blocks as dim 0: [num_blocks, ratio, H, N', C] when dim 0 counts
    kernel blocks, the view itself when it already counts manager blocks."""
    if cache.shape[0] == num_blocks:
        return cache
    assert cache.shape[0] % num_blocks == 0, "dim 0 is not a multiple of the number of blocks"
    return cache.unflatten(0, (num_blocks, cache.shape[0] // num_blocks))


# --------------------------------------------------------------------------
# The harness's configs and allocation.
# --------------------------------------------------------------------------

def kv_cache_spec_for(model, tensor_parallel_size: int = 1, *, num_kv_heads: Optional[int] = None,
                      page_size_padded: Optional[int] = None) -> AttentionSpec:
    """One worker's spec of `model`'s attention layers: MLAAttentionSpec (one latent of
    model.head_size, replicated on every rank) when model.use_mla, else FullAttentionSpec with the
    rank's share of the KV heads (or `num_kv_heads`) and head_size_v = model.head_size_v if any."""
    dtype = getattr(model, "kv_dtype", torch.float32)
    if getattr(model, "use_mla", False):
        return MLAAttentionSpec(block_size=model.block_size, num_kv_heads=1, head_size=model.head_size,
                                dtype=dtype, page_size_padded=page_size_padded)
    if num_kv_heads is None:
        assert model.n_kv_heads % tensor_parallel_size == 0, "KV heads must divide evenly over ranks"
        num_kv_heads = model.n_kv_heads // tensor_parallel_size
    return FullAttentionSpec(block_size=model.block_size, num_kv_heads=num_kv_heads, head_size=model.head_size,
                             head_size_v=getattr(model, "head_size_v", model.head_size), dtype=dtype,
                             page_size_padded=page_size_padded)


def kv_cache_tensor_for(spec: KVCacheSpec, layer_names: list, num_blocks: int, layout,
                        num_slots: Optional[int] = None) -> KVCacheTensor:
    """The KVCacheTensor of one group of same-shaped layers under `layout`, as vLLM's
    get_kv_cache_config_from_groups places a single group: strides from compute_layout_strides, the
    block stride of block-outermost layouts fixed to all layers' pages, offset 0.
    num_slots (default len(layer_names)): the layer slots the backing allocation has. A hybrid
    config gives every group the same slots (the largest group's size), so layer i of every group
    lands on the same bytes (see make_kv_cache_config)."""
    layout = resolve_kv_cache_layout(layout)
    num_slots = len(layer_names) if num_slots is None else num_slots
    assert num_slots >= len(layer_names)
    per_block = num_slots * spec.page_size_bytes
    fixed_block = per_block if layout.is_block_outermost else None
    layer_stride, block_stride = compute_layout_strides(spec, num_blocks, num_slots, layout,
                                                        fixed_strides=(None, fixed_block, None, None, None))[:2]
    return KVCacheTensor(size=per_block * num_blocks, layers=list(layer_names), layer_stride=layer_stride,
                         block_stride=block_stride)


def sliding_window_layers_of(model) -> dict:
    """model.sliding_window_layers ({layer index: window in tokens}), {} for a model without any."""
    return dict(getattr(model, "sliding_window_layers", None) or {})


def mamba_layers_of(model) -> tuple:
    """model.mamba_layer_indices (the layers whose KV cache entry is a recurrent state), () for a
    model without any."""
    return tuple(getattr(model, "mamba_layer_indices", None) or ())


def mamba_spec_for(model, attention_spec: AttentionSpec, tensor_parallel_size: int = 1, *,
                   mamba_cache_mode: str = "align", max_model_len: Optional[int] = None) -> MambaSpec:
    """One worker's MambaSpec of `model`'s recurrent layers: its state tensors
    (model.mamba_state_shapes(tp), model.mamba_state_dtypes), the page padded to the attention
    page as vLLM pads it (the model's block size must already be raised so that the attention page
    holds a state: align_hybrid_block_size); block_size the attention block size in "align" mode,
    max_model_len (default model.max_positions) in "none" mode, as vLLM sets mamba_block_size."""
    if mamba_cache_mode not in MAMBA_CACHE_MODES:
        raise NotImplementedError(f"mamba_cache_mode {mamba_cache_mode!r} is not modelled (one of {MAMBA_CACHE_MODES})")
    shapes = tuple(tuple(s) for s in model.mamba_state_shapes(tensor_parallel_size))
    dtypes = tuple(model.mamba_state_dtypes)
    state_bytes = sum(int(torch.Size(s).numel()) * _dtype_size(d) for s, d in zip(shapes, dtypes))
    attn_page = attention_spec.page_size_bytes
    if state_bytes > attn_page:
        raise ValueError(f"a recurrent state of {state_bytes} bytes does not fit the attention page of {attn_page} "
                         "bytes: raise the block size as vLLM does (align_hybrid_block_size)")
    block_size = attention_spec.block_size if mamba_cache_mode == "align" else (max_model_len or model.max_positions)
    return MambaSpec(block_size=block_size, shapes=shapes, dtypes=dtypes,
                     page_size_padded=attn_page if attn_page != state_bytes else None,
                     mamba_cache_mode=mamba_cache_mode)


def kv_cache_specs_for(model, tensor_parallel_size: int = 1, *, page_size_padded: Optional[int] = None,
                       mamba_cache_mode: str = "align", max_model_len: Optional[int] = None) -> dict:
    """Per KV cache layer (name -> spec), as a model's layers report them to vLLM's
    get_kv_cache_spec: kv_cache_spec_for's FullAttentionSpec (or MLAAttentionSpec),
    SlidingWindowSpec(sliding_window=W) for the layers in model.sliding_window_layers, and
    mamba_spec_for's MambaSpec (mamba_cache_mode, max_model_len) for model.mamba_layer_indices."""
    base = kv_cache_spec_for(model, tensor_parallel_size, page_size_padded=page_size_padded)
    windows = sliding_window_layers_of(model)
    if windows and isinstance(base, MLAAttentionSpec):
        raise ValueError("sliding-window MLA layers are not modelled by the mini engine")
    mamba = mamba_layers_of(model)
    state = (mamba_spec_for(model, base, tensor_parallel_size, mamba_cache_mode=mamba_cache_mode,
                            max_model_len=max_model_len) if mamba else None)
    specs = {}
    for i, name in enumerate(model.attention_layer_names):
        if i in mamba:
            specs[name] = state
        elif i in windows:
            specs[name] = SlidingWindowSpec(block_size=base.block_size, num_kv_heads=base.num_kv_heads,
                                            head_size=base.head_size, head_size_v=base.head_size_v,
                                            dtype=base.dtype, page_size_padded=base.page_size_padded,
                                            sliding_window=windows[i])
        else:
            specs[name] = base
    return specs


def unify_hybrid_kv_cache_specs(specs: dict) -> dict:
    """The hybrid KV cache manager off (vllm/v1/core/kv_cache_utils.py
    @bbf906a88ba1a39104884c88c9811a4f968e4659, unify_hybrid_kv_cache_specs): with both full and
    sliding-window layers, every SlidingWindowSpec becomes a FullAttentionSpec that records its
    window (blocks are allocated for all tokens; the layer still computes over its window only)."""
    if any(isinstance(s, MambaSpec) for s in specs.values()) and len({type(s) for s in specs.values()}) > 1:
        # vLLM cannot unify a Mamba layer with attention layers: such models need the hybrid manager.
        raise ValueError("Hybrid KV cache manager is disabled but failed to convert the KV cache specs to one "
                         "unified type (a recurrent-state layer beside attention layers)")
    has_full = any(type(s) is FullAttentionSpec for s in specs.values())
    has_sw = any(isinstance(s, SlidingWindowSpec) for s in specs.values())
    if not (has_full and has_sw):
        return dict(specs)
    out = {}
    for name, s in specs.items():
        if isinstance(s, SlidingWindowSpec):
            s = FullAttentionSpec(block_size=s.block_size, num_kv_heads=s.num_kv_heads, head_size=s.head_size,
                                  head_size_v=s.head_size_v, dtype=s.dtype, kv_quant_mode=s.kv_quant_mode,
                                  page_size_padded=s.page_size_padded, sliding_window=s.sliding_window)
        out[name] = s
    return out


def merge_full_attention_specs(specs: list) -> FullAttentionSpec:
    """FullAttentionSpec.merge (vllm/v1/kv_cache_interface.py, the stored version with
    create_kv_cache_views): one spec for a group whose layers differ only in their recorded window;
    the group records the one window its layers have (two different windows: ValueError)."""
    windows = {s.sliding_window for s in specs if s.sliding_window is not None}
    if len(windows) > 1:
        raise ValueError("All attention layers in the same KV cache group must have the same window size.")
    first = specs[0]
    merged = FullAttentionSpec(block_size=first.block_size, num_kv_heads=first.num_kv_heads,
                               head_size=first.head_size, head_size_v=first.head_size_v, dtype=first.dtype,
                               kv_quant_mode=first.kv_quant_mode, page_size_padded=first.page_size_padded,
                               sliding_window=windows.pop() if windows else None)
    for s in specs:
        if (s.block_size, s.num_kv_heads, s.head_size, s.head_size_v, s.dtype, s.page_size_padded) != (
                merged.block_size, merged.num_kv_heads, merged.head_size, merged.head_size_v, merged.dtype,
                merged.page_size_padded):
            raise ValueError("All attention layers in the same KV cache group must have the same attention spec.")
    return merged


def get_kv_cache_groups(specs: dict) -> list:
    """The KV cache groups of per-layer specs (vllm/v1/core/kv_cache_utils.py
    @bbf906a88ba1a39104884c88c9811a4f968e4659, get_kv_cache_config's grouping): one group when
    every layer has one spec type (after unify_hybrid_kv_cache_specs, a FullAttentionSpec that
    records the window); otherwise (_get_kv_cache_config_uniform_page_size) the layers of each type,
    in the order the types first appear, are cut into groups of `group_size` layers, group_size being
    the smallest number of layers of any type (the "1" of an n:1 pattern), the last group of a type
    short (padding) if needed. Every group's spec must have the same page size."""
    if not specs:
        return []
    if all(type(s) is FullAttentionSpec for s in specs.values()) or all(
            isinstance(s, MLAAttentionSpec) for s in specs.values()):
        names = list(specs)
        spec = specs[names[0]]
        if any(s != spec for s in specs.values()):
            if type(spec) is not FullAttentionSpec:
                raise ValueError("all layers of one KV cache group must have one spec")
            spec = merge_full_attention_specs(list(specs.values()))
        return [KVCacheGroupSpec(names, spec)]
    same_type: dict = {}
    for name, s in specs.items():
        same_type.setdefault(s, []).append(name)
    if len({s.page_size_bytes for s in same_type}) != 1:
        raise NotImplementedError("hybrid KV cache groups need one page size (vLLM: uniform page size)")
    group_size = min(len(names) for names in same_type.values())
    groups = []
    for s, names in same_type.items():
        for i in range(0, len(names), group_size):
            groups.append(KVCacheGroupSpec(names[i:i + group_size], s))
    return groups


def kv_cache_config_from_groups(groups: list, num_blocks: int, layout=KVCacheLayout.LBNHC) -> KVCacheConfig:
    """KVCacheConfig of `groups` with one backing allocation for all (current vLLM's
    vllm/v1/worker/utils.py allocate_kv_cache: every KVCacheTensor has the one backing size and
    places its layers in it; "cache groups overlay each other", KVCacheTensor's docstring in
    vllm/v1/kv_cache_interface.py). One KVCacheTensor per group, layers = the group's layers,
    placed for `group_size` layer slots (the largest group) at offset 0: layer i of every group
    shares the bytes of slot i, which is sound because a block id belongs to one group at a time
    (all groups allocate from one BlockPool). A single group: one tensor for all its layers, the
    placement this harness always had. Older vLLM (before #51718) had one KVCacheTensor(size,
    shared_by) per slot, shared by layer i of every group: the same bytes per (slot, block)."""
    if not groups:
        return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[])
    group_size = max(len(g.layer_names) for g in groups)
    pages = {g.kv_cache_spec.page_size_bytes for g in groups}
    if len(pages) != 1:
        raise NotImplementedError("the mini engine overlays groups of one page size only")
    tensors = [kv_cache_tensor_for(g.kv_cache_spec, g.layer_names, num_blocks, layout, num_slots=group_size)
               for g in groups]
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=tensors, kv_cache_groups=list(groups))


def get_pp_indices(num_hidden_layers: int, pp_rank: int, pp_size: int) -> tuple:
    """(start, end) of pipeline stage `pp_rank`'s decoder layers (vllm/distributed/utils.py
    get_pp_indices): an even split, the remainder going one layer each to the stages before the
    last, starting from the second to last; VLLM_PP_LAYER_PARTITION (comma-separated layer counts)
    overrides."""
    explicit = os.environ.get("VLLM_PP_LAYER_PARTITION")
    if explicit:
        partitions = [int(x) for x in explicit.split(",")]
        if len(partitions) != pp_size or sum(partitions) != num_hidden_layers:
            raise ValueError(f"VLLM_PP_LAYER_PARTITION={explicit!r} does not split {num_hidden_layers} layers "
                             f"into {pp_size} stages")
    else:
        partitions = [num_hidden_layers // pp_size] * pp_size
        for i in range(2, num_hidden_layers % pp_size + 2):
            partitions[-i] += 1
    start = sum(partitions[:pp_rank])
    return start, start + partitions[pp_rank]


def pp_stage_layer_names(model, pipeline_parallel_size: int = 1) -> list:
    """The attention layer names of each pipeline stage (get_pp_indices over the model's layers)."""
    names = list(model.attention_layer_names)
    out = []
    for p in range(pipeline_parallel_size):
        start, end = get_pp_indices(len(names), p, pipeline_parallel_size)
        out.append(names[start:end])
    return out


def make_kv_cache_config(model, num_blocks: int, tensor_parallel_size: int = 1, *,
                         layout=KVCacheLayout.LBNHC, page_size_padded: Optional[int] = None,
                         disable_hybrid_kv_cache_manager: bool = False,
                         layer_names: Optional[Sequence[str]] = None, mamba_cache_mode: str = "align",
                         max_model_len: Optional[int] = None) -> KVCacheConfig:
    """The per-worker KVCacheConfig of `model`'s attention layers, placed for `layout` (a
    KVCacheLayout or its name). A model with one kind of layer: one group (kv_cache_spec_for) and one
    KVCacheTensor for all its layers. A hybrid model (model.sliding_window_layers = {layer index:
    window}): with the hybrid KV cache manager on (disable_hybrid_kv_cache_manager=False, vLLM's
    default) one group per layer type and group_size layers (FullAttentionSpec groups first when the
    model's first layer is full attention, then SlidingWindowSpec groups; see get_kv_cache_groups),
    overlaid in one backing allocation (kv_cache_config_from_groups); with it off, one group of
    FullAttentionSpec(sliding_window=W) for all layers (unify_hybrid_kv_cache_specs).
    layer_names (default: all): only these layers, e.g. one pipeline stage's
    (pp_stage_layer_names), as each vLLM worker's KVCacheConfig lists only its own layers.
    A model with recurrent layers (model.mamba_layer_indices) gets a MambaSpec group per
    mamba_spec_for (mamba_cache_mode: "align", vLLM's with prefix caching, or "none";
    max_model_len: the "none" mode's block size); it needs the hybrid manager on and a
    block-compact layout (LBHNC, LBNHC, BLHNC, BLNHC), since its pages overlay the attention pages."""
    specs = kv_cache_specs_for(model, tensor_parallel_size, page_size_padded=page_size_padded,
                               mamba_cache_mode=mamba_cache_mode, max_model_len=max_model_len)
    if any(isinstance(s, MambaSpec) for s in specs.values()) and not resolve_kv_cache_layout(layout).is_block_compact:
        raise ValueError(f"layout {resolve_kv_cache_layout(layout).name} spreads a block over the heads: a Mamba "
                         "group's pages, overlaid on the attention pages, need a block-compact layout")
    if layer_names is not None:
        unknown = set(layer_names) - set(specs)
        assert not unknown, f"not attention layers of the model: {sorted(unknown)}"
        specs = {n: s for n, s in specs.items() if n in set(layer_names)}
    if disable_hybrid_kv_cache_manager:
        specs = unify_hybrid_kv_cache_specs(specs)
    return kv_cache_config_from_groups(get_kv_cache_groups(specs), num_blocks, layout)


def check_kv_cache_config_layout(kv_cache_config: KVCacheConfig, layout) -> None:
    """Raises ValueError if a KVCacheTensor of the config is not placed as `layout` places it."""
    layout = resolve_kv_cache_layout(layout)
    num_slots = max((len(t.layers) for t in kv_cache_config.kv_cache_tensors), default=0)
    for tensor in kv_cache_config.kv_cache_tensors:
        spec = kv_cache_config.spec_of(tensor.layers[0])
        want = kv_cache_tensor_for(spec, tensor.layers, kv_cache_config.num_blocks, layout, num_slots=num_slots)
        if (tensor.layer_stride, tensor.block_stride) != (want.layer_stride, want.block_stride) or \
                tensor.size < want.size:
            raise ValueError(f"kv_cache_config places {tensor.layers[0]} with layer/block strides "
                             f"{tensor.layer_stride}/{tensor.block_stride}, layout {layout.name} needs "
                             f"{want.layer_stride}/{want.block_stride} (make_kv_cache_config(..., layout=...))")


def legacy_kv_cache_shape(spec: AttentionSpec, num_blocks: int, kv_cache_format: str,
                          kernel_block_size: Optional[int] = None) -> tuple:
    """Older vLLM's per-layer tensor shape (kernel blocks counted like the views: num_blocks * ratio
    blocks of kernel_block_size tokens). MLA: [blocks, tokens, head_size] for either legacy format."""
    kbs = kernel_block_size or spec.block_size
    blocks = compute_layer_kv_cache_shape_bytes(spec, num_blocks, kbs)[0]
    if isinstance(spec, MLAAttentionSpec):
        return (blocks, kbs, spec.head_size)
    if spec.head_size_v != spec.head_size or spec.page_size_padded is not None:
        raise ValueError("older vLLM's 5-D caches need head_size_v == head_size and unpadded pages")
    if kv_cache_format == "legacy_kv_first":
        return (2, blocks, kbs, spec.num_kv_heads, spec.head_size)
    if kv_cache_format == "legacy_blocks_first":
        return (blocks, 2, kbs, spec.num_kv_heads, spec.head_size)
    raise ValueError(f"not a legacy KV cache format: {kv_cache_format!r}")


def allocate_kv_caches(kv_cache_config: KVCacheConfig, *, kv_cache_format: str = "views", layout=None,
                       kernel_block_size: Optional[int] = None) -> dict:
    """What a worker passes to register_kv_caches: dict layer_name -> zeroed cache, in the groups'
    layer order. "views": current vLLM (vllm/v1/worker/utils.py allocate_kv_cache): when every
    KVCacheTensor has the same size, ONE zeroed int8 backing buffer of that size that every tensor
    places its layers in (so the groups of a hybrid config overlay each other), then
    create_kv_cache_views; tensors of different sizes (configs built by hand) get one buffer each.
    "legacy_*": older vLLM, one zeroed tensor of spec.dtype per layer slot, shared by layer i of every
    group (a single group: one tensor per layer)."""
    if kv_cache_format not in KV_CACHE_FORMATS:
        raise ValueError(f"kv_cache_format {kv_cache_format!r} is not one of {KV_CACHE_FORMATS}")
    caches = {}
    if kv_cache_format == "views":
        tensors = kv_cache_config.kv_cache_tensors
        shared = None
        if len(tensors) > 1 and len({t.size for t in tensors}) == 1:
            shared = torch.zeros(tensors[0].size, dtype=torch.int8)
        for tensor in tensors:
            raw = shared if shared is not None else torch.zeros(tensor.size, dtype=torch.int8)
            spec = kv_cache_config.spec_of(tensor.layers[0])
            # The kernel block split is the attention backend's; a Mamba group keeps one state per block.
            kbs = None if isinstance(spec, MambaSpec) else kernel_block_size
            views = create_kv_cache_views(raw, spec, kv_cache_config.num_blocks, layout, tensor, kbs)
            caches.update(zip(tensor.layers, views))
    else:
        if any(isinstance(g.kv_cache_spec, MambaSpec) for g in kv_cache_config.kv_cache_groups):
            raise ValueError(f"kv_cache_format {kv_cache_format!r} (older vLLM) has no form for recurrent-state "
                             "layers: use \"views\"")
        groups = kv_cache_config.kv_cache_groups
        for slot in range(max((len(g.layer_names) for g in groups), default=0)):
            owners = [g for g in groups if slot < len(g.layer_names)]
            shapes = {legacy_kv_cache_shape(g.kv_cache_spec, kv_cache_config.num_blocks, kv_cache_format,
                                            kernel_block_size) for g in owners}
            dtypes = {g.kv_cache_spec.dtype for g in owners}
            assert len(shapes) == 1 and len(dtypes) == 1, "overlaid groups need one tensor shape"
            t = torch.zeros(shapes.pop(), dtype=dtypes.pop())
            caches.update((g.layer_names[slot], t) for g in owners)
    order = [name for group in kv_cache_config.kv_cache_groups for name in group.layer_names]
    return {name: caches[name] for name in order if name in caches}
