"""Forward context (vllm/forward_context.py @01fb6e2f) and attention stand-ins. The current
forward context lives here and only here (`_forward_context`, rebound by set_forward_context):
read it through get_forward_context(), never through a `from ... import _forward_context` copy."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from .config import VllmConfig


# --------------------------------------------------------------------------
# Forward context (vllm/forward_context.py @01fb6e2f) and attention stand-ins.
# --------------------------------------------------------------------------

class Attention(torch.nn.Module):
    """Stand-in for a vLLM attention layer in static_forward_context: `.kv_cache` is the layer's
    cache, the very tensor register_kv_caches received (current vLLM: the 4-D [B, H, N, C] view;
    older vLLM: [2, num_blocks, block_size, num_kv_heads(rank), head_size] or its FlashInfer/MLA forms)."""

    def __init__(self, layer_name: str, kv_cache: torch.Tensor, num_kv_heads: int, head_size: int):
        super().__init__()
        self.layer_name = layer_name
        self.kv_cache = kv_cache
        self.num_kv_heads = num_kv_heads
        self.head_size = head_size
        self.kv_cache_dtype = "auto"


class MambaMixer(torch.nn.Module):
    """Stand-in for a vLLM recurrent layer (MambaBase: Mamba/GDN mixers) in static_forward_context:
    `.kv_cache` is the layer's [num_blocks, 1, 1, state bytes] int8 view, the tensor
    register_kv_caches received. vLLM's maybe_transfer_kv_layer wraps attention ops only, so no
    wait_for_layer_load / save_kv_layer is called for such a layer."""

    def __init__(self, layer_name: str, kv_cache: torch.Tensor, mamba_type: str = "mamba2"):
        super().__init__()
        self.layer_name = layer_name
        self.kv_cache = kv_cache
        self.mamba_type = mamba_type


@dataclass
class MambaMetadata:
    """The step's metadata of a Mamba group (the role of vLLM's Mamba2AttentionMetadata in "align"
    mode, its fields named after it): per request, the group's block table row
    (state_indices_tensor, padded with 0) and the table entries the recurrent kernel reads its
    initial state from (block_idx_last_computed_token: cdiv(num_computed, block_size) - 1, -1 when
    there is none) and writes its final state to (block_idx_last_scheduled_token:
    cdiv(num_computed + num_scheduled, block_size) - 1)."""
    num_actual_tokens: int
    query_start_loc: torch.Tensor  # int32 [num_reqs + 1]
    seq_lens: torch.Tensor  # int32 [num_reqs]
    block_size: int
    state_indices_tensor: torch.Tensor  # int32 [num_reqs, max_blocks]
    has_initial_states: torch.Tensor  # bool [num_reqs]
    block_idx_last_computed_token: torch.Tensor  # int32 [num_reqs]
    block_idx_last_scheduled_token: torch.Tensor  # int32 [num_reqs]


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
