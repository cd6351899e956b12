"""The kvtier vLLM connector's counters: KvtierConnectorStats (vLLM's
KVConnectorStats: reset / aggregate / reduce / is_empty over a dict of
sums, picklable, sent from every worker to vLLM's logger process) and
KvtierPromMetrics (vLLM's KVConnectorPromMetrics: Prometheus counters of
the same sums, labelled per engine).

Read against vllm-project/vllm
vllm/distributed/kv_transfer/kv_connector/v1/metrics.py (the newest stored
version): observe(transfer_stats_data, engine_idx) receives the data dict
already aggregated across workers.
"""

import threading
from dataclasses import dataclass, field

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats
except ImportError:  # vLLM is not installed: stand-ins with the same surface
    @dataclass
    class KVConnectorStats:  # noqa: D101 - vLLM's name
        data: dict = field(default_factory=dict)

    class KVConnectorPromMetrics:  # noqa: D101 - vLLM's name
        def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
            self._counter_cls = next(cls for key, cls in metric_types.items() if key.__name__ == "Counter")
            self._labelnames = labelnames
            self.per_engine_labelvalues = per_engine_labelvalues

# Every counter: name -> what it counts (the Prometheus help text).
COUNTERS = {
    "lookups": "lookups sent to kvtierd",
    "hit_tokens": "prompt tokens found in kvtier and loaded instead of computed",
    "load_blocks": "kvtier blocks loaded into vLLM's KV cache",
    "load_bytes": "bytes loaded into vLLM's KV cache",
    "load_ms": "milliseconds from the start of a load to its end, summed over loads",
    "load_errors": "engine blocks that failed to load and were recomputed",
    "save_blocks": "kvtier blocks saved from vLLM's KV cache",
    "save_bytes": "bytes saved from vLLM's KV cache",
}


@dataclass
class KvtierConnectorStats(KVConnectorStats):
    """Sums of COUNTERS since the last reset."""
    data: dict = field(default_factory=dict)

    def reset(self):
        self.data = {}

    def aggregate(self, other):
        for key, value in (other.data if other is not None else {}).items():
            self.data[key] = self.data.get(key, 0) + value
        return self

    def reduce(self):
        out = dict(self.data)
        if out.get("load_blocks"):
            out["avg_load_ms_per_block"] = round(out.get("load_ms", 0) / out["load_blocks"], 3)
        return out

    def is_empty(self):
        return not any(self.data.values())


class StatsRecorder:
    """Counts for one connector instance; take() hands vLLM what was counted
    since the previous take. Thread-safe (the committer thread counts too)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._data = {}

    def add(self, key, value):
        with self._lock:
            self._data[key] = self._data.get(key, 0) + value

    def take(self):
        with self._lock:
            data, self._data = self._data, {}
        return KvtierConnectorStats(data) if any(data.values()) else None


class KvtierPromMetrics(KVConnectorPromMetrics):
    """One Prometheus counter per entry of COUNTERS, named
    vllm:kvtier_<name>_total, per engine."""

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters = {}
        for name, help_text in COUNTERS.items():
            counter = self._counter_cls(name=f"vllm:kvtier_{name}", documentation=f"kvtier: {help_text}",
                                        labelnames=labelnames)
            self._counters[name] = {engine: counter.labels(*values)
                                    for engine, values in per_engine_labelvalues.items()}

    def observe(self, transfer_stats_data, engine_idx=0):
        for name, value in (transfer_stats_data or {}).items():
            per_engine = self._counters.get(name)
            if per_engine is not None and engine_idx in per_engine and value:
                per_engine[engine_idx].inc(value)
