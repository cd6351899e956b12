"""A small stand-in of SGLang's hierarchical cache (HiCache) flow around a
real tiny model, so a prefix reuse through KvtierStorage can be checked bit
for bit (test_sglang_real_model.py).

Read from sgl-project/sglang:
- managers/cache_controller.py @001067ff: write() (device -> host pages,
  then write_storage -> backup thread -> _page_backup: batch_set_v1 per
  STORAGE_BATCH_SIZE pages, stop at the first failed batch),
  prefetch -> _storage_hit_query (page hashes of the tokens after the last
  matched hash, batch_exists per batch, stop at the first short batch),
  _page_transfer / _page_get_zero_copy (batch_get_v1 into the host slots,
  count pages up to the first failure), load() (host -> device slots);
  attach_storage_backend (interface_v1 selects the zero-copy functions,
  prefetch_threshold = max(threshold, page_size)).
- mem_cache/memory_pool.py (the index lists upstream's at @14c3feee; the
  excerpts read came without a commit): MHATokenToKVPool's k_buffer[layer]
  and v_buffer[layer], [size + page_size, head_num, head_dim], and
  MLATokenToKVPool's kv_buffer[layer], [size + page_size, 1, kv_cache_dim],
  indexed by token slot, slot 0's page padded for dummy writes.
- mem_cache/hiradix_cache.py (upstream's is listed at @263bc85d; excerpts
  without a commit): write_backup_storage hands the node's host_value, key
  and hash_value to write_storage once the device -> host write is acked.
- get_hash_str (mem_cache/hicache_storage.py; a stored copy whose commit the
  search tool did not show; the controller @001067ff calls it from
  mem_cache/utils with page_size for a list of page hashes): SHA-256 over the
  prior page's digest bytes, then each token as u32 little-endian, chained
  page by page: sglang_fakes.page_keys.
The host pool is sglang_fakes.MHATokenToKVPoolHost (pool_host/mha.py
@0047d999), page_first.

What it simplifies: everything runs synchronously on the caller's thread
(SGLang's backup, prefetch and I/O threads and their acks collapse into
calls in the same order); the radix tree is a dict page hash -> device page
(a page-granular prefix match, no eviction, nothing is freed); one request
at a time; the prompt's full pages are backed up right after its prefill
(write_backup, then write_backup_storage at once instead of on the write
ack), decoded tokens are not; a prefetch runs whenever the storage part is
at least prefetch_threshold tokens (SGLang's default threshold is 256; here
page_size); a hit leaves at least one prompt token to compute (a request
always computes its last prompt token).

The device cache: one tensor per layer in the model's "legacy_kv_first"
form [2, pages, page_size, heads, head_size]; k_buffer[layer] and
v_buffer[layer] are views [pages * page_size, heads, head_size] of it, so a
token slot is SGLang's index and the model reads the same memory through a
page table (page = slot // page_size), its paged-attention entry point.
page_size must be the model's block_size. For TinyMLA the device pool is
MLATokenToKVPool's kv_buffer[layer] (a view of the model's 3-D MLA cache
[pages, page_size, latent]) and the host pool
sglang_fakes.MLATokenToKVPoolHost (pool_host/mla.py @01c0ede3), page_first
[size, layer, 1, kv_cache_dim].
"""

import torch

from sglang_fakes import HiCacheStorageExtraInfo, MHATokenToKVPoolHost, MLATokenToKVPoolHost, page_keys
from tiny_model import TinyDecoder, TinyMLA

STORAGE_BATCH_SIZE = 128


class MHATokenToKVPool:
    """MHATokenToKVPool: k_buffer/v_buffer per layer indexed by token slot;
    page 0 is the padded page (never allocated)."""

    def __init__(self, model: TinyDecoder, num_pages: int):
        self.page_size, self.layer_num = model.block_size, model.n_layers
        self.head_num, self.head_dim = model.n_kv_heads, model.head_size
        self.size = (num_pages - 1) * self.page_size
        self.kv_caches = {}
        self.k_buffer, self.v_buffer = [], []
        for name in model.attention_layer_names:
            cache = torch.zeros((2, num_pages, self.page_size, self.head_num, self.head_dim), dtype=torch.float32)
            self.kv_caches[name] = cache
            self.k_buffer.append(cache[0].view(-1, self.head_num, self.head_dim))
            self.v_buffer.append(cache[1].view(-1, self.head_num, self.head_dim))
        self._free = list(range(1, num_pages))

    def alloc_pages(self, n):
        """n device pages (page ids); None when the pool is out of pages."""
        if n > len(self._free):
            return None
        pages, self._free = self._free[:n], self._free[n:]
        return pages

    def host_pool(self, page_num):
        return MHATokenToKVPoolHost("page_first", page_num, self.page_size, self.layer_num, self.head_num,
                                    self.head_dim, dtype=torch.float32)

    def slots(self, pages):
        return torch.tensor([p * self.page_size + t for p in pages for t in range(self.page_size)],
                            dtype=torch.int64)


class MLATokenToKVPool(MHATokenToKVPool):
    """MLATokenToKVPool: one kv_buffer[layer] [slots, 1, kv_cache_dim] (the
    latent c then k_pe) indexed by token slot; page 0 is the padded page."""

    def __init__(self, model: TinyMLA, num_pages: int):
        self.page_size, self.layer_num = model.block_size, model.n_layers
        self.kv_lora_rank, self.qk_rope_head_dim = model.kv_lora_rank, model.qk_rope_head_dim
        self.kv_cache_dim = model.head_size
        self.size = (num_pages - 1) * self.page_size
        self.kv_caches = {}
        self.kv_buffer = []
        for name in model.attention_layer_names:
            cache = torch.zeros((num_pages, self.page_size, self.kv_cache_dim), dtype=torch.float32)
            self.kv_caches[name] = cache
            self.kv_buffer.append(cache.view(-1, 1, self.kv_cache_dim))
        self._free = list(range(1, num_pages))

    def host_pool(self, page_num):
        return MLATokenToKVPoolHost(page_num, self.page_size, self.layer_num, self.kv_lora_rank,
                                    self.qk_rope_head_dim, dtype=torch.float32)


class HostAllocator:
    """SGLang's host page allocator over an MHA/MLATokenToKVPoolHost (the
    sglang_fakes pools, used as they are: KvtierStorage checks the exact
    class), and the pool's two transfer directions
    (backup_from_device_all_layer, load_to_device_per_layer, all layers at
    once, page_first indexing: MHA kv_buffer[0 for K, 1 for V][slot, layer],
    MLA kv_buffer[slot, layer])."""

    def __init__(self, pool: MHATokenToKVPoolHost):
        self.pool, self.page_size, self._next = pool, pool.page_size, 0

    def alloc(self, n_tokens):
        """Host token slots of n_tokens // page_size fresh pages; None when full."""
        pages = n_tokens // self.page_size
        if self._next + pages > self.pool.size // self.page_size:
            return None
        first, self._next = self._next, self._next + pages
        return torch.arange(first * self.page_size, (first + pages) * self.page_size, dtype=torch.int64)

    def backup_from_device(self, device: MHATokenToKVPool, host_indices, device_indices):
        for layer in range(self.pool.layer_num):
            if isinstance(device, MLATokenToKVPool):
                self.pool.kv_buffer[host_indices, layer] = device.kv_buffer[layer][device_indices]
                continue
            self.pool.kv_buffer[0, host_indices, layer] = device.k_buffer[layer][device_indices]
            self.pool.kv_buffer[1, host_indices, layer] = device.v_buffer[layer][device_indices]

    def load_to_device(self, device: MHATokenToKVPool, host_indices, device_indices):
        for layer in range(self.pool.layer_num):
            if isinstance(device, MLATokenToKVPool):
                device.kv_buffer[layer][device_indices] = self.pool.kv_buffer[host_indices, layer]
                continue
            device.k_buffer[layer][device_indices] = self.pool.kv_buffer[0, host_indices, layer]
            device.v_buffer[layer][device_indices] = self.pool.kv_buffer[1, host_indices, layer]


class MiniSGLang:
    """One engine: device pool (MHA, or MLA for a model with use_mla), host
    pool, an optional storage backend (a registered HiCacheStorage, e.g.
    KvtierStorage) and the model."""

    def __init__(self, model, storage=None, device_pages=64, host_pages=64):
        self.model, self.storage = model, storage
        pool_class = MLATokenToKVPool if getattr(model, "use_mla", False) else MHATokenToKVPool
        self.device = pool_class(model, device_pages)
        self.host_pool = self.device.host_pool(host_pages)
        self.host = HostAllocator(self.host_pool)
        self.page_size = self.device.page_size
        assert self.page_size == model.block_size, "SGLang's page_size must be the model's block size"
        self.prefetch_threshold = self.page_size
        self.tree = {}  # page hash -> device page (the radix tree's device values)
        self.backed_up = set()  # page hashes written to storage by this engine
        self.last = {}  # what the last request did

    # ---- the request path ----

    def generate(self, tokens, max_new_tokens, backup=True):
        """Runs one request: prefix match (device tree, then storage
        prefetch), prefill of the rest, greedy decode. Returns (new tokens,
        logits of every computed prompt position's last row then of each
        decode step): a list of [vocab] tensors, the first from the prefill."""
        tokens = list(tokens)
        hashes = page_keys(tokens, self.page_size)
        limit = (len(tokens) - 1) // self.page_size  # leave one token to compute
        pages = []
        for h in hashes[:limit]:
            if h not in self.tree:
                break
            pages.append(self.tree[h])
        local = len(pages)
        fetched = self._prefetch_and_load(hashes[local:limit], pages) if self.storage is not None else 0
        computed = (local + fetched) * self.page_size
        total = len(tokens) + max_new_tokens
        need = -(-total // self.page_size) - len(pages)
        fresh = self.device.alloc_pages(need)
        assert fresh is not None, "device pool too small"
        table = pages + fresh
        logits = self.model(tokens[computed:], list(range(computed, len(tokens))), table, computed,
                            self.device.kv_caches)
        steps = [logits[-1]]
        prompt_pages = len(tokens) // self.page_size
        for i, h in enumerate(hashes[:prompt_pages]):
            self.tree.setdefault(h, table[i])
        if backup and self.storage is not None:
            self._write_backup(hashes[:prompt_pages], table[:prompt_pages])
        out, seq = [], list(tokens)
        for _ in range(max_new_tokens):
            nxt = int(torch.argmax(steps[-1]))
            out.append(nxt)
            seq.append(nxt)
            if len(out) == max_new_tokens:
                break
            pos = len(seq) - 1
            steps.append(self.model([nxt], [pos], table, pos, self.device.kv_caches)[-1])
        self.last = dict(local_hit_tokens=local * self.page_size, storage_hit_tokens=fetched * self.page_size,
                         computed_tokens=computed, prefill_logits=logits, block_table=table)
        return out, steps

    # ---- HiCacheController ----

    def _write_backup(self, hashes, device_pages):
        """write (device -> host) then write_storage -> _page_backup
        (batch_set_v1 per batch, stop at the first failed batch)."""
        todo = [(h, p) for h, p in zip(hashes, device_pages) if h not in self.backed_up]
        if not todo:
            return 0
        host_indices = self.host.alloc(len(todo) * self.page_size)
        if host_indices is None:
            return 0
        self.host.backup_from_device(self.device, host_indices, self.device.slots([p for _, p in todo]))
        keys = [h for h, _ in todo]
        done = 0
        for i in range(0, len(keys), STORAGE_BATCH_SIZE):
            batch = keys[i:i + STORAGE_BATCH_SIZE]
            idx = host_indices[i * self.page_size:(i + len(batch)) * self.page_size]
            if not all(self.storage.batch_set_v1(batch, idx, HiCacheStorageExtraInfo())):
                break
            self.backed_up.update(batch)
            done += len(batch)
        return done

    def _prefetch_and_load(self, hashes, pages):
        """_storage_hit_query (batch_exists per batch), host alloc,
        _page_transfer (batch_get_v1, pages up to the first failure), then
        load() of the fetched host pages into fresh device pages, which
        join `pages` and the tree. Returns the pages fetched."""
        if len(hashes) * self.page_size < self.prefetch_threshold:
            return 0
        hit = []
        for start in range(0, len(hashes), STORAGE_BATCH_SIZE):
            batch = hashes[start:start + STORAGE_BATCH_SIZE]
            n = self.storage.batch_exists(batch, HiCacheStorageExtraInfo())
            hit += batch[:n]
            if n < len(batch):
                break
        if not hit:
            return 0
        host_indices = self.host.alloc(len(hit) * self.page_size)
        if host_indices is None:
            return 0
        done = 0
        for i in range(0, len(hit), STORAGE_BATCH_SIZE):
            batch = hit[i:i + STORAGE_BATCH_SIZE]
            idx = host_indices[i * self.page_size:(i + len(batch)) * self.page_size]
            results = self.storage.batch_get_v1(batch, idx, HiCacheStorageExtraInfo())
            n = next((j for j, ok in enumerate(results) if not ok), len(batch))
            done += n
            if n != len(batch):
                break
        if done == 0:
            return 0
        device_pages = self.device.alloc_pages(done)
        assert device_pages is not None, "device pool too small"
        self.host.load_to_device(self.device, host_indices[:done * self.page_size], self.device.slots(device_pages))
        for h, p in zip(hit[:done], device_pages):
            self.tree[h] = p
        pages += device_pages
        return done
