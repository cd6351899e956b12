"""The worker side of the kvtier vLLM connector: one client per worker,
loads into and saves from vLLM's paged KV tensors.

Layer-wise (the default): loads start in start_load_kv and each layer is
copied in when wait_for_layer_load asks for it; saves copy each layer in
save_kv_layer. Whole-block mode (kv_connector_extra_config.layerwise =
false, which full CUDA graphs allow): start_load_kv copies every layer
before the forward pass, wait_for_save copies every layer after it.
Commits run on a committer thread, off the forward pass. A block that
fails to load is reported, with every later block of its request, by
get_block_ids_with_load_errors, so vLLM recomputes from there.

Thread: vLLM's worker thread calls every method; the committer thread
only commits saves whose bytes are already in the arena.
"""

import concurrent.futures
import logging
import time

import kvtier
from kvtier.integrations import _kv_layout
from kvtier.integrations._kv_layout import Unsupported

logger = logging.getLogger("kvtier.vllm")


class WorkerSide:
    """What the connector does in one vLLM worker process."""

    def __init__(self, geometry, connect, stats, tp_rank, pp_rank):
        self._g = geometry
        self._connect = connect
        self._stats = stats
        self.tp_rank, self.pp_rank = tp_rank, pp_rank
        self.rank_index = geometry.rank_index(tp_rank, pp_rank)
        self._saves_here = geometry.saves_on(tp_rank)
        self.namespace = geometry.namespace(tp_rank, pp_rank)
        self.client = None
        self._next_connect = 0.0
        self._adapter_clients = {}       # adapter -> kvtier.Client of this rank's namespace
        self.kv_caches = {}
        self._names = []
        self._layer_index = {}
        self._loads = []                 # _ActiveLoad of this step
        self._saves = {}                 # req_id -> (kvtier.LayerSave, SaveSpec) of this step
        self._commits = {}               # req_id -> [Future] of committing saves
        self._with_saves = set()         # requests whose saves get_finished must report
        self._finished = set()           # finished by the scheduler, saves maybe in flight
        self._load_errors = set()
        self._bound_loads = []           # LoadSpec of the step's metadata
        self.committer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kvtier-commit")
        self.disabled = None             # the reason, once the worker serves without the cache

    # ---- set-up ----

    def register_kv_caches(self, kv_caches):
        """Checks every layer's tensor against the namespace (Unsupported
        when kvtier cannot store it faithfully) and connects."""
        g = self._g
        names = [n for n in g.layer_names if n in kv_caches]
        if len(names) != len(kv_caches):
            names = list(kv_caches)  # the worker's own order (one pipeline stage)
        for i, name in enumerate(names):
            form = _kv_layout.describe(kv_caches[name], g.num_blocks, g.engine_block, g.page_bytes)
            if form.name != g.form:
                raise Unsupported(f"layer {name} is laid out {form.name}, the namespace says {g.form} "
                                  f"(set kv_connector_extra_config.kv_layout)")
            self._layer_index[name] = i
        if len(names) != self.namespace.layer_count:
            raise Unsupported(f"pipeline stage {self.pp_rank} has {len(names)} KV layers, the scheduler expects "
                              f"{self.namespace.layer_count} (set kv_connector_extra_config.pp_layer_counts)")
        self.kv_caches = {n: kv_caches[n] for n in names}
        self._names = names
        self._ensure_client()

    def _ensure_client(self):
        """The client, connecting again every reconnect interval while
        kvtierd cannot be reached."""
        if self.client is None and time.monotonic() >= self._next_connect:
            self.client = self._connect([self.namespace])
            self._next_connect = time.monotonic() + self._g.reconnect_s
        return self.client

    def client_for(self, adapter):
        """This rank's client for the base model (None) or a LoRA adapter."""
        if adapter is None or self.client is None:
            return self.client
        client = self._adapter_clients.get(adapter)
        if client is None:
            ns = self._g.namespace(self.tp_rank, self.pp_rank, adapter)
            client = self._adapter_clients[adapter] = self._connect([ns])
        return client

    # ---- every step ----

    def bind(self, meta):
        # The scheduler holds these requests' blocks until get_finished
        # reports them, whether or not their saves ever start.
        self._with_saves.update(spec.req_id for spec in meta.saves)
        self._bound_loads = list(meta.loads)
        if self.disabled is None:
            self._ensure_client()
        else:
            for spec in meta.loads:
                self._load_errors.update(_all_block_ids(spec))

    def start_load_kv(self, meta):
        if self.disabled is not None:
            return
        for spec in meta.loads:
            self._loads.append(_ActiveLoad(self, spec))
        if not self._g.layerwise:
            for name, i in self._layer_index.items():
                for load in self._loads:
                    load.layer(i, self.kv_caches[name])
            self.end_loads()

    def wait_for_layer_load(self, layer_name):
        layer = self._layer_index.get(layer_name)
        if layer is None or not self._loads:
            return
        for load in self._loads:
            load.layer(layer, self.kv_caches[layer_name])
        if layer == len(self._names) - 1:
            self.end_loads()

    def end_loads(self):
        for load in self._loads:
            self._load_errors.update(load.end())
        self._loads = []

    def save_kv_layer(self, meta, layer_name, kv_layer):
        layer = self._layer_index.get(layer_name)
        if layer is None or self.disabled is not None or not self._saves_here:
            return
        for spec in meta.saves:
            self._save_layer(spec, layer, kv_layer)

    def _save_layer(self, spec, layer, kv_layer):
        entry = self._saves.get(spec.req_id)
        if entry is None:
            if layer != 0:
                return  # its save could not start at layer 0
            client = self.client_for(spec.adapter)
            if client is None:
                return
            try:
                save = client.begin_save(0, spec.keys[self.rank_index], chain=True,
                                         parent=spec.parents[self.rank_index])
            except kvtier.Error as e:
                logger.warning("kvtier: save of %s not started: %s", spec.req_id, e)
                return
            entry = self._saves[spec.req_id] = (save, spec)
        save = entry[0]
        try:
            for b, ids in enumerate(spec.block_ids):
                if save.status(b).ok:
                    _kv_layout.gather(kv_layer, self._g.form, ids, save.layer_span(b, layer), self._g.num_blocks)
            save.layer_written(layer)
        except kvtier.Error as e:
            logger.warning("kvtier: save of %s dropped: %s", spec.req_id, e)
            save.abort()
            del self._saves[spec.req_id]

    def wait_for_save(self, meta):
        if self._loads:  # layers the forward pass never asked for
            self.end_loads()
        if meta is not None and not self._g.layerwise and self.disabled is None and self._saves_here:
            for name, i in self._layer_index.items():
                for spec in meta.saves:
                    self._save_layer(spec, i, self.kv_caches[name])
        for req_id, (save, spec) in self._saves.items():
            if save.layers_saved != save.layer_count:
                save.abort()  # some layer never came: nothing is published
                continue
            self._stats.add("save_blocks", len(spec.block_ids))
            self._stats.add("save_bytes", len(spec.block_ids) * self.namespace.block_bytes)
            self._commits.setdefault(req_id, []).append(self.committer.submit(_finish, save, req_id))
        self._saves = {}

    def get_finished(self, finished_req_ids):
        """Requests whose blocks may be freed: finished ones whose commits
        are done (all of them once the worker serves without the cache)."""
        self._finished.update(r for r in finished_req_ids if r in self._with_saves)
        done = set()
        for req_id in list(self._finished):
            futures = self._commits.get(req_id, [])
            if self.disabled is not None or all(f.done() for f in futures):
                done.add(req_id)
                self._commits.pop(req_id, None)
        self._finished -= done
        self._with_saves -= done
        return (done or None), None

    def take_load_errors(self):
        errors, self._load_errors = self._load_errors, set()
        if errors:
            self._stats.add("load_errors", len(errors))
        return errors

    def disable(self, reason):
        """Serves without the cache from now on: pending loads become load
        errors (vLLM recomputes them), saves in flight are dropped."""
        self.disabled = reason
        for spec in self._bound_loads:  # this step's loads, finished or not: vLLM recomputes them
            self._load_errors.update(_all_block_ids(spec))
        self._loads = []
        for save, _ in self._saves.values():
            try:
                save.abort()
            except Exception:  # noqa: BLE001 - already failing
                pass
        self._saves = {}

    def close(self):
        self.committer.shutdown(wait=True)
        for client in [self.client, *self._adapter_clients.values()]:
            if client is not None:
                client.close()
        self.client = None


def _all_block_ids(spec):
    ids = set()
    for b, block in enumerate(spec.block_ids):
        ids.update(block[spec.skip:] if b == 0 else block)
    return ids


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
    """One request's load during a forward pass, layer by layer."""

    def __init__(self, worker, spec):
        self.spec = spec
        self._worker = worker
        self._failed_from = len(spec.block_ids)  # kvtier blocks from here on are not usable
        self._load = None
        self._started = time.monotonic()
        client = worker.client_for(spec.adapter)
        if client is None:
            self._failed_from = 0
            return
        try:
            self._load = client.begin_load(0, spec.keys[worker.rank_index])
        except kvtier.Error as e:
            logger.warning("kvtier: load of %s failed: %s", spec.req_id, e)
            self._failed_from = 0

    def layer(self, layer, tensor):
        if self._load is None or self._failed_from == 0:
            return
        try:
            self._load.wait_layer(layer)
        except kvtier.Error as e:
            logger.warning("kvtier: load of %s failed at layer %d: %s", self.spec.req_id, layer, e)
            self._failed_from = 0
            return
        g = self._worker._g
        for b in range(self._failed_from):
            if not self._load.status(b).ok:
                self._failed_from = b
                break
            skip = self.spec.skip if b == 0 else 0
            _kv_layout.scatter(tensor, g.form, self.spec.block_ids[b], skip, self._load.layer_span(b, layer),
                               g.num_blocks)

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
        stats = self._worker._stats
        stats.add("load_blocks", self._failed_from)
        stats.add("load_bytes", self._failed_from * self._worker.namespace.block_bytes)
        stats.add("load_ms", 1e3 * (time.monotonic() - self._started))
        failed = set()
        for b in range(self._failed_from, len(self.spec.block_ids)):
            ids = self.spec.block_ids[b]
            failed.update(ids[self.spec.skip:] if b == 0 else ids)
        return failed
