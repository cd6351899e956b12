"""The v2 half of kvtier's SGLang HiCache backend: the host pools registered
with ``register_mem_host_pool_v2`` and the ``batch_*_v2`` calls on them.

Read against sgl-project/sglang (the corpus has no dates; upstream files
chosen over forks, newest-looking version where several are stored):

- ``mem_cache/hicache_storage.py`` @00fe477f: HiCacheStorage's v2 methods,
  PoolName, PoolHitPolicy, PoolTransfer, PoolTransferResult,
  count_pool_hits;
- ``mem_cache/hybrid_cache/hybrid_cache_controller.py`` @00343773: how the
  controller calls them (below);
- ``mem_cache/storage/mooncake_store/mooncake_store.py`` @00fe477f: how a
  real backend answers (one object per page component, hit policies);
- ``mem_cache/pool_host/mamba.py`` @02f0c2a0, ``pool_host/group.py``
  @0142dde6, ``hi_mamba_radix_cache.py`` @00df707e: the Mamba host pool
  (page_size 1, page_first layouts, temporal then conv_i buffers per slot)
  and the transfers the radix cache builds for it.

How the hybrid controller calls a backend. At attach:
``register_mem_pool_host(anchor host pool)``, then
``register_mem_host_pool_v2(entry.host_pool, entry.name)`` for every
HostPoolGroup entry, the KV anchor included; both outside any try, so an
exception there aborts the start (or the runtime attach) with its message.
Prefetch: ``batch_exists_v2(all page hashes, pool_transfers, extra_info)``
(one call, not batched) -> KV pages via batch_get_v1 in batches -> the
trailing sidecar keys re-aligned to the last hit pages ->
``batch_get_v2(sidecar transfers)``; backup: ``batch_set_v2(transfers)`` then
KV via batch_set_v1. Results are dicts ``{pool name: [bool per key]}``
that ``count_pool_hits`` turns into leading-run counts.

Pool kinds served (by the host pool's exact class; subclasses such as the
fp4/int8/mxfp8 pools with scale buffers, asymmetric or unified pools, DSA
and DeepSeek-V4 pools are other formats and are refused):

- ``MHATokenToKVPoolHost``: objects ``_k``, ``_v`` per page (TP rank in
  the namespace);
- ``MLATokenToKVPoolHost``: one ``_kv`` object per page, namespace rank 0
  of 1, written by TP rank 0 only;
- ``MambaPoolHost``: ``_temporal`` (absent for conv-only models) and
  ``_conv<i>`` per state slot, in a namespace with ``object_kind =
  "recurrent_state"`` and the TP rank (the state is TP-sharded even when
  the KV is MLA), page_first / page_first_direct only.

Each pool name gets its own kvtier namespace (kv_layout names the pool);
the KV anchor keeps the v1 namespace and objects, so v1 and v2 see the same
KV pages. Sidecar MHA/MLA pools (SWA, draft) are served in the zero-copy
layouts only.
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from typing import Dict, List, Optional

import kvtier

@dataclasses.dataclass
class PoolTransferResult:
    """SGLang's PoolTransferResult when SGLang is absent (same fields)."""

    kv_hit_pages: int
    extra_pool_hit_pages: dict
    restorable_prefix_pages: Optional[List[int]] = None


KV_POOL = "kv"
MHA_CLASS, MLA_CLASS, MAMBA_CLASS = "MHATokenToKVPoolHost", "MLATokenToKVPoolHost", "MambaPoolHost"
SERVED_CLASSES = (MHA_CLASS, MLA_CLASS, MAMBA_CLASS)
ZERO_COPY_LAYOUTS = ("page_first", "page_first_direct", "page_head")
MAMBA_LAYOUTS = ("page_first", "page_first_direct")
TRAILING_PAGES = "trailing_pages"
_SCAN_CHUNK = 64  # TRAILING_PAGES stop points whose lookups are in flight at once


def pool_name(name) -> str:
    """A PoolName (a str Enum) or a plain string, as its value."""
    return str(getattr(name, "value", name))


def make_result(kv_hit_pages: int, extra: dict, restorable: List[int]):
    """SGLang's PoolTransferResult (without restorable_prefix_pages where
    the installed version lacks the field), else the local one."""
    try:
        cls = importlib.import_module("sglang.srt.mem_cache.hicache_storage").PoolTransferResult
    except Exception:  # noqa: BLE001  (no SGLang, or one without the v2 interface)
        cls = PoolTransferResult
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    if "restorable_prefix_pages" in fields or cls is PoolTransferResult:
        return cls(kv_hit_pages, extra, restorable)
    return cls(kv_hit_pages, extra)


def pool_kind(pool) -> str:
    """"mha", "mla" or "mamba" for a host pool kvtier serves; raises
    ValueError naming the class for any other."""
    cls = type(pool).__name__
    kind = {MHA_CLASS: "mha", MLA_CLASS: "mla", MAMBA_CLASS: "mamba"}.get(cls)
    if kind is None:
        raise ValueError(f"kvtier: host pool {cls} is not supported (kvtier serves {', '.join(SERVED_CLASSES)}; "
                         "quantized pools with scale buffers, DSA/DeepSeek-V4, unified and asymmetric pools are "
                         "other formats). Use another HiCache storage backend for this model.")
    return kind


@dataclasses.dataclass
class PoolSpec:
    """What kvtier stores for one sidecar host pool."""

    name: str
    pool: object
    kind: str
    namespace: object
    fingerprint: object
    suffixes: tuple  # one object per component per page, in get_page_buffer_meta order
    page_size: int  # host slots per page (key)
    writes: bool  # False: an MLA pool on TP rank > 0 (rank 0 writes for all)
    ns_index: int = -1


class SidecarPools:
    """The pools registered through register_mem_host_pool_v2, other than
    the KV anchor, and the v2 I/O on them. Owned by one KvtierStorage,
    whose client, failure log and counters it uses (`storage`). Thread-safe
    for the data path once registration is over (specs are only read)."""

    def __init__(self, storage):
        self._storage = storage
        self._specs: Dict[str, PoolSpec] = {}

    def register(self, host_pool, name) -> Optional[PoolSpec]:
        """Describes a sidecar pool; raises ValueError for one kvtier does not
        serve. Returns None for the KV anchor (served by the v1 objects)."""
        s = self._storage
        name = pool_name(name)
        if name == KV_POOL:
            if s.mem_pool_host is None:
                s.register_mem_pool_host(host_pool)
            elif host_pool is not s.mem_pool_host:
                raise ValueError("kvtier: the KV pool registered for v2 is not the one register_mem_pool_host got")
            return None
        if s.namespace is None:
            raise ValueError("kvtier: register_mem_pool_host must come before register_mem_host_pool_v2")
        kind = pool_kind(host_pool)
        layout = getattr(host_pool, "layout", None)
        if layout not in (MAMBA_LAYOUTS if kind == "mamba" else ZERO_COPY_LAYOUTS):
            raise ValueError(f"kvtier: {type(host_pool).__name__} {name!r} in layout {layout!r} is not supported")
        if kind == "mamba":
            convs = len(getattr(host_pool, "conv_buffer", None) or [])
            suffixes = (("_temporal",) if int(host_pool.temporal_state_elem_size) > 0 else ()) + tuple(
                f"_conv{i}" for i in range(convs))
            layers = int(host_pool.num_mamba_layers)
            dtype = s.dtype_name(host_pool.temporal_dtype)
            if convs and str(host_pool.conv_dtype) != str(host_pool.temporal_dtype):
                dtype += "_conv_" + s.dtype_name(host_pool.conv_dtype)
            replicated, object_kind = False, "recurrent_state"
        else:
            suffixes = ("_kv",) if kind == "mla" else ("_k", "_v")
            layers, dtype = int(host_pool.layer_num), s.dtype_name(host_pool.dtype)
            replicated, object_kind = kind == "mla", "kv"
        if not suffixes or layers <= 0:
            raise ValueError(f"kvtier: host pool {name!r} has no state to store")
        per_token = int(host_pool.get_size_per_token())
        ns = kvtier.Namespace(
            model_id=s.model_id, model_revision=s.model_revision, kv_dtype=dtype,
            block_tokens=s.page_tokens(), layer_count=layers, bytes_per_token_per_layer=max(1, per_token // layers),
            kv_layout=s.layout_name(f"sglang_{layout}_{kind}_{name}"), object_kind=object_kind,
            tp_rank=0 if replicated else s.tp_rank, tp_size=1 if replicated else s.tp_size)
        if hasattr(ns, "pp_rank"):
            ns.pp_rank, ns.pp_size = s.pp_rank, s.pp_size
        spec = PoolSpec(name=name, pool=host_pool, kind=kind, namespace=ns, fingerprint=ns.fingerprint(),
                        suffixes=suffixes, page_size=int(host_pool.page_size),
                        writes=not (replicated and s.tp_rank != 0))
        self._specs[name] = spec
        return spec

    # ---- data path: every method answers in SGLang's shape and never raises ----

    def exists(self, keys, pool_transfers, extra_info) -> object:
        """PoolTransferResult: the longest prefix whose KV pages and, for each
        transfer, the pool's pages are stored (ALL_PAGES: every page of the
        prefix; TRAILING_PAGES: the len(transfer.keys) pages ending it). The
        object keys come from `keys`: the controller's transfer keys are
        placeholders before the hit is known. restorable_prefix_pages holds
        the longest prefix only (a subset of the stop points: a cross-rank
        intersection may then miss, never load a wrong state)."""
        s = self._storage
        try:
            kv_pages = int(s.batch_exists(keys, extra_info))
            hits = {KV_POOL: kv_pages} if kv_pages else {}
            bound, trailing = kv_pages, []
            for t in pool_transfers or []:
                name = pool_name(t.name)
                if name == KV_POOL:
                    continue  # the KV prefix itself
                spec = self._specs.get(name)
                if spec is None:
                    raise ValueError(f"pool {name!r} was not registered")
                if pool_name(t.hit_policy) == TRAILING_PAGES:
                    trailing.append((t, spec, max(1, len(t.keys or ()))))
                    continue
                stored = self._stored_prefix(spec, keys[:bound])
                hits[t.name] = stored
                bound = min(bound, stored)
            final = self._longest_with_windows(keys, bound, trailing) if trailing else bound
            if trailing:
                for t, _, _ in trailing:
                    if final:
                        hits[t.name] = final
            return make_result(final, hits, [final] if final else [])
        except Exception as e:  # noqa: BLE001  (never into SGLang's prefetch thread)
            s._failed("batch_exists_v2", e)
            return make_result(0, {}, [])

    def transfer(self, transfers, is_set: bool) -> dict:
        """{transfer.name: [bool per key]} for batch_get_v2 / batch_set_v2."""
        s = self._storage
        out = {}
        for t in transfers or []:
            keys = list(t.keys or [])
            try:
                name = pool_name(t.name)
                if name == KV_POOL:
                    run = s.batch_set_v1 if is_set else s.batch_get_v1
                    out[t.name] = list(run(keys, t.host_indices))
                    continue
                spec = self._specs.get(name)
                if spec is None:
                    raise ValueError(f"pool {name!r} was not registered")
                out[t.name] = self._put(spec, keys, t.host_indices) if is_set else self._get(spec, keys, t.host_indices)
            except Exception as e:  # noqa: BLE001  (never into SGLang's prefetch/backup threads)
                s._failed("batch_set_v2" if is_set else "batch_get_v2", e)
                out[t.name] = [False] * len(keys)
        return out

    # ---- helpers ----

    def _longest_with_windows(self, keys, bound: int, trailing) -> int:
        """The largest p <= bound for which every (transfer, spec, n) in
        `trailing` has its n pages ending at p stored; 0 if none. Checks the
        candidates from the longest down, _SCAN_CHUNK at a time with their
        lookups in flight together (one round trip per chunk, not per page)."""
        client = self._storage._get_client()
        if client is None:
            return 0
        for top in range(bound, 0, -_SCAN_CHUNK):
            candidates = range(top, max(0, top - _SCAN_CHUNK), -1)
            pending = [[(client.lookup_async(spec.ns_index, self._object_keys(spec, keys[max(0, p - n):p])),
                         min(n, p) * len(spec.suffixes)) for _, spec, n in trailing] for p in candidates]
            for p, windows in zip(candidates, pending):
                if all(w.result(self._storage._call_timeout_s).prefix_blocks == want for w, want in windows):
                    return p
        return 0

    def _stored_prefix(self, spec, keys) -> int:
        """How many of `keys` from the first on have all their objects in
        `spec`'s namespace."""
        if not keys:
            return 0
        client = self._storage._get_client()
        if client is None:
            return 0
        return client.lookup(spec.ns_index, self._object_keys(spec, keys)).prefix_blocks // len(spec.suffixes)

    def _object_keys(self, spec, keys):
        return [kvtier.external_key(spec.fingerprint, _engine_key(k, sfx)) for k in keys for sfx in spec.suffixes]

    def _buffers(self, spec, keys, host_indices):
        """(address, nbytes) of each object, in _object_keys order."""
        if len(host_indices) != len(keys) * spec.page_size:
            raise ValueError(f"{len(host_indices)} host slots for {len(keys)} pages of {spec.page_size} "
                             f"in pool {spec.name!r}")
        ptrs, sizes = spec.pool.get_page_buffer_meta(host_indices)
        if isinstance(sizes, int):
            sizes = [sizes] * len(ptrs)
        if len(ptrs) != len(keys) * len(spec.suffixes) or len(sizes) != len(ptrs):
            raise ValueError(f"pool {spec.name!r}: get_page_buffer_meta gave {len(ptrs)} buffers for {len(keys)} "
                             f"pages; expected {len(spec.suffixes)} per page")
        return [(int(p), int(n)) for p, n in zip(ptrs, sizes)]

    def _get(self, spec, keys, host_indices) -> List[bool]:
        s = self._storage
        client = s._get_client()
        if client is None or not keys:
            return [False] * len(keys)
        start = time.monotonic()
        buffers = self._buffers(spec, keys, host_indices)
        statuses = s._checked(client.get_batch(spec.ns_index, self._object_keys(spec, keys), buffers))
        done = [st.ok and st.value == n for st, (_, n) in zip(statuses, buffers)]
        pages = s._per_page(done, len(keys))
        s._stats.count_transfer("prefetch", pages, done, [[b] for b in buffers], time.monotonic() - start)
        return pages

    def _put(self, spec, keys, host_indices) -> List[bool]:
        s = self._storage
        if not spec.writes:
            s._stats.count(pages_set_skipped=len(keys))
            return [True] * len(keys)
        client = s._get_client()
        if client is None or not keys:
            return [False] * len(keys)
        start = time.monotonic()
        buffers = self._buffers(spec, keys, host_indices)
        okeys = self._object_keys(spec, keys)
        done = [st.ok for st in s._checked(client.put_batch(spec.ns_index, okeys, buffers))]
        s._stats.remember([k for k, ok in zip(okeys, done) if ok], spec.ns_index)
        pages = s._per_page(done, len(keys))
        s._stats.count_transfer("backup", pages, done, [[b] for b in buffers], time.monotonic() - start)
        return pages


def _engine_key(page_key, suffix: str):
    if isinstance(page_key, (bytes, bytearray)):
        return bytes(page_key) + suffix.encode()
    return str(page_key) + suffix
