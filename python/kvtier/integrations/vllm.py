"""kvtier as vLLM's external KV cache: a KV connector v1 (KVConnectorBase_V1).

Load it with::

    vllm serve <model> --kv-transfer-config '{"kv_connector": "KvtierConnector",
        "kv_connector_module_path": "kvtier.integrations.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"socket_path": "/run/kvtier/kvtierd.sock",
                                      "model_revision": "<the weights commit>"}}'

Extra config keys: ``socket_path``; ``model_revision`` (required unless
vLLM's model_config.revision is set: a cache without a revision would serve
stale KV after a model update); ``block_tokens`` (tokens per kvtier block, a
multiple of vLLM's block size; default 256 rounded to one); ``kv_layout``
(``kv_first``, vLLM FlashAttention's ``[2, blocks, block_size, heads,
head_size]``, or ``blocks_first``); ``call_timeout`` (seconds);
``use_directory`` (default true: lookups of host-resident blocks read the
daemon's shared-memory directory without a round trip);
``verify_checksums`` (default false: every block or layer the connector
reads is checked against the checksums recorded when it was stored; one
that does not match is a load error, reported to vLLM like a miss, and the
daemon drops it).

Scheduler side: keys come from the token ids (never vLLM's block hashes,
which start from a random seed per process) in one namespace per tensor-
and pipeline-parallel rank and LoRA adapter (an adapter's namespaces get
their own connection on first use). A lookup is asynchronous: get_num_new_matched_
tokens answers None ("ask again") until every rank's answer is in, then the
number of tokens all ranks hold as whole kvtier blocks, leaving at least one
prompt token to compute. Loads are synchronous with the forward pass, layer
by layer; saves copy each layer as vLLM computes it and commit after the
pass, off the engine's thread; request_finished keeps a request's blocks
until its saves are committed (get_finished reports them). Queue hints tell
kvtierd which prefixes waiting requests need.

Worker side: one client per worker; register_kv_caches checks that the
tensors match the namespace. A block that fails to load is reported by
get_block_ids_with_load_errors together with every later block of that
request, so vLLM recomputes from there.
"""

import concurrent.futures
import enum
import itertools
import logging

import kvtier
from kvtier.integrations import _kv_layout
from kvtier.integrations._vllm_plan import KvtierConnectorMetadata, RequestState, plan_load, plan_save

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

__all__ = ["KvtierConnector", "KvtierConnectorMetadata"]


def _role_name(role):
    return role.name if isinstance(role, enum.Enum) else str(role)


def _extra(vllm_config):
    config = vllm_config.kv_transfer_config
    return dict(getattr(config, "kv_connector_extra_config", None) or {})


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def _element_size(dtype):
    import torch
    return torch.empty((), dtype=dtype).element_size() if isinstance(dtype, torch.dtype) else int(dtype)


class _Geometry:
    """Everything both sides derive from the configuration alone, so that the
    scheduler's keys and the workers' namespaces agree."""

    def __init__(self, vllm_config, kv_cache_config):
        extra = _extra(vllm_config)
        model = vllm_config.model_config
        self.revision = extra.get("model_revision") or getattr(model, "revision", None)
        if not self.revision:
            raise ValueError("kvtier: set kv_connector_extra_config.model_revision (or --revision): "
                             "without it a model update would be served stale KV")
        groups = kv_cache_config.kv_cache_groups
        if len(groups) != 1:
            raise ValueError(f"kvtier: {len(groups)} KV cache groups; this connector handles one "
                             f"(run vLLM with --disable-hybrid-kv-cache-manager)")
        spec = groups[0].kv_cache_spec
        self.layer_names = list(groups[0].layer_names)
        self.engine_block = spec.block_size
        default_tokens = max(1, 256 // spec.block_size) * spec.block_size
        self.block_tokens = int(extra.get("block_tokens", default_tokens))
        if self.block_tokens <= 0 or self.block_tokens % spec.block_size:
            raise ValueError(f"kvtier: block_tokens {self.block_tokens} is not a multiple of vLLM's "
                             f"block size {spec.block_size}")
        self.per_block = self.block_tokens // spec.block_size
        self.bytes_per_token = 2 * spec.num_kv_heads * spec.head_size * _element_size(spec.dtype)
        self.layout = extra.get("kv_layout", "kv_first")
        if self.layout not in _kv_layout.LAYOUTS:
            raise ValueError(f"kvtier: kv_layout {self.layout!r} is not one of {_kv_layout.LAYOUTS}")
        parallel = vllm_config.parallel_config
        self.tp_size = getattr(parallel, "tensor_parallel_size", 1)
        self.pp_size = getattr(parallel, "pipeline_parallel_size", 1)
        self.model_id = model.model
        self.dtype = _dtype_name(spec.dtype)
        self.socket_path = extra.get("socket_path", "/run/kvtier/kvtierd.sock")
        self.call_timeout = float(extra.get("call_timeout", 30.0))
        self.use_directory = bool(extra.get("use_directory", True))
        self.verify_checksums = bool(extra.get("verify_checksums", False))

    def namespace(self, tp_rank, pp_rank, adapter=None):
        """One rank's namespace; `adapter` is a LoRA's (name, path), or None."""
        ns = kvtier.Namespace(model_id=self.model_id, model_revision=self.revision, kv_dtype=self.dtype,
                              block_tokens=self.block_tokens, layer_count=len(self.layer_names),
                              bytes_per_token_per_layer=self.bytes_per_token,
                              kv_layout=f"vllm_{self.layout}", tp_rank=tp_rank, tp_size=self.tp_size,
                              adapter_id=adapter[0] if adapter else "", adapter_revision=adapter[1] if adapter else "")
        if hasattr(ns, "pp_size"):
            ns.pp_rank, ns.pp_size = pp_rank, self.pp_size
        elif self.pp_size > 1:
            ns.kv_layout += f"_pp{pp_rank}of{self.pp_size}"
        return ns

    def ranks(self):
        """(tp_rank, pp_rank) of every worker, in namespace-id order."""
        return [(t, p) for p in range(self.pp_size) for t in range(self.tp_size)]


def _worker_rank(vllm_config, geometry):
    try:
        from vllm.distributed.parallel_state import (get_pp_group, get_tensor_model_parallel_rank)
        return get_tensor_model_parallel_rank(), get_pp_group().rank_in_group
    except Exception:  # no vLLM, or its groups are not set up: the config's global rank
        rank = getattr(vllm_config.parallel_config, "rank", 0)
        return rank % geometry.tp_size, rank // geometry.tp_size


class KvtierConnector(KVConnectorBase_V1, *([SupportsHMA] if SupportsHMA is not object else [])):
    """vLLM KV connector v1 over kvtierd. One instance per process and role.
    It declares SupportsHMA so vLLM accepts it with the hybrid KV cache
    manager on; a configuration with more than one KV cache group is then
    refused with a clear error (one group is supported)."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        if kv_cache_config is None:
            raise ValueError("kvtier: needs vLLM's kv_cache_config (KV connector v1 with KVCacheConfig)")
        self._geometry = _Geometry(vllm_config, kv_cache_config)
        self._is_scheduler = _role_name(role) == "SCHEDULER"
        self._metadata = None
        g = self._geometry
        if self._is_scheduler:
            self._scopes = {}  # adapter -> _Scope
            scope = self._scope(None)
            self._namespaces, self._hashers, self._client = scope.namespaces, scope.hashers, scope.client
            self._requests = {}
            self._hint_ids = itertools.count(1)
        else:
            self._tp_rank, self._pp_rank = _worker_rank(vllm_config, g)
            self._rank_index = self._pp_rank * g.tp_size + self._tp_rank
            self._namespace = g.namespace(self._tp_rank, self._pp_rank)
            self._client = None
            self._adapter_clients = {}       # adapter -> kvtier.Client of this rank's namespace
            self._kv_caches = {}
            self._layer_index = {}
            self._loads = []                 # _ActiveLoad of this step
            self._saves = {}                 # req_id -> kvtier.LayerSave of this step
            self._commits = {}               # req_id -> [Future] of committing saves
            self._with_saves = set()         # requests whose saves get_finished must report
            self._finished = set()           # finished by the scheduler, saves maybe in flight
            self._load_errors = set()
            self._committer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kvtier-commit")

    # ---- common ----

    def _connect(self, namespaces):
        try:
            return kvtier.Client(self._geometry.socket_path, namespaces, client_name="vllm",
                                 call_timeout=self._geometry.call_timeout,
                                 use_directory=self._geometry.use_directory,
                                 verify_checksums=self._geometry.verify_checksums)
        except kvtier.Error as e:
            logger.warning("kvtier: no cache (%s); serving without it", e)
            return None

    @property
    def requires_kv_delivery(self):
        """A cache is best effort: a dropped save is a later miss."""
        return False

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config):
        return True  # wait_for_layer_load / save_kv_layer run per layer

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        return None

    def bind_connector_metadata(self, connector_metadata):
        self._metadata = connector_metadata
        if not self._is_scheduler and connector_metadata is not None:
            # The scheduler holds these requests' blocks until get_finished
            # reports them, whether or not their saves ever start.
            self._with_saves.update(spec.req_id for spec in connector_metadata.saves)

    def clear_connector_metadata(self):
        self._metadata = None

    def has_connector_metadata(self):
        return self._metadata is not None

    def _get_connector_metadata(self):
        return self._metadata

    def shutdown(self):
        if not self._is_scheduler:
            self._committer.shutdown(wait=True)
        clients = ([s.client for s in self._scopes.values()] if self._is_scheduler
                   else [self._client, *self._adapter_clients.values()])
        for client in clients:
            if client is not None:
                client.close()
        self._client = None

    # ---- scheduler side ----

    def _state(self, request):
        state = self._requests.get(request.request_id)
        if state is None:
            tokens = list(request.prompt_token_ids or [])
            adapter = _adapter_of(request)
            scope = self._scope(adapter)
            salt, extras = _key_extras(request, len(tokens), self._geometry.block_tokens)
            state = RequestState(request.request_id, next(self._hint_ids), tokens,
                                 [h.keys(tokens, cache_salt=salt, extras=extras) for h in scope.hashers],
                                 adapter=adapter)
            self._requests[request.request_id] = state
            self._hint(lambda c: c.enqueue(state.hint_id, 0, state.keys[0]), state)
        return state

    def _scope(self, adapter):
        """The namespaces, hashers and client of the base model (None) or of
        one LoRA adapter: namespaces are registered at connect, so each
        adapter gets its own connection on first use."""
        scope = self._scopes.get(adapter)
        if scope is None:
            g = self._geometry
            namespaces = [g.namespace(t, p, adapter) for t, p in g.ranks()]
            scope = _Scope(namespaces, [kvtier.ChainHasher(ns) for ns in namespaces], self._connect(namespaces))
            self._scopes[adapter] = scope
        return scope

    def _hint(self, call, state):
        client = self._scope(state.adapter).client
        if client is None or not state.keys[0]:
            return
        try:
            call(client)
        except kvtier.NotFoundError:
            pass  # the request was no longer queued
        except kvtier.Error as e:
            logger.debug("kvtier: queue hint failed: %s", e)

    def on_new_request(self, request):
        """The request entered the waiting queue: tell kvtierd its prefix."""
        self._state(request)

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        g = self._geometry
        state = self._state(request)
        usable = (len(state.tokens) - 1) // g.block_tokens  # leave a token to compute
        client = self._scope(state.adapter).client
        if client is None or usable * g.block_tokens <= num_computed_tokens:
            return 0, False
        if state.hits is None:
            if state.pending is None:
                state.pending = [client.lookup_async(i, keys[:usable]) for i, keys in enumerate(state.keys)]
            if not all(p.done() for p in state.pending):
                return None, False  # ask again next step
            try:
                state.hits = min(p.result().prefix_blocks for p in state.pending)
            except kvtier.Error as e:
                logger.warning("kvtier: lookup failed: %s", e)
                state.hits = 0
            state.pending = None
        matched = min(state.hits, usable) * g.block_tokens
        return max(0, matched - num_computed_tokens), False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        state = self._requests.get(request.request_id)
        if state is None or not num_external_tokens or state.hits is None:
            return
        g = self._geometry
        end = min(state.hits, (len(state.tokens) - 1) // g.block_tokens)
        local = end * g.block_tokens - num_external_tokens
        state.block_ids = list(blocks.get_block_ids()[0])
        state.load = (local // g.block_tokens, end, (local % g.block_tokens) // g.engine_block)
        state.saved = max(state.saved, end)

    def build_connector_meta(self, scheduler_output):
        g = self._geometry
        meta = KvtierConnectorMetadata()
        scheduled = scheduler_output.num_scheduled_tokens
        for req in scheduler_output.scheduled_new_reqs:
            state = self._requests.get(req.req_id)
            if state is None:
                continue  # never looked up (no prompt ids)
            state.block_ids = list(req.block_ids[0])
            self._plan(state, req.num_computed_tokens + scheduled.get(req.req_id, 0), meta)
        cached = scheduler_output.scheduled_cached_reqs
        resumed = getattr(cached, "resumed_req_ids", set()) or set()
        for i, req_id in enumerate(cached.req_ids):
            state = self._requests.get(req_id)
            if state is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in resumed:
                state.block_ids = list(new_ids[0]) if new_ids else []
            elif new_ids:
                state.block_ids.extend(new_ids[0])
            self._plan(state, cached.num_computed_tokens[i] + scheduled.get(req_id, 0), meta)
        for req_id in getattr(scheduler_output, "preempted_req_ids", None) or ():
            state = self._requests.get(req_id)
            if state is not None:  # its blocks are gone; it is looked up again on resume
                state.hits, state.pending, state.load, state.block_ids = None, None, None, []
        return meta

    def _plan(self, state, computed_tokens, meta):
        g = self._geometry
        if not state.started:
            state.started = True
            self._hint(lambda c: c.started(state.hint_id), state)
        load = plan_load(state, g.per_block)
        if load is not None:
            meta.loads.append(load)
        save = plan_save(state, computed_tokens, g.per_block, g.block_tokens)
        if save is not None:
            meta.saves.append(save)

    def update_connector_output(self, connector_output):
        pass  # finished saves free blocks in vLLM itself

    def request_finished(self, request, block_ids):
        state = self._requests.pop(request.request_id, None)
        if state is None:
            return False, None
        if not state.started:
            self._hint(lambda c: c.finished(state.hint_id), state)
        # Blocks wait for the commit of any save planned for the request.
        return state.saves_planned, None

    def request_finished_all_groups(self, request, block_ids):
        return self.request_finished(request, block_ids[0])

    # ---- worker side ----

    def register_kv_caches(self, kv_caches):
        g = self._geometry
        names = [n for n in g.layer_names if n in kv_caches]
        if len(names) != len(kv_caches):
            names = list(kv_caches)  # the worker's own order (one pipeline stage)
        for i, name in enumerate(names):
            tensor = kv_caches[name]
            layout = _kv_layout.detect_layout(tensor, tensor.shape[1] if tensor.shape[0] == 2 else tensor.shape[0])
            if layout != g.layout:
                raise ValueError(f"kvtier: layer {name} is laid out {layout}, the namespace says {g.layout} "
                                 f"(set kv_connector_extra_config.kv_layout)")
            if _kv_layout.bytes_per_token(tensor) != g.bytes_per_token:
                raise ValueError(f"kvtier: layer {name} holds {_kv_layout.bytes_per_token(tensor)} bytes a token, "
                                 f"the KV cache spec says {g.bytes_per_token}")
            self._layer_index[name] = i
        self._kv_caches = {n: kv_caches[n] for n in names}
        self._names = names
        if len(names) != self._namespace.layer_count:
            self._namespace.layer_count = len(names)
        self._client = self._connect([self._namespace])

    def start_load_kv(self, forward_context, **kwargs):
        meta = self._metadata
        if meta is None:
            return
        for spec in meta.loads:
            self._loads.append(_ActiveLoad(self, spec))

    def wait_for_layer_load(self, layer_name):
        layer = self._layer_index.get(layer_name)
        if layer is None:
            return
        for load in self._loads:
            load.layer(layer, self._kv_caches[layer_name])
        if layer == len(self._names) - 1:
            self._end_loads()

    def _end_loads(self):
        for load in self._loads:
            self._load_errors.update(load.end())
        self._loads = []

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        meta, layer = self._metadata, self._layer_index.get(layer_name)
        if meta is None or layer is None or self._client is None:
            return
        for spec in meta.saves:
            save = self._saves.get(spec.req_id)
            if save is None:
                if layer != 0:
                    continue  # its save could not start at layer 0
                client = self._client_for(spec.adapter)
                if client is None:
                    continue
                try:
                    save = client.begin_save(0, spec.keys[self._rank_index], chain=True,
                                             parent=spec.parents[self._rank_index])
                except kvtier.Error as e:
                    logger.warning("kvtier: save of %s not started: %s", spec.req_id, e)
                    continue
                self._saves[spec.req_id] = save
            try:
                for b, ids in enumerate(spec.block_ids):
                    if save.status(b).ok:
                        _kv_layout.gather(kv_layer, self._geometry.layout, ids, save.layer_span(b, layer))
                save.layer_written(layer)
            except kvtier.Error as e:
                logger.warning("kvtier: save of %s dropped: %s", spec.req_id, e)
                save.abort()
                del self._saves[spec.req_id]

    def _client_for(self, adapter):
        """This rank's client for the base model (None) or a LoRA adapter."""
        if adapter is None or self._client is None:
            return self._client
        client = self._adapter_clients.get(adapter)
        if client is None:
            ns = self._geometry.namespace(self._tp_rank, self._pp_rank, adapter)
            ns.layer_count = self._namespace.layer_count
            client = self._adapter_clients[adapter] = self._connect([ns])
        return client

    def wait_for_save(self):
        if self._loads:  # layers the forward pass never asked for
            self._end_loads()
        for req_id, save in self._saves.items():
            if save.layers_saved != save.layer_count:
                save.abort()  # some layer never came: nothing is published
                continue
            self._commits.setdefault(req_id, []).append(self._committer.submit(_finish, save, req_id))
        self._saves = {}

    def get_finished(self, finished_req_ids):
        self._finished.update(r for r in finished_req_ids if r in self._with_saves)
        done = set()
        for req_id in list(self._finished):
            futures = self._commits.get(req_id, [])
            if all(f.done() for f in futures):
                done.add(req_id)
                self._commits.pop(req_id, None)
        self._finished -= done
        self._with_saves -= done
        return (done or None), None

    def get_block_ids_with_load_errors(self):
        errors, self._load_errors = self._load_errors, set()
        return errors


def _key_extras(request, num_tokens, block_tokens):
    """The request's cache salt and per-block extra keys (docs/KEYS.md), as
    vLLM's own block hashes take them: the salt on block 0; each multimodal
    input's identifier, with its offset within the block, on every block it
    overlaps; a digest of the prompt embeddings of each block."""
    import hashlib

    import torch
    salt = getattr(request, "cache_salt", None) or None
    blocks = num_tokens // block_tokens
    extras = [[] for _ in range(blocks)]
    for feature in getattr(request, "mm_features", None) or []:
        start, length = feature.mm_position.offset, feature.mm_position.length
        for b in range(start // block_tokens, min(blocks, -(-(start + length) // block_tokens))):
            extras[b].append((kvtier.ExtraKind.MULTIMODAL, f"{feature.identifier}@{start - b * block_tokens}"))
    embeds = getattr(request, "prompt_embeds", None)
    if embeds is not None:
        for b in range(blocks):
            rows = embeds[b * block_tokens:(b + 1) * block_tokens].detach().cpu().contiguous()
            digest = hashlib.sha256(rows.view(-1).view(torch.uint8).numpy().tobytes()).digest()
            extras[b].append((kvtier.ExtraKind.PROMPT_EMBEDS, digest))
    return salt, (extras if any(extras) else None)


class _Scope:
    """The base model's or one adapter's namespaces (one per rank), hashers
    and scheduler-side client."""

    def __init__(self, namespaces, hashers, client):
        self.namespaces, self.hashers, self.client = namespaces, hashers, client


def _adapter_of(request):
    """A LoRA request's (name, path): its place in the namespace (adapter_id,
    adapter_revision). Give each version of an adapter its own name or path."""
    lora = getattr(request, "lora_request", None)
    if lora is None:
        return None
    return (str(lora.lora_name), str(getattr(lora, "lora_path", "") or f"id-{lora.lora_int_id}"))


def _finish(save, req_id):
    try:
        statuses = save.finish()
    except kvtier.Error as e:
        logger.warning("kvtier: commit of %s failed: %s", req_id, e)
        return
    failed = [s for s in statuses if not s.ok and s.code != "already_exists"]
    if failed:
        logger.info("kvtier: %d blocks of %s not saved (%s)", len(failed), req_id, failed[0])


class _ActiveLoad:
    """One request's layer-wise load during a forward pass."""

    def __init__(self, connector, spec):
        self._spec = spec
        self._layout = connector._geometry.layout
        self._failed_from = len(spec.block_ids)  # kvtier blocks from here on are not usable
        self._load = None
        client = connector._client_for(spec.adapter)
        if client is None:
            self._failed_from = 0
            return
        try:
            self._load = client.begin_load(0, spec.keys[connector._rank_index])
        except kvtier.Error as e:
            logger.warning("kvtier: load of %s failed: %s", spec.req_id, e)
            self._failed_from = 0

    def layer(self, layer, tensor):
        if self._load is None or self._failed_from == 0:
            return
        try:
            self._load.wait_layer(layer)
        except kvtier.Error as e:
            logger.warning("kvtier: load of %s failed at layer %d: %s", self._spec.req_id, layer, e)
            self._failed_from = 0
            return
        for b in range(self._failed_from):
            if not self._load.status(b).ok:
                self._failed_from = b
                break
            skip = self._spec.skip if b == 0 else 0
            _kv_layout.scatter(tensor, self._layout, self._spec.block_ids[b], skip, self._load.layer_span(b, layer))

    def end(self):
        """Ends the load; returns the engine block ids that did not load."""
        if self._load is not None:
            for b in range(self._failed_from):  # a block may fail at its last layer
                if not self._load.status(b).ok:
                    self._failed_from = b
                    break
            try:
                self._load.end()
            except kvtier.Error:
                pass  # the pins ended with the connection
            self._load = None
        failed = set()
        for b in range(self._failed_from, len(self._spec.block_ids)):
            ids = self._spec.block_ids[b]
            failed.update(ids[self._spec.skip:] if b == 0 else ids)
        return failed
