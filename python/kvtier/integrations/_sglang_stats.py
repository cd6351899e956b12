"""The counters of kvtier's SGLang storage backend (sglang.py): pages and
bytes moved, the per-call samples SGLang's StorageMetrics carries, and the
record of the objects stored that clear() erases."""

from __future__ import annotations

import collections
import importlib
import threading

_METRICS_MODULES = ("sglang.srt.observability.metrics_collector", "sglang.srt.metrics.collector")


class BackendStats:
    """Cumulative counters and the samples since the last snapshot, and the
    most recent `record_limit` objects stored (oldest first; 0 keeps none).
    Thread-safe: SGLang's prefetch, prefetch-I/O and backup threads count
    at once."""

    def __init__(self, record_limit: int):
        self._record_limit = record_limit
        self._lock = threading.Lock()
        self._counters = collections.Counter()
        self._samples = {"prefetch_pgs": [], "backup_pgs": [], "prefetch_bandwidth": [], "backup_bandwidth": []}
        self._written = collections.OrderedDict()  # (namespace index, kvtier.Key) -> None, oldest first
        self._stats_class = None

    def count(self, **deltas):
        with self._lock:
            self._counters.update(deltas)

    def count_transfer(self, kind, pages, done, objects, seconds):
        """One call's pages (one bool each) of `kind` "prefetch" or
        "backup"; the bytes of the `objects` (lists of (address, nbytes)
        pieces) whose `done` is true."""
        nbytes = sum(sum(n for _, n in pieces) for ok, pieces in zip(done, objects) if ok)
        good = sum(pages)
        with self._lock:
            if kind == "prefetch":
                self._counters.update(pages_get=len(pages), pages_hit=good, pages_miss=len(pages) - good,
                                      bytes_read=nbytes)
            else:
                self._counters.update(pages_set=good, pages_set_failed=len(pages) - good, bytes_written=nbytes)
            if len(self._samples[kind + "_pgs"]) < 4096:
                self._samples[kind + "_pgs"].append(good)
                self._samples[kind + "_bandwidth"].append(nbytes / max(seconds, 1e-9) / 1e9)

    def remember(self, okeys, ns: int):
        """Records objects `okeys` stored in namespace index `ns`."""
        if self._record_limit <= 0:
            return
        with self._lock:
            for k in okeys:
                self._written[(ns, k)] = None
                self._written.move_to_end((ns, k))
            while len(self._written) > self._record_limit:
                self._written.popitem(last=False)

    def take_written(self) -> list:
        """The (namespace index, key) of the objects recorded, oldest first;
        the record starts empty again."""
        with self._lock:
            written, self._written = list(self._written), collections.OrderedDict()
        return written

    def snapshot(self):
        """The counters (dict), and the samples since the previous snapshot:
        a StorageMetrics too when SGLang's is importable (KvtierStorage.get_stats)."""
        with self._lock:
            counters = {k: int(self._counters[k]) for k in (
                "pages_get", "pages_hit", "pages_miss", "pages_set", "pages_set_failed",
                "pages_set_skipped", "bytes_read", "bytes_written", "errors")}
            samples = {k: list(v) for k, v in self._samples.items()}
            for v in self._samples.values():
                v.clear()
        cls = self._storage_metrics_class()
        return cls(counters, samples) if cls is not None else counters

    def _storage_metrics_class(self):
        if self._stats_class is None:
            self._stats_class = False
            for name in _METRICS_MODULES:
                try:
                    metrics = getattr(importlib.import_module(name), "StorageMetrics")
                except Exception:  # noqa: BLE001  (no SGLang, or another version)
                    continue

                fields = getattr(metrics, "__dataclass_fields__", {})

                class KvtierStats(dict, metrics):
                    def __init__(self, counters, samples):
                        dict.__init__(self, counters)
                        metrics.__init__(self, **{k: v for k, v in samples.items() if k in fields})

                self._stats_class = KvtierStats
                break
        return self._stats_class or None
