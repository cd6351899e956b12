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
- mem_cache/hiradix_cache.py @263bc85d: write_backup (controller.write;
  when the host pool is short, evict_host(len) and write again; nothing
  when still short), write_backup_storage on the write's ack
  (writing_check), insert (a new node is written through at once under
  write_through; a node evicted from the device takes the recomputed
  value), evict (device leaves, those whose children are all evicted, by
  the eviction strategy's priority, LRU = last_access_time; skip lock_ref
  > 0; a node backed up to host only frees its device indices,
  _evict_backuped; one that is not is freed and deleted, _evict_regular; the
  parent joins the heap once its children are all evicted), evict_host
  (leaves with no children; only nodes evicted from the device and with
  host_ref_counter 0 free their host indices and leave the tree; a parent
  left childless and evicted joins the heap), match_prefix (device value
  up to the last node on device, host_hit_length over the evicted nodes
  after it), load_back (the evicted nodes from the last hit up, all or
  none, none under load_back_threshold = 10 tokens; evict(len) and load
  again when the device is short), prefetch_from_storage (protect_host on
  the last host node, then the storage part) and _insert_helper_host (the
  fetched pages join the tree with only a host value).
- mem_cache/radix_cache.py @006b0e3d: TreeNode (evicted = value is None,
  backuped = host_value is not None, last_access_time), cache_finished_req
  (insert the page-aligned prefix, free the duplicates already in the tree
  and the unaligned tail), _match_prefix_helper touching each node.
- The later tree cache (unified_radix_cache.py, read without a commit) and
  the controller @001067ff allocate the prefetch's host pages only for the
  storage hit, after the hit query (prefetch_thread_func leaves the
  allocate-or-revoke decision to the scheduler's drain), evicting from host
  when short: the order followed here.
- get_hash_str (mem_cache/hicache_storage.py; a stored copy whose commit the
  search tool did not show; the controller @001067ff calls it from
  mem_cache/utils with page_size for a list of page hashes): SHA-256 over the
  prior page's digest bytes, then each token as u32 little-endian, chained
  page by page: sglang_fakes.page_keys.
The host pool is sglang_fakes.MHATokenToKVPoolHost (pool_host/mha.py
@0047d999), page_first.

What it simplifies: everything runs synchronously on the caller's thread
(SGLang's backup, prefetch and I/O threads and their acks collapse into
calls in the same order: a prefetch completes before the request is
scheduled, as the "wait_complete" policy makes it); one request at a time;
the radix tree is a dict page hash -> node with one node per page (SGLang's
nodes span several pages and are split on a partial match; here a page is
evicted, loaded or freed alone where SGLang moves a whole node); eviction
frees exactly as SGLang's does (evict(n) / evict_host(n) when an
allocation is short, then the allocation again), LRU over a counter
bumped once per request instead of a clock; the running request's pages
are skipped by both evictions (lock_ref and protect_host collapsed into
one set); write_through policy only (a new page is written to host, then
to storage, as soon as the request finishes; SGLang's
write_through_selective waits for a second hit); the prompt's full pages
join the tree, decoded tokens do not (SGLang inserts them too; in the
benchmark the next round's prompt never repeats them); a page this engine
already stored is not set again; a prefetch runs whenever the storage part
is at least prefetch_threshold tokens (SGLang's default threshold is 256;
here page_size) and no rate limit applies; when the host pool cannot hold
the whole hit even after evict_host there is no prefetch (later SGLang
fetches the prefix that fits); a hit leaves at least one prompt token to
compute (a request always computes its last prompt token). The pools are
sized in pages (device_pages counts the padded page 0, host_pages the host
pool's pages; SGLang sizes the host pool by hicache_ratio, 2 by default):
with the defaults (64 and 64) the tests' requests never evict.

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

import heapq

import torch

from sglang_fakes import HiCacheStorageExtraInfo, MHATokenToKVPoolHost, MLATokenToKVPoolHost, page_keys
from tiny_model import TinyDecoder, TinyMLA

STORAGE_BATCH_SIZE = 128
LOAD_BACK_THRESHOLD = 10  # tokens: HiRadixCache.load_back_threshold


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

    def free_pages(self, pages):
        """The allocator's free: the pages go back to the end of the free list."""
        self._free += list(pages)

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
    class): alloc and free of whole pages, handed out lowest page first
    while none was freed; and the pool's two transfer directions
    (backup_from_device_all_layer, load_to_device_per_layer, all layers at
    once, page_first indexing: MHA kv_buffer[0 for K, 1 for V][slot, layer],
    MLA kv_buffer[slot, layer])."""

    def __init__(self, pool: MHATokenToKVPoolHost):
        self.pool, self.page_size = pool, pool.page_size
        self._free = list(range(pool.size // self.page_size))

    def alloc(self, n_tokens):
        """Host token slots of n_tokens // page_size pages; None when the pool has too few free."""
        pages = n_tokens // self.page_size
        if pages > len(self._free):
            return None
        taken, self._free = self._free[:pages], self._free[pages:]
        return self.slots(taken)

    def free(self, host_indices):
        """mem_pool_host.free: the pages of these token slots go back."""
        self._free += host_indices[::self.page_size].div(self.page_size, rounding_mode="floor").tolist()

    def available_pages(self):
        return len(self._free)

    def slots(self, pages):
        return torch.tensor([p * self.page_size + t for p in pages for t in range(self.page_size)],
                            dtype=torch.int64)

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


class Node:
    """One page of the radix tree (TreeNode at page granularity): its parent
    page's hash (None under the root), its children's hashes, the device
    page (value; None once evicted from the device), the host page
    (host_value; None when not backed up to host) and last_access_time."""

    __slots__ = ("parent", "children", "device", "host", "last_access")

    def __init__(self, parent, device=None, host=None, last_access=0):
        self.parent, self.children = parent, set()
        self.device, self.host, self.last_access = device, host, last_access


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
        self.load_back_threshold = LOAD_BACK_THRESHOLD
        self.tree = {}  # page hash -> Node (the radix tree, one node per page)
        self.backed_up = set()  # page hashes written to storage by this engine
        self.evicted = dict(device=0, host=0)  # pages evicted from each pool, all requests
        self.last = {}  # what the last request did
        self._clock = 0  # last_access_time: a counter, so eviction order is reproducible
        self._locked = set()  # the running request's pages (lock_ref / protect_host)

    # ---- the request path ----

    def generate(self, tokens, max_new_tokens, backup=True):
        """Runs one request: prefix match (device pages, then host pages),
        storage prefetch of the rest, load back of the host part, prefill of
        the rest, greedy decode, then cache_finished_req (the full prompt
        pages join the tree and, with backup, are written to host and to
        storage). Returns (new tokens, logits of every computed prompt
        position's last row then of each decode step): a list of [vocab]
        tensors, the first from the prefill."""
        tokens = list(tokens)
        hashes = page_keys(tokens, self.page_size)
        limit = (len(tokens) - 1) // self.page_size  # leave one token to compute
        self._clock += 1
        path = self._match_prefix(hashes[:limit])
        on_device = sum(1 for h in path if self.tree[h].device is not None)
        host_hit = len(path) - on_device
        self._locked = set(path)
        fetched = []
        if self.storage is not None:
            fetched = self._prefetch_from_storage(hashes[len(path):limit], path[-1] if path else None)
            self._locked.update(fetched)
        loaded = self._load_back(path[on_device:] + fetched)
        pages = [self.tree[h].device for h in (path + fetched)[:on_device + loaded]]
        computed = len(pages) * self.page_size
        total = len(tokens) + max_new_tokens
        fresh = self._alloc_device(-(-total // self.page_size) - len(pages))
        assert fresh is not None, "device pool too small for the running request"
        table = pages + fresh
        logits = self.model(tokens[computed:], list(range(computed, len(tokens))), table, computed,
                            self.device.kv_caches)
        steps = [logits[-1]]
        out, seq = [], list(tokens)
        for _ in range(max_new_tokens):
            nxt = int(torch.argmax(steps[-1]))
            out.append(nxt)
            seq.append(nxt)
            if len(out) == max_new_tokens:
                break
            pos = len(seq) - 1
            steps.append(self.model([nxt], [pos], table, pos, self.device.kv_caches)[-1])
        self._cache_finished_req(hashes[:len(tokens) // self.page_size], table, backup)
        self._locked = set()
        self.last = dict(local_hit_tokens=on_device * self.page_size,
                         host_hit_tokens=min(loaded, host_hit) * self.page_size,
                         storage_hit_tokens=max(0, loaded - host_hit) * self.page_size,
                         computed_tokens=computed, prefill_logits=logits, block_table=table)
        return out, steps

    # ---- HiRadixCache ----

    def _match_prefix(self, hashes):
        """match_prefix: the pages of the longest prefix in the tree (device
        pages first, then pages only on host: a device leaf is a node whose
        children are all evicted, so the pages on device are a prefix), each
        touched."""
        path = []
        for h in hashes:
            node = self.tree.get(h)
            if node is None:
                break
            node.last_access = self._clock
            path.append(h)
        return path

    def _cache_finished_req(self, hashes, table, backup):
        """cache_finished_req -> insert: a new page joins the tree with the
        request's device page; a page evicted from the device takes it
        (recomputed over its host copy); a page already on the device keeps
        its own and the request's duplicate is freed, as is every page past
        the full prompt pages (partial page, decode). With backup, the new
        pages are written through to host (write_backup) and on to storage."""
        new, parent = [], None
        for h, page in zip(hashes, table):
            node = self.tree.get(h)
            if node is None:
                node = self.tree[h] = Node(parent, device=page)
                if parent is not None:
                    self.tree[parent].children.add(h)
                new.append(h)
            elif node.device is None:
                node.device = page
            elif node.device != page:
                self.device.free_pages([page])
            node.last_access = self._clock
            parent = h
        self.device.free_pages(table[len(hashes):])
        if backup:
            self._write_backup(new)

    def _alloc_device(self, n):
        """The allocator, evicting from the tree when it is short (alloc,
        evict(n), alloc again, as the scheduler and load_back do)."""
        pages = self.device.alloc_pages(n)
        if pages is None:
            self.evict(n)
            pages = self.device.alloc_pages(n)
        return pages

    def evict(self, num_pages):
        """HiRadixCache.evict: device leaves (on device, every child evicted)
        least recently used first, skipping the running request's; a page
        backed up to host only frees its device page (_evict_backuped), one
        that is not leaves the tree (_evict_regular, with any host-only
        pages under it); a parent whose children are now all evicted becomes
        a candidate."""
        def device_leaf(h):
            node = self.tree[h]
            return node.device is not None and all(self.tree[c].device is None for c in node.children)
        heap = [(n.last_access, h) for h, n in self.tree.items() if device_leaf(h)]
        heapq.heapify(heap)
        evicted = 0
        while evicted < num_pages and heap:
            _, h = heapq.heappop(heap)
            node = self.tree.get(h)
            if node is None or node.device is None or h in self._locked:
                continue  # gone or already evicted (a parent pushed twice), or the running request's
            self.device.free_pages([node.device])
            node.device = None
            if node.host is None:
                self._delete(h)
            evicted += 1
            if node.parent is not None and device_leaf(node.parent):
                heapq.heappush(heap, (self.tree[node.parent].last_access, node.parent))
        self.evicted["device"] += evicted
        return evicted

    def evict_host(self, num_pages):
        """HiRadixCache.evict_host: leaves (no children) least recently used
        first; only pages evicted from the device and not protected (the
        running request's) give back their host page and leave the tree; a
        parent left childless and evicted becomes a candidate. Pages stored
        to storage can come back by a prefetch; others are recomputed."""
        heap = [(n.last_access, h) for h, n in self.tree.items() if not n.children]
        heapq.heapify(heap)
        evicted = 0
        while evicted < num_pages and heap:
            _, h = heapq.heappop(heap)
            node = self.tree.get(h)
            if node is None or node.device is not None or h in self._locked:
                continue
            self._delete(h)
            evicted += 1
            parent = self.tree.get(node.parent)
            if parent is not None and not parent.children and parent.device is None:
                heapq.heappush(heap, (parent.last_access, node.parent))
        self.evicted["host"] += evicted
        return evicted

    def _delete(self, h):
        """A page leaves the tree, with the pages under it (all host-only
        here), giving back their host pages."""
        node = self.tree.pop(h)
        if node.parent is not None:
            self.tree[node.parent].children.discard(h)
        for c in list(node.children):
            self._delete(c)
        if node.host is not None:
            self.host.free(self.host.slots([node.host]))

    def _alloc_host(self, n_pages):
        """mem_pool_host.alloc, then evict_host(n) and alloc again when short."""
        host_indices = self.host.alloc(n_pages * self.page_size)
        if host_indices is None:
            self.evict_host(n_pages)
            host_indices = self.host.alloc(n_pages * self.page_size)
        return host_indices

    def _load_back(self, hashes):
        """load_back: the pages on host after the device match (the host hit,
        then what the prefetch brought), all or none, into fresh device
        pages (evicting on the device when short); none under
        load_back_threshold tokens. Returns the pages loaded."""
        if not hashes or len(hashes) * self.page_size < self.load_back_threshold:
            return 0
        device_pages = self._alloc_device(len(hashes))
        if device_pages is None:
            return 0
        host_pages = [self.tree[h].host for h in hashes]
        self.host.load_to_device(self.device, self.host.slots(host_pages), self.device.slots(device_pages))
        for h, p in zip(hashes, device_pages):
            self.tree[h].device = p
        return len(hashes)

    # ---- HiCacheController ----

    def _write_backup(self, hashes):
        """write_backup (device -> host pages of the new pages, evict_host
        when the host pool is short, nothing when still short), then on the
        write's ack write_backup_storage -> _page_backup (batch_set_v1 per
        batch, stop at the first failed batch) for pages this engine has not
        stored yet. Returns the pages stored."""
        if not hashes:
            return 0
        host_indices = self._alloc_host(len(hashes))
        if host_indices is None:
            return 0
        nodes = [self.tree[h] for h in hashes]
        self.host.backup_from_device(self.device, host_indices, self.device.slots([n.device for n in nodes]))
        for i, node in enumerate(nodes):
            node.host = int(host_indices[i * self.page_size]) // self.page_size
        if self.storage is None:
            return 0
        todo = [(h, n.host) for h, n in zip(hashes, nodes) if h not in self.backed_up]
        keys = [h for h, _ in todo]
        idx = self.host.slots([p for _, p in todo])
        done = 0
        for i in range(0, len(keys), STORAGE_BATCH_SIZE):
            batch = keys[i:i + STORAGE_BATCH_SIZE]
            if not all(self.storage.batch_set_v1(batch, idx[i * self.page_size:(i + len(batch)) * self.page_size],
                                                 HiCacheStorageExtraInfo())):
                break
            self.backed_up.update(batch)
            done += len(batch)
        return done

    def _prefetch_from_storage(self, hashes, anchor):
        """prefetch_from_storage for the pages after the host match (when at
        least prefetch_threshold tokens): _storage_hit_query (batch_exists
        per batch, stop at the first short batch), host pages for the hit
        (evict_host when short; no prefetch when still short), _page_transfer
        (batch_get_v1, pages up to the first failure); the unfetched host
        pages are freed and the fetched ones join the tree as host-only
        pages under `anchor` (_insert_helper_host). Returns their hashes."""
        if len(hashes) * self.page_size < self.prefetch_threshold:
            return []
        hit = []
        for start in range(0, len(hashes), STORAGE_BATCH_SIZE):
            batch = hashes[start:start + STORAGE_BATCH_SIZE]
            n = self.storage.batch_exists(batch, HiCacheStorageExtraInfo())
            hit += batch[:n]
            if n < len(batch):
                break
        if not hit:
            return []
        host_indices = self._alloc_host(len(hit))
        if host_indices is None:
            return []
        done = 0
        for i in range(0, len(hit), STORAGE_BATCH_SIZE):
            batch = hit[i:i + STORAGE_BATCH_SIZE]
            idx = host_indices[i * self.page_size:(i + len(batch)) * self.page_size]
            results = self.storage.batch_get_v1(batch, idx, HiCacheStorageExtraInfo())
            n = next((j for j, ok in enumerate(results) if not ok), len(batch))
            done += n
            if n != len(batch):
                break
        if done < len(hit):
            self.host.free(host_indices[done * self.page_size:])
        parent = anchor
        for i, h in enumerate(hit[:done]):
            self.tree[h] = Node(parent, host=int(host_indices[i * self.page_size]) // self.page_size,
                                last_access=self._clock)
            if parent is not None:
                self.tree[parent].children.add(h)
            parent = h
        return hit[:done]
