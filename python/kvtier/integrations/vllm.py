"""kvtier as vLLM's external KV cache: a KV connector v1 (KVConnectorBase_V1).

Load it with::

    vllm serve <model> --kv-transfer-config '{"kv_connector": "KvtierConnector",
        "kv_connector_module_path": "kvtier.integrations.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"socket_path": "/run/kvtier/kvtierd.sock",
                                      "model_revision": "<the weights commit>"}}'

``kv_load_failure_policy: "recompute"`` matters: vLLM's default, "fail",
ends a user's request with an error whenever a block the cache promised is
gone by the time it loads (the connector warns at start when it sees
"fail").

Extra config keys: ``socket_path``; ``model_revision`` (required unless
vLLM's model_config.revision is set: a cache without a revision would serve
stale KV after a model update); ``block_tokens`` (tokens per kvtier block, a
multiple of vLLM's block size; default 256 rounded to one); ``kv_layout``
(vLLM before 0.28 only: ``kv_first`` for FlashAttention's 5-D cache, the
default, or ``blocks_first`` for FlashInfer's; newer vLLM's 4-D views are
recognised by themselves); ``layerwise`` (default true: loads and saves
run layer by layer inside the forward pass, which needs piecewise CUDA
graphs; false moves whole blocks before and after the forward pass and
allows full CUDA graphs); ``pp_layer_counts`` (KV layers per pipeline stage
when vLLM's even split does not apply); ``call_timeout``, ``lookup_timeout``
(a lookup still unanswered after it counts as a miss, default 2 s) and
``reconnect_interval`` (seconds between tries to reach a kvtierd that is
down, default 5); ``use_directory`` (default true: lookups of host-resident
blocks read the daemon's shared-memory directory without a round trip);
``verify_checksums`` (default false); ``event_medium`` (the medium of the
KV events of kvtier's host tier, default "CPU"); ``forward_tier_events``
(default true: vLLM's KV events also carry kvtierd's own, each kvtier tier
under its medium, when kvtierd publishes events and pyzmq and msgpack or
msgspec are installed; _vllm_tier_events.py) and ``event_media`` (those
medium names, keyed by kvtierd's: ``{"GPU": "KVTIER_HBM", "DISK": "DISK",
"REMOTE": "REMOTE"}`` by default, the host's being ``event_medium``).

Per request, ``kv_transfer_params`` ``{"kvtier": false}`` opts out of the
cache, ``{"kvtier": {"load": false}}`` or ``{"save": false}`` of one half;
vLLM's ``skip_reading_prefix_cache`` stops loads.

Prefill/decode disaggregation (_vllm_handoff.py, docs/INTEGRATIONS.md): a
request the proxy sends to the prefill engine with ``{"do_remote_decode":
true}`` answers, in request_finished, kv_transfer_params naming the blocks it
saved (its free delayed until their commits are done); the decode engine,
given those params, waits for the blocks in its own kvtierd (which pulls them
from the prefill node's through the peer tier) and loads them asynchronously.
Options: ``peer`` (this node's kvtierd peer address, named in the params),
``handoff_wait`` (seconds the decode side waits for the blocks the params
announce before recomputing what is missing, default 1) and
``handoff_async`` (default true: load_async for hand-offs) and
``handoff_free_source`` (default false: the prefill node's kvtierd keeps its
copy; true frees each block once the decode node has read it whole).
``save_decode`` (default false) also saves the blocks decoding fills, keyed
after the prompt (a moved request, the next turn of a conversation).

The connector never raises out of an engine hook: an unsupported model
kind or KV layout, a failing daemon or a bug makes it log one warning with
the reason and serve without the cache (loads it had promised are
reported as load errors, so vLLM recomputes them).

Scheduler side (_vllm_scheduler.py): keys come from the token ids (never
vLLM's block hashes, which start from a random seed per process) in one
namespace per tensor- and pipeline-parallel rank and LoRA adapter (MLA: one
namespace for all TP ranks, saved by rank 0, loaded by all). Worker side
(_vllm_worker.py): one client per worker; register_kv_caches checks that
the tensors match the namespace.
"""

import enum
import functools
import logging

from kvtier.integrations._kv_layout import Unsupported
from kvtier.integrations._vllm_geometry import Geometry, extra_config, flag, layerwise
from kvtier.integrations._vllm_plan import KvtierConnectorMetadata
from kvtier.integrations._vllm_scheduler import SchedulerSide
from kvtier.integrations._vllm_stats import KvtierConnectorStats, KvtierPromMetrics, StatsRecorder
from kvtier.integrations._vllm_worker import WorkerSide

import kvtier

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA
except ImportError:  # vLLM absent, or older than the hybrid-model mixin
    SupportsHMA = object

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
except ImportError:  # vLLM is not installed: a stand-in with the same surface
    class KVConnectorBase_V1:  # noqa: N801 - vLLM's name
        """Stand-in for vLLM's base class (base.py) when vLLM is absent."""

        def __init__(self, vllm_config, role, kv_cache_config=None):
            self._vllm_config = vllm_config
            self._role = role
            self._kv_transfer_config = vllm_config.kv_transfer_config
            self._connector_metadata = None

logger = logging.getLogger("kvtier.vllm")

# The handshake bound of a reconnect attempt made on vLLM's scheduler or
# forward thread (the first connect, at start, may take connect_timeout).
RETRY_CONNECT_S = 0.25

__all__ = ["KvtierConnector", "KvtierConnectorMetadata", "KvtierConnectorStats"]


def _role_name(role):
    return role.name if isinstance(role, enum.Enum) else str(role)


def _worker_rank(vllm_config, tp_size):
    try:
        from vllm.distributed.parallel_state import get_pp_group, get_tensor_model_parallel_rank
        return get_tensor_model_parallel_rank(), get_pp_group().rank_in_group
    except Exception:  # noqa: BLE001 - no vLLM, or its groups are not set up: the config's global rank
        rank = getattr(vllm_config.parallel_config, "rank", 0)
        return rank % tp_size, rank // tp_size


def _fail_open(fallback, last_resort=None):
    """An engine hook that never raises: an exception disables the
    connector (one warning naming the hook and the error) and the hook
    answers fallback(self, *args) instead, or `last_resort` should that
    raise too."""
    def wrap(method):
        @functools.wraps(method)
        def hook(self, *args, **kwargs):
            if self._disabled is None:
                try:
                    return method(self, *args, **kwargs)
                except Exception as e:  # noqa: BLE001 - fail open: never crash the engine
                    self._disable(f"{method.__name__} failed: {e!r}")
            try:
                return fallback(self, *args, **kwargs)
            except Exception:  # noqa: BLE001 - the fallback of the fallback
                logger.debug("kvtier: fallback of %s failed", method.__name__, exc_info=True)
                return last_resort
        return hook
    return wrap


def _nothing(self, *args, **kwargs):
    return None


class KvtierConnector(KVConnectorBase_V1, *([SupportsHMA] if SupportsHMA is not object else [])):
    """vLLM KV connector v1 over kvtierd. One instance per process and role.
    It declares SupportsHMA so vLLM accepts it with the hybrid KV cache
    manager on; a configuration with more than one KV cache group then
    serves without the cache (one warning)."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        self._disabled = None
        self._unreachable = False
        self._is_scheduler = _role_name(role) == "SCHEDULER"
        self._metadata = None
        self._stats = StatsRecorder()
        self._scheduler = self._worker = None
        try:
            if kv_cache_config is None:
                raise Unsupported("vLLM gave no kv_cache_config (KV connector v1 with KVCacheConfig is needed)")
            if self._is_scheduler:
                self._geometry = Geometry(vllm_config, kv_cache_config)
                self._scheduler = SchedulerSide(self._geometry, self._connect, self._stats)
                extra = extra_config(vllm_config)
                self._scheduler.configure_events(extra.get("event_medium", "CPU"),
                                                 flag(extra, "forward_tier_events", True),
                                                 extra.get("event_media"))
                policy = getattr(vllm_config.kv_transfer_config, "kv_load_failure_policy", "recompute")
                if policy != "recompute":
                    logger.warning("kvtier: kv_load_failure_policy is %r: a block evicted between lookup and load "
                                   "fails the user's request; set \"kv_load_failure_policy\": \"recompute\"",
                                   policy)
            else:
                tp_rank, pp_rank = _worker_rank(vllm_config, getattr(vllm_config.parallel_config,
                                                                     "tensor_parallel_size", 1))
                self._geometry = Geometry(vllm_config, kv_cache_config, pp_rank)
                self._worker = WorkerSide(self._geometry, self._connect, self._stats, tp_rank, pp_rank)
        except Exception as e:  # noqa: BLE001 - fail open at start too
            self._disable(str(e) if isinstance(e, Unsupported) else f"start failed: {e!r}")

    def _disable(self, reason):
        if self._disabled is None:
            self._disabled = reason
            logger.warning("kvtier: serving without the cache: %s", reason)
            if self._worker is not None:
                self._worker.disable(reason)

    def _connect(self, namespaces, retry=False):
        """A client of `namespaces`, or None (one warning per outage). A
        retry, from an engine thread while kvtierd was down, waits at most
        RETRY_CONNECT_S for the handshake."""
        g = self._geometry
        try:
            client = kvtier.Client(g.socket_path, namespaces, client_name="vllm", call_timeout=g.call_timeout,
                                   connect_timeout=RETRY_CONNECT_S if retry else g.connect_timeout,
                                   use_directory=g.use_directory, verify_checksums=g.verify_checksums)
        except kvtier.Error as e:
            if not self._unreachable:
                logger.warning("kvtier: kvtierd not reachable (%s); serving without the cache, retrying every "
                               "%.0f s", e, g.reconnect_s)
            self._unreachable = True
            return None
        if self._unreachable:
            logger.warning("kvtier: kvtierd reached again at %s", g.socket_path)
            self._unreachable = False
        return client

    @property
    def disabled_reason(self):
        """Why the connector serves without the cache, or None."""
        return self._disabled

    @property
    def requires_kv_delivery(self):
        """A cache is best effort: a dropped save is a later miss."""
        return False

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config):
        return layerwise(extra_config or {})  # only the per-layer hooks need piecewise graphs

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        return None

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return KvtierConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return KvtierPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def get_kv_connector_stats(self):
        return self._stats.take()

    def bind_connector_metadata(self, connector_metadata):
        self._metadata = connector_metadata
        if self._worker is not None and connector_metadata is not None:
            try:
                self._worker.bind(connector_metadata)
            except Exception as e:  # noqa: BLE001 - fail open
                self._disable(f"bind_connector_metadata failed: {e!r}")

    def clear_connector_metadata(self):
        self._metadata = None

    def has_connector_metadata(self):
        return self._metadata is not None

    def _get_connector_metadata(self):
        return self._metadata

    def shutdown(self):
        for side in (self._scheduler, self._worker):
            if side is not None:
                try:
                    side.close()
                except Exception:  # noqa: BLE001 - shutting down
                    logger.debug("kvtier: close failed", exc_info=True)

    # ---- scheduler side ----

    @_fail_open(_nothing)
    def on_new_request(self, request):
        """The request entered the waiting queue: tell kvtierd its prefix."""
        self._scheduler.on_new_request(request)

    @_fail_open(lambda self, *a: (0, False), (0, False))
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    @_fail_open(_nothing)
    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def _meta_when_disabled(self, scheduler_output):
        # Loads already promised to vLLM still go out: the workers load
        # them or report them failed, and vLLM recomputes.
        meta = KvtierConnectorMetadata()
        if self._scheduler is not None:
            meta.loads = self._scheduler.promised_loads(scheduler_output)
            self._scheduler.pending_transfers(meta)  # async loads and delayed frees vLLM waits for
        return meta

    @_fail_open(_meta_when_disabled, KvtierConnectorMetadata())
    def build_connector_meta(self, scheduler_output):
        return self._scheduler.build_connector_meta(scheduler_output)

    @_fail_open(_nothing)
    def update_connector_output(self, connector_output):
        self._scheduler.update_connector_output(connector_output)

    def _finished_when_disabled(self, request, block_ids):
        # A request whose saves were planned is still reported by the
        # workers: vLLM must keep waiting for exactly those.
        return self._scheduler.forget(request) if self._scheduler is not None else (False, None)

    @_fail_open(_finished_when_disabled, (False, None))
    def request_finished(self, request, block_ids):
        return self._scheduler.request_finished(request, block_ids)

    def request_finished_all_groups(self, request, block_ids):
        return self.request_finished(request, block_ids[0])

    @_fail_open(lambda self: (), ())
    def take_events(self):
        return self._scheduler.take_events()

    @_fail_open(lambda self: False)
    def reset_cache(self):
        """After a weight update (reset_prefix_cache(reset_connector=True)):
        kvtierd drops every namespace of this connector, so nothing stored
        before is served. True when every drop succeeded."""
        return self._scheduler.reset_cache()

    def flush_hints(self, timeout=10.0):
        """Waits until queued hints reached kvtierd (tests, shutdown)."""
        return self._scheduler.flush_hints(timeout) if self._scheduler is not None else True

    # ---- worker side ----

    @_fail_open(_nothing)
    def register_kv_caches(self, kv_caches):
        self._worker.register_kv_caches(kv_caches)

    @_fail_open(_nothing)
    def start_load_kv(self, forward_context, **kwargs):
        if self._metadata is not None:
            self._worker.start_load_kv(self._metadata)

    @_fail_open(_nothing)
    def wait_for_layer_load(self, layer_name):
        self._worker.wait_for_layer_load(layer_name)

    @_fail_open(_nothing)
    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        if self._metadata is not None:
            self._worker.save_kv_layer(self._metadata, layer_name, kv_layer)

    @_fail_open(_nothing)
    def wait_for_save(self):
        self._worker.wait_for_save(self._metadata)

    def _finished_fallback(self, finished_req_ids):
        return self._worker.get_finished(finished_req_ids) if self._worker is not None else (None, None)

    @_fail_open(_finished_fallback, (None, None))
    def get_finished(self, finished_req_ids):
        return self._worker.get_finished(finished_req_ids)

    def _errors_fallback(self):
        return self._worker.take_load_errors() if self._worker is not None else set()

    @_fail_open(_errors_fallback, set())
    def get_block_ids_with_load_errors(self):
        return self._worker.take_load_errors()
