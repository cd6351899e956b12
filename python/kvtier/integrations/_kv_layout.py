"""Moving one layer of a kvtier block between an engine's paged KV tensor
and the arena.

A kvtier block of B tokens is `B / block_size` consecutive engine blocks of
one request. Its bytes are layer-major (docs/KEYS.md, `layer_count` equal
layers); within a layer the bytes are exactly the engine tensor's slice for
those engine blocks, in the tensor's own dimension order:

- ``kv_first``: vLLM FlashAttention's ``[2, num_blocks, block_size, heads,
  head_size]`` -> a layer is ``[2, f, block_size, heads, head_size]``;
- ``blocks_first``: ``[num_blocks, 2, block_size, heads, head_size]`` -> a
  layer is ``[f, 2, block_size, heads, head_size]``.

The layout is part of the namespace (``kv_layout``), so engines laying out
their caches differently never share blocks.
"""

import warnings

import torch

LAYOUTS = ("kv_first", "blocks_first")


def detect_layout(tensor, num_blocks):
    """The layout of a per-layer paged KV tensor, or ValueError."""
    if tensor.dim() == 5 and tensor.shape[0] == 2 and tensor.shape[1] == num_blocks:
        return "kv_first"
    if tensor.dim() == 5 and tensor.shape[0] == num_blocks and tensor.shape[1] == 2:
        return "blocks_first"
    raise ValueError(f"unsupported KV cache tensor shape {tuple(tensor.shape)} for {num_blocks} blocks: "
                     f"expected [2, num_blocks, block_size, heads, head_size] or "
                     f"[num_blocks, 2, block_size, heads, head_size]")


def bytes_per_token(tensor):
    """K and V bytes of one token of one layer."""
    return 2 * tensor.shape[3] * tensor.shape[4] * tensor.element_size()


def _span_tensor(span, dtype):
    # A memoryview of arena bytes as a flat tensor, no copy. Read-only
    # spans make torch warn that writes would be undefined; we only read
    # them.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(span, dtype=torch.uint8).view(dtype)


def gather(tensor, layout, block_ids, span):
    """Copies the layer slice of engine blocks `block_ids` into `span`: for a
    CPU tensor in one pass straight into the arena, for a device tensor
    through one device-side gather and one copy to the host."""
    index = torch.as_tensor(block_ids, dtype=torch.long, device=tensor.device)
    dim = 1 if layout == "kv_first" else 0
    shape = list(tensor.shape)
    shape[dim] = len(block_ids)
    dst = _span_tensor(span, tensor.dtype).view(shape)
    if tensor.device.type == "cpu":
        torch.index_select(tensor, dim, index, out=dst)
    else:
        dst.copy_(torch.index_select(tensor, dim, index))
    del dst  # the span's memoryview must be free before the commit


def scatter(tensor, layout, block_ids, skip, span):
    """Copies a layer slice from `span` into engine blocks `block_ids`,
    leaving out the first `skip` of them (already computed locally)."""
    if skip >= len(block_ids):
        return
    f = len(block_ids)
    src = _span_tensor(span, tensor.dtype)
    if layout == "kv_first":
        src = src.view(2, f, *tensor.shape[2:])[:, skip:]
        index = torch.as_tensor(block_ids[skip:], dtype=torch.long, device=tensor.device)
        tensor[:, index] = src.to(tensor.device)
    else:
        src = src.view(f, *tensor.shape[1:])[skip:]
        index = torch.as_tensor(block_ids[skip:], dtype=torch.long, device=tensor.device)
        tensor[index] = src.to(tensor.device)
    del src
