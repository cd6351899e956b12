"""The vLLM connector's CUDA data path (kvtier.integrations._vllm_cuda).

On any machine: the module imports on this torch and CPU tensors never reach
it; the arena registration's bookkeeping (ArenaPins) against a fake CUDA
runtime; and the whole connector driven through its CUDA path by the mini
vLLM engine on CPU tensors with a fake runtime whose streams and events are
entries in one log, so the order of every stream wait, event and host wait
is checked while the bytes still round-trip through a real kvtierd.

With a CUDA device (scripts/gpu-check.sh runs this file there and fails on a
skip): gather and scatter on the device against the CPU path, the arena's
real cudaHostRegister, and the connector saving and loading KV caches that
live on the GPU, bit-exact.
"""

import contextlib
import gc
import logging
import threading

import pytest
import torch

import kvtier
from bench_vllm_step import BenchModel, bench_engine, kv_tokens
from conftest import block_bytes, keys_of, test_namespace
from kvtier.integrations import _kv_layout, _vllm_cuda, _vllm_worker
from vllm_harness import (deterministic, model,  # noqa: F401 (fixtures)
                          computed_at_start, drain_commits, greedy_generate, kvtier_engine, prompt, reference_engine,
                          run_request)

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (scripts/gpu-check.sh)")


# ---- a CUDA runtime on the host: streams and events as log entries ----

class FakeEvent:
    def __init__(self, runtime, blocking):
        self.runtime, self.blocking = runtime, blocking
        self.stream = None  # the name of the stream it was recorded on

    def record(self, stream=None):
        stream = stream or self.runtime.current_stream(0)
        self.stream = stream.name
        self.runtime.note("record", stream.name, self)

    def synchronize(self):
        if self.stream is None:
            self.runtime.errors.append("a host wait on an event never recorded (on CUDA: returns at once)")
        self.runtime.note("sync", None, self)


class FakeStream:
    def __init__(self, runtime, name):
        self.runtime, self.name = runtime, name

    def wait_event(self, event):
        if event.stream is None:
            self.runtime.errors.append(f"{self.name} waits on an event never recorded")
        self.runtime.note("wait", self.name, event)


class FakeRuntime:
    """What _vllm_cuda asks of torch.cuda. `log`: (kind, thread name, stream name, event) in the
    order the calls happened; `registered`: address -> size of the host ranges CUDA would hold
    page-locked; register_codes: address -> the cudaError a registration there returns."""

    def __init__(self, register_codes=None):
        self.log, self.errors, self.calls = [], [], []
        self.registered = {}
        self.register_codes = dict(register_codes or {})
        self.forward = FakeStream(self, "forward")  # every thread's current stream outside using()
        self.side = []
        self._lock = threading.Lock()
        self._local = threading.local()

    def note(self, kind, stream, event=None):
        with self._lock:
            self.log.append((kind, threading.current_thread().name, stream, event))

    def current_device(self):
        return 0

    def new_stream(self, device):
        stream = FakeStream(self, f"side{len(self.side)}")
        self.side.append(stream)
        return stream

    def new_event(self, blocking=False):
        return FakeEvent(self, blocking)

    def current_stream(self, device):
        return getattr(self._local, "stream", None) or self.forward

    @contextlib.contextmanager
    def using(self, stream):
        before = getattr(self._local, "stream", None)
        self._local.stream = stream
        try:
            yield
        finally:
            self._local.stream = before

    def device(self, device):
        return contextlib.nullcontext()

    def host_register(self, address, size, device):
        self.calls.append(("register", address))
        code = self.register_codes.get(address, 0)
        if code == 0 and address in self.registered:
            return 712  # cudaErrorHostMemoryAlreadyRegistered
        if code == 0:
            self.registered[address] = size
        return code

    def host_unregister(self, address, device):
        self.calls.append(("unregister", address))
        return 0 if self.registered.pop(address, None) is not None else 713


class FakeClient:
    """The arena fields of a kvtier.Client."""

    def __init__(self, address, size=1 << 20):
        self.address, self.size, self.reconnects, self.closed = address, size, 0, False

    @property
    def arena_address(self):
        return self._open(self.address)

    @property
    def arena_bytes(self):
        return self._open(self.size)

    def _open(self, value):
        if self.closed:
            raise kvtier.FailedPreconditionError("client is closed")
        return value


def fenced(runtime, state):
    """Checks the log against _vllm_cuda's contract: copies run on their side stream only (scatters
    on the load stream, gathers on the save stream); each run of copies starts with its stream
    waiting for an event of the forward stream and ends with an event recorded behind it and waited
    for by the same thread, before that thread starts another run. Returns the log."""
    assert runtime.errors == []
    streams = state.streams(0)
    copy_stream = {"scatter": streams.load.name, "gather": streams.save.name}
    runs, closing = {}, {}  # thread -> its open run's stream / the event that closes it
    for kind, thread, stream, event in runtime.log:
        if kind == "wait" and stream != "forward":
            assert event.stream == "forward", "a side stream waits for something other than the forward pass"
            assert thread not in runs, f"{thread} starts a run of copies before its last one finished"
            runs[thread] = stream
        elif kind in copy_stream:
            assert stream == copy_stream[kind] == runs.get(thread), f"a {kind} outside its stream's run"
        elif kind == "record" and event.blocking:
            assert runs.get(thread) == stream
            closing[thread] = event
        elif kind == "sync" and closing.get(thread) is event:
            del runs[thread], closing[thread]
    assert runs == {}, "copies still running when their thread went on"
    return runtime.log


@pytest.fixture
def fake_cuda(monkeypatch):
    """Every KV tensor takes the CUDA path, against a FakeRuntime; gathers and scatters are logged
    with the stream current on their thread (the copies themselves run on the CPU tensors)."""
    runtime = FakeRuntime()
    state = _vllm_cuda.CudaState(runtime)
    monkeypatch.setattr(_vllm_cuda, "_state", state)
    monkeypatch.setattr(_vllm_cuda, "on_cuda", lambda tensor: True)
    for name in ("gather", "scatter"):
        def logged(*args, _copy=getattr(_kv_layout, name), _name=name, **kwargs):
            runtime.note(_name, runtime.current_stream(0).name)
            return _copy(*args, **kwargs)
        monkeypatch.setattr(_kv_layout, name, logged)
    return runtime, state


# ---- the CPU path ----

def test_the_module_imports_here_and_cpu_tensors_take_the_cpu_path():
    t = torch.zeros(4, 2, 2, 8)
    assert not _vllm_cuda.on_cuda(t)
    assert _vllm_cuda.record_ready(t) is None
    assert _vllm_cuda.load_copies([t], [None]) is None
    assert _vllm_cuda.load_copies([], [None]) is None
    assert isinstance(_vllm_cuda.layer_ready(None), type(threading.Event()))
    assert isinstance(_vllm_cuda.gathering(t, None, [None]), contextlib.nullcontext)


def round_trip(model, daemon, layerwise, max_tokens):
    """Engine a saves a prompt of 18 tokens, engine b loads its 16 and
    continues; returns a, b, b's prompt and its tokens and logits."""
    shared = prompt(1, 18)
    a = kvtier_engine(model, daemon, layerwise=layerwise)
    run_request(a, shared + [1], 1, "r1")
    drain_commits(a)
    b = kvtier_engine(model, daemon, layerwise=layerwise)
    p2 = shared + prompt(3, 6)
    toks, logits = run_request(b, p2, max_tokens, "r2")
    return a, b, p2, toks, logits


@pytest.mark.parametrize("layerwise", [True, False])
def test_a_cpu_connector_never_reaches_the_cuda_path(model, daemon, monkeypatch, layerwise):
    def no_cuda():
        raise AssertionError("CPU tensors reached the CUDA path")
    monkeypatch.setattr(_vllm_cuda, "state", no_cuda)  # a call would fail the connector open
    a, b, p2, toks, _ = round_trip(model, daemon, layerwise, 2)
    assert computed_at_start(b, "r2") == 16
    assert toks == greedy_generate(model, p2, 2)
    assert [w.disabled_reason for w in a.worker_connectors + b.worker_connectors] == [None, None]
    a.shutdown()
    b.shutdown()


# ---- the CUDA path's ordering, against the fake runtime ----

@pytest.mark.parametrize("layerwise", [True, False])
def test_the_cuda_path_fences_every_copy_and_round_trips(model, daemon, fake_cuda, layerwise):
    runtime, state = fake_cuda
    a, b, p2, toks, logits = round_trip(model, daemon, layerwise, 3)
    drain_commits(b)
    assert [w.disabled_reason for w in a.worker_connectors + b.worker_connectors] == [None, None]
    assert computed_at_start(b, "r2") == 16
    ref = reference_engine(model)
    ref_toks, ref_logits = run_request(ref, p2, 3, "r2")
    assert toks == ref_toks == greedy_generate(model, p2, 3)
    assert torch.equal(logits[0], ref_logits[0][16:])
    assert torch.equal(b.request_kv("r2", len(p2)), ref.request_kv("r2", len(p2)))

    log = fenced(runtime, state)
    kinds = [entry[0] for entry in log]
    assert "gather" in kinds and "scatter" in kinds
    load = state.streams(0).load.name
    layer_events = [e for kind, _, stream, e in log if kind == "record" and stream == load and not e.blocking]
    forward_waits = [(thread, e) for kind, thread, stream, e in log if kind == "wait" and stream == "forward"]
    host_waits = [thread for kind, thread, _, _ in log if kind == "sync"]
    if layerwise:
        # Each layer's load: the forward stream (on the forward thread) waits for its event, on the GPU.
        assert len(layer_events) == len(model.attention_layer_names)
        assert [e for _, e in forward_waits] == layer_events
        assert {thread for thread, _ in forward_waits} == {"MainThread"}
        # The forward thread never waits on the host for a copy.
        assert host_waits and all(t.startswith(("kvtier-load", "kvtier-gather")) for t in host_waits)
    else:
        assert layer_events == [] and forward_waits == []  # whole-block: copied before the forward pass
        assert "MainThread" in host_waits  # start_load_kv waits for its loads
    # One registration per client whose handles were copied, none undone.
    clients = [e.worker_connectors[0]._worker.client for e in (a, b)]
    assert sorted(address for _, address in runtime.calls) == sorted(c.arena_address for c in clients)
    assert all(state.pins.pinned(c.arena_address) for c in clients)
    a.shutdown()
    b.shutdown()


def test_a_copy_that_raises_drains_the_load_stream_and_fails_open(model, daemon, fake_cuda, monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="kvtier.vllm")
    runtime, state = fake_cuda
    shared = prompt(6, 18)
    a = kvtier_engine(model, daemon)
    run_request(a, shared + [1], 1, "r1")
    drain_commits(a)
    b = kvtier_engine(model, daemon)
    scatter, calls = _kv_layout.scatter, []

    def broken(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("copy failed")
        return scatter(*args, **kwargs)
    monkeypatch.setattr(_kv_layout, "scatter", broken)
    p2 = shared + [2, 3]
    toks, _ = run_request(b, p2, 2, "r2")
    assert toks == greedy_generate(model, p2, 2)
    assert "copy failed" in b.worker_connectors[0].disabled_reason
    fenced(runtime, state)  # the load stream ran dry before the loader thread let go
    a.shutdown()
    b.shutdown()


def test_a_layer_whose_copies_never_queued_is_released_without_a_gpu_wait():
    runtime = FakeRuntime()
    ready = _vllm_cuda.LayerReady(runtime, 0)
    done = threading.Thread(target=ready.wait)
    done.start()
    assert not ready.is_set()
    ready.set()  # the loader thread's clean-up after an error
    done.join(5)
    assert not done.is_alive() and runtime.log == [] and runtime.errors == []


def test_load_copies_start_behind_the_forward_stream():
    runtime = FakeRuntime()
    state = _vllm_cuda.CudaState(runtime)
    client = FakeClient(0x10000)
    copies = state.load_copies(torch.zeros(1), [client, None])
    (kind, _, stream, start), = runtime.log
    assert (kind, stream) == ("record", "forward")
    with copies.issuing():
        event = copies.layer_event()
    assert ("wait", state.streams(0).load.name, start) == runtime.log[1][:1] + runtime.log[1][2:]
    assert event.stream == state.streams(0).load.name
    fenced(runtime, state)
    assert runtime.registered == {0x10000: 1 << 20}


# ---- the arena's registration ----

def test_an_arena_is_registered_once_per_mapping():
    runtime = FakeRuntime()
    pins = _vllm_cuda.ArenaPins(runtime)
    c = FakeClient(0x100000)
    for _ in range(3):
        pins.hold([c, None, c], 0).release()
    assert runtime.calls == [("register", 0x100000)]
    assert pins.pinned(0x100000 + 4096) and not pins.pinned(0x100000 + (1 << 20))


def test_an_arena_registered_by_someone_else_is_left_to_them():
    runtime = FakeRuntime()
    runtime.registered[0x100000] = 1 << 20  # e.g. the C++ client's own GPU loads
    pins = _vllm_cuda.ArenaPins(runtime)
    c = FakeClient(0x100000)
    pins.hold([c], 0).release()
    assert pins.pinned(0x100000)
    c.reconnects, c.address = 1, 0x900000
    pins.hold([c], 0).release()
    assert runtime.calls == [("register", 0x100000), ("register", 0x900000)]  # never unregistered here


def test_a_failed_registration_is_logged_once_and_the_copies_run_unpinned(caplog):
    caplog.set_level(logging.WARNING, logger="kvtier.vllm")
    runtime = FakeRuntime(register_codes={0x100000: 2})  # cudaErrorMemoryAllocation
    pins = _vllm_cuda.ArenaPins(runtime)
    c = FakeClient(0x100000)
    pins.hold([c], 0).release()
    pins.hold([c], 0).release()
    assert runtime.calls == [("register", 0x100000)] and not pins.pinned(0x100000)
    assert [r.getMessage() for r in caplog.records if "cudaHostRegister" in r.getMessage()] == [
        "kvtier: cudaHostRegister of the kvtier arena (1048576 bytes) failed with cudaError 2: its copies to "
        "and from the GPU run unpinned (synchronous)"]


def test_a_reconnected_clients_old_arena_stays_registered_until_no_copy_holds_it():
    runtime = FakeRuntime()
    pins = _vllm_cuda.ArenaPins(runtime)
    c = FakeClient(0x100000)
    before = pins.hold([c], 0)  # a copy of a handle from before the reconnect
    c.reconnects, c.address = 1, 0x900000
    after = pins.hold([c], 0)
    assert runtime.calls == [("register", 0x100000), ("register", 0x900000)]
    before.release()
    assert pins.pinned(0x100000)  # `after` still holds
    after.release()
    assert runtime.calls[-1] == ("unregister", 0x100000)
    assert runtime.registered == {0x900000: 1 << 20}


def test_a_new_mapping_over_a_registered_range_replaces_it_at_once():
    """The old mapping is gone (its address is someone else's now), so no copy can use it: its
    registration goes before the new one, even while copies hold other arenas."""
    runtime = FakeRuntime()
    pins = _vllm_cuda.ArenaPins(runtime)
    c = FakeClient(0x100000)
    other = pins.hold([c, FakeClient(0x900000)], 0)
    c.reconnects = 1  # the new daemon's arena mapped where the old one was
    pins.hold([c], 0).release()
    assert runtime.calls == [("register", 0x100000), ("register", 0x900000), ("unregister", 0x100000),
                             ("register", 0x100000)]
    other.release()
    d = FakeClient(0x100000 + 4096)  # another client's mapping overlapping it
    pins.hold([d], 0).release()
    assert runtime.calls[-2:] == [("unregister", 0x100000), ("register", 0x100000 + 4096)]


def test_closed_collected_or_forgotten_clients_let_go_of_their_arenas():
    runtime = FakeRuntime()
    pins = _vllm_cuda.ArenaPins(runtime)
    closed, collected, forgotten = FakeClient(0x100000), FakeClient(0x300000), FakeClient(0x500000)
    pins.hold([closed, collected, forgotten], 0).release()
    closed.closed = True
    pins.hold([], 0).release()
    assert runtime.calls[-1] == ("unregister", 0x100000)
    del collected
    gc.collect()
    pins.hold([], 0).release()
    assert runtime.calls[-1] == ("unregister", 0x300000)
    pins.forget(forgotten)
    assert runtime.calls[-1] == ("unregister", 0x500000) and runtime.registered == {}


def test_cuda_calls_that_can_fail_run_on_a_thread_of_their_own():
    caller = threading.current_thread()
    assert _vllm_cuda._on_own_thread(lambda: threading.current_thread() is not caller)
    with pytest.raises(ValueError, match="boom"):
        _vllm_cuda._on_own_thread(lambda: (_ for _ in ()).throw(ValueError("boom")))


# ---- on a CUDA device ----

def _layer_tensor(form, num_blocks, block_size, generator):
    shape = {"nhc": (num_blocks * 2, 3, block_size // 2, 8),  # [B', H, N', C], two kernel blocks per block
             "kv_first": (2, num_blocks, block_size, 3, 8),
             "blocks_first": (num_blocks, 2, block_size, 3, 8)}[form]
    return torch.randn(*shape, generator=generator).to(torch.bfloat16)


@needs_cuda
@pytest.mark.parametrize("form", ["nhc", "kv_first", "blocks_first"])
def test_gather_and_scatter_on_the_device_match_the_cpu_path(form):
    num_blocks, block_size = 6, 4
    cpu = _layer_tensor(form, num_blocks, block_size, torch.Generator().manual_seed(7))
    dev = cpu.cuda()
    ids = [4, 1, 3]
    want = bytearray(cpu.numel() // num_blocks * cpu.element_size() * len(ids))
    _kv_layout.gather(cpu, form, ids, memoryview(want), num_blocks)
    host = torch.zeros(len(want), dtype=torch.uint8).pin_memory()
    stream = torch.cuda.Stream()
    ready = torch.cuda.Event()
    ready.record()
    with torch.cuda.stream(stream):
        stream.wait_event(ready)
        _kv_layout.gather(dev, form, ids, memoryview(host.numpy()), num_blocks, _kv_layout.block_index(dev, ids))
    stream.synchronize()
    assert bytes(host.numpy()) == bytes(want)

    out_cpu, out_dev = torch.zeros_like(cpu), torch.zeros_like(dev)
    _kv_layout.scatter(out_cpu, form, [0, 5, 2], 1, memoryview(want), num_blocks)
    with torch.cuda.stream(stream):
        _kv_layout.scatter(out_dev, form, [0, 5, 2], 1, memoryview(host.numpy()), num_blocks,
                           _kv_layout.block_index(out_dev, [5, 2]))
    stream.synchronize()
    assert torch.equal(out_dev.cpu(), out_cpu)


@needs_cuda
def test_the_arena_is_page_locked_once_and_let_go(daemon):
    ns = test_namespace()
    keys = keys_of(ns, 1)
    with kvtier.Client(daemon.socket_path, [ns]) as c:
        c.put(0, keys[0], block_bytes(ns, 0))
        view = c.pin(0, keys)[0]
        span = torch.frombuffer(view.data, dtype=torch.uint8)
        pins = _vllm_cuda.ArenaPins(_vllm_cuda.TorchCuda())
        assert not span.is_pinned()
        pins.hold([c], torch.cuda.current_device()).release()
        assert span.is_pinned() and pins.pinned(c.arena_address)
        pins.hold([c], torch.cuda.current_device()).release()  # nothing new to register
        pins.forget(c)
        assert not span.is_pinned()
        del span
        view.release()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])
@pytest.mark.parametrize("layerwise", [True, False])
def test_kv_caches_on_the_device_round_trip_bit_exact(daemon, monkeypatch, device, layerwise):
    """bench_vllm_step's model and engines (its --device cuda puts the KV caches on the GPU): a miss
    saves the prompt, a second engine loads it and computes the suffix; the loaded K/V are the
    saving engine's bytes. On CPU the CUDA path is never entered."""
    if device == "cpu":
        def no_cuda():
            raise AssertionError("CPU tensors reached the CUDA path")
        monkeypatch.setattr(_vllm_cuda, "state", no_cuda)
    block_tokens, n_prompt, n_suffix = 8, 32, 8
    total = n_prompt + n_suffix
    model = BenchModel(2, 2, 16, 64, 4, total + 4, torch.bfloat16, device=device)
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, model.vocab, (total,), generator=gen).tolist()
    a = bench_engine(model, daemon.socket_path, block_tokens, total, 24, layerwise=layerwise, device=device)
    b = bench_engine(model, daemon.socket_path, block_tokens, total, 24, layerwise=layerwise, device=device)
    try:
        run_request(a, tokens[:n_prompt], 1, "r1")
        drain_commits(a)
        run_request(b, tokens, 1, "r2")
        drain_commits(b)
        assert [w.disabled_reason for w in a.worker_connectors + b.worker_connectors] == [None, None]
        assert computed_at_start(b, "r2") == n_prompt
        assert next(iter(b.kv_caches.values())).device.type == device
        assert torch.equal(kv_tokens(a, "r1", n_prompt, model), kv_tokens(b, "r2", n_prompt, model))
        if device == "cuda":
            client = b.worker_connectors[0]._worker.client
            assert _vllm_cuda.state().pins.pinned(client.arena_address)
    finally:
        for e in (a, b):
            for w in e.worker_connectors:
                if device == "cuda" and w._worker.client is not None:
                    _vllm_cuda.state().pins.forget(w._worker.client)
            e.shutdown()
