"""Reconnect through the binding: a kvtier.Client whose kvtierd is killed
and started again recovers on its own (ClientOptions::reconnect), and a
view pinned before the restart stays readable and ends with an error
instead of reaching the new daemon."""

import time

import numpy as np
import pytest

import kvtier
from conftest import block_bytes, keys_of, test_namespace


def kill_and_start(daemon):
    daemon.proc.kill()  # SIGKILL: no goodbye on the socket
    daemon.proc.wait()
    daemon.start()  # the same socket path and configuration


def test_a_client_recovers_after_its_daemon_restarts(daemon):
    ns = test_namespace()
    keys = keys_of(ns, 2)
    data = [block_bytes(ns, i) for i in range(2)]
    with kvtier.Client(daemon.socket_path, [ns], call_timeout=30.0) as c:
        c.put(0, keys[0], data[0])
        view = c.pin(0, keys[:1])[0]
        assert view.ok
        old = np.frombuffer(view.data, dtype=np.uint8)

        kill_and_start(daemon)
        # Calls fail fast with Unavailable until a reconnect succeeds; the
        # client is never rebuilt.
        deadline = time.monotonic() + 10
        while True:
            started = time.monotonic()
            try:
                c.stats()
                break
            except kvtier.UnavailableError:
                assert time.monotonic() - started < 5, "a failing call waited"
                assert time.monotonic() < deadline, "the client did not reconnect"
                time.sleep(0.01)

        c.put(0, keys[1], data[1])
        out = bytearray(ns.block_bytes)
        assert c.get(0, keys[1], out) == ns.block_bytes
        assert bytes(out) == data[1].tobytes()
        with pytest.raises(kvtier.NotFoundError):
            c.get(0, keys[0], out)  # the old daemon's blocks are gone with it

        # The view from before still shows its bytes (the old arena stays
        # mapped), and its release fails on the old connection.
        assert np.array_equal(old, data[0])
        del old
        with pytest.raises(kvtier.UnavailableError):
            view.release()
        assert view.released
        assert c.stats()["engine.pinned_blocks"] == 0
