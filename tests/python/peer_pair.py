"""Two kvtierd processes that are peers of each other ([peer] listen and
members, one cluster secret in [remote] key_file, UCX over TCP on
loopback), for the tests that move KV between nodes (test_vllm_pd.py,
test_vllm_migration.py)."""

import fcntl
import os
import random
import socket
import time

import pytest

import kvtier


# Claims on the ports drawn, kept open for the life of this process.
_claims = []


def _claim(port):
    """Claims port against other processes drawing ports, as the C++ tests'
    support::ReserveLoopbackPorts does (an exclusive flock on
    /tmp/kvtier-ports-<uid>/<port>, held until this process exits): parallel
    tests otherwise drew the same port between its check and the daemon's
    bind. False when another process holds it; True when it is claimed or
    no claim can be made (the bind check then stands alone)."""
    d = f"/tmp/kvtier-ports-{os.getuid()}"
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
        f = open(os.path.join(d, str(port)), "a")
    except OSError:
        return True
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        return False
    _claims.append(f)
    return True


def free_ports(n):
    """n distinct free loopback ports (all held while drawn, so none
    repeats), drawn below the kernel's ephemeral range (32768 and up on
    Linux): a port from that range can be taken by any outgoing connection
    (the daemon's own peer tier connecting out first) before the daemon
    binds it. The C++ tests draw from the same range (FreeLoopbackPorts)
    and claim their ports the same way (_claim)."""
    rng = random.Random()
    held = []
    try:
        for _ in range(1000):
            if len(held) == n:
                break
            port = rng.randint(10000, 22767)
            if not _claim(port):
                continue
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            held.append(s)
        if len(held) < n:
            pytest.fail(f"fewer than {n} free loopback ports in 10000..22767")
        return tuple(s.getsockname()[1] for s in held)
    finally:
        for s in held:
            s.close()


def peer_toml(key_file, listen, members, probe_ms=500):
    return (f'[remote]\nkey_file = "{key_file}"\n'
            f'[peer]\nlisten = "127.0.0.1:{listen}"\nmembers = "{",".join(f"127.0.0.1:{m}" for m in members)}"\n'
            f'probe_timeout_ms = {probe_ms}\ntimeout_ms = 2000\nretry_ms = 100\n')


def stats(daemon, namespace):
    """The daemon's counters, through a client of `namespace`."""
    with kvtier.Client(daemon.socket_path, [namespace], client_name="test") as c:
        return c.stats()


def start_peer_pair(make_daemon, monkeypatch, tmp_path):
    """(first daemon, second daemon), once each is connected to the other;
    each has `peer_address`, its [peer] listen address."""
    monkeypatch.setenv("UCX_TLS", "tcp")  # the daemons inherit it
    key_file = tmp_path / "cluster.key"
    ports = free_ports(2)
    daemons = [make_daemon(extra=peer_toml(key_file, port, ports)) for port in ports]
    for daemon, port in zip(daemons, ports):
        daemon.peer_address = f"127.0.0.1:{port}"
    ns = kvtier.Namespace(model_id="probe", model_revision="r", kv_dtype="fp32", block_tokens=16, layer_count=1,
                          bytes_per_token_per_layer=16)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if all(stats(d, ns).get("peer.connected", 0) >= 1 for d in daemons):
            return tuple(daemons)
        time.sleep(0.05)
    pytest.fail("the daemons did not connect as peers:\n" + "\n".join(d.log.read_text() for d in daemons))
