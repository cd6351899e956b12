"""The worker side of the kvtier vLLM connector: one client per worker,
loads into and saves from vLLM's paged KV tensors.

Layer-wise (the default): loads start in start_load_kv, a loader thread
copies them in layer by layer while the forward pass runs, and
wait_for_layer_load waits only for its own layer; saves copy each layer
from save_kv_layer on. Whole-block mode (kv_connector_extra_config.layerwise =
false, which full CUDA graphs allow): start_load_kv copies every layer
before the forward pass, wait_for_save copies every layer after it.
Layer copies of a save run on a gather thread while the forward pass goes
on, and wait_for_save waits for them; commits run on a committer thread. A block that
fails to load is reported, with every later block of its request, by
get_block_ids_with_load_errors, so vLLM recomputes from there.
Recurrent-state groups (Mamba "align" mode) are moved by _vllm_state's
StateMover: loads whole in start_load_kv, saves of vLLM's offered states in
wait_for_save.

Thread: vLLM's worker thread calls every method; the loader thread only
copies loaded layers into engine blocks of this step's loads; the gather thread only
copies engine blocks into arena spans it was handed; the committer thread
only commits saves whose bytes are already in the arena.
"""

import concurrent.futures
import contextlib
import logging
import time

import kvtier
from kvtier.integrations import _kv_layout, _vllm_cuda
from kvtier.integrations._kv_layout import Unsupported
from kvtier.integrations._vllm_plan import NULL_BLOCK
from kvtier.integrations._vllm_state import StateMover

logger = logging.getLogger("kvtier.vllm")


class WorkerSide:
    """What the connector does in one vLLM worker process. Its client
    registers one namespace per KV cache group (namespace id = group)."""

    def __init__(self, geometry, connect, stats, tp_rank, pp_rank):
        self._g = geometry
        self._connect = connect
        self._stats = stats
        self.tp_rank, self.pp_rank = tp_rank, pp_rank
        self.rank_index = geometry.rank_index(tp_rank, pp_rank)
        self._saves_here = geometry.saves_on(tp_rank)
        self.namespaces = geometry.rank_namespaces(tp_rank, pp_rank)
        self.client = None
        self._next_connect = 0.0
        self._adapter_clients = {}       # adapter -> kvtier.Client of this rank's namespaces
        self.kv_caches = {}
        self._layer_of = {}              # layer name -> (group, index in the group)
        self._loads = []                 # _ActiveLoad of this step, one per request and group
        self._saves = {}                 # (req_id, group) -> _Save of this step
        self._load_errors = set()
        self._bound_loads = []           # LoadSpec of the step's metadata
        self._checked = False            # the scheduler's namespaces were compared with ours
        self.committer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kvtier-commit")
        self._gatherer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kvtier-gather")
        self._loader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kvtier-load")
        # Async loads (a prefill/decode hand-off) copy on their own thread, never
        # queued behind or ahead of a forward pass's layer-wise loads.
        self._receiver = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kvtier-recv")
        self._bound_async = []           # LoadSpec of the step's async loads, until start_load_kv starts them
        self._receiving = {}             # req_id -> (LoadSpec, Future of the failed engine block ids)
        self._sending = {}               # req_id -> Future done once the commits queued before it are
        self._loading = None             # Future of the loader thread's work this step
        self._layer_ready = {}           # layer name -> ready mark (_vllm_cuda.layer_ready), this step's loads
        self._load_order = []            # transferred attention layers in the order vLLM registered them
        self._states = StateMover(self)  # the recurrent-state groups' layers
        self.disabled = None             # the reason, once the worker serves without the cache

    @property
    def namespace(self):
        """The namespace of group 0 (the only one of most models)."""
        return self.namespaces[0]

    # ---- set-up ----

    def register_kv_caches(self, kv_caches):
        """Checks every transferred layer's tensor against its group's
        namespace (Unsupported when kvtier cannot store it faithfully) and
        connects. Layers of groups vLLM does not transfer are left alone."""
        g = self._g
        for group in g.groups:
            missing = [n for n in group.layer_names if n not in kv_caches]
            if missing:
                raise Unsupported(f"vLLM registered no KV cache for {missing[0]} (group {group.index})")
            self.namespaces[group.index].layer_count = len(group.layer_names)
            if group.state:
                self._states.register(group, kv_caches, g.num_blocks)
                continue
            for i, name in enumerate(group.layer_names):
                form = _kv_layout.describe(kv_caches[name], g.num_blocks, g.engine_block, group.page_bytes)
                if form.name != g.form:
                    raise Unsupported(f"layer {name} is laid out {form.name}, the namespace says {g.form} "
                                      f"(set kv_connector_extra_config.kv_layout)")
                self._layer_of[name] = (group.index, i)
                self.kv_caches[name] = kv_caches[name]
        self._load_order = [name for name in kv_caches if name in self._layer_of]
        self._ensure_client()
        self._pin_arena()

    def _ensure_client(self):
        """The client, connecting again every reconnect interval while
        kvtierd cannot be reached."""
        if self.client is None and time.monotonic() >= self._next_connect:
            self.client = self._connect(self.namespaces, retry=self._next_connect > 0)
            self._next_connect = time.monotonic() + self._g.reconnect_s
        return self.client

    def client_for(self, adapter):
        """This rank's client for the base model (None) or a LoRA adapter."""
        if adapter is None or self.client is None:
            return self.client
        client = self._adapter_clients.get(adapter)
        if client is None:
            namespaces = self._g.rank_namespaces(self.tp_rank, self.pp_rank, adapter)
            for ns, own in zip(namespaces, self.namespaces):
                ns.layer_count = own.layer_count
            client = self._adapter_clients[adapter] = self._connect(namespaces, retry=True)
        return client

    def _ns(self, group):
        """The scheduler's index of this rank's namespace of `group`."""
        return self._g.ns_index(self.rank_index, group)

    # ---- every step ----

    def bind(self, meta):
        # First what vLLM waits for: every request named here is reported in
        # get_finished, whatever happens to the connector.
        for req_id in getattr(meta, "handoff_sends", None) or ():
            self._sending[req_id] = self.committer.submit(_nothing)  # the committer runs in order
        self._bound_async = list(getattr(meta, "async_loads", None) or ())
        self._bound_loads = list(meta.loads)
        if self.disabled is None and not self._checked and meta.layer_counts:
            self._check_layer_counts(meta.layer_counts)
        if self.disabled is None:
            self._ensure_client()
        else:
            for spec in meta.loads:
                self._load_errors.update(spec.engine_block_ids())

    def _check_layer_counts(self, expected):
        """The scheduler keys this rank's blocks with its own idea of each
        group's layer count (it sees only stage 0's config): a difference
        would make every lookup miss, so it is refused, loudly."""
        self._checked = True
        for group, ns in enumerate(self.namespaces):
            want = expected[self._ns(group)]
            if want != ns.layer_count:
                raise Unsupported(f"pipeline stage {self.pp_rank} has {ns.layer_count} KV layers in group {group}, "
                                  f"the scheduler expects {want} (set kv_connector_extra_config.pp_layer_counts)")

    def start_load_kv(self, meta):
        """Begins this step's loads. Layer-wise, the loader thread copies
        layer after layer in the model's order while the forward pass
        computes, and wait_for_layer_load waits only for its layer; in
        whole-block mode every layer is copied before returning."""
        if self._bound_async:
            specs, self._bound_async = self._bound_async, []
            if self.disabled is None:
                for spec in specs:
                    self._start_receiving(spec)
            else:
                self._bound_async = specs  # get_finished reports them failed
        if self.disabled is not None or not meta.loads:
            return
        for spec in self._states.load(meta.loads):
            self._load_errors.update(spec.engine_block_ids())  # vLLM recomputes the whole load
        self._loads = [_ActiveLoad(self, spec, group) for spec in meta.loads for group in range(len(self._g.groups))
                       if not self._g.groups[group].state]
        # CUDA tensors: the step's copies go on a load stream, behind what the
        # forward stream queued so far (recorded here, on the forward thread).
        copies = _vllm_cuda.load_copies(self.kv_caches.values(), (self.client, *self._adapter_clients.values()))
        if not self._g.layerwise:
            self._load_layers(self._loads, {}, copies)
            self.end_loads()
            return
        self._layer_ready = {name: _vllm_cuda.layer_ready(copies) for name in self._load_order}
        self._loading = self._loader.submit(self._load_layers, self._loads, self._layer_ready, copies)

    def _load_layers(self, loads, ready, copies=None):
        """Copies every layer of `loads` in the model's order, marking each
        layer ready; every mark is set even when a copy raises. With CUDA
        tensors (`copies`, a _vllm_cuda.LoadCopies) each layer's copies are
        queued on the load stream once the daemon has its bytes, its mark
        carries the event behind them, and this returns only after the load
        stream ran them all: the loads end (their arena pins go) after it."""
        try:
            with copies.issuing() if copies is not None else contextlib.nullcontext():
                for name in self._load_order:
                    group, layer = self._layer_of[name]
                    for load in loads:
                        if load.group == group:
                            load.layer(layer, self.kv_caches[name])
                    if name in ready:
                        if copies is not None:
                            ready[name].event = copies.layer_event()
                        ready[name].set()
        finally:
            for event in ready.values():
                event.set()

    def _start_receiving(self, spec):
        """Starts an async load on the receiver thread: every layer of every
        group into engine blocks no forward pass touches until vLLM hears
        it finished (get_finished)."""
        loads = [_ActiveLoad(self, spec, group) for group in range(len(self._g.groups))
                 if not self._g.groups[group].state]
        copies = _vllm_cuda.load_copies(self.kv_caches.values(), (self.client, *self._adapter_clients.values()))
        self._receiving[spec.req_id] = (spec, self._receiver.submit(self._receive, spec, loads, copies))

    def _receive(self, spec, loads, copies):
        """On the receiver thread: copies `loads` and ends them; returns the
        engine blocks that did not load."""
        failed = set(spec.failed or ())
        try:
            self._load_layers(loads, {}, copies)
        finally:
            for load in loads:
                lost = load.end()
                if lost and len(self._g.groups) > 1:
                    lost = load.spec.engine_block_ids()
                failed |= lost
        return failed

    def wait_for_layer_load(self, layer_name):
        """Waits for the layer's loads: on CPU until they are copied; on CUDA
        (a _vllm_cuda.LayerReady) until they are queued, and then the current
        stream waits for them on the GPU."""
        event = self._layer_ready.get(layer_name)
        if event is not None:
            event.wait()

    def _finish_loading(self):
        """Waits for the loader thread and ends the step's loads."""
        if self._loading is not None:
            loading, self._loading, self._layer_ready = self._loading, None, {}
            loading.result()  # a copy that raised fails the connector open
        if self._loads:
            self.end_loads()

    def end_loads(self, group=None):
        """Ends this step's loads (of one group): their failed engine blocks
        become load errors. With several groups a request that failed in any
        group is reported whole, so vLLM recomputes every group from the
        same token."""
        keep = []
        for load in self._loads:
            if group is not None and load.group != group:
                keep.append(load)
                continue
            failed = load.end()
            if failed and len(self._g.groups) > 1:
                failed = load.spec.engine_block_ids()
            self._load_errors.update(failed)
        self._loads = keep

    def save_kv_layer(self, meta, layer_name, kv_layer):
        where = self._layer_of.get(layer_name)
        if where is None or self.disabled is not None or not self._saves_here or not self._g.layerwise:
            return  # whole-block mode saves in wait_for_save
        for spec in meta.saves:
            self._save_layer(spec, where[0], where[1], kv_layer)

    def _save_layer(self, spec, group, layer, kv_layer):
        """Starts the copy of one layer of one group's blocks into the arena
        on the gather thread, so it overlaps the forward pass's next layers;
        wait_for_save waits for it. The engine blocks stay untouched until
        then: they belong to this step's request and the step has not ended."""
        span = spec.groups[group]
        if span is None:
            return
        entry = self._saves.get((spec.req_id, group))
        if entry is None:
            if layer != 0:
                return  # its save could not start at the group's first layer
            client = self.client_for(spec.adapter)
            if client is None:
                return
            try:
                save = client.begin_save(group, spec.keys[self._ns(group)], chain=True,
                                         parent=spec.parents[self._ns(group)])
            except kvtier.Error as e:
                logger.warning("kvtier: save of %s not started: %s", spec.req_id, e)
                return
            if self._g.peer:
                # A node of a prefill/decode pair: each layer is readable by the
                # peers as it is saved, so a decode node can start before the commit.
                try:
                    if spec.handoff:
                        # D reads each block once: P's copy goes as soon as D has it.
                        try:
                            save.publish_to_peers(free_when_taken=True)
                        except TypeError:  # a kvtier binding older than hand-offs
                            logger.warning("kvtier: this kvtier package cannot free hand-offs "
                                           "(handoff_free_source): P keeps its copies")
                            save.publish_to_peers()
                    else:
                        save.publish_to_peers()
                except (kvtier.Error, AttributeError, TypeError) as e:
                    logger.warning("kvtier: layers of %s not published to peers: %s", spec.req_id, e)
            ok = [b for b in range(len(span.block_ids)) if save.status(b).ok]
            entry = self._saves[(spec.req_id, group)] = _Save(save, span, ok, [
                _kv_layout.block_index(kv_layer, span.block_ids[b]) for b in ok])
        try:
            spans = [entry.save.layer_span(b, layer) for b in entry.ok]
        except kvtier.Error as e:
            logger.warning("kvtier: save of %s dropped: %s", spec.req_id, e)
            entry.failed = True
            return
        ready = _device_ready(kv_layer)
        entry.layers.append((layer, self._gatherer.submit(self._gather_layer, kv_layer, entry, spans, ready)))

    def _gather_layer(self, kv_layer, entry, spans, ready):
        """On the gather thread: one layer of one save into its arena spans.
        With CUDA tensors the copies are queued on the save stream, which
        waits on the GPU for `ready` (the forward pass wrote this layer), and
        this returns once they are in the arena (a host wait here, on the
        gather thread)."""
        g = self._g
        with _vllm_cuda.gathering(kv_layer, ready, (self.client, *self._adapter_clients.values())):
            for b, dst, index in zip(entry.ok, spans, entry.index):
                _kv_layout.gather(kv_layer, g.form, entry.span.block_ids[b], dst, g.num_blocks, index)

    def wait_for_save(self, meta):
        self._finish_loading()
        if meta is not None and not self._g.layerwise and self.disabled is None and self._saves_here:
            for name, (group, layer) in self._layer_of.items():
                for spec in meta.saves:
                    self._save_layer(spec, group, layer, self.kv_caches[name])
        for (req_id, group), entry in self._saves.items():
            if not self._gathered(req_id, entry):
                entry.save.abort()  # a layer never came or failed: nothing is published
                continue
            self.account_save(group, len(entry.span.block_ids))
            self.commit(entry.save, req_id)
        self._saves = {}
        if meta is not None and self.disabled is None and self._saves_here and meta.state_saves:
            self._states.save(meta.state_saves)

    def commit(self, save, req_id):
        """Hands a save whose bytes are all in the arena to the committer
        thread, which publishes it (a failure there is a later miss)."""
        self.committer.submit(_finish, save, req_id)

    def account_save(self, group, blocks):
        """Counts `blocks` kvtier blocks of `group` handed to the committer."""
        self._stats.add("save_blocks", blocks)
        self._stats.add("save_bytes", blocks * self.namespaces[group].block_bytes)

    def account_load(self, group, blocks):
        """Counts `blocks` kvtier blocks of `group` loaded."""
        self._stats.add("load_blocks", blocks)
        self._stats.add("load_bytes", blocks * self.namespaces[group].block_bytes)

    def _gathered(self, req_id, entry):
        """Waits for a save's layer copies and declares them written; False
        when one failed or a layer is missing. A layer the gather thread
        finished is in the arena, on CUDA too (see _gather_layer)."""
        try:
            for layer, future in entry.layers:
                future.result()
                if not entry.failed:
                    entry.save.layer_written(layer)
        except Exception as e:  # noqa: BLE001 - a failed copy drops the save, never the step
            logger.warning("kvtier: save of %s dropped: %s", req_id, e)
            return False
        return not entry.failed and entry.save.layers_saved == entry.save.layer_count

    def get_finished(self, finished_req_ids):
        """(finished_sending, finished_recving): the hand-offs whose saves
        are committed (vLLM may free their blocks now) and the async loads
        that ended (their failed blocks go to get_block_ids_with_load_errors,
        called right after, so vLLM recomputes from there). Other requests
        are never held: vLLM frees their blocks at once."""
        recving = set()
        for spec in self._bound_async:  # never started (the connector serves without the cache)
            self._load_errors.update(spec.engine_block_ids() | set(spec.failed or ()))
            recving.add(spec.req_id)
        self._bound_async = []
        for req_id, (spec, future) in list(self._receiving.items()):
            if not future.done():
                continue
            del self._receiving[req_id]
            try:
                failed = future.result()
            except Exception as e:  # noqa: BLE001 - a failed copy fails the load, never the step
                logger.warning("kvtier: async load of %s failed: %s", req_id, e)
                failed = spec.engine_block_ids() | set(spec.failed or ())
            self._load_errors.update(failed)
            recving.add(req_id)
        # A hand-off's commits were queued in the step that finished it: wait
        # for them here (the bytes are in the arena already, so this is one
        # daemon round trip) and report it now, in the step after
        # request_finished, which vLLM always runs, rather than count on
        # later steps of an engine that may have gone idle.
        sending = set(self._sending)
        deadline = time.monotonic() + self._g.call_timeout
        for req_id, future in self._sending.items():
            try:
                future.result(timeout=max(0.0, deadline - time.monotonic()))
            except concurrent.futures.TimeoutError:
                logger.warning("kvtier: the saves of hand-off %s are not committed after %.0f s; its blocks are "
                               "freed anyway", req_id, self._g.call_timeout)
        self._sending = {}
        return sending or None, recving or None

    def take_load_errors(self):
        errors, self._load_errors = self._load_errors, set()
        if errors:
            self._stats.add("load_errors", len(errors))
        return errors

    def disable(self, reason):
        """Serves without the cache from now on: this step's loads become
        load errors (vLLM recomputes them), saves in flight are dropped."""
        self.disabled = reason
        if self._loading is not None:
            self._loading.exception()  # the loader thread no longer writes
            self._loading, self._layer_ready = None, {}
        for spec in self._bound_loads:  # finished or not: vLLM recomputes them
            self._load_errors.update(spec.engine_block_ids())
        self._loads = []
        for entry in self._saves.values():
            try:
                for _, future in entry.layers:
                    future.result()  # nothing may still write into the arena
                entry.save.abort()
            except Exception:  # noqa: BLE001 - already failing
                pass
        self._saves = {}

    def close(self):
        self._receiver.shutdown(wait=True)
        self._loader.shutdown(wait=True)
        self._gatherer.shutdown(wait=True)
        self.committer.shutdown(wait=True)
        on_cuda = any(_vllm_cuda.on_cuda(t) for t in self.kv_caches.values())
        for client in [self.client, *self._adapter_clients.values()]:
            if client is not None:
                if on_cuda:
                    _vllm_cuda.state().pins.forget(client)  # its arena's registration goes with it
                client.close()
        self.client = None

    def _pin_arena(self):
        """With KV tensors on a GPU, registers the client's arena with CUDA
        now, at start-up (it can take seconds for a large arena), not at the
        first copy of a request."""
        tensor = next(iter(self.kv_caches.values()), None)
        if self.client is not None and tensor is not None and _vllm_cuda.on_cuda(tensor):
            cuda = _vllm_cuda.state()
            cuda.pins.hold([self.client], cuda.device_of(tensor)).release()


class _Save:
    """One request's save of one group this step: the kvtier LayerSave, its
    blocks (`ok`: those with a reserved slot, and their index tensors) and
    the layer copies in flight on the gather thread."""

    def __init__(self, save, span, ok, index):
        self.save, self.span, self.ok, self.index = save, span, ok, index
        self.layers = []      # (layer, Future) in the order they were started
        self.failed = False


def _device_ready(tensor):
    """On the forward thread, after the forward pass queued its writes of
    this layer: a CUDA event recorded behind them on the current stream of
    the tensor's device (the gather's stream waits for it), or None on CPU."""
    return _vllm_cuda.record_ready(tensor)


def _nothing():
    return None


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
    """One request's load of one group during a forward pass, layer by layer."""

    def __init__(self, worker, spec, group):
        self.spec, self.group = spec, group
        self._span = spec.groups[group]
        self._worker = worker
        self._failed_from = len(self._span.block_ids)  # kvtier blocks from here on are not usable
        self._load = None
        self._index = {}  # kvtier block -> index tensor of its engine blocks, made at its first layer
        self._started = time.monotonic()
        if not self._span.block_ids:
            return
        client = worker.client_for(spec.adapter)
        if client is None:
            self._failed_from = 0
            return
        try:
            self._load = client.begin_load(group, spec.keys[worker._ns(group)], deadline=worker._g.load_deadline)
        except kvtier.Error as e:
            logger.warning("kvtier: load of %s failed: %s", spec.req_id, e)
            self._failed_from = 0

    def layer(self, layer, tensor):
        """On the copying thread: waits until kvtierd has `layer` of the
        load's blocks in the arena and copies it into `tensor`; with CUDA
        tensors the copies are queued on the thread's current stream (the
        load stream, see _load_layers), which must run them before the load
        ends."""
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
            skip = self._span.skip if b == 0 else 0
            ids = self._span.block_ids[b]
            index = self._index.get(b)
            if index is None:  # one per block for every layer (on CUDA made on the load stream)
                index = self._index[b] = _kv_layout.block_index(tensor, ids[skip:])
            _kv_layout.scatter(tensor, g.form, ids, skip, self._load.layer_span(b, layer), g.num_blocks, index)

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
        stats.add("load_bytes", self._failed_from * self._worker.namespaces[self.group].block_bytes)
        elapsed = time.monotonic() - self._started
        stats.add("load_ms", 1e3 * elapsed)
        if self._span.block_ids:
            stats.observe("load_seconds", elapsed)
        failed = set()
        for b in range(self._failed_from, len(self._span.block_ids)):
            ids = self._span.block_ids[b]
            failed.update(i for i in (ids[self._span.skip:] if b == 0 else ids) if i != NULL_BLOCK)
        return failed
