"""The binding's surface against a real kvtierd: errors, keys, copies,
zero-copy views and their lifetimes, batch calls, layer-wise I/O, queue
hints and the GIL."""

import threading
import time
import warnings

import numpy as np
import pytest
import torch

import kvtier
from conftest import block_bytes, keys_of, test_namespace


def test_key_hex_round_trip_and_errors_carry_the_status_name():
    k = kvtier.Key(0x0123456789ABCDEF, 0xFEDCBA9876543210)
    assert k.hex() == "0123456789abcdeffedcba9876543210"
    assert kvtier.Key.from_hex(k.hex()) == k
    assert k.canonical() == bytes.fromhex(k.hex())
    assert len({k, kvtier.Key.from_hex(k.hex())}) == 1
    with pytest.raises(kvtier.InvalidArgumentError) as e:
        kvtier.Key.from_hex("0X0123")
    assert e.value.code == "invalid_argument"
    assert isinstance(e.value, kvtier.Error) and isinstance(e.value, ValueError)


def test_chain_keys_from_lists_and_arrays_agree_and_extend():
    ns = test_namespace()
    h = kvtier.ChainHasher(ns)
    tokens = list(range(100, 100 + 3 * 16 + 5))
    keys = h.keys(tokens)
    assert len(keys) == 3  # the partial block gets no key
    assert keys == h.keys(np.array(tokens, dtype=np.int64)) == h.keys(np.array(tokens, dtype=np.uint32))
    assert h.extend(tokens, keys[:1]) == keys
    assert h.fingerprint == ns.fingerprint()
    with pytest.raises(kvtier.InvalidArgumentError):
        h.keys([-1] * 16)
    with pytest.raises(kvtier.InvalidArgumentError):
        kvtier.ChainHasher(test_namespace(revision=""))


def test_put_get_lookup_and_a_miss_raises_not_found(daemon):
    ns = test_namespace()
    keys = keys_of(ns, 3)
    data = [block_bytes(ns, i) for i in range(3)]
    with kvtier.Client(daemon.socket_path, [ns]) as c:
        assert c.fingerprints == [ns.fingerprint()]
        c.put(0, keys[0], data[0])
        c.put(0, keys[1], data[1].tobytes())
        hit = c.lookup(0, keys)
        assert hit.prefix_blocks == 2 and hit.tiers == [kvtier.Tier.HOST] * 2
        out = bytearray(ns.block_bytes)
        assert c.get(0, keys[1], out) == ns.block_bytes
        assert bytes(out) == data[1].tobytes()
        with pytest.raises(kvtier.NotFoundError) as e:
            c.get(0, keys[2], out)
        assert e.value.code == "not_found"
        with pytest.raises(kvtier.InvalidArgumentError):
            c.get(0, keys[0], bytearray(10))  # too small
        with pytest.raises(kvtier.InvalidArgumentError):
            c.put(0, keys[2], "not a buffer")


def test_batch_calls_report_one_status_per_key(daemon):
    ns = test_namespace()
    keys = keys_of(ns, 4)
    data = [block_bytes(ns, i) for i in range(4)]
    with kvtier.Client(daemon.socket_path, [ns]) as c:
        put = c.put_batch(0, keys[:3], data[:3], chain=True)
        assert [s.ok for s in put] == [True] * 3
        outs = [np.zeros(ns.block_bytes, np.uint8) for _ in keys]
        got = c.get_batch(0, keys, outs)
        assert [s.ok for s in got] == [True, True, True, False]
        assert got[3].code == "not_found" and got[0].value == ns.block_bytes
        with pytest.raises(kvtier.NotFoundError):
            got[3].raise_if_error()
        for i in range(3):
            assert np.array_equal(outs[i], data[i])
        assert c.lookup_async(0, keys).result(timeout=10).prefix_blocks == 3
        assert c.erase(0, keys) == 3
        assert c.lookup(0, keys).prefix_blocks == 0


def test_pinned_views_are_zero_copy_and_end_safely(daemon):
    ns = test_namespace()
    keys = keys_of(ns, 2)
    data = block_bytes(ns, 7)
    with kvtier.Client(daemon.socket_path, [ns]) as c:
        c.put(0, keys[0], data)
        items = c.pin(0, keys)
        assert items[0].ok and not items[1].ok and items[1].code == "not_found"
        view = items[0]
        a = np.frombuffer(view.data, dtype=np.uint8)
        b = np.frombuffer(view.data, dtype=np.uint8)
        assert a.ctypes.data == b.ctypes.data  # both show the arena's bytes, no copy
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch warns that the buffer is read-only
            t = torch.frombuffer(view.data, dtype=torch.uint8)
        assert t.data_ptr() == a.ctypes.data and torch.equal(t, torch.from_numpy(data))
        del t
        assert np.array_equal(a, data) and len(view) == ns.block_bytes
        assert view.data.readonly
        with pytest.raises((TypeError, ValueError)):
            a[0] = 1  # read-only
        assert c.stats()["engine.pinned_blocks"] == 1
        del a, b
        view.release()  # nothing else holds it: unpinned at once
        assert view.released and c.stats()["engine.pinned_blocks"] == 0
        with pytest.raises(kvtier.FailedPreconditionError):
            view.data  # a view used after its release raises


def wait_unpinned(c):
    deadline = time.monotonic() + 5
    while c.stats()["engine.pinned_blocks"] != 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    return c.stats()["engine.pinned_blocks"] == 0


@pytest.mark.parametrize("consumer", ["memoryview", "numpy", "torch"])
def test_what_was_made_from_a_view_keeps_the_pin_until_it_goes(daemon, consumer):
    ns = test_namespace()
    keys = keys_of(ns, 1)
    data = block_bytes(ns, 3)
    with kvtier.Client(daemon.socket_path, [ns]) as c:
        c.put(0, keys[0], data)
        with c.pin(0, keys)[0] as view:
            if consumer == "memoryview":
                held = view.data
            elif consumer == "numpy":
                held = np.frombuffer(view.data, dtype=np.uint8)
            else:  # torch.frombuffer keeps a raw pointer and the memoryview, not a buffer export
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    held = torch.frombuffer(view.data, dtype=torch.uint8)
        # The `with` released the view, but `held` still reads the arena:
        # the pin stays, so the block can be neither evicted nor reused.
        assert c.stats()["engine.pinned_blocks"] == 1
        assert c.erase(0, keys) == 1
        for i in range(200):  # refill what the erased block's space could hold
            c.put(0, keys_of(ns, 1, first_token=10_000 + 16 * i)[0], block_bytes(ns, 100 + i))
        assert bytes(held) == data.tobytes() if consumer == "memoryview" else np.array_equal(np.asarray(held), data)
        del held
        assert wait_unpinned(c)


def test_reserve_writes_in_place_and_refuses_to_commit_under_a_live_view(daemon):
    ns = test_namespace()
    keys = keys_of(ns, 2)
    data = [block_bytes(ns, 20 + i) for i in range(2)]
    with kvtier.Client(daemon.socket_path, [ns]) as c:
        res = c.reserve(0, keys, [ns.block_bytes] * 2, chain=True)
        assert len(res) == 2 and res.status(0).ok
        arr = np.frombuffer(res.data(0), dtype=np.uint8)
        arr[:] = data[0]
        res.data(1)[:] = data[1].tobytes()
        with pytest.raises(kvtier.FailedPreconditionError):
            res.commit()  # `arr` could still write after publication
        del arr
        tensor = torch.frombuffer(res.data(1), dtype=torch.uint8)  # a tensor over the arena, no copy
        with pytest.raises(kvtier.FailedPreconditionError):
            res.commit()
        del tensor
        assert [s.ok for s in res.commit()] == [True, True]
        out = np.zeros(ns.block_bytes, np.uint8)
        for k, d in zip(keys, data):
            c.get(0, k, out)
            assert np.array_equal(out, d)
        # Leaving a `with` without commit aborts: nothing is published.
        other = keys_of(ns, 1, first_token=5000)
        with c.reserve(0, other, [ns.block_bytes]) as r:
            r.data(0)[:] = bytes(ns.block_bytes)
        assert c.lookup(0, other).prefix_blocks == 0
        assert c.stats()["engine.reserved_blocks"] == 0


def test_layer_save_then_layer_load_copy_and_zero_copy(daemon):
    ns = test_namespace()
    keys = keys_of(ns, 3)
    layers = [[block_bytes(ns, 100 * b + l)[: ns.layer_bytes] for l in range(ns.layer_count)] for b in range(3)]
    with kvtier.Client(daemon.socket_path, [ns]) as c:
        with c.begin_save(0, keys) as save:
            assert save.layer_count == ns.layer_count and save.layer_bytes == ns.layer_bytes
            for l in range(ns.layer_count):
                if l % 2 == 0:
                    save.save_layer(l, [layers[b][l] for b in range(3)])
                else:  # in place
                    for b in range(3):
                        save.layer_span(b, l)[:] = layers[b][l].tobytes()
                    save.layer_written(l)
            held = np.frombuffer(save.layer_span(0, 0), dtype=np.uint8)
            with pytest.raises(kvtier.FailedPreconditionError):
                save.finish()  # `held` could still write after publication
            del held
            assert [s.ok for s in save.finish()] == [True] * 3
        whole = [np.concatenate(layers[b]) for b in range(3)]
        dst = [np.zeros(ns.block_bytes, np.uint8) for _ in keys]
        with c.begin_load(0, keys, dst=dst) as load:
            assert load.source == kvtier.Tier.HOST and len(load) == 3
            for l in range(ns.layer_count):
                load.wait_layer(l)
            assert load.done and load.usable_prefix == 3
        for b in range(3):
            assert np.array_equal(dst[b], whole[b])
        with c.begin_load(0, keys) as load:
            load.wait_all()
            span = load.layer_span(2, 1)
            assert bytes(span) == layers[2][1].tobytes()
        assert load.ended
        with pytest.raises(kvtier.FailedPreconditionError):
            load.layer_span(2, 1)  # no new views after the end
        with pytest.raises(kvtier.FailedPreconditionError):
            load.wait_layer(0)
        assert bytes(span) == layers[2][1].tobytes()  # the span kept the load's pins
        assert c.stats()["engine.loads_open"] == 1
        del span
        deadline = time.monotonic() + 5
        while c.stats()["engine.loads_open"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert c.stats()["engine.loads_open"] == 0


def test_layer_load_reports_failed_blocks_and_bad_arguments(daemon):
    ns = test_namespace()
    keys = keys_of(ns, 2)
    with kvtier.Client(daemon.socket_path, [ns]) as c:
        c.put(0, keys[0], block_bytes(ns, 1))
        with c.begin_load(0, keys) as load:
            load.wait_all()
            assert load.status(0).ok and load.status(1).code == "not_found"
            assert load.usable_prefix == 1
            with pytest.raises(kvtier.NotFoundError):
                load.layer_span(1, 0)
        with pytest.raises(kvtier.InvalidArgumentError):
            c.begin_load(0, [])
        with pytest.raises(kvtier.InvalidArgumentError):
            c.begin_load(0, keys, dst=[np.zeros(4, np.uint8)] * 2)
        # A deadline the load meets changes nothing; a negative one is refused.
        with c.begin_load(0, keys[:1], deadline=30.0, recompute_us_per_layer=1000.0) as load:
            load.wait_all()
            assert load.status(0).ok and load.usable_prefix == 1
        with pytest.raises(ValueError):
            c.begin_load(0, keys, deadline=-1.0)


def test_queue_hints_reach_the_daemon(daemon):
    ns = test_namespace()
    keys = keys_of(ns, 2)
    with kvtier.Client(daemon.socket_path, [ns]) as c:
        before = c.stats()["engine.enqueues"]
        c.open_session(7)
        c.enqueue(1, 0, keys, start_in_s=0.5, session=7)
        assert c.stats()["engine.enqueues"] == before + 1
        c.started(1)
        with pytest.raises(kvtier.NotFoundError):
            c.finished(1)  # it already left the queue
        c.close_session(7)
        with pytest.raises(kvtier.InvalidArgumentError):
            c.open_session(0)
        plan = c.plan_preload(kvtier.Tier.HOST, 1 << 20, 100.0, 4)
        assert 1 <= plan.layers_to_preload <= 4


def test_estimate_ready_round_trip(daemon):
    ns = test_namespace()
    keys = keys_of(ns, 3)
    with kvtier.Client(daemon.socket_path, [ns]) as c:
        for i, k in enumerate(keys[:2]):
            c.put(0, k, block_bytes(ns, i))
        ready = c.estimate_ready(0, keys)
        assert isinstance(ready, kvtier.ReadyEstimate)
        assert ready.prefix_blocks == 2
        assert ready.tiers == [kvtier.Tier.HOST, kvtier.Tier.HOST]
        assert ready.tiers == c.lookup(0, keys).tiers
        assert ready.prefix_bytes == 2 * ns.block_bytes
        assert ready.host_ready_us == 0
        assert ready.gpu_copy_bytes == ready.prefix_bytes
        assert ready.gpu_ready_us == pytest.approx(ready.gpu_copy_bytes / ready.gpu_copy_bytes_per_s * 1e6)
        assert ready.below == []  # no tier below this daemon
        with pytest.raises(kvtier.InvalidArgumentError):
            c.estimate_ready(5, keys)  # an unknown namespace
        assert c.estimate_ready(0, []).prefix_blocks == 0


def test_blocking_calls_release_the_gil(daemon):
    ns = test_namespace()
    keys = keys_of(ns, 1)
    c = kvtier.Client(daemon.socket_path, [ns], call_timeout=3.0, use_directory=False)
    inside, outcome = threading.Event(), []

    def call():
        inside.set()
        try:
            c.lookup(0, keys)
            outcome.append("answered")
        except kvtier.TimedOutError:
            outcome.append("timed out")

    daemon.pause()  # the daemon cannot answer
    try:
        t = threading.Thread(target=call)
        t.start()
        assert inside.wait(5)
        # This thread runs Python while the other waits in the call: it could
        # not if the call held the GIL (it would return first, timed out).
        spins = 0
        while spins < 1000:
            spins += 1
        time.sleep(0.2)
        assert t.is_alive() and outcome == []
    finally:
        daemon.resume()
    t.join(10)
    assert outcome == ["timed out"] or outcome == ["answered"]
    c.close()


def test_a_closed_client_raises_and_a_missing_daemon_is_unavailable(daemon, tmp_path):
    ns = test_namespace()
    c = kvtier.Client(daemon.socket_path, [ns])
    c.close()
    with pytest.raises(kvtier.FailedPreconditionError):
        c.lookup(0, keys_of(ns, 1))
    with pytest.raises(kvtier.UnavailableError) as e:
        kvtier.Client(str(tmp_path / "nobody.sock"), [ns], connect_timeout=1.0)
    assert e.value.code == "unavailable" and isinstance(e.value, ConnectionError)


def test_the_arena_address_spans_every_view_and_follows_a_reconnect(daemon):
    """arena_address and arena_bytes name the whole mapping (what the vLLM connector registers with
    CUDA); after kvtierd restarts, reconnects counts the reconnect and they name the new arena."""
    ns = test_namespace()
    keys = keys_of(ns, 2)

    def inside(c, view):
        address = np.frombuffer(view.data, dtype=np.uint8).ctypes.data
        return c.arena_address <= address and address + ns.block_bytes <= c.arena_address + c.arena_bytes

    c = kvtier.Client(daemon.socket_path, [ns], call_timeout=30.0)
    assert c.arena_address != 0 and c.arena_bytes > 0 and c.reconnects == 0
    c.put(0, keys[0], block_bytes(ns, 0))
    view = c.pin(0, keys[:1])[0]
    assert inside(c, view)
    view.release()

    daemon.proc.kill()
    daemon.proc.wait()
    daemon.start()
    deadline = time.monotonic() + 10
    while True:
        try:
            c.stats()
            break
        except kvtier.UnavailableError:
            assert time.monotonic() < deadline, "the client did not reconnect"
            time.sleep(0.01)
    assert c.reconnects == 1
    c.put(0, keys[1], block_bytes(ns, 1))
    view = c.pin(0, keys[1:])[0]
    assert inside(c, view)
    view.release()
    c.close()
    with pytest.raises(kvtier.FailedPreconditionError):
        c.arena_address


def test_health_reports_the_daemon_its_version_and_tiers(daemon):
    with kvtier.Client(daemon.socket_path, []) as c:
        report = c.health()
    assert report["healthy"] is True and report["problems"] == []
    assert report["version"] and report["uptime_s"] >= 0
    assert "host" in report["tiers"]


def test_copy_pieces_moves_each_range_in_order():
    from kvtier._kvtier import _copy_pieces
    src = np.arange(64, dtype=np.uint8)
    dst = np.zeros(64, dtype=np.uint8)
    s, d = src.ctypes.data, dst.ctypes.data
    _copy_pieces([(d, s + 10, 4), (d + 4, s, 2), (d + 6, s + 60, 4)])
    assert list(dst[:10]) == [10, 11, 12, 13, 0, 1, 60, 61, 62, 63] and not dst[10:].any()
    _copy_pieces([])  # nothing to do
