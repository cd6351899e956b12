"""Tiny, real, deterministic decoder models with a vLLM-style paged KV cache.

Test doubles for the kvtier vLLM connector: a connector moves the bytes of
these caches, so the models must be real (outputs depend on every cached
byte and on positions) and bit-reproducible.

Cache forms the models read and write (one tensor per attention layer, the
values of the dict vLLM passes to `register_kv_caches`, keyed by layer names
`"model.layers.{i}.self_attn.attn"`):
  * "views" (current vLLM, since vllm#51718, see mini_vllm/kv_cache_interface.py):
    a 4-D view [B, H, N, C] of one flat allocation, any KVCacheLayout, so in
    general non-contiguous; C packs K (the first head_size elements) then V;
    for MLA H = 1 and C is the latent. Dim 0 may count kernel blocks of
    N < block_size tokens (manager block b = kernel blocks b*r .. b*r+r-1).
  * "legacy_kv_first" (older vLLM FlashAttention, vllm/v1/attention/backends/
    flash_attn.py @5704f34f): [2, num_blocks, block_size, heads, head_size];
  * "legacy_blocks_first" (older FlashInfer): [num_blocks, 2, block_size,
    heads, head_size]; older MLA: [num_blocks, block_size, head_size] for both.
A slot p (vLLM's slot mapping: block_table[p // block_size] * block_size +
p % block_size) is token p % n of block p // n where n = the cache's tokens
per (kernel) block. The models write through views of the tensor they were
handed (never a reshaped copy), so every form holds the same float values
and the numerics do not depend on the form.

Hooks (the kv_transfer_utils.py decorator @2b9269b2): per layer,
`hooks.wait_for_layer_load(layer_name)` before the layer reads the cache and
`hooks.save_kv_layer(layer_name, kv_cache, attn_metadata)` after it wrote
this step's K/V: the order of vLLM's `maybe_transfer_kv_layer` decorator
(vllm/model_executor/layers/attention/kv_transfer_utils.py @2b9269b2).

Bit-exactness, by construction: every per-token operation runs on tensors of
one fixed shape (`[1, width]`) whatever the batch, the chunking or the number
of requests, and attention for the token at position p reduces over exactly
the p + 1 (or window) cached positions. So the logits and the K/V written for
a token are a pure function of (weights, token, position, cached K/V bytes of
the earlier positions), independent of how the prompt was chunked, of other
requests in the step and of tensor-parallel sharding of the KV heads. This is
slower than batched matmuls (a Python loop per token and layer) and that is
the point: no BLAS blocking or reduction order can depend on the batch.
Call `make_deterministic()` once per process (the tests' fixtures do).

Sliding window (TinyGemma): a layer in `model.sliding_window_layers` ({layer index: W})
reads only positions [p - W + 1, p] for the token at p (vLLM's sliding_window semantics).
With vLLM's hybrid KV cache manager each layer has the block table of its KV cache group
(SeqInput.layer_block_tables); a sliding-window group's table holds the null block (0)
before the window, which the layer never reads nor writes.

Recurrent state (TinyHybridRecurrent): a sliding-window attention layer and a recurrent layer
whose state lives in the layer's Mamba pages ([num_blocks, 1, 1, state bytes] int8 views, the
state's fp32 bytes first), read and written through the layer's block table as vLLM's recurrent
kernels do: the initial state from entry cdiv(n, bs) - 1 (none when n = 0), the final state to
entry cdiv(n + new, bs) - 1, bs being the Mamba group's block size.

Tensor parallelism: the model always computes all heads; a `KVShard` is one
rank's caches and the heads `[kv_head_start, kv_head_end)` tensor parallelism
gives it (`model.num_tp_heads` of them in all): KV heads for TinyDecoder and
TinyHybrid (the rank's cache holds exactly those), query heads for TinyMLA
(every rank's cache holds the whole latent, replicated, as vLLM's MLA does).
The model writes each shard's share, reads each head from the cache of the
shard that owns it and calls each shard's hooks, so results are
bit-identical for 1 or 2 shards.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F

__all__ = [
    "AttnMetadata", "HybridOutput", "KVCache", "KVShard", "SeqInput", "TinyDecoder", "TinyGemma", "TinyHybrid",
    "TinyHybridRecurrent", "TinyMLA",
    "greedy_generate", "kv_planes", "make_deterministic", "slot_mapping", "tp_head_range",
]

KV_FORMATS = ("views", "legacy_kv_first", "legacy_blocks_first")


def make_deterministic() -> None:
    """Single-threaded deterministic kernels; call before building or running a model."""
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)


def slot_mapping(block_table: Sequence[int], positions: Sequence[int], block_size: int) -> torch.Tensor:
    """vLLM's slot mapping: block_table[p // block_size] * block_size + p % block_size (int64)."""
    return torch.tensor([int(block_table[p // block_size]) * block_size + p % block_size for p in positions],
                        dtype=torch.int64)


def tp_head_range(model, rank: int, tp_size: int) -> tuple:
    """The heads tensor parallelism gives `rank` of `tp_size`: an equal share of model.num_tp_heads."""
    assert model.num_tp_heads % tp_size == 0, "heads must divide evenly over ranks"
    per = model.num_tp_heads // tp_size
    return rank * per, (rank + 1) * per


# --------------------------------------------------------------------------
# Reading and writing any cache form.
# --------------------------------------------------------------------------

def infer_kv_format(cache: torch.Tensor) -> str:
    """The form of a layer cache from its shape: 4-D views, 3-D older MLA ("legacy_kv_first"), 5-D
    older attention: kv_first when dim 0 is 2, else blocks_first ([2, 2, ...] is taken as kv_first:
    pass the format explicitly for a 2-block blocks_first cache)."""
    if cache.dim() == 4:
        return "views"
    if cache.dim() == 3:
        return "legacy_kv_first"
    assert cache.dim() == 5, f"not a paged KV cache: shape {tuple(cache.shape)}"
    return "legacy_kv_first" if cache.shape[0] == 2 else "legacy_blocks_first"


def kv_planes(cache: torch.Tensor, head_size: Optional[int] = None, kv_format: Optional[str] = None) -> list:
    """Views [blocks, tokens, heads, width] of one layer's cache, sharing its storage, indexed by
    (kernel) block and token in block: [K, V] for attention; [latent] (heads = 1) for MLA caches
    (3-D, or 4-D with head_size = C). head_size splits a 4-D view's C (None: C / 2)."""
    fmt = kv_format or infer_kv_format(cache)
    assert fmt in KV_FORMATS, f"unknown KV cache format {fmt!r}"
    if cache.dim() == 3:
        return [cache.unsqueeze(2)]
    if fmt == "views":
        cells = cache.transpose(1, 2)  # [B, N, H, C]
        k_width = cells.shape[-1] // 2 if head_size is None else head_size
        if k_width == cells.shape[-1]:
            return [cells]
        return [cells[..., :k_width], cells[..., k_width:]]
    if fmt == "legacy_kv_first":
        return [cache[0], cache[1]]
    return [cache[:, 0], cache[:, 1]]


def _block_and_offset(slots, tokens_per_block: int):
    return slots // tokens_per_block, slots % tokens_per_block


def _read_slots(plane: torch.Tensor, slots: torch.Tensor, head: int) -> torch.Tensor:
    """Rows [len(slots), width] of one head of a plane (a new contiguous tensor)."""
    block, offset = _block_and_offset(slots, plane.shape[1])
    return plane[:, :, head][block, offset].contiguous()


def _write_slot(plane: torch.Tensor, slot: int, rows: torch.Tensor) -> None:
    """Writes rows [heads, width] to one slot of a plane, in place."""
    block, offset = _block_and_offset(slot, plane.shape[1])
    plane[block, offset] = rows


@dataclass
class AttnMetadata:
    """Stand-in for a vLLM attention metadata object when the model runs without the
    mini engine (the engine passes its FlashAttentionMetadata-like object instead).
    Connectors read `slot_mapping` (int64, one slot per token computed this step)."""
    slot_mapping: torch.Tensor


@dataclass
class SeqInput:
    """One request's share of a forward pass: the tokens computed now, their positions
    (consecutive, starting at the request's num_computed_tokens) and the request's block
    table (group 0, covering every position up to the last one). layer_block_tables (optional,
    vLLM's hybrid KV cache manager): layer name -> the block table of that layer's KV cache
    group; a sliding-window group's table has the null block (0) for blocks before the window.
    layer_block_sizes (optional): layer name -> tokens per block of that layer's group, when it
    is not the model's block size (a Mamba group in "none" mode: one block of max_model_len)."""
    token_ids: Sequence[int]
    positions: Sequence[int]
    block_table: Sequence[int]
    layer_block_tables: Optional[dict] = None
    layer_block_sizes: Optional[dict] = None

    def table_for(self, layer_name: str) -> Sequence[int]:
        if self.layer_block_tables is not None and layer_name in self.layer_block_tables:
            return self.layer_block_tables[layer_name]
        return self.block_table

    def block_size_for(self, layer_name: str, default: int) -> int:
        if self.layer_block_sizes is not None and layer_name in self.layer_block_sizes:
            return self.layer_block_sizes[layer_name]
        return default


@dataclass
class KVShard:
    """The paged caches of one tensor-parallel rank and the heads [kv_head_start, kv_head_end)
    tensor parallelism gives it (see the module docstring: KV heads, or MLA query heads).
    `kv_caches[layer_name]` is in any form of the module docstring; `kv_format` names it (None:
    inferred from the shape). `hooks` (optional) gets wait_for_layer_load/save_kv_layer calls for
    this rank; `attn_metadata` is what save_kv_layer receives: one object, or a dict
    layer_name->object (vLLM's forward_context.attn_metadata); None builds an AttnMetadata with
    the slot mapping."""
    kv_caches: dict
    kv_head_start: int
    kv_head_end: int
    hooks: Any = None
    attn_metadata: Any = None
    kv_format: Optional[str] = None
    # The layers whose caches this shard holds (pipeline parallelism: one stage's layers); None =
    # every attention layer of the model. The model reads, writes and calls the hooks of a layer
    # only through the shards that own it.
    layers: Optional[frozenset] = None

    def owns(self, layer_name: str) -> bool:
        return self.layers is None or layer_name in self.layers

    def metadata_for(self, layer_name: str, default: Any) -> Any:
        if self.attn_metadata is None:
            return default
        if isinstance(self.attn_metadata, dict):
            return self.attn_metadata[layer_name]
        return self.attn_metadata

    def planes(self, layer_name: str, head_size: int) -> list:
        return kv_planes(self.kv_caches[layer_name], head_size, self.kv_format)


def _owning(shards, layer_name: str) -> list:
    """The shards that hold `layer_name` (KVShard.layers; pipeline parallelism)."""
    return [s for s in shards if s.owns(layer_name)]


def _as_shards(model, kv_caches, hooks=None, attn_metadata=None) -> list:
    """Accepts a dict (one cache set with all heads), a KVShard or a list of KVShards."""
    if isinstance(kv_caches, KVShard):
        return [kv_caches]
    if isinstance(kv_caches, (list, tuple)):
        return list(kv_caches)
    return [KVShard(kv_caches, 0, model.num_tp_heads, hooks, attn_metadata)]


class KVCache:
    """Allocation and inspection of paged caches in any form (see the module docstring).
    kv_format defaults to "legacy_kv_first" here (the form these helpers always had); the mini
    engine allocates "views" by default."""

    @staticmethod
    def shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
              kv_format: str = "legacy_kv_first") -> tuple:
        """One layer's shape for an attention model (K and V of head_size each)."""
        if kv_format == "views":
            return (num_blocks, num_kv_heads, block_size, 2 * head_size)
        if kv_format == "legacy_blocks_first":
            return (num_blocks, 2, block_size, num_kv_heads, head_size)
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    @staticmethod
    def allocate(model, num_blocks: int, kv_head_range: Optional[tuple] = None, fill: float = 0.0,
                 dtype: torch.dtype = torch.float32, *, kv_format: str = "legacy_kv_first", layout=None,
                 kernel_block_size: Optional[int] = None, page_size_padded: Optional[int] = None) -> dict:
        """dict layer_name -> zero (or `fill`) cache of the model's attention layers, as a worker
        allocates it (mini_vllm.kv_cache_interface.allocate_kv_caches): `kv_format`, `layout` (a
        KVCacheLayout or its name, views only; None = LBNHC), `kernel_block_size`, `page_size_padded`.
        `kv_head_range=(start, end)` allocates one TP rank's KV heads (ignored by MLA: every rank
        holds the whole latent). This dict is what vLLM passes to `register_kv_caches`."""
        from mini_vllm.kv_cache_interface import (KVCacheConfig, KVCacheGroupSpec, allocate_kv_caches,
                                                  kv_cache_spec_for, kv_cache_tensor_for)
        start, end = kv_head_range if kv_head_range is not None else (0, getattr(model, "n_kv_heads", 1))
        spec = replace(kv_cache_spec_for(model, num_kv_heads=end - start, page_size_padded=page_size_padded),
                       dtype=dtype)
        names = list(model.attention_layer_names)
        config = KVCacheConfig(num_blocks, [kv_cache_tensor_for(spec, names, num_blocks, layout)],
                               [KVCacheGroupSpec(names, spec)])
        caches = allocate_kv_caches(config, kv_cache_format=kv_format, layout=layout,
                                    kernel_block_size=kernel_block_size)
        if fill != 0.0:
            for cache in caches.values():
                cache.fill_(fill)
        return caches

    @staticmethod
    def shards(model, num_blocks: int, tp_size: int, fill: float = 0.0, **allocate_kwargs) -> list:
        """One KVShard per rank, rank r holding heads tp_head_range(model, r, tp_size) (MLA: the
        whole latent); allocate_kwargs as for allocate (kv_format, layout, ...)."""
        shards = []
        for r in range(tp_size):
            start, end = tp_head_range(model, r, tp_size)
            caches = KVCache.allocate(model, num_blocks, (start, end), fill, **allocate_kwargs)
            shards.append(KVShard(caches, start, end, kv_format=allocate_kwargs.get("kv_format", "legacy_kv_first")))
        return shards

    @staticmethod
    def gather_tokens(kv_caches: dict, block_table: Sequence[int], num_tokens: int, block_size: int, *,
                      head_size: Optional[int] = None, kv_format: Optional[str] = None) -> torch.Tensor:
        """K/V of positions [0, num_tokens) read through a block table, whatever the form:
        [num_layers, 2, num_tokens, heads, head_size] (layers in dict order; K and V must have one
        width). An MLA cache (3-D, or 4-D with head_size = C) gives its latent as the one plane:
        [num_layers, 1, num_tokens, 1, latent width]. head_size as for kv_planes."""
        slots = slot_mapping(block_table, range(num_tokens), block_size)
        out = []
        for cache in kv_caches.values():
            planes = kv_planes(cache, head_size, kv_format)
            rows = [p[_block_and_offset(slots, p.shape[1])] for p in planes]
            if len({r.shape for r in rows}) != 1:
                raise ValueError("gather_tokens: K and V have different widths")
            out.append(torch.stack(rows))
        return torch.stack(out)

    @staticmethod
    def copy_blocks(src: dict, dst: dict, src_block_ids: Sequence[int], dst_block_ids: Sequence[int], *,
                    block_size: Optional[int] = None, kv_format: Optional[str] = None) -> None:
        """Copies whole blocks (all layers, K and V) between two cache dicts of one form and the
        same heads. block_size: tokens per manager block, needed when the caches count kernel
        blocks (a manager block is then block_size // kernel tokens of them); None: no split."""
        for name, s in src.items():
            d = dst[name]
            fmt = kv_format or infer_kv_format(s)
            dim = 1 if (fmt == "legacy_kv_first" and s.dim() == 5) else 0
            tokens = s.shape[1] if s.dim() == 3 else s.shape[2]
            ratio = (block_size // tokens) if block_size else 1
            s_ids = torch.tensor([b * ratio + i for b in src_block_ids for i in range(ratio)], dtype=torch.int64)
            d_ids = torch.tensor([b * ratio + i for b in dst_block_ids for i in range(ratio)], dtype=torch.int64)
            if dim == 0:
                d[d_ids] = s[s_ids]
            else:
                d[:, d_ids] = s[:, s_ids]


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * weight


def _rope_tables(max_positions: int, head_size: int, base: float = 10000.0):
    half = head_size // 2
    inv_freq = 1.0 / (base ** (torch.arange(half, dtype=torch.float64) * 2.0 / head_size))
    angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cos(angles).to(torch.float32), torch.sin(angles).to(torch.float32)


def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """GPT-NeoX style rotation of x [heads, head_size] by one position's cos/sin [head_size/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class _Weights:
    """Seeded parameter factory (torch.Generator, so construction is reproducible)."""

    def __init__(self, seed: int):
        self.gen = torch.Generator().manual_seed(seed)

    def normal(self, *shape, scale: float) -> torch.nn.Parameter:
        return torch.nn.Parameter(torch.randn(*shape, generator=self.gen) * scale, requires_grad=False)

    def norm(self, dim: int) -> torch.nn.Parameter:
        return torch.nn.Parameter(1.0 + 0.1 * torch.randn(dim, generator=self.gen), requires_grad=False)


def _add_attention(layer, w, d_model: int, n_heads: int, n_kv_heads: int, head_size: int, head_size_v: int) -> None:
    """A decoder layer's attention norm and Q, K, V, O weights, drawn in this order from `w`."""
    layer.attn_norm = w.norm(d_model)
    layer.wq = w.normal(n_heads * head_size, d_model, scale=d_model ** -0.5)
    layer.wk = w.normal(n_kv_heads * head_size, d_model, scale=d_model ** -0.5)
    layer.wv = w.normal(n_kv_heads * head_size_v, d_model, scale=d_model ** -0.5)
    layer.wo = w.normal(d_model, n_heads * head_size_v, scale=(n_heads * head_size_v) ** -0.5)


def _add_swiglu_mlp(layer, w, d_model: int, d_ff: int) -> None:
    """A decoder layer's norm and SwiGLU MLP weights, drawn in this order from `w`."""
    layer.mlp_norm = w.norm(d_model)
    layer.w_gate = w.normal(d_ff, d_model, scale=d_model ** -0.5)
    layer.w_up = w.normal(d_ff, d_model, scale=d_model ** -0.5)
    layer.w_down = w.normal(d_model, d_ff, scale=d_ff ** -0.5)


def _swiglu_mlp(layer, x: torch.Tensor) -> torch.Tensor:
    """x + the layer's SwiGLU MLP of RMSNorm(x) (weights of _add_swiglu_mlp)."""
    h = _rms_norm(x, layer.mlp_norm)
    return x + F.linear(F.silu(F.linear(h, layer.w_gate)) * F.linear(h, layer.w_up), layer.w_down)


def _final_norm_and_head(w, vocab: int, d_model: int) -> tuple:
    """The final norm and the LM head, drawn in this order from `w`."""
    return w.norm(d_model), w.normal(vocab, d_model, scale=2.0 * d_model ** -0.5)


def _register_rope(module: torch.nn.Module, max_positions: int, rotary_dim: int) -> None:
    cos, sin = _rope_tables(max_positions, rotary_dim)
    module.register_buffer("rope_cos", cos, persistent=False)
    module.register_buffer("rope_sin", sin, persistent=False)


class _PagedAttentionMixin:
    """Shared paged-attention mechanics of TinyDecoder, TinyHybrid and TinyMLA (per token)."""

    @property
    def num_tp_heads(self) -> int:
        """The heads tensor parallelism splits over ranks: the KV heads (each rank caches its share)."""
        return self.n_kv_heads

    def _write_kv(self, shards, layer_name: str, slot: int, k: torch.Tensor, v: torch.Tensor) -> None:
        for shard in _owning(shards, layer_name):
            k_plane, v_plane = shard.planes(layer_name, self.head_size)
            _write_slot(k_plane, slot, k[shard.kv_head_start:shard.kv_head_end])
            _write_slot(v_plane, slot, v[shard.kv_head_start:shard.kv_head_end])

    def _attend(self, shards, layer_name: str, q: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """q [n_heads, head_size] attends to `slots` (the cached positions it may see, in order);
        returns [1, n_heads * head_size_v]. One matmul pair per KV head, whatever the sharding."""
        group = self.n_heads // self.n_kv_heads
        outs = []
        owners = _owning(shards, layer_name)
        for h in range(self.n_kv_heads):
            shard = next(s for s in owners if s.kv_head_start <= h < s.kv_head_end)
            k_plane, v_plane = shard.planes(layer_name, self.head_size)
            local = h - shard.kv_head_start
            keys = _read_slots(k_plane, slots, local)      # [L, head_size]
            values = _read_slots(v_plane, slots, local)    # [L, head_size_v]
            qh = q[h * group:(h + 1) * group]  # [group, head_size]
            probs = torch.softmax((qh @ keys.T) * self.scale, dim=-1)
            outs.append(probs @ values)
        return torch.cat(outs, dim=0).reshape(1, -1)

    @staticmethod
    def _call_wait(shards, layer_name: str) -> None:
        for shard in _owning(shards, layer_name):
            if shard.hooks is not None:
                shard.hooks.wait_for_layer_load(layer_name)

    def _call_save(self, shards, layer_name: str, default_meta) -> None:
        for shard in _owning(shards, layer_name):
            if shard.hooks is not None:
                shard.hooks.save_kv_layer(layer_name, shard.kv_caches[layer_name],
                                          shard.metadata_for(layer_name, default_meta))

    def _check_inputs(self, seqs, shards) -> None:
        for name in self.attention_layer_names:  # every layer's owning shards tile the heads
            heads = sorted((s.kv_head_start, s.kv_head_end) for s in _owning(shards, name))
            assert heads and heads[0][0] == 0 and heads[-1][1] == self.num_tp_heads and all(
                a[1] == b[0] for a, b in zip(heads, heads[1:])), f"shards must tile the heads of {name}: {heads}"
        for seq in seqs:
            assert len(seq.token_ids) == len(seq.positions) > 0
            p0 = int(seq.positions[0])
            assert list(seq.positions) == list(range(p0, p0 + len(seq.positions))), "positions must be consecutive"
            last_pos = int(seq.positions[-1])
            assert last_pos // self.block_size < len(seq.block_table), "block table too short"
            for name, table in (seq.layer_block_tables or {}).items():
                assert last_pos // seq.block_size_for(name, self.block_size) < len(table), "block table too short"
            assert int(seq.positions[-1]) < self.max_positions

    def layer_window(self, layer_index: int) -> Optional[int]:
        """The sliding window (tokens, the current one included) of a layer, None for full attention."""
        return (getattr(self, "sliding_window_layers", None) or {}).get(layer_index)

    def attended_positions(self, layer_index: int, pos: int) -> range:
        """The cached positions the token at `pos` reads in layer `layer_index`: [pos - W + 1, pos]
        for a sliding-window layer (vLLM's sliding_window semantics), [0, pos] otherwise."""
        window = self.layer_window(layer_index)
        return range(0 if window is None else max(0, pos - window + 1), pos + 1)


class _PagedDecoder(_PagedAttentionMixin):
    """forward/forward_batch of a decoder whose layers are attention + SwiGLU MLP. A subclass
    gives `_project(layer, h, pos) -> (query, cache_entry)`, `_store(shards, name, slot, entry)`
    and `_attention(shards, name, layer, query, slots) -> [1, width of layer.wo's input]`."""

    @torch.no_grad()
    def forward(self, token_ids: Sequence[int], positions: Sequence[int], block_table: Sequence[int],
                num_computed_tokens: int, kv_caches, hooks: Any = None, attn_metadata: Any = None) -> torch.Tensor:
        """One request: computes `token_ids` at `positions` (which must start at num_computed_tokens),
        writes their K/V to the slots of `block_table` and returns logits [n_new, vocab].
        `kv_caches` is a dict (all heads), or a list of KVShard (tensor parallel; then hooks come
        from the shards)."""
        assert int(positions[0]) == num_computed_tokens, "positions must start at num_computed_tokens"
        shards = _as_shards(self, kv_caches, hooks, attn_metadata)
        return self.forward_batch([SeqInput(token_ids, positions, block_table)], shards)[0]

    @torch.no_grad()
    def forward_batch(self, seqs: Sequence[SeqInput], kv_caches, before_layer: Any = None) -> list:
        """Several requests in one pass, layer-major like vLLM: for each layer, the hooks'
        wait_for_layer_load once, K/V of all new tokens written, attention per token, then
        save_kv_layer once. Returns one logits tensor [n_new, vocab] per request.
        before_layer (optional): called as before_layer(layer_index, layer_name) before each layer
        (the mini engine's pipeline stages hand over there)."""
        shards = _as_shards(self, kv_caches)
        self._check_inputs(seqs, shards)
        hidden = [[self.embed[int(t)].reshape(1, -1) for t in seq.token_ids] for seq in seqs]
        slot_cache: dict = {}

        def slots_of(seq, name):  # every position's slot through the layer's block table
            table = seq.table_for(name)
            key = (id(seq), id(table))
            if key not in slot_cache:
                slot_cache[key] = slot_mapping(table, range(int(seq.positions[-1]) + 1), self.block_size)
            return slot_cache[key]

        for li, (layer, name) in enumerate(zip(self.layers, self.attention_layer_names)):
            self._attention_layer(li, layer, name, seqs, hidden, shards, slots_of, before_layer)
        return [torch.cat([F.linear(_rms_norm(x, self.final_norm), self.lm_head) for x in xs]) for xs in hidden]

    def _attention_layer(self, li: int, layer, name: str, seqs, hidden: list, shards, slots_of,
                         before_layer: Any = None) -> None:
        """Layer `li` (attention + SwiGLU MLP) over every request, updating `hidden` in place:
        wait_for_layer_load, K/V of all new tokens written, attention per token, save_kv_layer."""
        all_slots = [slots_of(seq, name) for seq in seqs]
        default_meta = AttnMetadata(torch.cat([s[int(seq.positions[0]):] for s, seq in zip(all_slots, seqs)]))
        if before_layer is not None:
            before_layer(li, name)
        self._call_wait(shards, name)
        queries = []
        for seq, xs, slots in zip(seqs, hidden, all_slots):
            qs = []
            for x, pos in zip(xs, seq.positions):
                query, entry = self._project(layer, _rms_norm(x, layer.attn_norm), int(pos))
                self._store(shards, name, int(slots[int(pos)]), entry)
                qs.append(query)
            queries.append(qs)
        for seq, xs, slots, qs in zip(seqs, hidden, all_slots, queries):
            for i, (pos, q) in enumerate(zip(seq.positions, qs)):
                seen = self.attended_positions(li, int(pos))
                attn = self._attention(shards, name, layer, q, slots[seen.start:seen.stop])
                x = xs[i] + F.linear(attn, layer.wo)
                xs[i] = _swiglu_mlp(layer, x)
        self._call_save(shards, name, default_meta)


class TinyDecoder(_PagedDecoder, torch.nn.Module):
    """Decoder-only transformer (RMSNorm, RoPE, GQA attention, SwiGLU MLP, separate LM head), fp32, CPU.

    Construction is seeded: two `TinyDecoder(seed=s)` have identical weights.
    Widths are multiples of 16 floats by default so every row view is 64-byte aligned.
    head_size_v (default head_size) is V's width: vLLM's spec allows it to differ from K's
    (then only the "views" cache form can hold it).
    """

    def __init__(self, seed: int = 0, vocab: int = 101, d_model: int = 32, n_layers: int = 3, n_heads: int = 4,
                 n_kv_heads: int = 2, head_size: int = 8, block_size: int = 4, d_ff: int = 64,
                 max_positions: int = 1024, head_size_v: Optional[int] = None):
        super().__init__()
        assert n_heads % n_kv_heads == 0 and head_size % 2 == 0
        head_size_v = head_size if head_size_v is None else head_size_v
        self.seed, self.vocab, self.d_model, self.n_layers = seed, vocab, d_model, n_layers
        self.n_heads, self.n_kv_heads, self.head_size, self.block_size = n_heads, n_kv_heads, head_size, block_size
        self.head_size_v = head_size_v
        self.d_ff, self.max_positions = d_ff, max_positions
        self.scale = 1.0 / math.sqrt(head_size)
        w = _Weights(seed)
        self.embed = w.normal(vocab, d_model, scale=1.0)
        self.layers = torch.nn.ModuleList()
        for _ in range(n_layers):
            layer = torch.nn.Module()
            _add_attention(layer, w, d_model, n_heads, n_kv_heads, head_size, head_size_v)
            _add_swiglu_mlp(layer, w, d_model, d_ff)
            self.layers.append(layer)
        self.final_norm, self.lm_head = _final_norm_and_head(w, vocab, d_model)
        _register_rope(self, max_positions, head_size)
        self.attention_layer_names = [f"model.layers.{i}.self_attn.attn" for i in range(n_layers)]

    def _project(self, layer, h: torch.Tensor, pos: int) -> tuple:
        """(q [n_heads, head_size], (k, v)) of one token: RoPE'd q and k, plain v."""
        cos, sin = self.rope_cos[pos], self.rope_sin[pos]
        q = _apply_rope(F.linear(h, layer.wq).view(self.n_heads, self.head_size), cos, sin)
        k = _apply_rope(F.linear(h, layer.wk).view(self.n_kv_heads, self.head_size), cos, sin)
        v = F.linear(h, layer.wv).view(self.n_kv_heads, self.head_size_v)
        return q, (k, v)

    def _store(self, shards, layer_name: str, slot: int, entry: tuple) -> None:
        self._write_kv(shards, layer_name, slot, *entry)

    def _attention(self, shards, layer_name: str, layer, q: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        return self._attend(shards, layer_name, q, slots)


class TinyGemma(TinyDecoder):
    """TinyDecoder with sliding-window layers (the role of Gemma 2/3's or gpt-oss's local
    attention next to global attention): by default 2 layers, layer 0 full attention and layer 1
    sliding window of `sliding_window` tokens including the current one (vLLM's sliding_window:
    the token at position p reads positions [p - W + 1, p]). Same weights as TinyDecoder(seed,
    n_layers=...), same machinery, so it is as bit-exact and deterministic; the sliding-window
    layer reads only the window, through its own block table when the engine runs it with the
    hybrid KV cache manager (SeqInput.layer_block_tables), through the one table otherwise.

    sliding_window_layers: {layer index: window} (what make_kv_cache_config reads to build a
    FullAttentionSpec group and a SlidingWindowSpec group). Layer names
    "model.layers.{i}.self_attn.attn"."""

    def __init__(self, seed: int = 0, n_layers: int = 2, sliding_window: int = 8,
                 sliding_window_layers: Optional[dict] = None, block_size: int = 4, **kwargs):
        super().__init__(seed=seed, n_layers=n_layers, block_size=block_size, **kwargs)
        if sliding_window_layers is None:
            sliding_window_layers = {i: sliding_window for i in range(1, n_layers, 2)}  # odd layers local
        assert all(0 <= i < n_layers and w >= 1 for i, w in sliding_window_layers.items())
        self.sliding_window_layers = dict(sliding_window_layers)

    @property
    def sliding_window_layer_names(self) -> dict:
        """{layer name: window} of the sliding-window layers."""
        return {self.attention_layer_names[i]: w for i, w in self.sliding_window_layers.items()}

    def blocks_needed_to_resume(self, layer_index: int, num_computed_tokens: int) -> range:
        """Indices (into the block table) of the blocks of layer `layer_index` a resume at
        `num_computed_tokens` reads: all for full attention, the window's for a sliding layer."""
        n = num_computed_tokens
        if n == 0:
            return range(0)
        first = self.attended_positions(layer_index, n).start
        return range(first // self.block_size, (n - 1) // self.block_size + 1)


class TinyMLA(_PagedDecoder, torch.nn.Module):
    """Decoder with multi-head latent attention (DeepSeek-V2 style, the role of vLLM's MLA), fp32, CPU.

    Per layer and token only one latent vector is cached: [c | k_pe], head_size =
    kv_lora_rank + qk_rope_head_dim wide, with c = RMSNorm(W_dkv h) (the compressed KV) and
    k_pe = RoPE(W_kr h) (one rotary key shared by all heads). At attention time each query head i
    derives its keys and values from the cached latents: K_i = [W_uk_i c | k_pe], V_i = W_uv_i c;
    its query is [W_q_nope_i h | RoPE(W_q_rope_i h)]. So the cache has one "head" and no V
    (MLAAttentionSpec: num_kv_heads = 1, head_size_v = 0), and under tensor parallelism the query
    heads are split (num_tp_heads = n_heads) while every rank's cache holds the whole latent; head i
    reads the cache of the shard that owns it. Seeded and bit-exact like TinyDecoder.
    """

    use_mla = True
    n_kv_heads = 1  # what vLLM's ModelConfig reports for MLA
    head_size_v = 0

    def __init__(self, seed: int = 0, vocab: int = 101, d_model: int = 32, n_layers: int = 2, n_heads: int = 4,
                 kv_lora_rank: int = 8, qk_rope_head_dim: int = 8, qk_nope_head_dim: int = 8, v_head_dim: int = 8,
                 block_size: int = 4, d_ff: int = 64, max_positions: int = 1024):
        super().__init__()
        assert qk_rope_head_dim % 2 == 0
        self.seed, self.vocab, self.d_model, self.n_layers, self.n_heads = seed, vocab, d_model, n_layers, n_heads
        self.kv_lora_rank, self.qk_rope_head_dim = kv_lora_rank, qk_rope_head_dim
        self.qk_nope_head_dim, self.v_head_dim = qk_nope_head_dim, v_head_dim
        self.head_size = kv_lora_rank + qk_rope_head_dim  # the cached latent's width
        self.block_size, self.d_ff, self.max_positions = block_size, d_ff, max_positions
        self.scale = 1.0 / math.sqrt(qk_nope_head_dim + qk_rope_head_dim)
        w = _Weights(seed)
        self.embed = w.normal(vocab, d_model, scale=1.0)
        self.layers = torch.nn.ModuleList()
        for _ in range(n_layers):
            layer = torch.nn.Module()
            layer.attn_norm = w.norm(d_model)
            layer.w_dkv = w.normal(kv_lora_rank, d_model, scale=d_model ** -0.5)
            layer.kv_norm = w.norm(kv_lora_rank)
            layer.w_kr = w.normal(qk_rope_head_dim, d_model, scale=d_model ** -0.5)
            layer.wq_nope = w.normal(n_heads * qk_nope_head_dim, d_model, scale=d_model ** -0.5)
            layer.wq_rope = w.normal(n_heads * qk_rope_head_dim, d_model, scale=d_model ** -0.5)
            layer.w_uk = w.normal(n_heads * qk_nope_head_dim, kv_lora_rank, scale=kv_lora_rank ** -0.5)
            layer.w_uv = w.normal(n_heads * v_head_dim, kv_lora_rank, scale=kv_lora_rank ** -0.5)
            layer.wo = w.normal(d_model, n_heads * v_head_dim, scale=(n_heads * v_head_dim) ** -0.5)
            _add_swiglu_mlp(layer, w, d_model, d_ff)
            self.layers.append(layer)
        self.final_norm, self.lm_head = _final_norm_and_head(w, vocab, d_model)
        _register_rope(self, max_positions, qk_rope_head_dim)
        self.attention_layer_names = [f"model.layers.{i}.self_attn.attn" for i in range(n_layers)]

    @property
    def num_tp_heads(self) -> int:
        """Query heads: tensor parallelism splits them; the latent cache is replicated."""
        return self.n_heads

    def _project(self, layer, h: torch.Tensor, pos: int) -> tuple:
        """((q_nope [n_heads, nope], q_pe [n_heads, rope]), latent [1, head_size]) of one token."""
        cos, sin = self.rope_cos[pos], self.rope_sin[pos]
        c = _rms_norm(F.linear(h, layer.w_dkv), layer.kv_norm)
        k_pe = _apply_rope(F.linear(h, layer.w_kr), cos, sin)
        q_nope = F.linear(h, layer.wq_nope).view(self.n_heads, self.qk_nope_head_dim)
        q_pe = _apply_rope(F.linear(h, layer.wq_rope).view(self.n_heads, self.qk_rope_head_dim), cos, sin)
        return (q_nope, q_pe), torch.cat((c, k_pe), dim=-1)

    def _store(self, shards, layer_name: str, slot: int, latent: torch.Tensor) -> None:
        """Every rank caches the whole latent."""
        for shard in _owning(shards, layer_name):
            (plane,) = shard.planes(layer_name, self.head_size)
            _write_slot(plane, slot, latent)

    def _attention(self, shards, layer_name: str, layer, q: tuple, slots: torch.Tensor) -> torch.Tensor:
        """[1, n_heads * v_head_dim]: head i reads the latents of `slots` from its own shard's cache."""
        q_nope, q_pe = q
        r, dn, dv = self.kv_lora_rank, self.qk_nope_head_dim, self.v_head_dim
        outs = []
        owners = _owning(shards, layer_name)
        for i in range(self.n_heads):
            shard = next(s for s in owners if s.kv_head_start <= i < s.kv_head_end)
            (plane,) = shard.planes(layer_name, self.head_size)
            latents = _read_slots(plane, slots, 0)  # [L, head_size]
            c, k_pe = latents[:, :r], latents[:, r:]
            k_nope = F.linear(c, layer.w_uk[i * dn:(i + 1) * dn])  # [L, nope]
            values = F.linear(c, layer.w_uv[i * dv:(i + 1) * dv])  # [L, v_head_dim]
            scores = (q_nope[i:i + 1] @ k_nope.T + q_pe[i:i + 1] @ k_pe.T) * self.scale
            outs.append(torch.softmax(scores, dim=-1) @ values)
        return torch.cat(outs, dim=0).reshape(1, -1)


def greedy_generate(model, prompt: Sequence[int], max_new_tokens: int, return_logits: bool = False,
                    kv_format: str = "views", **allocate_kwargs):
    """Reference without any cache reuse: every new token recomputes the whole sequence from
    scratch in a fresh cache (KVCache.allocate(kv_format=..., **allocate_kwargs); the form does not
    change the numerics; a model with its own allocate_caches, TinyHybridRecurrent, uses that)
    and takes the argmax of the last position's logits.
    Returns the generated tokens (and, with return_logits, each step's last-position logits)."""
    tokens = list(prompt)
    out, logits_seen = [], []
    own_allocate = getattr(model, "allocate_caches", None)
    for _ in range(max_new_tokens):
        num_blocks = (len(tokens) + model.block_size - 1) // model.block_size
        if own_allocate is not None:
            caches = own_allocate(num_blocks + 1)
        else:
            caches = KVCache.allocate(model, num_blocks + 1, kv_format=kv_format, **allocate_kwargs)
        table = list(range(1, num_blocks + 1))  # block 0 left unused, like vLLM's null block
        logits = model(tokens, list(range(len(tokens))), table, 0, caches)[-1]
        nxt = int(torch.argmax(logits))
        out.append(nxt)
        logits_seen.append(logits)
        tokens.append(nxt)
    return (out, logits_seen) if return_logits else out


@dataclass
class HybridOutput:
    """logits [n_new, vocab]; `state` the recurrent state [d_state] after the last new token;
    `boundary_states[n]` the state after exactly n tokens, for every block boundary
    n (a multiple of block_size) crossed by this call."""
    logits: torch.Tensor
    state: torch.Tensor
    boundary_states: dict = field(default_factory=dict)


class TinyHybrid(_PagedAttentionMixin, torch.nn.Module):
    """Toy hybrid model: layer 0 sliding-window attention over a paged KV cache (window of
    `window` tokens including the current one, vLLM's sliding_window semantics), layer 1 a
    gated linear RNN (the role of a Mamba layer, named "model.layers.1.mixer"):

        a_t = sigmoid(W_a x_t + b_a)        u_t = W_u x_t
        s_t = a_t * s_{t-1} + (1 - a_t) * u_t           y_t = W_o s_t

    Resuming a request at token n needs (1) the K/V of positions [n - window + 1, n) in layer 0's
    cache and (2) the recurrent state after exactly n tokens. The state at a block boundary
    cannot be recovered from a later state: each update rounds a_t * s and (1 - a_t) * u to
    fp32 and mixes them, so s_{t-1} is not a function of s_t (and of the inputs) in floating
    point, and a gate near 0 erases it outright. A cache must therefore snapshot the state at
    every boundary it may resume from (what vLLM's Mamba "align" cache mode does), e.g. from
    `forward(...).boundary_states`.
    """

    def __init__(self, seed: int = 0, vocab: int = 101, d_model: int = 32, n_heads: int = 4, n_kv_heads: int = 2,
                 head_size: int = 8, block_size: int = 4, window: int = 8, d_state: int = 16, d_ff: int = 64,
                 max_positions: int = 1024):
        super().__init__()
        self.vocab, self.d_model, self.n_heads, self.n_kv_heads = vocab, d_model, n_heads, n_kv_heads
        self.head_size, self.block_size, self.window, self.d_state = head_size, block_size, window, d_state
        self.max_positions = max_positions
        self.scale = 1.0 / math.sqrt(head_size)
        w = _Weights(seed)
        self.embed = w.normal(vocab, d_model, scale=1.0)
        self.attn_norm = w.norm(d_model)
        self.wq = w.normal(n_heads * head_size, d_model, scale=d_model ** -0.5)
        self.wk = w.normal(n_kv_heads * head_size, d_model, scale=d_model ** -0.5)
        self.wv = w.normal(n_kv_heads * head_size, d_model, scale=d_model ** -0.5)
        self.wo = w.normal(d_model, n_heads * head_size, scale=(n_heads * head_size) ** -0.5)
        self.mix_norm = w.norm(d_model)
        self.w_a = w.normal(d_state, d_model, scale=d_model ** -0.5)
        self.b_a = w.normal(d_state, scale=1.0)
        self.w_u = w.normal(d_state, d_model, scale=d_model ** -0.5)
        self.w_out = w.normal(d_model, d_state, scale=d_state ** -0.5)
        self.mlp_norm = w.norm(d_model)
        self.w_up = w.normal(d_ff, d_model, scale=d_model ** -0.5)
        self.w_down = w.normal(d_model, d_ff, scale=d_ff ** -0.5)
        self.final_norm = w.norm(d_model)
        self.lm_head = w.normal(vocab, d_model, scale=2.0 * d_model ** -0.5)
        cos, sin = _rope_tables(max_positions, head_size)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.attention_layer_names = ["model.layers.0.self_attn.attn"]
        self.mixer_layer_name = "model.layers.1.mixer"

    def initial_state(self) -> torch.Tensor:
        return torch.zeros(self.d_state)

    def window_positions(self, pos: int) -> range:
        """Cached positions the token at `pos` attends to."""
        return range(max(0, pos - self.window + 1), pos + 1)

    def blocks_needed_to_resume(self, num_computed_tokens: int) -> range:
        """Indices (into the block table) of the blocks whose layer-0 K/V a resume at
        `num_computed_tokens` reads: those holding positions [n - window + 1, n)."""
        n = num_computed_tokens
        if n == 0:
            return range(0)
        first = max(0, n - self.window + 1)
        return range(first // self.block_size, (n - 1) // self.block_size + 1)

    @torch.no_grad()
    def forward(self, token_ids: Sequence[int], positions: Sequence[int], block_table: Sequence[int], kv_caches,
                state: Optional[torch.Tensor] = None, hooks: Any = None) -> HybridOutput:
        """Computes `token_ids` at consecutive `positions` starting from recurrent `state`
        (the state after positions[0] tokens; zeros when None and positions[0] == 0).
        Layer 0 writes K/V through `block_table` and reads only the window; the hooks see
        layer 0's name only (the recurrent state is not in the paged cache)."""
        shards = _as_shards(self, kv_caches, hooks)
        seq = SeqInput(token_ids, positions, block_table)
        self._check_inputs([seq], shards)
        if state is None:
            assert int(positions[0]) == 0, "a resume needs the recurrent state at positions[0]"
            state = self.initial_state()
        s = state.reshape(1, -1).clone()
        name = self.attention_layer_names[0]
        slots = slot_mapping(block_table, range(int(positions[-1]) + 1), self.block_size)
        self._call_wait(shards, name)
        xs, qs = [], []
        for t, pos in zip(token_ids, positions):
            pos = int(pos)
            x = self.embed[int(t)].reshape(1, -1)
            h = _rms_norm(x, self.attn_norm)
            cos, sin = self.rope_cos[pos], self.rope_sin[pos]
            qs.append(_apply_rope(F.linear(h, self.wq).view(self.n_heads, self.head_size), cos, sin))
            k = _apply_rope(F.linear(h, self.wk).view(self.n_kv_heads, self.head_size), cos, sin)
            v = F.linear(h, self.wv).view(self.n_kv_heads, self.head_size)
            self._write_kv(shards, name, int(slots[pos]), k, v)
            xs.append(x)
        for i, (pos, q) in enumerate(zip(positions, qs)):
            window = slots[self.window_positions(int(pos)).start:int(pos) + 1]
            xs[i] = xs[i] + F.linear(self._attend(shards, name, q, window), self.wo)
        self._call_save(shards, name, AttnMetadata(slots[int(positions[0]):]))
        logits, boundary = [], {}
        for i, pos in enumerate(positions):
            x = xs[i]
            h = _rms_norm(x, self.mix_norm)
            a = torch.sigmoid(F.linear(h, self.w_a) + self.b_a)
            s = a * s + (1.0 - a) * F.linear(h, self.w_u)
            x = x + F.linear(s, self.w_out)
            h = _rms_norm(x, self.mlp_norm)
            x = x + F.linear(F.relu(F.linear(h, self.w_up)), self.w_down)
            logits.append(F.linear(_rms_norm(x, self.final_norm), self.lm_head))
            if (int(pos) + 1) % self.block_size == 0:
                boundary[int(pos) + 1] = s.reshape(-1).clone()
        return HybridOutput(torch.cat(logits), s.reshape(-1).clone(), boundary)

    def state_at(self, token_ids: Sequence[int], num_tokens: int) -> torch.Tensor:
        """Recurrent state after the first `num_tokens` tokens, computed from scratch."""
        if num_tokens == 0:
            return self.initial_state()
        blocks = (num_tokens + self.block_size - 1) // self.block_size
        caches = KVCache.allocate(self, blocks)
        return self.forward(list(token_ids[:num_tokens]), list(range(num_tokens)), list(range(blocks)), caches).state


class TinyHybridRecurrent(_PagedDecoder, torch.nn.Module):
    """A hybrid model with a recurrent layer, as vLLM runs Jamba, Nemotron-H, Granite 4 or Qwen3-Next
    with the hybrid KV cache manager: layer 0 sliding-window attention ("model.layers.0.self_attn.attn",
    window `sliding_window` tokens, the current one included), layer 1 a recurrent mixer
    ("model.layers.1.mixer", the role of a Mamba/GDN layer), each followed by a SwiGLU MLP (the
    helpers and conventions of TinyDecoder/TinyGemma; its own weights, seeded).

    The mixer is a diagonal linear recurrence, fp32, scanned token by token:
        u_t = W_u x_t  [d_inner]     b_t = W_b x_t, c_t = W_c x_t  [d_state]
        H_t = A * H_{t-1} + u_t b_t^T          y_t = H_t c_t          x_t += W_out y_t
    with A in (0, 1) elementwise (fixed, sigmoid of seeded values) and H [d_inner, d_state] the
    state (640 bytes by default). Every step is one fixed-shape operation per token, so any
    chunking, batching or resume from a stored state gives bit-identical logits and states; the
    state after n tokens is not recoverable from a later one, so resuming at n needs exactly it.

    KV cache: a SlidingWindowSpec group and a MambaSpec group under vLLM's hybrid KV cache
    manager (sliding_window_layers = {0: W}, mamba_layer_indices = (1,), mamba_state_shapes,
    mamba_state_dtypes, read by mini_vllm's kv_cache_specs_for). The block size is raised as vLLM
    raises it (align_hybrid_block_size: the smallest multiple of kernel_block_alignment_size whose
    attention page holds a state, at least `block_size`; 8 tokens by default, an attention page of
    1024 bytes, the state's page padded from 640 to it). The state sits in the mixer's page of a
    block: the bytes of its [num_blocks, 1, 1, state bytes] int8 view, fp32 row-major; the model
    reads the initial state of a step from table entry cdiv(n, bs) - 1 (none when n = 0) and writes
    the final one to entry cdiv(n + new, bs) - 1, bs the Mamba group's block size
    (SeqInput.block_size_for; in vLLM's "align" mode the attention block size). Tensor parallelism
    shards the state's rows with the KV heads (d_inner / n_kv_heads rows per head): each rank's page
    holds its rows. The mixer calls no connector hooks (vLLM's maybe_transfer_kv_layer wraps
    attention only)."""

    def __init__(self, seed: int = 0, vocab: int = 101, d_model: int = 32, n_heads: int = 4, n_kv_heads: int = 2,
                 head_size: int = 8, sliding_window: int = 12, d_inner: int = 16, d_state: int = 10,
                 d_ff: int = 64, block_size: int = 4, kernel_block_alignment_size: int = 4,
                 max_positions: int = 1024):
        super().__init__()
        from mini_vllm.kv_cache_interface import align_hybrid_block_size
        assert n_heads % n_kv_heads == 0 and head_size % 2 == 0 and d_inner % n_kv_heads == 0
        self.seed, self.vocab, self.d_model, self.n_layers = seed, vocab, d_model, 2
        self.n_heads, self.n_kv_heads, self.head_size, self.head_size_v = n_heads, n_kv_heads, head_size, head_size
        self.d_inner, self.d_state, self.d_ff, self.max_positions = d_inner, d_state, d_ff, max_positions
        self.scale = 1.0 / math.sqrt(head_size)
        attn_page_size_1_token = n_kv_heads * 2 * head_size * 4  # fp32 K and V
        self.block_size, _ = align_hybrid_block_size(attn_page_size_1_token, self.state_bytes, block_size,
                                                     kernel_block_alignment_size)
        w = _Weights(seed)
        self.embed = w.normal(vocab, d_model, scale=1.0)
        attn = torch.nn.Module()
        _add_attention(attn, w, d_model, n_heads, n_kv_heads, head_size, head_size)
        _add_swiglu_mlp(attn, w, d_model, d_ff)
        mixer = torch.nn.Module()
        mixer.mix_norm = w.norm(d_model)
        mixer.w_u = w.normal(d_inner, d_model, scale=d_model ** -0.5)
        mixer.w_b = w.normal(d_state, d_model, scale=d_model ** -0.5)
        mixer.w_c = w.normal(d_state, d_model, scale=d_model ** -0.5)
        mixer.decay = torch.nn.Parameter(torch.sigmoid(w.normal(d_inner, d_state, scale=1.0) + 1.5),
                                         requires_grad=False)
        mixer.w_out = w.normal(d_model, d_inner, scale=d_inner ** -0.5)
        _add_swiglu_mlp(mixer, w, d_model, d_ff)
        self.layers = torch.nn.ModuleList([attn, mixer])
        self.final_norm, self.lm_head = _final_norm_and_head(w, vocab, d_model)
        _register_rope(self, max_positions, head_size)
        self.attention_layer_names = ["model.layers.0.self_attn.attn", "model.layers.1.mixer"]
        self.sliding_window_layers = {0: sliding_window}
        self.mamba_layer_indices = (1,)

    # What mini_vllm's kv_cache_specs_for reads.
    mamba_state_dtypes = (torch.float32,)

    def mamba_state_shapes(self, tensor_parallel_size: int = 1) -> tuple:
        """The state tensors of one rank: its share of the rows."""
        assert self.d_inner % tensor_parallel_size == 0
        return ((self.d_inner // tensor_parallel_size, self.d_state),)

    @property
    def state_bytes(self) -> int:
        return self.d_inner * self.d_state * 4

    @property
    def mixer_layer_name(self) -> str:
        return self.attention_layer_names[1]

    _project = TinyDecoder._project
    _store = TinyDecoder._store
    _attention = TinyDecoder._attention

    @torch.no_grad()
    def forward_batch(self, seqs: Sequence[SeqInput], kv_caches, before_layer: Any = None) -> list:
        """As _PagedDecoder.forward_batch, layer 1 being the recurrent mixer (no hooks)."""
        shards = _as_shards(self, kv_caches)
        self._check_inputs(seqs, shards)
        hidden = [[self.embed[int(t)].reshape(1, -1) for t in seq.token_ids] for seq in seqs]
        slot_cache: dict = {}

        def slots_of(seq, name):
            table = seq.table_for(name)
            if id(table) not in slot_cache:
                slot_cache[id(table)] = slot_mapping(table, range(int(seq.positions[-1]) + 1), self.block_size)
            return slot_cache[id(table)]

        for li, (layer, name) in enumerate(zip(self.layers, self.attention_layer_names)):
            if li in self.mamba_layer_indices:
                if before_layer is not None:
                    before_layer(li, name)
                self._recurrent_layer(layer, name, seqs, hidden, shards)
            else:
                self._attention_layer(li, layer, name, seqs, hidden, shards, slots_of, before_layer)
        return [torch.cat([F.linear(_rms_norm(x, self.final_norm), self.lm_head) for x in xs]) for xs in hidden]

    def _recurrent_layer(self, layer, name: str, seqs, hidden: list, shards) -> None:
        """The mixer + MLP over every request: each request's state read from its table, scanned
        over its new tokens, written back to its table."""
        owners = _owning(shards, name)
        for seq, xs in zip(seqs, hidden):
            table, bs = seq.table_for(name), seq.block_size_for(name, self.block_size)
            start, end = int(seq.positions[0]), int(seq.positions[-1]) + 1
            state = self.read_state(owners, name, table, start, bs)
            for i, x in enumerate(xs):
                h = _rms_norm(x, layer.mix_norm)
                u = F.linear(h, layer.w_u).reshape(-1, 1)  # [d_inner, 1]
                state = layer.decay * state + u * F.linear(h, layer.w_b)  # [d_inner, d_state]
                y = (state @ F.linear(h, layer.w_c).reshape(-1, 1)).reshape(1, -1)  # [1, d_inner]
                xs[i] = _swiglu_mlp(layer, x + F.linear(y, layer.w_out))
            self.write_state(owners, name, table, end, bs, state)

    def _state_rows(self, shard: KVShard) -> range:
        per_head = self.d_inner // self.n_kv_heads
        return range(shard.kv_head_start * per_head, shard.kv_head_end * per_head)

    def _state_view(self, shard: KVShard, name: str, block_id: int) -> torch.Tensor:
        """The fp32 state rows a shard's page of `block_id` holds (a view into the cache)."""
        rows = self._state_rows(shard)
        page = shard.kv_caches[name][block_id].reshape(-1)  # [state bytes] of the [B, 1, 1, C] view
        return page[:len(rows) * self.d_state * 4].view(torch.float32).view(len(rows), self.d_state)

    def read_state(self, shards, name: str, block_table: Sequence[int], num_computed_tokens: int,
                   block_size: int) -> torch.Tensor:
        """The state after `num_computed_tokens` tokens [d_inner, d_state]: zeros for 0, else the
        shards' rows of block table entry cdiv(n, block_size) - 1 (never the null block)."""
        if num_computed_tokens == 0:
            return torch.zeros(self.d_inner, self.d_state)
        block_id = int(block_table[-(-num_computed_tokens // block_size) - 1])
        assert block_id != 0, f"the state after {num_computed_tokens} tokens would be read from the null block"
        return torch.cat([self._state_view(s, name, block_id).clone() for s in shards])

    def write_state(self, shards, name: str, block_table: Sequence[int], num_tokens: int, block_size: int,
                    state: torch.Tensor) -> None:
        """Writes the state after `num_tokens` tokens to table entry cdiv(n, block_size) - 1."""
        block_id = int(block_table[-(-num_tokens // block_size) - 1])
        assert block_id != 0, "a recurrent state written to the null block"
        for s in shards:
            rows = self._state_rows(s)
            self._state_view(s, name, block_id).copy_(state[rows.start:rows.stop])

    def allocate_caches(self, num_blocks: int, layout=None, tensor_parallel_size: int = 1) -> dict:
        """dict layer name -> a zeroed "views" cache of its own (not overlaid, so one block table can
        serve both layers, as greedy_generate uses it), as mini_vllm's workers shape them."""
        from mini_vllm.kv_cache_interface import (KVCacheConfig, KVCacheGroupSpec, allocate_kv_caches,
                                                  kv_cache_specs_for, kv_cache_tensor_for)
        caches = {}
        for name, spec in kv_cache_specs_for(self, tensor_parallel_size).items():
            config = KVCacheConfig(num_blocks, [kv_cache_tensor_for(spec, [name], num_blocks, layout)],
                                   [KVCacheGroupSpec([name], spec)])
            caches.update(allocate_kv_caches(config, layout=layout))
        return caches

    def state_at(self, token_ids: Sequence[int], num_tokens: int) -> torch.Tensor:
        """The recurrent state [d_inner, d_state] after the first `num_tokens` tokens, computed from
        scratch (the reference for a stored or loaded state)."""
        if num_tokens == 0:
            return torch.zeros(self.d_inner, self.d_state)
        blocks = -(-num_tokens // self.block_size)
        caches = self.allocate_caches(blocks + 1)
        table = list(range(1, blocks + 1))
        self.forward(list(token_ids[:num_tokens]), list(range(num_tokens)), table, 0, caches)
        return self.read_state(_as_shards(self, caches), self.mixer_layer_name, table, num_tokens, self.block_size)
