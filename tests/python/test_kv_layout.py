"""The connector's byte forms (python/kvtier/integrations/_kv_layout.py)
against KV caches built as vLLM builds them (mini_vllm's mirror of
create_kv_cache_views): every KVCacheLayout, kernel block splitting, K and
V of different head sizes, MLA, padded pages, and older vLLM's 5-D and
3-D tensors. The stored bytes of a block are checked against a reference
read through the logical [B, H, N, C] axes one token at a time."""

import itertools

import pytest
import torch

from kvtier.integrations import _kv_layout
from kvtier.integrations._kv_layout import Unsupported
from mini_vllm.kv_cache_interface import (FullAttentionSpec, MLAAttentionSpec, create_kv_cache_views,
                                          kv_cache_tensor_for)
from mini_vllm.kv_cache_layout import KVCacheLayout

NUM_BLOCKS, BLOCK_SIZE, LAYERS = 6, 8, 2


def views(spec, layout, kernel_block_size=None, seed=0):
    """dict layer -> 4-D view of one flat int8 buffer, filled with seeded values."""
    names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
    tensor = kv_cache_tensor_for(spec, names, NUM_BLOCKS, layout)
    raw = torch.zeros(tensor.size, dtype=torch.int8)
    out = dict(zip(names, create_kv_cache_views(raw, spec, NUM_BLOCKS, layout, tensor, kernel_block_size)))
    gen = torch.Generator().manual_seed(seed)
    for v in out.values():
        v.copy_(torch.randn(v.shape, generator=gen).to(v.dtype))
    return out


def reference_nhc(view, block_ids):
    """[f, block_size, H, C] of the blocks, read one token at a time through
    the logical axes (kernel block b * r + t // N', offset t % N')."""
    kernel_tokens = view.shape[2]
    ratio = BLOCK_SIZE // kernel_tokens
    rows = []
    for b in block_ids:
        rows.append(torch.stack([view[b * ratio + t // kernel_tokens, :, t % kernel_tokens, :]
                                 for t in range(BLOCK_SIZE)]))
    return torch.stack(rows)


def span_of(nbytes):
    return memoryview(bytearray(nbytes))


SPECS = {
    "mha": FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=2, head_size=4, dtype=torch.float32),
    "mha_v_wider": FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=2, head_size=4, head_size_v=8,
                                     dtype=torch.bfloat16),
    "mla": MLAAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=12, dtype=torch.float16),
}


@pytest.mark.parametrize("layout,kernel,kind", itertools.product(list(KVCacheLayout), [None, 4], sorted(SPECS)))
def test_a_block_is_stored_in_the_same_bytes_whatever_the_physical_layout(layout, kernel, kind):
    spec = SPECS[kind]
    dense = kv_cache_tensor_for(spec, ["l"] * LAYERS, NUM_BLOCKS, layout).block_stride == spec.page_size_bytes
    if kernel is not None and not dense:
        with pytest.raises(ValueError, match="dense page"):  # vLLM refuses to split these too
            views(spec, layout, kernel)
        return
    caches = views(spec, layout, kernel)
    page = spec.real_page_size_bytes
    ids = [4, 1]
    for name, view in caches.items():
        form = _kv_layout.describe(view, NUM_BLOCKS, BLOCK_SIZE, page)
        assert form.name == "nhc" and form.block_bytes == page
        span = span_of(len(ids) * page)
        _kv_layout.gather(view, "nhc", ids, span, NUM_BLOCKS)
        want = reference_nhc(view, ids).contiguous().view(torch.uint8).reshape(-1)
        assert bytes(span) == bytes(want.numpy())


@pytest.mark.parametrize("src_layout,dst_layout", [(KVCacheLayout.LBNHC, KVCacheLayout.BLHNC),
                                                   (KVCacheLayout.BHLNC, KVCacheLayout.LBHNC),
                                                   (KVCacheLayout.LHBNC, KVCacheLayout.BLNHC)])
def test_a_block_saved_in_one_layout_loads_into_another(src_layout, dst_layout):
    spec = SPECS["mha_v_wider"]
    src, dst = views(spec, src_layout, seed=1), views(spec, dst_layout, seed=2)
    page = spec.real_page_size_bytes
    before = {n: v.clone() for n, v in dst.items()}
    for name in src:
        span = span_of(3 * page)
        _kv_layout.gather(src[name], "nhc", [2, 5, 3], span, NUM_BLOCKS)
        _kv_layout.scatter(dst[name], "nhc", [0, 4, 1], 1, span, NUM_BLOCKS)  # the first was computed locally
        assert torch.equal(dst[name][4], src[name][5]) and torch.equal(dst[name][1], src[name][3])
        for untouched in (0, 2, 3, 5):
            assert torch.equal(dst[name][untouched], before[name][untouched])


def test_kernel_split_and_whole_blocks_store_the_same_bytes():
    spec = SPECS["mha"]
    whole, split = views(spec, KVCacheLayout.LBHNC, None, seed=3), views(spec, KVCacheLayout.LBHNC, 2, seed=3)
    # Same flat buffer contents, two views of it: the stored bytes must agree.
    page = spec.real_page_size_bytes
    for name in whole:
        a, b = span_of(2 * page), span_of(2 * page)
        _kv_layout.gather(whole[name], "nhc", [1, 3], a, NUM_BLOCKS)
        for blk in (1, 3):  # write the whole-block tokens into the split view, token by token
            for t in range(BLOCK_SIZE):
                split[name][blk * 4 + t // 2, :, t % 2, :] = whole[name][blk, :, t, :]
        _kv_layout.gather(split[name], "nhc", [1, 3], b, NUM_BLOCKS)
        assert bytes(a) == bytes(b)


def test_padded_pages_store_only_the_content():
    spec = MLAAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=12, dtype=torch.float16,
                            page_size_padded=256)
    caches = views(spec, KVCacheLayout.LBHNC)
    page = spec.real_page_size_bytes
    assert page < spec.page_size_bytes
    for view in caches.values():
        assert _kv_layout.describe(view, NUM_BLOCKS, BLOCK_SIZE, page).block_bytes == page
        span = span_of(page)
        _kv_layout.gather(view, "nhc", [2], span, NUM_BLOCKS)
        assert bytes(span) == bytes(reference_nhc(view, [2]).contiguous().view(torch.uint8).reshape(-1).numpy())


def test_older_mla_tensors_share_the_form_of_current_views():
    spec = SPECS["mla"]
    view = next(iter(views(spec, KVCacheLayout.LBNHC, seed=4).values()))
    legacy = view[:, 0].contiguous()  # older vLLM: [num_blocks, block_size, head_size]
    page = spec.real_page_size_bytes
    assert _kv_layout.describe(legacy, NUM_BLOCKS, BLOCK_SIZE, page).name == "nhc"
    a, b = span_of(2 * page), span_of(2 * page)
    _kv_layout.gather(view, "nhc", [0, 5], a, NUM_BLOCKS)
    _kv_layout.gather(legacy, "nhc", [0, 5], b, NUM_BLOCKS)
    assert bytes(a) == bytes(b)


@pytest.mark.parametrize("form", ["kv_first", "blocks_first"])
def test_older_5d_tensors_round_trip(form):
    shape = (2, NUM_BLOCKS, BLOCK_SIZE, 2, 4) if form == "kv_first" else (NUM_BLOCKS, 2, BLOCK_SIZE, 2, 4)
    src = torch.randn(shape, generator=torch.Generator().manual_seed(5))
    dst = torch.zeros(shape)
    page = 2 * BLOCK_SIZE * 2 * 4 * 4
    assert _kv_layout.describe(src, NUM_BLOCKS, BLOCK_SIZE, page).name == form
    span = span_of(2 * page)
    _kv_layout.gather(src, form, [3, 1], span, NUM_BLOCKS)
    _kv_layout.scatter(dst, form, [2, 4], 0, span, NUM_BLOCKS)
    pick = (lambda t, i: t[:, i]) if form == "kv_first" else (lambda t, i: t[i])
    assert torch.equal(pick(dst, 2), pick(src, 3)) and torch.equal(pick(dst, 4), pick(src, 1))


def test_what_does_not_fit_is_unsupported_with_the_reason():
    view = next(iter(views(SPECS["mha"], KVCacheLayout.LBNHC).values()))
    page = SPECS["mha"].real_page_size_bytes
    with pytest.raises(Unsupported, match="spec's page"):
        _kv_layout.describe(view, NUM_BLOCKS, BLOCK_SIZE, page + 64)  # scales or padding not in the view
    with pytest.raises(Unsupported, match="kernel blocks"):
        _kv_layout.describe(view, NUM_BLOCKS - 1, BLOCK_SIZE, page)
    with pytest.raises(Unsupported, match="none of the forms"):
        _kv_layout.describe(torch.zeros(NUM_BLOCKS, 3), NUM_BLOCKS, BLOCK_SIZE, page)
