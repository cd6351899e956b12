"""SGLang HiCache storage backend on kvtierd: ``KvtierStorage``.

SGLang loads it through its dynamic backend factory, which imports this
module, builds ``KvtierStorage(storage_config, {})`` and then calls
``register_mem_pool_host(host_pool)``::

    python -m sglang.launch_server ... --enable-hierarchical-cache \\
      --hicache-storage-backend dynamic \\
      --hicache-storage-backend-extra-config '{"backend_name":"kvtier",
        "module_path":"kvtier.integrations.sglang","class_name":"KvtierStorage",
        "interface_v1":1,"socket_path":"/run/kvtier/kvtierd.sock",
        "model_revision":"<commit>"}'

Settings, read from ``storage_config.extra_config`` (the whole JSON above):

- ``model_revision`` (required): the model's commit. Part of every key, so
  a model update never reads the KV of the old weights.
- ``socket_path``: kvtierd's socket (default /run/kvtier/kvtierd.sock).
- ``interface_v1``: 1 = zero-copy path (batch_get_v1/batch_set_v1, what
  SGLang then calls), 0 = generic path (get/set/batch_get/batch_set).
- ``kv_dtype``: overrides the dtype name taken from the host pool. Set it
  for an fp8 KV cache, which the host pool holds as uint8 (otherwise e4m3
  and e5m2 caches of one model would share keys).
- ``model_id``: overrides ``storage_config.model_name``.
- ``connect_timeout_s`` (2), ``call_timeout_s`` (10): kvtier.Client limits.
- ``verify_checksums`` (false): every object read is checked against the
  checksum recorded when it was stored (kvtier.Client's
  ``verify_checksums``); one that does not match reads as missing and the
  daemon drops it.
- ``reconnect_interval_s`` (5): after the daemon went away, the least time
  between two connection attempts (calls meanwhile miss).
- ``clear_record_objects`` (131072): how many stored objects clear() can
  erase (see clear()).

Naming. Each backend (one per host pool) registers one kvtier namespace:
model_id = model_name, model_revision, kv_dtype, block_tokens = page_size,
layer_count = layer_num, bytes_per_token_per_layer = get_size_per_token()
/ layer_num (K and V together, as docs/KEYS.md defines it), kv_layout =
``sglang_<pool layout>_<kv|mla>`` (+ ``_pp<r>of<n>`` when the binding has no
pp fields and pp_size > 1, + ``_cp<r>of<n>`` when attn_cp_size > 1), and
tp_rank/tp_size (an MLA pool is the same on every rank: rank 0 of 1, and
only TP rank 0 writes; the others report success without writing). A page
(SGLang's SHA-256 hex page key) is stored as objects keyed
``kvtier.external_key(fingerprint, page_key + suffix)``:

- zero-copy path: MHA ``_k`` and ``_v`` (the two buffers
  ``get_page_buffer_meta`` gives per page, in that order), MLA ``_kv``;
- generic path: ``_flat``, the flat page tensor SGLang passes.

A page exists only when all its objects do. The objects are parts of a
page in SGLang's byte order, not layer-major kvtier blocks: kvtierd keeps
them as opaque objects (plain get/put, no layer-wise loads). The two paths
store different objects, so batch_exists/exists answer for the path this
backend uses. Not supported: the K-only MHA pool (one buffer per page: its
calls fail and log), split heads, and host pool classes other than
MHATokenToKVPoolHost / MLATokenToKVPoolHost (refused at registration).

Hybrid models (v2): every pool of a HostPoolGroup registered with
``register_mem_host_pool_v2`` and the ``batch_*_v2`` calls on them; the KV
anchor keeps the objects above, other served pools get a namespace each
(``_sglang_v2.py``).

Layouts. page_first, page_first_direct and page_head: each object is one
contiguous buffer of the host pool, copied once between it and kvtier's
arena by put_batch/get_batch (no staging). layer_first gives one buffer
per layer and component: a set gathers them straight into reserved arena
space (reserve, one copy, commit); a get pins the objects with one request
and scatters them straight from the arena (one copy; the pins end together
with the next request, not one round trip each). Gathers and scatters are
one C++ loop with the GIL released (kvtier._kvtier._copy_pieces).

Threads. SGLang calls from its prefetch, prefetch-I/O and backup threads
at once; the kvtier Client is thread-safe, counters (``_sglang_stats.py``)
and reconnection (``_sglang_link.py``) take their own locks. Failures: no
data-path method raises; every one logs a warning (at most one per 10 s)
and answers "missed / not stored" in the shape SGLang expects. The
generic path is in ``_sglang_flat.py``.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import time
from typing import List

import kvtier
from kvtier._kvtier import _copy_pieces
from kvtier.integrations import _sglang_flat, _sglang_link, _sglang_stats, _sglang_v2
from kvtier.integrations._sglang_flat import FLAT_SUFFIX

logger = logging.getLogger(__name__)

try:  # SGLang's factory requires the subclass; without SGLang it is a plain class.
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
except Exception:  # noqa: BLE001  (not installed, or broken: still usable standalone)
    _Base = object

DEFAULT_SOCKET_PATH = "/run/kvtier/kvtierd.sock"
ZERO_COPY_LAYOUTS = ("page_first", "page_first_direct", "page_head")
GATHER_LAYOUTS = ("layer_first",)
_DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32",
                "float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}


class KvtierStorage(_Base):
    """A HiCacheStorage whose pages live in kvtierd (module docstring)."""

    def __init__(self, storage_config, kwargs=None):
        """`storage_config`: SGLang's HiCacheStorageConfig (fields read with
        getattr, they differ across versions). `kwargs`: the factory's extra
        keyword dict (unused). Does not connect: that waits for the pool.
        Raises ValueError when model_revision or the model name is missing."""
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        self.model_revision = str(extra.get("model_revision") or "")
        if not self.model_revision:
            raise ValueError("kvtier: extra_config needs 'model_revision' (the model's commit): a cache "
                             "without it would serve stale KV after a model update")
        self.model_id = str(extra.get("model_id") or getattr(storage_config, "model_name", None) or "")
        if not self.model_id:
            raise ValueError("kvtier: storage_config.model_name is empty; set extra_config 'model_id'")
        self.tp_rank = int(getattr(storage_config, "tp_rank", 0) or 0)
        self.tp_size = int(getattr(storage_config, "tp_size", 1) or 1)
        self.pp_rank = int(getattr(storage_config, "pp_rank", 0) or 0)
        self.pp_size = int(getattr(storage_config, "pp_size", 1) or 1)
        self.cp_rank = int(getattr(storage_config, "attn_cp_rank", 0) or 0)
        self.cp_size = int(getattr(storage_config, "attn_cp_size", 1) or 1)
        self.is_mla = bool(getattr(storage_config, "is_mla_model", False))
        self.split_heads = bool(getattr(storage_config, "should_split_heads", False))
        self.socket_path = str(extra.get("socket_path") or DEFAULT_SOCKET_PATH)
        self.kv_dtype_override = extra.get("kv_dtype")
        self.interface_v1 = bool(extra.get("interface_v1", 0))
        connect_timeout_s = float(extra.get("connect_timeout_s", 2.0))
        self._call_timeout_s = float(extra.get("call_timeout_s", 10.0))
        verify_checksums = bool(extra.get("verify_checksums", False))
        reconnect_interval_s = float(extra.get("reconnect_interval_s", 5.0))
        record_limit = int(extra.get("clear_record_objects", 131072))
        self._writes = not (self.is_mla and self.tp_rank != 0)  # MLA: rank 0 writes for all

        self.mem_pool_host = None
        self.namespace = None  # kvtier.Namespace, once the pool is registered
        self.fingerprint = None
        self._layout = None
        self._components = ("_kv",) if self.is_mla else ("_k", "_v")
        self._page_size = 0
        self._layers = 0
        self._stats = _sglang_stats.BackendStats(record_limit)
        self._link = _sglang_link.DaemonLink(  # registers the KV namespace, then the sidecar pools'
            self.socket_path, f"sglang-tp{self.tp_rank}-pp{self.pp_rank}", connect_timeout_s, self._call_timeout_s,
            verify_checksums, reconnect_interval_s, self._stats)
        self._sidecars = _sglang_v2.SidecarPools(self)
        self.registered_pools = {}  # pool name -> host pool, as HiCacheStorage's default keeps them

    # ---- registration ----

    def register_mem_pool_host(self, mem_pool_host):
        """Derives the namespace from the pool and connects. Raises ValueError
        for a pool this backend cannot store (a class other than
        MHATokenToKVPoolHost / MLATokenToKVPoolHost or one that disagrees with
        is_mla_model, unknown layout, split heads, no get_size_per_token); a
        daemon that cannot be reached is only logged (calls miss until a
        later attempt connects). SGLang calls this outside any try: the
        error stops the start (or the attach) before a request is served."""
        kind = _sglang_v2.pool_kind(mem_pool_host)
        if kind != ("mla" if self.is_mla else "mha"):
            raise ValueError(f"kvtier: KV host pool {type(mem_pool_host).__name__} does not match is_mla_model="
                             f"{self.is_mla} (a rank-replicated pool kvtier does not serve?)")
        layout = getattr(mem_pool_host, "layout", None)
        if layout not in ZERO_COPY_LAYOUTS + GATHER_LAYOUTS:
            raise ValueError(f"kvtier: host pool layout {layout!r} is not supported "
                             f"(use one of {ZERO_COPY_LAYOUTS + GATHER_LAYOUTS})")
        if self.split_heads:
            raise ValueError("kvtier: should_split_heads (heterogeneous TP) is not supported")
        page_size, layers = int(mem_pool_host.page_size), int(mem_pool_host.layer_num)
        per_token = int(mem_pool_host.get_size_per_token())  # all layers and components
        ns = kvtier.Namespace(
            model_id=self.model_id, model_revision=self.model_revision, kv_dtype=self._kv_dtype(mem_pool_host),
            block_tokens=page_size, layer_count=layers,
            bytes_per_token_per_layer=per_token // layers,
            kv_layout=self._kv_layout(layout),
            tp_rank=0 if self.is_mla else self.tp_rank, tp_size=1 if self.is_mla else self.tp_size)
        if hasattr(ns, "pp_rank"):
            ns.pp_rank, ns.pp_size = self.pp_rank, self.pp_size
        self.fingerprint = ns.fingerprint()  # validates: InvalidArgumentError is a ValueError
        self.mem_pool_host, self.namespace, self._layout = mem_pool_host, ns, layout
        self._page_size, self._layers = page_size, layers
        self._link.namespaces = [ns]
        self._get_client()

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        """Registers one HostPoolGroup entry (the hybrid controller calls this
        for each, the KV anchor included, after register_mem_pool_host). A
        pool kvtier does not serve raises ValueError here, never later: SGLang
        does not catch it, so the server does not start with a pool whose
        pages this backend would drop (see _sglang_v2 for the kinds served).
        A new sidecar namespace makes the next call reconnect with it."""
        spec = self._sidecars.register(host_pool, host_pool_name)
        self.registered_pools[_sglang_v2.pool_name(host_pool_name)] = host_pool
        if spec is None:
            return
        spec.ns_index = self._link.add_namespace(spec.namespace)
        self._get_client()

    # ---- v2: pools of a HostPoolGroup (_sglang_v2.SidecarPools) ----

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        """PoolTransferResult: kv_hit_pages = the longest prefix of `keys`
        whose KV pages and every transfer's pool pages (by its hit policy)
        are stored. A failure answers 0 pages."""
        return self._sidecars.exists(keys, pool_transfers, extra_info)

    def batch_get_v2(self, transfers, extra_info=None):
        """{transfer.name: [bool per key]}: pages read into the pool slots
        transfer.host_indices (len(keys) * the pool's page_size slots)."""
        return self._sidecars.transfer(transfers, is_set=False)

    def batch_set_v2(self, transfers, extra_info=None):
        """{transfer.name: [bool per key]}: pages stored (already cached, or
        skipped because TP rank 0 writes a replicated pool, count as True)."""
        return self._sidecars.transfer(transfers, is_set=True)

    def _kv_dtype(self, pool) -> str:
        if self.kv_dtype_override:
            return str(self.kv_dtype_override)
        if str(pool.dtype).replace("torch.", "") == "uint8":
            logger.warning("kvtier: the host pool holds uint8 (an fp8 KV cache?): set extra_config "
                           "'kv_dtype' (e.g. fp8_e4m3) so caches of different fp8 formats never mix")
        return self.dtype_name(pool.dtype)

    @staticmethod
    def dtype_name(dtype) -> str:
        """kvtier's name of a torch dtype (bf16, fp16, ...; others as torch names them)."""
        name = str(dtype).replace("torch.", "")
        return _DTYPE_NAMES.get(name, name)

    def page_tokens(self) -> int:
        """Tokens per page (key) of the KV pool; 0 before registration."""
        return self._page_size

    def _kv_layout(self, layout: str) -> str:
        return self.layout_name(f"sglang_{layout}_{'mla' if self.is_mla else 'kv'}")

    def layout_name(self, base: str) -> str:
        """`base` + the pp/cp parts every namespace of this backend carries."""
        out = base
        if self.pp_size > 1 and not hasattr(kvtier.Namespace, "pp_rank"):
            out += f"_pp{self.pp_rank}of{self.pp_size}"
        if self.cp_size > 1:
            out += f"_cp{self.cp_rank}of{self.cp_size}"
        return out

    # ---- zero-copy path ----

    def batch_exists(self, keys, extra_info=None) -> int:
        """How many pages from keys[0] on are stored (all their objects, for
        this backend's path); one lookup. 0 on any failure."""
        try:
            client = self._get_client()
            if client is None or not keys:
                return 0
            suffixes = self._path_suffixes()
            hit = client.lookup(0, self._object_keys(keys, suffixes)).prefix_blocks
            return hit // len(suffixes)
        except Exception as e:  # noqa: BLE001  (never into SGLang's prefetch thread)
            self._failed("batch_exists", e)
            return 0

    def batch_get_v1(self, keys, host_indices, extra_info=None) -> List[bool]:
        """Reads pages into the host pool slots `host_indices` (len(keys) *
        page_size slots, page i from host_indices[i * page_size]). Returns
        len(keys) bools: True when every object of the page was read whole.
        A False page's slots may hold part of it (SGLang discards them)."""
        try:
            return self._get_v1(keys, host_indices)
        except Exception as e:  # noqa: BLE001
            self._failed("batch_get_v1", e)
            return [False] * len(keys)

    def batch_set_v1(self, keys, host_indices, extra_info=None) -> List[bool]:
        """Stores pages from the host pool slots `host_indices`. Returns
        len(keys) bools: True when every object is stored (already cached
        counts). MLA ranks other than 0 write nothing and return all True."""
        try:
            return self._set_v1(keys, host_indices)
        except Exception as e:  # noqa: BLE001
            self._failed("batch_set_v1", e)
            return [False] * len(keys)

    def _get_v1(self, keys, host_indices) -> List[bool]:
        client = self._get_client()
        if client is None or not keys:
            return [False] * len(keys)
        start = time.monotonic()
        objects = self._pool_objects(keys, host_indices)
        okeys = self._object_keys(keys, self._components)
        if self._layout in GATHER_LAYOUTS:
            done = self._get_scattered(client, okeys, objects)
        else:
            statuses = self._checked(client.get_batch(0, okeys, [pieces[0] for pieces in objects]))
            done = [s.ok and s.value == pieces[0][1] for s, pieces in zip(statuses, objects)]
        pages = self._per_page(done, len(keys))
        self._stats.count_transfer("prefetch", pages, done, objects, time.monotonic() - start)
        return pages

    def _set_v1(self, keys, host_indices) -> List[bool]:
        if not self._writes:
            self._stats.count(pages_set_skipped=len(keys))
            return [True] * len(keys)
        client = self._get_client()
        if client is None or not keys:
            return [False] * len(keys)
        start = time.monotonic()
        objects = self._pool_objects(keys, host_indices)
        okeys = self._object_keys(keys, self._components)
        if self._layout in GATHER_LAYOUTS:
            done = self._put_gathered(client, okeys, objects)
        else:
            done = [s.ok for s in self._checked(client.put_batch(0, okeys, [pieces[0] for pieces in objects]))]
        pages = self._per_page(done, len(keys))
        self._stats.remember([k for k, ok in zip(okeys, done) if ok], 0)
        self._stats.count_transfer("backup", pages, done, objects, time.monotonic() - start)
        return pages

    def _pool_objects(self, keys, host_indices):
        """The pool memory of each object, in _object_keys order: a list per
        object of (address, nbytes) pieces, one piece unless layer_first."""
        if len(host_indices) != len(keys) * self._page_size:
            raise ValueError(f"{len(host_indices)} host slots for {len(keys)} pages of {self._page_size}")
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        if isinstance(sizes, int):
            sizes = [sizes] * len(ptrs)
        ncomp = len(self._components)
        layers = self._layers if self._layout in GATHER_LAYOUTS else 1
        if len(ptrs) != len(keys) * ncomp * layers or len(sizes) != len(ptrs):
            raise ValueError(f"get_page_buffer_meta gave {len(ptrs)} buffers for {len(keys)} pages; expected "
                             f"{ncomp * layers} per page ({self._layout}, {ncomp} components)")
        pieces = list(zip((int(p) for p in ptrs), (int(s) for s in sizes)))
        if layers == 1:
            return [[p] for p in pieces]
        per_page = ncomp * layers  # page: layer: component (K then V)
        return [[pieces[page * per_page + layer * ncomp + comp] for layer in range(layers)]
                for page in range(len(keys)) for comp in range(ncomp)]

    def _put_gathered(self, client, okeys, objects) -> List[bool]:
        """Gathers each object's pieces into reserved arena space (one copy
        call for all of them, the GIL released), commits."""
        with client.reserve(0, okeys, [sum(n for _, n in pieces) for pieces in objects]) as res:
            moves, windows, window, view = [], [], None, None
            for i, pieces in enumerate(objects):
                if not res.status(i).ok:
                    continue  # already cached (a success) or failed: commit reports it
                view = res.data(i)
                window = (ctypes.c_char * view.nbytes).from_buffer(view)
                windows.append((window, view))
                dst = ctypes.addressof(window)
                for ptr, n in pieces:
                    moves.append((dst, ptr, n))
                    dst += n
            _copy_pieces(moves)
            del windows, window, view  # commit refuses while an export is alive
            return [s.ok or s.code == "already_exists" for s in self._checked(res.commit())]

    def _get_scattered(self, client, okeys, objects) -> List[bool]:
        """Pins every object and scatters the whole ones straight from the
        arena into the pool's pieces (one copy, one call with the GIL
        released). The views are dropped, not released one by one: their
        unpins go out together with the connection's next request."""
        views = client.pin(0, okeys)
        self._checked([v for v in views if not v.ok])  # the misses are Statuses
        try:
            done, moves = [], []
            for view, pieces in zip(views, objects):
                ok = view.ok and len(view) == sum(n for _, n in pieces)
                if ok:
                    src = view._address
                    for ptr, size in pieces:
                        moves.append((ptr, src, size))
                        src += size
                done.append(ok)
            _copy_pieces(moves)
            return done
        finally:
            del views

    # ---- generic path: one "_flat" object per page ----

    def get(self, key, target_location=None, target_sizes=None):
        """Reads page `key` into `target_location` (a flat CPU tensor of one
        page; None: a dummy page from the pool) and returns it; None on a
        miss or failure. An int target_location with target_sizes is a raw
        (address, nbytes)."""
        locations = None if target_location is None else [target_location]
        sizes = None if target_sizes is None else [target_sizes]
        return self.batch_get([key], locations, sizes)[0]

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        """List of len(keys): target_locations[i] filled with page i, or None."""
        return _sglang_flat.get_pages(self, keys, target_locations, target_sizes)

    def set(self, key, value=None, target_location=None, target_sizes=None) -> bool:
        """Stores page `key` from `value` (or `target_location`): a flat CPU
        tensor, a buffer, or an int address with target_sizes. False on failure."""
        values = None if value is None else [value]
        locations = None if target_location is None else [target_location]
        sizes = None if target_sizes is None else [target_sizes]
        return self.batch_set([key], values, locations, sizes)

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None) -> bool:
        """True iff every page was stored (already cached counts)."""
        return _sglang_flat.set_pages(self, keys, values, target_locations, target_sizes)

    def exists(self, key) -> bool:
        """Whether page `key` is stored for this backend's path."""
        return self.batch_exists([key]) == 1

    # ---- housekeeping ----

    def clear(self) -> None:
        """Erases the objects this backend stored, as far as its record of the
        most recent `clear_record_objects` reaches. kvtierd is shared by other
        engines, ranks and models, so nothing else is dropped; a page another
        backend stored too becomes a miss for it as well (a miss, never wrong
        bytes). Failures are logged."""
        written = self._stats.take_written()
        try:
            client = self._get_client()
            if client is None or not written:
                return
            by_ns = collections.defaultdict(list)
            for ns, key in written:
                by_ns[ns].append(key)
            erased = sum(client.erase(ns, keys[i:i + 4096]) for ns, keys in by_ns.items()
                         for i in range(0, len(keys), 4096))
            logger.info("kvtier: clear() erased %d of the %d objects this backend stored", erased, len(written))
        except Exception as e:  # noqa: BLE001
            self._failed("clear", e)

    def get_stats(self):
        """Cumulative counters (dict): pages_get, pages_hit, pages_miss,
        pages_set, pages_set_failed, pages_set_skipped, bytes_read,
        bytes_written, errors. When SGLang's StorageMetrics is importable
        the dict is also a StorageMetrics carrying the per-call page counts
        and GB/s since the previous get_stats (what --enable-storage-metrics
        logs; its collector asserts that type)."""
        return self._stats.snapshot()

    # ---- helpers ----

    def _path_suffixes(self):
        return self._components if self.interface_v1 else (FLAT_SUFFIX,)

    def _object_keys(self, keys, suffixes) -> list:
        fp = self.fingerprint
        return [kvtier.external_key(fp, _engine_key(k, s)) for k in keys for s in suffixes]

    def _per_page(self, done, n_pages) -> List[bool]:
        ncomp = len(done) // n_pages
        return [all(done[i * ncomp:(i + 1) * ncomp]) for i in range(n_pages)]

    def _get_client(self):
        """The connection, or None (no pool yet, or the daemon unreachable and
        the next attempt not due). Never waits for another thread's attempt."""
        return self._link.client(registered=self.namespace is not None)

    def _checked(self, statuses):
        """`statuses`, after dropping the connection if one says it died."""
        return self._link.checked(statuses)

    def _failed(self, what, error, code=None):
        """Counts and (rate-limited) logs a failure; drops a dead connection."""
        self._link.failed(what, error, code)


def _engine_key(page_key, suffix: str):
    if isinstance(page_key, (bytes, bytearray)):
        return bytes(page_key) + suffix.encode()
    return str(page_key) + suffix
