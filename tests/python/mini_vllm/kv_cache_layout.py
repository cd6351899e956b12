"""KVCacheLayout: the physical order of a KV cache group's bytes.

Mirrors vllm/v1/kv_cache_layout.py @14f7a27c776bd0c423bbc155b25ce21ee5a839da (added by
vllm#51718 "Standardize KV cache layout", vLLM v0.28/v0.29), rewritten here.

Every KV cache group has the same logical axes, [L, B, H, N, C]:
  L  the layer (position in KVCacheTensor.layers),
  B  the block (a kernel block when the manager block is split),
  H  the head slot,
  N  the token (state) inside the block,
  C  the bytes of one (head slot, token) cell: K then V for attention, the latent for MLA.
A layout's value lists, outermost physical axis first, which logical axis sits there:
value[i] is the logical index of the i-th physical axis. C is always innermost.
"""

from __future__ import annotations

import enum
from typing import Optional, Union

# Logical axis indices of [L, B, H, N, C].
DIM_L, DIM_B, DIM_H, DIM_N, DIM_C = range(5)


class KVCacheLayout(enum.Enum):
    """Physical order of the logical axes [L, B, H, N, C] (outermost first)."""

    LBHNC = (0, 1, 2, 3, 4)  # per layer, per block: heads outside tokens ("HND")
    LBNHC = (0, 1, 3, 2, 4)  # per layer, per block: tokens outside heads ("NHD", FlashAttention's)
    LHBNC = (0, 2, 1, 3, 4)  # per layer, per head: all blocks of that head
    BLHNC = (1, 0, 2, 3, 4)  # per block: every layer's page, heads outside tokens
    BLNHC = (1, 0, 3, 2, 4)  # per block: every layer's page, tokens outside heads
    BHLNC = (1, 2, 0, 3, 4)  # per block, per head: every layer

    @property
    def stride_order(self) -> tuple:
        """The logical axes in physical order, outermost first (the value)."""
        return self.value

    @property
    def layer_view_order(self) -> tuple:
        """Physical order of the axes of one layer's 4-D [B, H, N, C] view (L removed, renumbered)."""
        return tuple(axis - 1 for axis in self.value if axis != DIM_L)

    @property
    def is_layer_compact(self) -> bool:
        """L is the outermost axis: each layer's bytes are one contiguous region."""
        return self.value[0] == DIM_L

    @property
    def is_block_outermost(self) -> bool:
        """B is the outermost axis: a block holds the pages of every layer."""
        return self.value[0] == DIM_B

    @property
    def is_block_contiguous(self) -> bool:
        """Within a block, [H, N, C] are in logical order (heads outside tokens)."""
        return self.value[-3:] == (DIM_H, DIM_N, DIM_C)

    @property
    def is_block_compact(self) -> bool:
        """L and B are the two outermost axes: each (layer, block) page is one contiguous run."""
        return set(self.value[:2]) == {DIM_L, DIM_B}


# The per-layer names older vLLM used (vllm/v1/attention/backends/utils.py get_kv_cache_layout),
# taken here as aliases of the layer-compact layouts they describe.
_ALIASES = {"NHD": KVCacheLayout.LBNHC, "HND": KVCacheLayout.LBHNC}

# What CacheConfig.kv_cache_layout=None resolves to: CUDA FlashAttention's NHD page.
DEFAULT_KV_CACHE_LAYOUT = KVCacheLayout.LBNHC


def resolve_kv_cache_layout(layout: Optional[Union[str, KVCacheLayout]]) -> KVCacheLayout:
    """A KVCacheLayout from a member, a member name ("BLNHC"), "NHD"/"HND", or None (the default)."""
    if layout is None:
        return DEFAULT_KV_CACHE_LAYOUT
    if isinstance(layout, KVCacheLayout):
        return layout
    name = str(layout).upper()
    if name in _ALIASES:
        return _ALIASES[name]
    try:
        return KVCacheLayout[name]
    except KeyError:
        raise ValueError(f"unknown KV cache layout {layout!r}; one of "
                         f"{[m.name for m in KVCacheLayout] + list(_ALIASES)}") from None
