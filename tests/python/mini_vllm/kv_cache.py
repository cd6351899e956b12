"""Block pool, per-group managers, the coordinator and the KV cache manager, several KV cache
groups (vLLM's hybrid KV cache manager, "HMA") for full-attention, sliding-window and
recurrent-state (Mamba, "align" or "none" mode) groups.

Mirrored, rewritten here, from vLLM (vllm-project/vllm):
  vllm/v1/core/block_pool.py @c59cb7941357443da7c5eef75cfa8697d683d228
      one pool for all groups; the prefix cache is keyed by (block hash, group id)
      (BlockHashWithGroupId); get_cached_block(hash, group_ids) answers for every group or not
      at all; cache_full_blocks skips null blocks; block 0 is the null block, never handed out.
  vllm/v1/core/single_type_kv_cache_manager.py @129ab7c60cbb8eb11e875373e67f7e521b74aa30
      FullAttentionManager / SlidingWindowManager: get_num_skipped_tokens (sliding window:
      max(0, n - W + 1), the window being W tokens including the current one),
      get_num_blocks_to_allocate, allocate_new_computed_blocks (blocks before the window are
      the null block, for locally cached AND connector-loaded tokens: vLLM allocates real blocks
      only for the in-window part of num_external_computed_tokens), allocate_new_blocks,
      remove_skipped_blocks (frees out-of-window blocks, null block in their place),
      find_longest_cache_hit (full: left to right; sliding window: right to left, the first run
      of cdiv(W - 1, block_size) cached blocks, nulls before it; a run that reaches block 0 is a
      hit even when shorter); MambaManager (get_num_skipped_tokens = n - 1; in mamba_cache_mode
      "align": find_longest_cache_hit right to left, the last cached block with nulls before it;
      get_num_blocks_to_allocate / allocate_new_blocks: nulls up to the step's last block and one
      new block there; remove_skipped_blocks also frees last_state_block_idx; no speculative
      blocks, so num_tokens_main_model == num_tokens).
  vllm/v1/core/kv_cache_coordinator.py @00b08dc44519a82cbdd9061d92d1226985094622
      no-prefix-cache / unitary / hybrid coordinators; HybridKVCacheCoordinator's
      find_longest_cache_hit: full-attention groups first, each group type shortens the
      candidate length until all accept it (one pass for 1 full + 1 other type), full groups
      trimmed to the result; allocate_new_computed_blocks in two phases (every group's hit
      blocks touched, then every group's blocks for external tokens: add_local_computed_blocks /
      allocate_external_computed_blocks, here the two halves of @129ab7c6's one method).
  vllm/v1/core/kv_cache_manager.py @ace980e6de0540f49b0c63248437a1a7807590c1
      KVCacheBlocks (one list per group), allocate_slots (remove_skipped_blocks on the computed
      tokens BEFORE counting and allocating, then the computed blocks, then new blocks, then
      caching), get_blocks / get_block_ids (a tuple of one list per group); the newer
      remove_skipped_blocks(request_id, processed_computed_tokens, num_prompt_tokens) signature
      and get_block_ids_for_computed_tokens as the scheduler @00f4240e calls them.
Simplified: hash_block_size == block_size == the scheduler block size for every group (no
mixed block sizes but a "none"-mode Mamba group's, no fine-grained partial hits), no EAGLE, no
DCP/PCP, no cascade-attention common prefix, no retention interval, no KV events, no
chunked-local / cross-attention managers, no Mamba "all" mode, copy-on-write or partial-tail
pins (the boundary-state offers are the scheduler's, see scheduler.py). Freed blocks keep their
hash ("retained") until evicted by a new allocation, LRU first; a request's blocks are freed
tail first so they evict first.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from .kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheSpec, MambaSpec, SlidingWindowSpec
from .request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --------------------------------------------------------------------------
# Blocks and the block pool (vllm/v1/core/block_pool.py @c59cb794).
# --------------------------------------------------------------------------

class KVCacheBlock:
    """block_hash, once cached: (block hash, kv cache group id), vLLM's BlockHashWithGroupId."""

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self._block_hash: Optional[tuple] = None
        self.is_null = False

    @property
    def block_hash(self) -> Optional[tuple]:
        return self._block_hash

    @block_hash.setter
    def block_hash(self, value: tuple) -> None:
        assert self._block_hash is None, "the block already has a hash"
        self._block_hash = value

    def reset_hash(self) -> None:
        self._block_hash = None

    def __repr__(self):
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, hashed={self._block_hash is not None})"


class BlockPool:
    """One pool for every KV cache group. The null block (id 0) is never handed out, never cached
    and its reference count is not kept (touch and free skip it)."""

    def __init__(self, num_gpu_blocks: int, enable_caching: bool):
        assert num_gpu_blocks >= 2
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue: "OrderedDict[int, KVCacheBlock]" = OrderedDict((b.block_id, b) for b in self.blocks)
        self.cached_block_hash_to_block: dict = {}  # (hash, group id) -> {block_id: block}
        _, self.null_block = self.free_block_queue.popitem(last=False)
        self.null_block.is_null = True
        self.num_evictions = 0

    def get_num_free_blocks(self) -> int:
        return len(self.free_block_queue)

    def get_cached_block(self, block_hash: bytes, kv_cache_group_ids: Sequence[int] = (0,)) -> Optional[list]:
        """One cached block per group of kv_cache_group_ids, or None if any group misses."""
        out = []
        for gid in kv_cache_group_ids:
            blocks = self.cached_block_hash_to_block.get((block_hash, gid))
            if not blocks:
                return None
            out.append(next(iter(blocks.values())))
        return out

    def cache_full_blocks(self, request: Request, blocks: list, num_cached_blocks: int, num_full_blocks: int,
                          kv_cache_group_id: int = 0) -> None:
        for i in range(num_cached_blocks, num_full_blocks):
            blk = blocks[i]
            if blk.is_null:
                continue  # a sliding-window group's block outside the window
            key = (request.block_hashes[i], kv_cache_group_id)
            if blk.block_hash is not None:
                assert blk.block_hash == key, "a prefix-cache hit block has the wrong hash"
                continue
            blk.block_hash = key
            self.cached_block_hash_to_block.setdefault(key, {})[blk.block_id] = blk

    def _maybe_evict_cached_block(self, blk: KVCacheBlock) -> None:
        key = blk.block_hash
        if key is None:
            return
        group = self.cached_block_hash_to_block.get(key)
        if group is not None:
            group.pop(blk.block_id, None)
            if not group:
                del self.cached_block_hash_to_block[key]
        blk.reset_hash()
        self.num_evictions += 1

    def get_new_blocks(self, num_blocks: int) -> list:
        assert num_blocks <= self.get_num_free_blocks(), "not enough free blocks"
        out = []
        for _ in range(num_blocks):
            _, blk = self.free_block_queue.popitem(last=False)
            self._maybe_evict_cached_block(blk)
            assert blk.ref_cnt == 0
            blk.ref_cnt = 1
            out.append(blk)
        return out

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        for blk in blocks:
            if blk.is_null:
                continue
            if blk.ref_cnt == 0:
                del self.free_block_queue[blk.block_id]
            blk.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        for blk in ordered_blocks:
            if blk.is_null:
                continue
            blk.ref_cnt -= 1
            assert blk.ref_cnt >= 0
            if blk.ref_cnt == 0:
                self.free_block_queue[blk.block_id] = blk

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        for bid in block_ids:
            if bid != self.null_block.block_id:
                self._maybe_evict_cached_block(self.blocks[bid])

    def reset_prefix_cache(self) -> bool:
        if self.get_num_free_blocks() != self.num_gpu_blocks - 1:
            return False
        for blk in self.blocks:
            blk.reset_hash()
        self.cached_block_hash_to_block.clear()
        return True

    @property
    def usage(self) -> float:
        return 1.0 - self.get_num_free_blocks() / (self.num_gpu_blocks - 1)


@dataclass
class KVCacheBlocks:
    """vllm/v1/core/kv_cache_manager.py: blocks[group] is a list of KVCacheBlock (nulls included)."""
    blocks: tuple

    def get_block_ids(self, allow_none: bool = False) -> Optional[tuple]:
        if allow_none and all(len(g) == 0 for g in self.blocks):
            return None
        return tuple([b.block_id for b in g] for g in self.blocks)

    def get_unhashed_block_ids(self) -> list:
        assert len(self.blocks) == 1, "Only one group is supported"
        return [b.block_id for b in self.blocks[0] if b.block_hash is None]

    def get_unhashed_block_ids_all_groups(self) -> list:
        """Per group, the unhashed blocks' ids, null (padding) blocks left out."""
        return [[b.block_id for b in g if b.block_hash is None and not b.is_null] for g in self.blocks]

    def __add__(self, other: "KVCacheBlocks") -> "KVCacheBlocks":
        return KVCacheBlocks(tuple(list(a) + list(b) for a, b in zip(self.blocks, other.blocks)))

    def new_empty(self) -> "KVCacheBlocks":
        return KVCacheBlocks(tuple([] for _ in self.blocks))


# --------------------------------------------------------------------------
# Per-group managers (vllm/v1/core/single_type_kv_cache_manager.py @129ab7c6).
# --------------------------------------------------------------------------

class SingleTypeKVCacheManager:
    """The blocks of one KV cache group: req_to_blocks[request_id] is the group's block table
    (position-indexed: entry i holds tokens [i * block_size, (i + 1) * block_size), the null block
    for entries the group no longer needs)."""

    def __init__(self, kv_cache_spec: KVCacheSpec, block_pool: BlockPool, kv_cache_group_id: int,
                 enable_caching: bool):
        self.kv_cache_spec = kv_cache_spec
        self.block_size = kv_cache_spec.block_size
        self.block_pool = block_pool
        self.kv_cache_group_id = kv_cache_group_id
        self.enable_caching = enable_caching
        self.req_to_blocks: dict = defaultdict(list)
        self.num_cached_block: dict = {}
        self._null_block = block_pool.null_block

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Tokens before the attention window of the next token (full attention: none)."""
        return 0

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int, new_computed_blocks: Sequence,
                                   total_computed_tokens: int) -> int:
        num_required = cdiv(num_tokens, self.block_size)
        num_req_blocks = len(self.req_to_blocks.get(request_id, ()))
        if request_id in self.num_cached_block:
            assert len(new_computed_blocks) == 0  # a running request has no new prefix hits
            return max(num_required - num_req_blocks, 0)
        num_skipped_blocks = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        num_local_blocks = len(new_computed_blocks) + num_req_blocks
        num_new = max(num_required - max(num_skipped_blocks, num_local_blocks), 0)
        # Touched hit blocks that sit in the free queue (ref 0) leave it: count them too.
        skipped_hits = max(0, num_skipped_blocks - num_req_blocks)
        evictable = sum(1 for b in new_computed_blocks[skipped_hits:] if b.ref_cnt == 0 and not b.is_null)
        return num_new + evictable

    def add_local_computed_blocks(self, request_id: str, new_computed_blocks: Sequence,
                                  num_local_computed_tokens: int, num_external_computed_tokens: int) -> None:
        """A new request's local hit blocks, touched, after null blocks for what falls before the
        window of the hit point (local + external tokens): the first part of vLLM's
        allocate_new_computed_blocks."""
        if request_id in self.num_cached_block:
            assert len(new_computed_blocks) == 0  # a running request has no new prefix hits
            return
        req_blocks = self.req_to_blocks[request_id]
        assert not req_blocks
        total = num_local_computed_tokens + num_external_computed_tokens
        num_skipped_blocks = self.get_num_skipped_tokens(total) // self.block_size
        new_computed_blocks = list(new_computed_blocks)[num_skipped_blocks:]
        if self.enable_caching:
            self.block_pool.touch(new_computed_blocks)
        else:
            assert not any(new_computed_blocks), "computed blocks without prefix caching"
        req_blocks.extend([self._null_block] * num_skipped_blocks)
        req_blocks.extend(new_computed_blocks)
        self.num_cached_block[request_id] = len(req_blocks)  # hits (and nulls) are cached already

    def allocate_external_computed_blocks(self, request_id: str, num_local_computed_tokens: int,
                                          num_external_computed_tokens: int) -> None:
        """New blocks for the connector's tokens that are inside the window of the hit point (the
        rest got null blocks): the second part of vLLM's allocate_new_computed_blocks."""
        total = num_local_computed_tokens + num_external_computed_tokens
        num_skipped = self.get_num_skipped_tokens(total)
        if min(total - num_skipped, num_external_computed_tokens) <= 0:
            return  # every external token is before the window
        req_blocks = self.req_to_blocks[request_id]
        need = cdiv(total, self.block_size) - len(req_blocks)
        if need > 0:
            req_blocks.extend(self.block_pool.get_new_blocks(need))

    def allocate_new_computed_blocks(self, request_id: str, new_computed_blocks: Sequence,
                                     num_local_computed_tokens: int, num_external_computed_tokens: int) -> None:
        self.add_local_computed_blocks(request_id, new_computed_blocks, num_local_computed_tokens,
                                       num_external_computed_tokens)
        if num_external_computed_tokens > 0:
            self.allocate_external_computed_blocks(request_id, num_local_computed_tokens,
                                                   num_external_computed_tokens)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list:
        req_blocks = self.req_to_blocks[request_id]
        num_new = cdiv(num_tokens, self.block_size) - len(req_blocks)
        if num_new <= 0:
            return []
        new_blocks = self.block_pool.get_new_blocks(num_new)
        req_blocks.extend(new_blocks)
        return new_blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        num_cached = self.num_cached_block.get(request.request_id, 0)
        num_full = num_tokens // self.block_size
        if num_cached >= num_full:
            return
        self.block_pool.cache_full_blocks(request, self.req_to_blocks[request.request_id], num_cached, num_full,
                                          self.kv_cache_group_id)
        self.num_cached_block[request.request_id] = num_full

    def free(self, request_id: str) -> None:
        blocks = self.req_to_blocks.pop(request_id, [])
        self.block_pool.free_blocks(reversed(blocks))
        self.num_cached_block.pop(request_id, None)

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        """Frees the blocks the next token's attention no longer reads; the null block takes their
        place in the block table (walking back from the last skipped block to the first null)."""
        num_skipped = self.get_num_skipped_tokens(total_computed_tokens)
        if num_skipped <= 0:
            return
        blocks = self.req_to_blocks[request_id]
        num_skipped_blocks = min(num_skipped // self.block_size, len(blocks))
        removed = []
        for i in range(num_skipped_blocks - 1, -1, -1):
            if blocks[i] is self._null_block:
                break  # everything before was nulled by an earlier call
            removed.append(blocks[i])
            blocks[i] = self._null_block
        self.block_pool.free_blocks(removed)

    @classmethod
    def find_longest_cache_hit(cls, block_hashes: Sequence[bytes], max_length: int, kv_cache_group_ids: list,
                               block_pool: BlockPool, kv_cache_spec: KVCacheSpec) -> tuple:
        """(one list of hit blocks per group of kv_cache_group_ids, hit length in tokens)."""
        raise NotImplementedError


class FullAttentionManager(SingleTypeKVCacheManager):
    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, kv_cache_group_ids, block_pool, kv_cache_spec):
        computed = tuple([] for _ in kv_cache_group_ids)
        bs = kv_cache_spec.block_size
        for h in block_hashes[:max_length // bs]:
            hit = block_pool.get_cached_block(h, kv_cache_group_ids)
            if hit is None:
                break  # a chain: nothing after a miss can be cached
            for blocks, blk in zip(computed, hit):
                blocks.append(blk)
        return computed, len(computed[0]) * bs


class SlidingWindowManager(SingleTypeKVCacheManager):
    def __init__(self, kv_cache_spec: SlidingWindowSpec, *args, **kwargs):
        super().__init__(kv_cache_spec, *args, **kwargs)
        self.sliding_window = kv_cache_spec.sliding_window

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        # The token at position n reads [n - W + 1, n]: the first n - W + 1 are skipped.
        return max(0, num_computed_tokens - self.sliding_window + 1)

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, kv_cache_group_ids, block_pool, kv_cache_spec):
        bs = kv_cache_spec.block_size
        needed = cdiv(kv_cache_spec.sliding_window - 1, bs)  # the window before the hit point, in blocks
        max_blocks = max_length // bs
        computed = tuple([block_pool.null_block] * max_blocks for _ in kv_cache_group_ids)
        run, found = 0, False
        for i in range(max_blocks - 1, -1, -1):
            hit = block_pool.get_cached_block(block_hashes[i], kv_cache_group_ids)
            if hit is None:
                run = 0
                continue
            for blocks, blk in zip(computed, hit):
                blocks[i] = blk
            run += 1
            if run >= needed:
                for blocks in computed:
                    del blocks[i + run:]
                found = True
                break
        if not found:
            for blocks in computed:  # a run starting at block 0 is a hit even if shorter
                del blocks[run:]
        return computed, len(computed[0]) * bs


class MambaManager(SingleTypeKVCacheManager):
    """A recurrent-state (Mamba/GDN) group (single_type_kv_cache_manager.py @129ab7c6 MambaManager,
    no speculative blocks). The table is position-indexed like an attention group's, but only the
    block(s) holding live state are real: the state after tokens [0, k * block_size) lives in entry
    k - 1. The recurrent kernel reads the state of a step from entry cdiv(num_computed, block_size)
    - 1 (none when num_computed is 0) and writes it to entry cdiv(num_computed + num_scheduled,
    block_size) - 1.

    "align" mode (block_size = the attention block size): a step that enters a new block gets one
    new block there, nulls before it (allocate_new_blocks); the state block of the step before is
    freed one step later (remove_skipped_blocks: everything before the entry the next step reads,
    plus last_state_block_idx, which a chunk spanning several blocks leaves behind), so it is
    intact while the step that reads it runs. A local hit of n blocks needs the state at n *
    block_size cached: find_longest_cache_hit takes, right to left, the last cached block, nulls
    before it. External (connector) tokens get nulls up to the last block of the hit and one new
    block there, which the connector fills (SingleTypeKVCacheManager's allocation with
    get_num_skipped_tokens = num_computed - 1).
    "none" mode (block_size = max_model_len, prefix caching off): one block per request, read
    and written in place."""

    def __init__(self, kv_cache_spec: MambaSpec, *args, **kwargs):
        super().__init__(kv_cache_spec, *args, **kwargs)
        self.mamba_cache_mode = kv_cache_spec.mamba_cache_mode
        assert kv_cache_spec.num_speculative_blocks == 0, "speculative Mamba blocks are not modelled"
        # Align mode: the table index of the state block allocated the step before, freed once the
        # request has computed past it; and the requests whose first allocation is done.
        self.last_state_block_idx: dict = {}
        self._allocated_block_reqs: set = set()

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        # Only the state after the last computed token is needed.
        return num_computed_tokens - 1

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, kv_cache_group_ids, block_pool, kv_cache_spec):
        bs = kv_cache_spec.block_size
        computed = tuple([] for _ in kv_cache_group_ids)
        for i in range(max_length // bs - 1, -1, -1):  # right to left: the last boundary with a state
            hit = block_pool.get_cached_block(block_hashes[i], kv_cache_group_ids)
            if hit is not None:
                for blocks, blk in zip(computed, hit):
                    blocks.extend([block_pool.null_block] * i)
                    blocks.append(blk)
                break
        return computed, len(computed[0]) * bs

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        super().remove_skipped_blocks(request_id, total_computed_tokens)
        if self.mamba_cache_mode != "align":
            return
        last = self.last_state_block_idx.get(request_id)
        if last is not None and last < cdiv(total_computed_tokens, self.block_size) - 1:
            blocks = self.req_to_blocks[request_id]
            if blocks[last] is not self._null_block:
                self.block_pool.free_blocks([blocks[last]])
                blocks[last] = self._null_block

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int, new_computed_blocks: Sequence,
                                   total_computed_tokens: int) -> int:
        if self.mamba_cache_mode != "align":
            return super().get_num_blocks_to_allocate(request_id, num_tokens, new_computed_blocks,
                                                      total_computed_tokens)
        num_new = cdiv(num_tokens, self.block_size) - len(new_computed_blocks) - len(
            self.req_to_blocks.get(request_id, ()))
        num_new = min(num_new, 1)  # at most one new state block per step
        evictable = sum(1 for b in new_computed_blocks if b.ref_cnt == 0 and not b.is_null)
        return max(num_new, 0) + evictable

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list:
        if self.mamba_cache_mode != "align":
            return super().allocate_new_blocks(request_id, num_tokens)
        req_blocks = self.req_to_blocks[request_id]
        num_required = cdiv(num_tokens, self.block_size)
        if num_required == len(req_blocks):
            return []
        assert num_required > len(req_blocks), f"{num_required} blocks required, the table has {len(req_blocks)}"
        prev_len = len(req_blocks)
        if prev_len > 0:  # the running state's block, or the state of a (local or external) hit
            self.last_state_block_idx[request_id] = prev_len - 1
        req_blocks.extend([self._null_block] * max(0, num_required - 1 - prev_len))
        new_blocks = self.block_pool.get_new_blocks(num_required - len(req_blocks))
        assert len(new_blocks) == 1
        req_blocks.extend(new_blocks)
        self._allocated_block_reqs.add(request_id)
        return req_blocks[prev_len:]

    def free(self, request_id: str) -> None:
        self._allocated_block_reqs.discard(request_id)
        self.last_state_block_idx.pop(request_id, None)
        super().free(request_id)


def manager_class_for(spec: KVCacheSpec) -> type:
    """spec_manager_map: FullAttentionSpec (MLA, and sliding-window layers under a disabled hybrid
    manager, which record their window in the spec) -> FullAttentionManager; SlidingWindowSpec ->
    SlidingWindowManager; MambaSpec -> MambaManager."""
    if isinstance(spec, SlidingWindowSpec):
        return SlidingWindowManager
    if isinstance(spec, FullAttentionSpec):
        return FullAttentionManager
    if isinstance(spec, MambaSpec):
        return MambaManager
    raise NotImplementedError(f"the mini engine has no manager for {type(spec).__name__}")


# --------------------------------------------------------------------------
# The coordinator (vllm/v1/core/kv_cache_coordinator.py @00b08dc4).
# --------------------------------------------------------------------------

def _is_unaligned_mamba(spec: KVCacheSpec) -> bool:
    return isinstance(spec, MambaSpec) and spec.mamba_cache_mode != "align"


class KVCacheCoordinator:
    """One manager per group over one BlockPool. find_longest_cache_hit: no prefix caching -> no
    hit; one group -> that group's; several (HybridKVCacheCoordinator) -> the longest length
    every group type accepts."""

    def __init__(self, kv_cache_config: KVCacheConfig, max_model_len: int, enable_caching: bool):
        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        groups = kv_cache_config.kv_cache_groups
        assert groups, "the mini engine needs at least one KV cache group"
        # One block size for all groups, but for Mamba groups in "none" mode (one block of
        # max_model_len tokens), which vLLM allows only without prefix caching.
        sizes = {g.kv_cache_spec.block_size for g in groups if not _is_unaligned_mamba(g.kv_cache_spec)}
        assert len(sizes) <= 1, "the mini engine has one block size for all groups"
        self.block_size = sizes.pop() if sizes else groups[0].kv_cache_spec.block_size
        assert not (enable_caching and any(_is_unaligned_mamba(g.kv_cache_spec) for g in groups)), \
            "Mamba groups with prefix caching need mamba_cache_mode 'align'"
        self.block_pool = BlockPool(kv_cache_config.num_blocks, enable_caching)
        self.single_type_managers = tuple(
            manager_class_for(g.kv_cache_spec)(g.kv_cache_spec, self.block_pool, i, enable_caching)
            for i, g in enumerate(groups))
        # Hybrid lookup order: groups of one spec looked up together, full attention first.
        spec_groups: list = []
        for i, g in enumerate(groups):
            for sg in spec_groups:
                if sg[0] == g.kv_cache_spec:
                    sg[1].append(i)
                    break
            else:
                spec_groups.append((g.kv_cache_spec, [i]))
        spec_groups.sort(key=lambda sg: not isinstance(sg[0], FullAttentionSpec))
        self.attention_groups = [(spec, ids, manager_class_for(spec)) for spec, ids in spec_groups]

    def get_num_blocks_to_allocate(self, request_id: str, num_tokens: int, new_computed_blocks: tuple,
                                   total_computed_tokens: int) -> int:
        return sum(m.get_num_blocks_to_allocate(request_id, num_tokens, new_computed_blocks[i], total_computed_tokens)
                   for i, m in enumerate(self.single_type_managers))

    def allocate_new_computed_blocks(self, request_id: str, new_computed_blocks: tuple,
                                     num_local_computed_tokens: int, num_external_computed_tokens: int) -> None:
        if any(request_id in m.num_cached_block for m in self.single_type_managers):
            assert all(len(b) == 0 for b in new_computed_blocks)
            return
        # Two phases (vLLM issue #33775): touch every group's hit blocks first, then allocate the
        # external tokens' blocks, so one group's allocation cannot evict another's hit.
        for i, m in enumerate(self.single_type_managers):
            m.add_local_computed_blocks(request_id, new_computed_blocks[i], num_local_computed_tokens,
                                        num_external_computed_tokens)
        if num_external_computed_tokens > 0:
            for m in self.single_type_managers:
                m.allocate_external_computed_blocks(request_id, num_local_computed_tokens,
                                                    num_external_computed_tokens)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> tuple:
        return tuple(m.allocate_new_blocks(request_id, num_tokens) for m in self.single_type_managers)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        for m in self.single_type_managers:
            m.cache_blocks(request, num_computed_tokens)

    def free(self, request_id: str) -> None:
        for m in self.single_type_managers:
            m.free(request_id)

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        for m in self.single_type_managers:
            m.remove_skipped_blocks(request_id, total_computed_tokens)

    def get_blocks(self, request_id: str) -> tuple:
        return tuple(list(m.req_to_blocks.get(request_id) or []) for m in self.single_type_managers)

    def find_longest_cache_hit(self, block_hashes: Sequence[bytes], max_cache_hit_length: int) -> tuple:
        n = len(self.single_type_managers)
        if not self.enable_caching:
            return tuple([] for _ in range(n)), 0
        if n == 1:
            spec, ids, cls = self.attention_groups[0]
            return cls.find_longest_cache_hit(block_hashes, max_cache_hit_length, ids, self.block_pool, spec)
        hit_length = max_cache_hit_length
        blocks_by_group: list = [None] * n
        length_by_group = [0] * n
        simple = len(self.attention_groups) == 2 and isinstance(self.attention_groups[0][0], FullAttentionSpec)
        while True:
            curr = hit_length
            for spec, ids, cls in self.attention_groups:
                if isinstance(spec, FullAttentionSpec) and blocks_by_group[ids[0]] is not None:
                    curr = min(curr, length_by_group[ids[0]])  # downward closed: looked up once
                    continue
                hit_blocks, curr = cls.find_longest_cache_hit(block_hashes, curr, ids, self.block_pool, spec)
                for gid, blocks in zip(ids, hit_blocks):
                    blocks_by_group[gid], length_by_group[gid] = blocks, curr
            if curr >= hit_length:
                break
            hit_length = curr
            if simple:
                break
        for spec, ids, _ in self.attention_groups:
            if isinstance(spec, FullAttentionSpec):
                for gid in ids:
                    if blocks_by_group[gid] is not None:
                        del blocks_by_group[gid][cdiv(hit_length, self.block_size):]
        return tuple(b if b is not None else [] for b in blocks_by_group), hit_length


# --------------------------------------------------------------------------
# The KV cache manager (vllm/v1/core/kv_cache_manager.py @ace980e6).
# --------------------------------------------------------------------------

class KVCacheManager:
    def __init__(self, kv_cache_config: KVCacheConfig, max_model_len: int, enable_caching: bool):
        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.coordinator = KVCacheCoordinator(kv_cache_config, max_model_len, enable_caching)
        self.block_size = self.coordinator.block_size
        self.block_pool = self.coordinator.block_pool
        self.num_kv_cache_groups = len(kv_cache_config.kv_cache_groups)
        self.empty_kv_cache_blocks = KVCacheBlocks(tuple([] for _ in range(self.num_kv_cache_groups)))

    @property
    def single_type_managers(self) -> tuple:
        return self.coordinator.single_type_managers

    @property
    def req_to_blocks(self) -> dict:
        """Group 0's block tables (the one group of a non-hybrid model)."""
        return self.single_type_managers[0].req_to_blocks

    @property
    def num_cached_block(self) -> dict:
        return self.single_type_managers[0].num_cached_block

    def has_blocks(self, request_id: str) -> bool:
        return any(request_id in m.req_to_blocks for m in self.single_type_managers)

    def get_computed_blocks(self, request: Request) -> tuple:
        """Longest locally cached prefix every group accepts, at most num_tokens - 1 tokens."""
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return self.empty_kv_cache_blocks, 0
        blocks, num_tokens = self.coordinator.find_longest_cache_hit(request.block_hashes, request.num_tokens - 1)
        return KVCacheBlocks(tuple(list(b) for b in blocks)), num_tokens

    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: Optional[KVCacheBlocks] = None, num_lookahead_tokens: int = 0,
                       num_external_computed_tokens: int = 0, delay_cache_blocks: bool = False
                       ) -> Optional[KVCacheBlocks]:
        if num_new_tokens == 0 and num_external_computed_tokens == 0:
            raise ValueError("num_new_tokens must be greater than 0 when there are no external computed tokens")
        computed = new_computed_blocks.blocks if new_computed_blocks is not None else self.empty_kv_cache_blocks.blocks
        num_local_computed = request.num_computed_tokens + num_new_computed_tokens
        total_computed = min(num_local_computed + num_external_computed_tokens, self.max_model_len)
        num_tokens_main = total_computed + num_new_tokens
        need_slots = min(num_tokens_main + num_lookahead_tokens, self.max_model_len)
        # Free what the window left behind before counting (and maybe evicting) new blocks.
        self.coordinator.remove_skipped_blocks(request.request_id, total_computed)
        to_allocate = self.coordinator.get_num_blocks_to_allocate(
            request.request_id, need_slots, computed, num_local_computed + num_external_computed_tokens)
        if to_allocate > self.block_pool.get_num_free_blocks():
            return None
        if any(computed) or num_external_computed_tokens > 0:
            self.coordinator.allocate_new_computed_blocks(request.request_id, computed, num_local_computed,
                                                          num_external_computed_tokens)
        new_blocks = self.coordinator.allocate_new_blocks(request.request_id, need_slots)
        if self.enable_caching and not delay_cache_blocks:
            self.coordinator.cache_blocks(request, min(total_computed + num_new_tokens, request.num_tokens))
        return KVCacheBlocks(tuple(list(b) for b in new_blocks))

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        if self.enable_caching:
            self.coordinator.cache_blocks(request, num_computed_tokens)

    def free(self, request: Request) -> None:
        self.coordinator.free(request.request_id)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks(self.coordinator.get_blocks(request_id))

    def get_block_ids(self, request_id: str) -> tuple:
        """One list per group; a sliding-window group's out-of-window entries are 0 (the null block)."""
        return self.get_blocks(request_id).get_block_ids()

    def get_block_ids_for_computed_tokens(self, request_id: str, num_computed_tokens: int) -> tuple:
        return tuple(ids[:cdiv(num_computed_tokens, g.kv_cache_spec.block_size)]
                     for g, ids in zip(self.kv_cache_config.kv_cache_groups, self.get_block_ids(request_id)))

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int,
                              num_prompt_tokens: Optional[int] = None) -> None:
        """num_prompt_tokens is for vLLM's R-SWA groups, which the mini engine does not have."""
        self.coordinator.remove_skipped_blocks(request_id, processed_computed_tokens)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    @property
    def usage(self) -> float:
        return self.block_pool.usage
