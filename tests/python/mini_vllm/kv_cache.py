"""Block pool, KVCacheBlocks and KV cache manager (vllm/v1/core/block_pool.py, kv_cache_manager.py)."""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from dataclasses import dataclass
from typing import Iterable, Optional

from .kv_cache_interface import KVCacheConfig
from .request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --------------------------------------------------------------------------
# Block pool and KV cache manager (vllm/v1/core/block_pool.py,
# kv_cache_manager.py, one group). Block 0 is the null block, never handed out.
# Freed blocks keep their hash ("retained") until evicted by a new allocation,
# LRU first; a request's blocks are freed tail first so they evict first.
# --------------------------------------------------------------------------

class KVCacheBlock:
    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self._block_hash: Optional[bytes] = None
        self.is_null = False

    @property
    def block_hash(self) -> Optional[bytes]:
        return self._block_hash

    @block_hash.setter
    def block_hash(self, value: bytes) -> None:
        assert self._block_hash is None, "the block already has a hash"
        self._block_hash = value

    def reset_hash(self) -> None:
        self._block_hash = None

    def __repr__(self):
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, hashed={self._block_hash is not None})"


class BlockPool:
    def __init__(self, num_gpu_blocks: int, enable_caching: bool):
        assert num_gpu_blocks >= 2
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue: "OrderedDict[int, KVCacheBlock]" = OrderedDict((b.block_id, b) for b in self.blocks)
        self.cached_block_hash_to_block: dict = {}  # hash -> {block_id: block}
        _, self.null_block = self.free_block_queue.popitem(last=False)
        self.null_block.is_null = True
        self.num_evictions = 0

    def get_num_free_blocks(self) -> int:
        return len(self.free_block_queue)

    def get_cached_block(self, block_hash: bytes) -> Optional[KVCacheBlock]:
        blocks = self.cached_block_hash_to_block.get(block_hash)
        return next(iter(blocks.values())) if blocks else None

    def cache_full_blocks(self, request: Request, blocks: list, num_cached_blocks: int, num_full_blocks: int) -> None:
        for i in range(num_cached_blocks, num_full_blocks):
            blk = blocks[i]
            if blk.block_hash is None:
                blk.block_hash = request.block_hashes[i]
            self.cached_block_hash_to_block.setdefault(blk.block_hash, {})[blk.block_id] = blk

    def _maybe_evict_cached_block(self, blk: KVCacheBlock) -> None:
        h = blk.block_hash
        if h is None:
            return
        group = self.cached_block_hash_to_block.get(h)
        if group is not None:
            group.pop(blk.block_id, None)
            if not group:
                del self.cached_block_hash_to_block[h]
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
            if blk.ref_cnt == 0 and not blk.is_null:
                del self.free_block_queue[blk.block_id]
            blk.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        for blk in ordered_blocks:
            blk.ref_cnt -= 1
            assert blk.ref_cnt >= 0
            if blk.ref_cnt == 0 and not blk.is_null:
                self.free_block_queue[blk.block_id] = blk

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        for bid in block_ids:
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
    """vllm/v1/core/kv_cache_manager.py: blocks[group] is a list of KVCacheBlock."""
    blocks: tuple

    def get_block_ids(self, allow_none: bool = False) -> Optional[tuple]:
        if allow_none and all(len(g) == 0 for g in self.blocks):
            return None
        return tuple([b.block_id for b in g] for g in self.blocks)

    def get_unhashed_block_ids(self) -> list:
        assert len(self.blocks) == 1
        return [b.block_id for b in self.blocks[0] if b.block_hash is None]

    def __add__(self, other: "KVCacheBlocks") -> "KVCacheBlocks":
        return KVCacheBlocks(tuple(list(a) + list(b) for a, b in zip(self.blocks, other.blocks)))

    def new_empty(self) -> "KVCacheBlocks":
        return KVCacheBlocks(tuple([] for _ in self.blocks))


class KVCacheManager:
    def __init__(self, kv_cache_config: KVCacheConfig, max_model_len: int, enable_caching: bool):
        assert len(kv_cache_config.kv_cache_groups) == 1, "the mini engine has one KV-cache group"
        self.kv_cache_config = kv_cache_config
        self.block_size = kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(kv_cache_config.num_blocks, enable_caching)
        self.req_to_blocks: dict = defaultdict(list)
        self.num_cached_block: dict = {}
        self.empty_kv_cache_blocks = KVCacheBlocks(([],))

    def get_computed_blocks(self, request: Request) -> tuple:
        """Longest locally cached prefix of full blocks, at most num_tokens - 1 tokens."""
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return self.empty_kv_cache_blocks, 0
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hits = []
        for h in request.block_hashes[:max_hit_blocks]:
            blk = self.block_pool.get_cached_block(h)
            if blk is None:
                break
            hits.append(blk)
        return KVCacheBlocks((hits,)), len(hits) * self.block_size

    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: Optional[KVCacheBlocks] = None, num_lookahead_tokens: int = 0,
                       num_external_computed_tokens: int = 0, delay_cache_blocks: bool = False
                       ) -> Optional[KVCacheBlocks]:
        computed = list(new_computed_blocks.blocks[0]) if new_computed_blocks is not None else []
        num_local_computed = request.num_computed_tokens + num_new_computed_tokens
        total_computed = min(num_local_computed + num_external_computed_tokens, self.max_model_len)
        need_slots = min(total_computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        req_blocks = self.req_to_blocks[request.request_id]
        to_allocate = max(0, cdiv(need_slots, self.block_size) - len(req_blocks) - len(computed))
        evictable_computed = sum(1 for b in computed if b.ref_cnt == 0 and not b.is_null)
        if to_allocate > self.block_pool.get_num_free_blocks() - evictable_computed:
            return None
        if computed:
            assert not req_blocks, "computed blocks are only added to a request without blocks"
            self.block_pool.touch(computed)
            req_blocks.extend(computed)
            self.num_cached_block[request.request_id] = len(computed)
        new_blocks = self.block_pool.get_new_blocks(to_allocate)
        req_blocks.extend(new_blocks)
        if self.enable_caching and not delay_cache_blocks:
            self.cache_blocks(request, min(total_computed + num_new_tokens, request.num_tokens))
        return KVCacheBlocks((new_blocks,))

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        if not self.enable_caching:
            return
        num_full = num_computed_tokens // self.block_size
        num_cached = self.num_cached_block.get(request.request_id, 0)
        if num_cached >= num_full:
            return
        self.block_pool.cache_full_blocks(request, self.req_to_blocks[request.request_id], num_cached, num_full)
        self.num_cached_block[request.request_id] = num_full

    def free(self, request: Request) -> None:
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.block_pool.free_blocks(reversed(blocks))
        self.num_cached_block.pop(request.request_id, None)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        return KVCacheBlocks((list(self.req_to_blocks.get(request_id, [])),))

    def get_block_ids(self, request_id: str) -> tuple:
        return self.get_blocks(request_id).get_block_ids()

    def get_block_ids_for_computed_tokens(self, request_id: str, num_computed_tokens: int) -> tuple:
        (ids,) = self.get_block_ids(request_id)
        return (ids[:cdiv(num_computed_tokens, self.block_size)],)

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int) -> None:
        return  # full attention skips nothing

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    @property
    def usage(self) -> float:
        return self.block_pool.usage
