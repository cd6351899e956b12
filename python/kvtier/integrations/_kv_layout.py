"""Moving one layer of a kvtier block between vLLM's paged KV tensors and
the arena, for every tensor form vLLM has handed connectors.

A kvtier block of B tokens is ``f = B / block_size`` consecutive engine
(manager) blocks of one request. Its bytes are layer-major (docs/KEYS.md,
``layer_count`` equal layers); a layer's bytes are one of these forms, named
in the namespace's ``kv_layout`` so that forms never share blocks:

- ``nhc`` (vLLM 0.28 and later, and older MLA): per engine block the
  tokens in order, each token all its head slots, each slot its packed
  content (K then V, or MLA's one latent vector): ``[f, block_size, H, C]``.
  It does not depend on the engine's physical ``KVCacheLayout`` (LBHNC,
  LBNHC, BLHNC, ...), on kernel block splitting or on page padding, so
  changing those keeps the cache. Current vLLM hands each layer a 4-D
  view ``[B', H, N', C]`` of a flat allocation (``create_kv_cache_views``,
  vllm/v1/kv_cache_interface.py; axis order from vllm/v1/kv_cache_layout.py
  @14f7a27c), where ``B' = num_blocks * r`` counts kernel blocks of
  ``N' = block_size / r`` tokens; older vLLM's MLA cache is the 3-D
  ``[num_blocks, block_size, C]``.
- ``kv_first`` (vLLM before 0.28, FlashAttention): the 5-D
  ``[2, num_blocks, block_size, heads, head_size]``; a layer is
  ``[2, f, block_size, heads, head_size]``.
- ``blocks_first`` (vLLM before 0.28, FlashInfer): the 5-D
  ``[num_blocks, 2, block_size, heads, head_size]``; a layer is
  ``[f, 2, block_size, heads, head_size]``.

Copies are strided views of the engine's own tensor: nothing here
reshapes the engine tensor into a copy.
"""

import warnings
from dataclasses import dataclass

import torch

FORMS = ("nhc", "kv_first", "blocks_first")


class Unsupported(Exception):
    """A KV cache kvtier cannot store faithfully; the message names why.
    The connector serves without the cache when it sees one."""


@dataclass(frozen=True)
class LayerForm:
    """How one layer's tensor maps to kvtier bytes: the form's name and the
    bytes of one engine block of one layer."""
    name: str
    block_bytes: int


def describe(tensor, num_blocks, block_size, page_bytes):
    """The LayerForm of a per-layer paged KV tensor of `num_blocks` engine
    blocks of `block_size` tokens whose unpadded page is `page_bytes`, or
    Unsupported naming what does not fit."""
    shape = tuple(tensor.shape)
    if tensor.dim() == 4:  # [B', H, N', C] views
        kernel_blocks, _, kernel_tokens, _ = shape
        if kernel_blocks % num_blocks or kernel_tokens * (kernel_blocks // num_blocks) != block_size:
            raise Unsupported(f"a KV view of shape {shape} does not split {num_blocks} blocks of {block_size} "
                              f"tokens into kernel blocks")
        form = "nhc"
    elif tensor.dim() == 3 and shape[0] == num_blocks and shape[1] == block_size:  # older MLA
        form = "nhc"
    elif tensor.dim() == 5 and shape[0] == 2 and shape[1] == num_blocks:
        form = "kv_first"
    elif tensor.dim() == 5 and shape[0] == num_blocks and shape[1] == 2:
        form = "blocks_first"
    else:
        raise Unsupported(f"a KV cache tensor of shape {shape} for {num_blocks} blocks is none of the forms "
                          f"kvtier knows ([B, H, N, C] views, [2, B, N, H, D], [B, 2, N, H, D], [B, N, C])")
    block_bytes = tensor.numel() // num_blocks * tensor.element_size()
    if block_bytes != page_bytes:
        raise Unsupported(f"a KV cache block of this tensor holds {block_bytes} bytes, the KV cache spec's page "
                          f"{page_bytes}: some bytes would not be stored")
    return LayerForm(form, block_bytes)


def _span_tensor(span, dtype):
    # A memoryview of arena bytes as a flat tensor, no copy. Read-only
    # spans make torch warn that writes would be undefined; we only read
    # them.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(span, dtype=torch.uint8).view(dtype)


def _nhc_view(tensor, num_blocks):
    """A view [num_blocks, r, N', H, C] of a 4-D [B', H, N', C] or 3-D
    [B, N, C] cache: manager block, kernel block, token, slot, content.
    Flattening its last four axes of one manager block gives the nhc bytes."""
    if tensor.dim() == 3:
        return tensor.unsqueeze(1).unsqueeze(3)
    return tensor.permute(0, 2, 1, 3).unflatten(0, (num_blocks, -1))


def block_index(tensor, block_ids):
    """The index tensor gather() and scatter() take for `block_ids` (build it
    once per save or load, not per layer). For a device tensor it is queued
    on the current stream through page-locked memory: a plain copy to the
    device would make the calling thread wait for that stream."""
    if tensor.device.type == "cpu":
        return torch.as_tensor(block_ids, dtype=torch.long)
    return torch.tensor(block_ids, dtype=torch.long).pin_memory().to(tensor.device, non_blocking=True)


def gather(tensor, form, block_ids, span, num_blocks, index=None):
    """Copies the layer slice of engine blocks `block_ids` into `span`: for a
    CPU tensor in one strided pass straight into the arena, for a device
    tensor through one gather on the device and one copy to the host, both
    queued on the current stream (asynchronous when the span is page-locked:
    the caller waits for the stream before the span's bytes count).
    `index`: block_index(tensor, block_ids), when the caller has it."""
    if index is None:
        index = block_index(tensor, block_ids)
    if form == "nhc":
        src = _nhc_view(tensor, num_blocks)
        dim = 0
    else:
        src, dim = tensor, (1 if form == "kv_first" else 0)
    shape = list(src.shape)
    shape[dim] = len(block_ids)
    dst = _span_tensor(span, tensor.dtype).view(shape)
    if tensor.device.type == "cpu":
        torch.index_select(src, dim, index, out=dst)
    else:
        if index.device.type == "cuda":  # made on another stream (the forward pass's): not reused before ours ran
            index.record_stream(torch.cuda.current_stream(index.device))
        dst.copy_(torch.index_select(src, dim, index), non_blocking=True)
    del dst  # the span's memoryview must be free before the commit


def scatter(tensor, form, block_ids, skip, span, num_blocks, index=None):
    """Copies a layer slice from `span` into engine blocks `block_ids`,
    leaving out the first `skip` of them (already computed locally). For a
    device tensor the span goes to the device in one copy (asynchronous when
    it is page-locked), then into the blocks, both queued on the current
    stream: the span must stay as it is until that stream ran them.
    `index`: block_index(tensor, block_ids[skip:]), when the caller has it."""
    if skip >= len(block_ids):
        return
    f = len(block_ids)
    src = _span_tensor(span, tensor.dtype)
    if tensor.device.type != "cpu":
        src = src.to(tensor.device, non_blocking=True)  # all of it: slicing on the host would copy there first
    # index_put_ (view[ids] = rows): faster than index_copy_ into these
    # strided views, and one call per block group (measured in
    # tests/python/bench_vllm_step.py).
    if index is None:
        index = torch.as_tensor(block_ids[skip:], dtype=torch.long, device=tensor.device)
    if form == "nhc":
        dst = _nhc_view(tensor, num_blocks)
        dst[index] = src.view(f, *dst.shape[1:])[skip:]
    elif form == "kv_first":
        tensor[:, index] = src.view(2, f, *tensor.shape[2:])[:, skip:]
    else:
        tensor[index] = src.view(f, *tensor.shape[1:])[skip:]
    del src
