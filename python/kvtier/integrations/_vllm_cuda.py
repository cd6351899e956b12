"""The CUDA side of the vLLM connector's copies: side streams, per-layer
CUDA events and the arena's registration with CUDA. The worker
(_vllm_worker.py) comes here only for KV tensors on a CUDA device: with CPU
tensors nothing here runs. The module imports on a CPU-only torch; torch.cuda
is touched only through TorchCuda, on first use.

Loads. start_load_kv (forward thread) records `start` on the forward stream;
the load stream waits for it on the GPU, so no copy overwrites an engine
block under work queued before the step's loads. The loader thread waits for
each layer's bytes in the arena (LayerLoad.wait_layer, the only daemon round
trip), queues the layer's copies on the load stream (each block's arena span
to the device in one copy, then one index_put_ into the engine blocks),
records the layer's event and sets the layer's `issued` flag.
wait_for_layer_load (forward thread) blocks on that flag only, then has the
forward stream wait for the layer's event on the GPU. After the last layer
the loader thread synchronizes the load stream: the loads end (their arena
pins go) only once nothing reads the arena.

Saves. save_kv_layer (forward thread) records `ready` on the forward stream
behind the layer's writes. The gather thread has the save stream wait for it
on the GPU, queues the gather (index_select on the device) and the copy into
each arena span (non_blocking, into the registered arena), records `done` and
waits for it on the gather thread: a layer the gather thread hands back is in
the arena, so wait_for_save's commit (on the committer thread) never
publishes half-written bytes, and no abort frees arena space a copy still
writes.

The arena is page-locked by one cudaHostRegister of each client's whole
mapping (ArenaPins), so these copies are DMA. Where registration fails, the
copies still run, synchronously through CUDA's staging buffers.

Every CUDA call goes through a runtime object (TorchCuda in production, a
fake in tests/python/test_vllm_cuda_path.py). Host waits are only ever on
events that were recorded, so none can hang on work that was never queued.
"""

import contextlib
import itertools
import logging
import threading
import weakref

import kvtier

logger = logging.getLogger("kvtier.vllm")

# cuda_runtime_api.h: cudaHostRegisterPortable (pinned for every context of
# the process), cudaErrorHostMemoryAlreadyRegistered.
_REGISTER_PORTABLE = 1
_ALREADY_REGISTERED = 712


def on_cuda(tensor):
    """Whether the connector copies `tensor` through this module."""
    return tensor.device.type == "cuda"


def _on_own_thread(fn):
    """fn() on a thread that ends with it; blocks until it returns. A CUDA
    call that fails leaves its error as its thread's "last error", which
    torch's next kernel-launch check on that thread (cudaGetLastError) would
    raise as its own; a thread of its own forgets it."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
            out["error"] = e

    thread = threading.Thread(target=run, name="kvtier-cuda-register", daemon=True)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


class TorchCuda:
    """The CUDA runtime as torch.cuda offers it, imported on first use.
    Thread-safe (torch's calls are)."""

    @staticmethod
    def _cuda():
        import torch.cuda
        return torch.cuda

    def current_device(self):
        return self._cuda().current_device()

    def new_stream(self, device):
        return self._cuda().Stream(device=device)

    def new_event(self, blocking=False):
        """blocking: a host wait sleeps instead of spinning (events waited on
        for as long as a forward pass)."""
        return self._cuda().Event(blocking=blocking)

    def current_stream(self, device):
        return self._cuda().current_stream(device)

    def using(self, stream):
        """Makes `stream` the calling thread's current stream of its device."""
        return self._cuda().stream(stream)

    def device(self, device):
        return self._cuda().device(device)

    def host_register(self, address, size, device):
        """cudaHostRegister(address, size, portable): the cudaError_t as an int."""
        cuda = self._cuda()

        def call():
            with cuda.device(device):  # the caller's GPU, never another one's context
                return int(cuda.cudart().cudaHostRegister(address, size, _REGISTER_PORTABLE))
        return _on_own_thread(call)

    def host_unregister(self, address, device):
        cuda = self._cuda()

        def call():
            with cuda.device(device):
                return int(cuda.cudart().cudaHostUnregister(address))
        return _on_own_thread(call)


class _Range:
    """One arena mapping as registered: its owner is (client token,
    reconnects) of the mapping; `ours` when this process registered it here,
    `pinned` when CUDA holds it page-locked (ours or someone else's)."""

    def __init__(self, address, size, owner, device, ours, pinned):
        self.address, self.size, self.owner, self.device = address, size, owner, device
        self.ours, self.pinned = ours, pinned
        self.superseded = False

    def overlaps(self, address, size):
        return self.address < address + size and address < self.address + self.size


class _Hold:
    """Copies in flight on some arenas; release() once they finished."""

    def __init__(self, pins):
        self._pins = pins

    def release(self):
        pins, self._pins = self._pins, None
        if pins is not None:
            pins._release()


class ArenaPins:
    """The cudaHostRegister of kvtier arena mappings. CUDA keeps one table of
    registered host ranges per process, so there is one of these per process
    (state()): a range is registered once, never twice.

    hold(clients) before queuing copies from or into arena spans of those
    clients' handles registers each client's current mapping the first time
    it is seen; release() the hold once the copies finished. A client's
    mapping changes when it reconnects (kvtierd restarted): the new one is
    registered at the next hold, the old one unregistered when no hold is
    left (a copy of a handle from before the reconnect may use it until
    then). A range of ours that a new mapping overlaps is unregistered at
    once: its mapping is gone, and with it every handle that could have a
    copy in it. The range of a client found closed at a hold is unregistered
    at once (the worker closes its clients after its last step); that of a
    client garbage collected, or named by forget(), when no hold is left.

    CUDA refusing a range as already registered means someone else owns it
    (the C++ client registers its arena for its own GPU loads): it is left to
    them. Any other failure is logged once per mapping and its copies run
    unpinned (synchronous, correct).

    Known gap: between a client's close (its arena unmapped) and the next
    hold of any client in the process (or forget()), its range stays
    registered; CUDA keeps those pages locked, and a copy by other code from
    a new mapping at that address in this window would go to the old pages.
    Our own copies never do: a mapping of ours over that address is new to
    this object, which unregisters the old range first.

    Thread-safe. Register and unregister calls run on a thread of their own
    (_on_own_thread); a hold can take seconds the first time (pinning a large
    arena), once per mapping.
    """

    def __init__(self, runtime):
        self._runtime = runtime
        self._lock = threading.Lock()
        self._tokens = weakref.WeakKeyDictionary()  # client -> token: ids are reused, tokens are not
        self._next_token = itertools.count(1)
        self._ranges = []  # _Range, guarded by _lock
        self._holds = 0    # holds not released, guarded by _lock

    def hold(self, clients, device):
        """Registers the current arena mapping of each client (None entries
        are skipped) for copies on `device`; the returned hold must be
        released once those copies finished. Raises what reading a client's
        arena raises (a closed client); registration failures do not."""
        with self._lock:
            self._holds += 1
            try:
                self._drop_closed()
                for client in clients:
                    if client is not None:
                        self._ensure(client, device)
            except BaseException:
                self._holds -= 1
                raise
        return _Hold(self)

    def forget(self, client):
        """The client is closing: its ranges are unregistered now if no hold
        is left, else when the last one is released."""
        with self._lock:
            token = self._tokens.pop(client, None)
            for r in self._ranges:
                if r.owner[0] == token:
                    r.superseded = True
            if self._holds == 0:
                self._drop_unused()

    def pinned(self, address):
        """Whether `address` lies in a range CUDA holds page-locked (as far as
        this object knows)."""
        with self._lock:
            return any(r.pinned and r.overlaps(address, 1) for r in self._ranges)

    def _release(self):
        with self._lock:
            self._holds -= 1
            if self._holds == 0:
                self._drop_unused()

    def _ensure(self, client, device):
        token = self._tokens.get(client)
        if token is None:
            token = self._tokens[client] = next(self._next_token)
        while True:  # the mapping and the reconnect count of one connection, not of two
            reconnects = client.reconnects
            address, size = client.arena_address, client.arena_bytes
            if client.reconnects == reconnects:
                break
        owner = (token, reconnects)
        if any(r.owner == owner and (r.address, r.size) == (address, size) for r in self._ranges):
            return
        for r in [r for r in self._ranges if r.overlaps(address, size)]:
            self._drop(r)  # the mapping it was registered for is gone
        for r in self._ranges:
            if r.owner[0] == token:
                r.superseded = True  # the client's mapping from before its reconnect
        self._ranges.append(self._register(address, size, owner, device))

    def _register(self, address, size, owner, device):
        try:
            code = self._runtime.host_register(address, size, device)
        except Exception as e:  # noqa: BLE001 - e.g. a torch without the cudart binding
            logger.warning("kvtier: cudaHostRegister of the kvtier arena could not be called (%r): its copies to "
                           "and from the GPU run unpinned (synchronous)", e)
            return _Range(address, size, owner, device, ours=False, pinned=False)
        if code == 0:
            return _Range(address, size, owner, device, ours=True, pinned=True)
        if code == _ALREADY_REGISTERED:
            return _Range(address, size, owner, device, ours=False, pinned=True)
        logger.warning("kvtier: cudaHostRegister of the kvtier arena (%d bytes) failed with cudaError %d: "
                       "its copies to and from the GPU run unpinned (synchronous)", size, code)
        return _Range(address, size, owner, device, ours=False, pinned=False)

    def _drop_closed(self):
        for client in list(self._tokens.keys()):
            try:
                client.arena_bytes
            except kvtier.Error:  # closed: no copy of ours uses its handles any more
                token = self._tokens.pop(client)
                for r in [r for r in self._ranges if r.owner[0] == token]:
                    self._drop(r)

    def _drop_unused(self):
        live = set(self._tokens.values())
        for r in [r for r in self._ranges if r.superseded or r.owner[0] not in live]:
            self._drop(r)

    def _drop(self, r):
        self._ranges.remove(r)
        if r.ours:
            try:
                code = self._runtime.host_unregister(r.address, r.device)
            except Exception as e:  # noqa: BLE001 - logged; the pages stay locked
                code = repr(e)
            if code != 0:
                logger.warning("kvtier: cudaHostUnregister of a kvtier arena (%d bytes) failed: %s", r.size, code)


class _Streams:
    """The side streams of one device: loads and saves apart, so a save's
    copies to the host never queue behind a load's copies to the device."""

    def __init__(self, runtime, device):
        self.load = runtime.new_stream(device)
        self.save = runtime.new_stream(device)


class LayerReady:
    """One layer of this step's loads on CUDA, in place of the
    threading.Event the CPU path uses. The copying thread sets `event`
    (recorded behind the layer's copies) and then set(); on an error set()
    comes without an event (the step fails open: vLLM recomputes the loads).
    Thread: `event` and set() on the copying thread, set() also from its
    clean-up; wait() on the forward thread."""

    def __init__(self, runtime, device):
        self._runtime, self._device = runtime, device
        self._issued = threading.Event()
        self.event = None

    def set(self):
        self._issued.set()

    def is_set(self):
        return self._issued.is_set()

    def wait(self):
        """Blocks the host only until the layer's copies are queued (which
        waits for the daemon's bytes); the calling thread's current stream
        (the forward pass) then waits for them on the GPU."""
        self._issued.wait()
        if self.event is not None:
            self._runtime.current_stream(self._device).wait_event(self.event)


class CudaState:
    """What the connector's CUDA copies share in a process: the runtime,
    the arena pins and the side streams of each device. Thread-safe."""

    def __init__(self, runtime):
        self.runtime = runtime
        self.pins = ArenaPins(runtime)
        self._lock = threading.Lock()
        self._streams = {}  # device -> _Streams, guarded by _lock

    def device_of(self, tensor):
        index = tensor.device.index
        return self.runtime.current_device() if index is None else index

    def streams(self, device):
        with self._lock:
            s = self._streams.get(device)
            if s is None:
                s = self._streams[device] = _Streams(self.runtime, device)
            return s

    def record_ready(self, tensor):
        """On the forward thread: an event recorded on the current stream of
        the tensor's device, behind the work queued so far (the forward
        pass's writes of this layer)."""
        device = self.device_of(tensor)
        event = self.runtime.new_event()
        event.record(self.runtime.current_stream(device))
        return event

    @contextlib.contextmanager
    def on_side_stream(self, device, stream, after, clients):
        """Around copies queued on `stream` (a side stream of `device`) by the
        calling thread: holds the arena pins of `clients`, makes `stream`
        current and has it wait for event `after` on the GPU. On leaving,
        even on an error, records an event on `stream` and waits for it on
        this thread: nothing queued inside runs after this returns. The pins
        are released only after that wait succeeded."""
        runtime = self.runtime
        hold = self.pins.hold(clients, device)
        drained = False
        try:
            with runtime.device(device), runtime.using(stream):
                stream.wait_event(after)
                try:
                    yield
                finally:
                    done = runtime.new_event(blocking=True)
                    done.record(stream)
                    done.synchronize()
                    drained = True
        finally:
            if drained:
                hold.release()

    def gathering(self, tensor, ready, clients):
        """On the gather thread, around one layer's copies into arena spans:
        the save stream waits for `ready` (record_ready on the forward thread)
        and the layer is in the arena when this ends (see on_side_stream)."""
        device = self.device_of(tensor)
        return self.on_side_stream(device, self.streams(device).save, ready, clients)

    def load_copies(self, tensor, clients):
        """On the forward thread, in start_load_kv: this step's LoadCopies for
        the device of `tensor`."""
        return LoadCopies(self, self.device_of(tensor), clients)


class LoadCopies:
    """One step's load copies on one device. Made on the forward thread
    (start_load_kv), whose current stream it records `start` on. issuing()
    and layer_event() belong to the one thread that copies (the
    loader thread, or the forward thread in whole-block mode); layer_ready()
    marks go to wait_for_layer_load on the forward thread."""

    def __init__(self, state, device, clients):
        self._state, self.device = state, device
        self._runtime = state.runtime
        self._stream = state.streams(device).load
        self._clients = [c for c in clients if c is not None]
        self._start = self._runtime.new_event()
        self._start.record(self._runtime.current_stream(device))

    def layer_ready(self):
        return LayerReady(self._runtime, self.device)

    def issuing(self):
        """Around all of the step's copies: the load stream is current and
        waits for `start`; when this ends every copy has finished (see
        CudaState.on_side_stream)."""
        return self._state.on_side_stream(self.device, self._stream, self._start, self._clients)

    def layer_event(self):
        """An event on the load stream behind the copies queued so far."""
        event = self._runtime.new_event()
        event.record(self._stream)
        return event


_state = None
_state_lock = threading.Lock()


def state():
    """The process's CudaState over torch.cuda, made on first use."""
    global _state
    with _state_lock:
        if _state is None:
            _state = CudaState(TorchCuda())
        return _state


def record_ready(tensor):
    """save_kv_layer's `ready` for the gather thread: None for a CPU tensor."""
    return state().record_ready(tensor) if on_cuda(tensor) else None


def gathering(tensor, ready, clients):
    """The context of one layer's gather: nothing on CPU (`ready` None)."""
    return contextlib.nullcontext() if ready is None else state().gathering(tensor, ready, clients)


def load_copies(tensors, clients):
    """start_load_kv's LoadCopies for the device of the engine's KV tensors,
    or None on CPU (or with no tensor registered)."""
    tensor = next(iter(tensors), None)
    return state().load_copies(tensor, clients) if tensor is not None and on_cuda(tensor) else None


def layer_ready(copies):
    """A layer's ready mark: a threading.Event on CPU (copies None)."""
    return threading.Event() if copies is None else copies.layer_ready()
