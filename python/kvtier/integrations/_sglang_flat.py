"""The generic path of kvtier's SGLang storage backend (sglang.py, with
``interface_v1`` 0: get/set/batch_get/batch_set): one ``_flat`` object per
page, the flat page SGLang passes (a CPU tensor, a buffer, or a raw
address with its size), moved with one get_batch / put_batch per call."""

from __future__ import annotations

import time

FLAT_SUFFIX = "_flat"


def get_pages(storage, keys, target_locations, target_sizes):
    """KvtierStorage.batch_get for `storage` (a KvtierStorage): a list of
    len(keys), target_locations[i] filled with page i, or None."""
    s = storage
    try:
        client = s._get_client()
        if client is None or not keys:
            return [None] * len(keys)
        start = time.monotonic()
        if target_locations is None:
            target_locations = [s.mem_pool_host.get_dummy_flat_data_page() for _ in keys]
        outs = [_span(t, None if target_sizes is None else target_sizes[i], writable=True)
                for i, t in enumerate(target_locations)]
        statuses = s._checked(client.get_batch(0, s._object_keys(keys, (FLAT_SUFFIX,)),
                                               [b for b, _, _ in outs]))
        done = [st.ok and st.value == n for st, (_, n, _) in zip(statuses, outs)]
        s._stats.count_transfer("prefetch", done, done, [[(0, n)] for _, n, _ in outs], time.monotonic() - start)
        return [t if ok else None for t, ok in zip(target_locations, done)]
    except Exception as e:  # noqa: BLE001
        s._failed("batch_get", e)
        return [None] * len(keys)


def set_pages(storage, keys, values, target_locations, target_sizes) -> bool:
    """KvtierStorage.batch_set for `storage`: True iff every page was stored
    (already cached counts)."""
    s = storage
    try:
        if not s._writes:
            s._stats.count(pages_set_skipped=len(keys))
            return True
        client = s._get_client()
        if client is None:
            return False
        if not keys:
            return True
        start = time.monotonic()
        sources = values if values is not None else target_locations
        outs = [_span(t, None if target_sizes is None else target_sizes[i], writable=False)
                for i, t in enumerate(sources)]
        okeys = s._object_keys(keys, (FLAT_SUFFIX,))
        done = [st.ok for st in s._checked(client.put_batch(0, okeys, [b for b, _, _ in outs]))]
        s._stats.remember([k for k, ok in zip(okeys, done) if ok], 0)
        s._stats.count_transfer("backup", done, done, [[(0, n)] for _, n, _ in outs], time.monotonic() - start)
        return all(done)
    except Exception as e:  # noqa: BLE001
        s._failed("batch_set", e)
        return False

def _span(obj, size, writable: bool):
    """(what the binding gets, nbytes, keep-alive) for one page buffer: a CPU
    tensor becomes its raw (data_ptr, nbytes), any dtype (bf16 included); an
    int address needs `size`; anything else goes to the binding as a buffer."""
    if isinstance(obj, int):
        return (obj, int(size)), int(size), None
    if hasattr(obj, "data_ptr") and hasattr(obj, "element_size"):
        if getattr(obj.device, "type", "cpu") != "cpu":
            raise ValueError(f"kvtier: expected a CPU tensor, got one on {obj.device}")
        if not obj.is_contiguous():
            if writable:
                raise ValueError("kvtier: target tensor is not contiguous")
            obj = obj.contiguous()
        nbytes = obj.numel() * obj.element_size()
        return (obj.data_ptr(), nbytes), nbytes, obj
    return obj, memoryview(obj).nbytes, obj
