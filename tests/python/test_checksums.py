"""verify_checksums=True reaches every read path of the binding: a block
whose arena bytes changed after it was committed (written here through
another client's pinned view, as a hostile or buggy process could) is
CorruptionError, never its bytes, on get, get_batch, get_layers, pin and a
layer-wise load, and later reads miss; a client that does not verify gets
the bytes as they are. The connectors pass the option through."""

import ctypes
import sys
import threading

import numpy as np
import pytest

import kvtier
from conftest import block_bytes, keys_of, test_namespace


def corrupt(client, key, offset):
    """Flips one byte of committed block `key` in the shared arena, through a
    pinned view of `client` (one that does not verify)."""
    item = client.pin(0, [key])[0]
    assert item.ok, item
    with item as view:
        address = np.frombuffer(view.data, dtype=np.uint8).ctypes.data
        byte = ctypes.c_ubyte.from_address(address + offset)
        byte.value ^= 0xFF


def test_every_verifying_read_reports_corruption_and_later_reads_miss(daemon):
    ns = test_namespace()
    keys = keys_of(ns, 6)
    data = [block_bytes(ns, 50 + i) for i in range(6)]
    with kvtier.Client(daemon.socket_path, [ns]) as plain, \
            kvtier.Client(daemon.socket_path, [ns], verify_checksums=True) as checked:
        for k, d in zip(keys, data):
            checked.put(0, k, d)  # a writer that verifies: with per-layer checksums
        for k in keys:
            corrupt(plain, k, 2 * ns.layer_bytes + 5)  # layer 2 of each block

        # A client that does not verify copies what is there.
        out = bytearray(ns.block_bytes)
        assert plain.get(0, keys[0], out) == ns.block_bytes
        assert bytes(out) != data[0].tobytes()

        with pytest.raises(kvtier.CorruptionError):
            checked.get(0, keys[0], out)
        statuses = checked.get_batch(0, [keys[1]], [bytearray(ns.block_bytes)])
        assert statuses[0].code == "corruption"
        items = checked.pin(0, [keys[2]])
        assert not items[0].ok and items[0].code == "corruption"
        whole = checked.get_layers(0, [keys[3]], 0, ns.layer_count, [bytearray(ns.block_bytes)])
        assert whole[0].code == "corruption"
        part = checked.get_layers(0, [keys[4]], 2, 3, [bytearray(ns.layer_bytes)])
        assert part[0].code == "corruption"
        # Layers that did not change verify alone (per-layer checksums,
        # which a writer that verifies records).
        clean = bytearray(ns.layer_bytes)
        ok = checked.get_layers(0, [keys[5]], 1, 2, [clean])
        assert ok[0].ok and bytes(clean) == data[5][ns.layer_bytes:2 * ns.layer_bytes].tobytes()
        with checked.begin_load(0, [keys[5]]) as load:
            load.wait_all()
            assert load.status(0).code == "corruption" and load.usable_prefix == 0
            with pytest.raises(kvtier.NotFoundError):
                load.layer_span(0, 2)

        # Each block that failed verification was reported: it is gone.
        for k in keys[:5]:
            with pytest.raises(kvtier.NotFoundError):
                plain.get(0, k, out)
        assert plain.lookup(0, keys).prefix_blocks == 0


def test_a_non_verifying_reader_misses_once_a_verifying_reader_flagged_the_block(daemon):
    """The daemon has checked and dropped a reported block by the time the
    verifying read returns, so no reader gets the tampered bytes after it,
    not even one that reads the arena through the block directory without
    asking kvtierd. While kvtierd is stopped the verifying read cannot
    return (its report waits for the daemon's verdict); the reads of both
    clients go through the directory, which answers without kvtierd."""
    ns = test_namespace()
    key = keys_of(ns, 1)[0]
    data = block_bytes(ns, 70)
    with kvtier.Client(daemon.socket_path, [ns]) as plain, \
            kvtier.Client(daemon.socket_path, [ns], verify_checksums=True) as checked:
        checked.put(0, key, data)
        corrupt(plain, key, 3)
        outcome = []

        def verified_read():
            try:
                checked.get(0, key, bytearray(ns.block_bytes))
                outcome.append("ok")
            except kvtier.CorruptionError:
                outcome.append("corruption")

        daemon.pause()
        try:
            reader = threading.Thread(target=verified_read)
            reader.start()
            reader.join(timeout=2)
            if outcome:  # it returned without kvtierd: the block must be gone already
                out = bytearray(ns.block_bytes)
                try:
                    got = plain.get(0, key, out)
                except kvtier.NotFoundError:
                    got = 0
                assert got == 0, "a non-verifying reader got the flagged bytes"
        finally:
            daemon.resume()
        reader.join()
        assert outcome == ["corruption"]
        with pytest.raises(kvtier.NotFoundError):
            plain.get(0, key, bytearray(ns.block_bytes))
        stats = plain.stats()
        assert stats["engine.corrupt_reports"] == 1
        assert stats["engine.corrupt_drops"] == 1
        assert stats["engine.corrupt_reports_refuted"] == 0


def test_verifying_reads_of_intact_blocks_hand_out_the_bytes(daemon):
    ns = test_namespace()
    keys = keys_of(ns, 2)
    data = [block_bytes(ns, 80 + i) for i in range(2)]
    with kvtier.Client(daemon.socket_path, [ns], verify_checksums=True) as c:
        for k, d in zip(keys, data):
            c.put(0, k, d)
        out = bytearray(ns.block_bytes)
        assert c.get(0, keys[0], out) == ns.block_bytes and bytes(out) == data[0].tobytes()
        with c.pin(0, [keys[1]])[0] as view:
            assert bytes(view.data) == data[1].tobytes()
        layer = bytearray(2 * ns.layer_bytes)
        assert c.get_layers(0, [keys[1]], 1, 3, [layer])[0].ok
        assert bytes(layer) == data[1][ns.layer_bytes:3 * ns.layer_bytes].tobytes()
        dst = [np.zeros(ns.block_bytes, np.uint8) for _ in keys]
        with c.begin_load(0, keys, dst=dst) as load:
            load.wait_all()
            assert load.usable_prefix == 2
        assert all(np.array_equal(dst[i], data[i]) for i in range(2))


class _Geometry:
    """What the vLLM connector's _connect reads."""
    socket_path = None
    call_timeout = 5.0
    connect_timeout = 5.0
    use_directory = True
    verify_checksums = True


def test_connectors_pass_verify_checksums_through(daemon, monkeypatch):
    made = []
    real = kvtier.Client

    def spy(*args, **kwargs):
        made.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(kvtier, "Client", spy)
    from kvtier.integrations import vllm
    connector = vllm.KvtierConnector.__new__(vllm.KvtierConnector)
    connector._geometry = _Geometry()
    connector._geometry.socket_path = daemon.socket_path
    connector._unreachable = False
    client = connector._connect([test_namespace()])
    assert client is not None and made[-1]["verify_checksums"] is True
    client.close()

    # SGLang's backend, made as SGLang's dynamic factory makes it (the fake
    # SGLang of sglang_fakes), with verify_checksums in its extra config.
    from sglang_fakes import MHAHostPool, fresh_adapter, load_dynamic_backend, storage_config
    adapter = fresh_adapter(monkeypatch)
    next(adapter)
    try:
        config = dict(backend_name="kvtier", module_path="kvtier.integrations.sglang", class_name="KvtierStorage",
                      interface_v1=1, socket_path=daemon.socket_path, model_revision="rev-1", verify_checksums=True)
        made.clear()
        storage = load_dynamic_backend(config, storage_config(config), MHAHostPool())
        assert "verify_checksums" in sys.modules[type(storage).__module__].__doc__  # documented
        assert storage._get_client() is not None
        assert made and all(k["verify_checksums"] is True for k in made)
    finally:
        next(adapter, None)
