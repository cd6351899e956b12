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
            by_name = {key.__name__: cls for key, cls in metric_types.items()}
            self._counter_cls, self._histogram_cls = by_name.get("Counter"), by_name.get("Histogram")
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
    "handoff_offered_blocks": "kvtier blocks a prefill engine named in kv_transfer_params for a decode engine",
    "handoff_tokens": "prompt tokens a decode engine loaded from a prefill engine's hand-off",
    "handoff_missed_blocks": "hand-off blocks a decode engine did not find within handoff_wait (recomputed)",
    "handoff_refused": "hand-offs refused: another namespace, block size or prompt than the decode engine's",
}

# Every series of observations: name -> (what one observation is, buckets).
SERIES = {
    "load_seconds": ("seconds from the start of one request's load of one group to its end",
                     (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)),
}


@dataclass
class KvtierConnectorStats(KVConnectorStats):
    """Sums of COUNTERS since the last reset."""
    data: dict = field(default_factory=dict)

    def reset(self):
        self.data = {}

    def aggregate(self, other):
        for key, value in (other.data if other is not None else {}).items():
            if isinstance(value, list):
                self.data[key] = self.data.get(key, []) + value
            else:
                self.data[key] = self.data.get(key, 0) + value
        return self

    def reduce(self):
        out = {k: v for k, v in self.data.items() if not isinstance(v, list)}
        if out.get("load_blocks"):
            out["avg_load_ms_per_block"] = round(out.get("load_ms", 0) / out["load_blocks"], 3)
        for key, values in self.data.items():
            if isinstance(values, list) and values:
                ordered = sorted(values)
                out[f"{key}_p50"] = ordered[len(ordered) // 2]
                out[f"{key}_max"] = ordered[-1]
        return out

    def is_empty(self):
        return not any(self.data.values())  # sums and series alike


class StatsRecorder:
    """Counts for one connector instance; take() hands vLLM what was counted
    since the previous take. Thread-safe (the committer thread counts too)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._data = {}

    def add(self, key, value):
        with self._lock:
            self._data[key] = self._data.get(key, 0) + value

    def observe(self, key, value):
        """One observation of a SERIES entry."""
        with self._lock:
            self._data.setdefault(key, []).append(value)

    def take(self):
        with self._lock:
            data, self._data = self._data, {}
        return KvtierConnectorStats(data) if any(data.values()) else None  # a list counts when not empty


class KvtierPromMetrics(KVConnectorPromMetrics):
    """Per engine: one Prometheus counter per entry of COUNTERS
    (vllm:kvtier_<name>, exported as ..._total) and one histogram per
    entry of SERIES (vllm:kvtier_<name>)."""

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters, self._histograms = {}, {}
        for name, help_text in COUNTERS.items():
            counter = self._counter_cls(name=f"vllm:kvtier_{name}", documentation=f"kvtier: {help_text}",
                                        labelnames=labelnames)
            self._counters[name] = self._per_engine(counter, per_engine_labelvalues)
        for name, (help_text, buckets) in SERIES.items():
            if self._histogram_cls is None:
                continue
            histogram = self._histogram_cls(name=f"vllm:kvtier_{name}", documentation=f"kvtier: {help_text}",
                                            buckets=list(buckets), labelnames=labelnames)
            self._histograms[name] = self._per_engine(histogram, per_engine_labelvalues)

    @staticmethod
    def _per_engine(metric, per_engine_labelvalues):
        return {engine: metric.labels(*values) for engine, values in per_engine_labelvalues.items()}

    def observe(self, transfer_stats_data, engine_idx=0):
        for name, value in (transfer_stats_data or {}).items():
            if name in self._histograms and engine_idx in self._histograms[name]:
                for sample in value:
                    self._histograms[name][engine_idx].observe(sample)
            elif name in self._counters and engine_idx in self._counters[name] and value:
                self._counters[name][engine_idx].inc(value)
