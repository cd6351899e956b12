"""Client state is bounded per connection, per tenant and in total
(docs/RELIABILITY.md, "Client state"): one tenant that opens many
connections and fills each with queue hints, leases and namespace
registrations is answered Busy at its bound, kvtierd's resident memory stays
within the stated total, and another tenant keeps working.

Clients run as other uids (setpriv), as in test_tenants.py; needs root.
"""

import json
import subprocess
import sys
import textwrap

import pytest

from test_tenants import ALPHA, BETA, SOCKET_GID, client, make_tenancy

MiB = 1 << 20
CLIENT_MEMORY = 64 * MiB
PER_CONNECTION = 8 * MiB
CONNECTIONS = 20
# What the daemon holds per open connection besides its charged state
# (docs/RELIABILITY.md: at most 64 KiB).
CONNECTION_BASE = 64 << 10

pytestmark = pytest.mark.skipif(__import__("os").geteuid() != 0, reason="needs root to run clients as other uids")

# Run as the hoarding tenant: opens argv[2] connections, each registering 64
# namespaces with long strings, pinning one block over and over, and queueing
# 4096-key requests, until kvtierd answers Busy or it has sent argv[3] keys in
# all (twice what the tenant's bound allows: past the bound without it).
# Prints what it got, then holds every connection until a line on stdin.
HOARDER = textwrap.dedent('''
    import json, sys
    import kvtier
    sock, conns, key_cap = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    def ns(c, j, long):
        return kvtier.Namespace(model_id=("hog/%d/%d/" % (c, j)) + ("x" * 400 if long else ""),
                                model_revision="r" * (200 if long else 1), kv_dtype="fp32", block_tokens=16,
                                layer_count=4, bytes_per_token_per_layer=64)
    out = {"namespaces": 0, "hello_busy": 0, "leases": 0, "lease_busy": 0, "queued_keys": 0, "queue_busy": 0}
    clients = []
    for c in range(conns):
        try:
            clients.append(kvtier.Client(sock, [ns(c, j, True) for j in range(64)]))
            out["namespaces"] += 64
        except kvtier.BusyError:
            out["hello_busy"] += 1
            clients.append(kvtier.Client(sock, [ns(c, 0, False)]))
    block_key = kvtier.Key(7, 7)
    clients[0].put(0, block_key, bytes(16 * 4 * 64))
    pins = []
    for c in clients:
        while out["leases"] < 200000:
            items = c.pin(0, [block_key] * 1024)
            ok = [i for i in items if i.ok]
            out["leases"] += len(ok)
            pins.append(ok)
            if len(ok) < len(items):
                out["lease_busy"] += 1
                break
    request = 0
    for ci, c in enumerate(clients):
        while out["queued_keys"] < key_cap:
            request += 1
            keys = [kvtier.Key(ci + 1, request * 4096 + i) for i in range(4096)]
            try:
                c.enqueue(request, 0, keys)
                out["queued_keys"] += 4096
            except kvtier.BusyError as e:
                out["queue_busy"] += 1
                out["queue_busy_message"] = str(e)
                break
    print(json.dumps(out), flush=True)
    sys.stdin.readline()
''')


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_one_tenant_at_its_bound_leaves_memory_within_the_total_and_the_other_tenant_working(make_daemon):
    d = make_tenancy(make_daemon, server_extra=(
        f"client_memory_bytes = {CLIENT_MEMORY}\nmax_client_memory_per_connection = {PER_CONNECTION}\n"
        "reserved_client_memory_percent = 50\nmax_leases_per_connection = 1000000\n"))
    (d.directory / "hoarder.py").write_text(HOARDER)
    # Both tenants have done their first requests: what grows now is state.
    assert "error" not in client(d, BETA, "put")
    before = rss(d.proc.pid)

    # Twice the keys the tenant's bound (its part and all the shared rest) could hold.
    tenant_bound = CLIENT_MEMORY // 2 // 3 + CLIENT_MEMORY // 2
    key_cap = 2 * tenant_bound // 256
    hoarder = subprocess.Popen(
        ["setpriv", f"--reuid={ALPHA}", f"--regid={ALPHA}", f"--groups={SOCKET_GID}", sys.executable,
         str(d.directory / "hoarder.py"), d.socket_path, str(CONNECTIONS), str(key_cap)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=d.child_env)
    try:
        line = hoarder.stdout.readline()
        assert line, hoarder.stderr.read()
        got = json.loads(line)
        grown = rss(d.proc.pid) - before
        print(f"hoarder: {got}; kvtierd grew {grown / MiB:.1f} MiB")

        # Each kind of state met a bound, and said which.
        assert got["queue_busy"] >= 1 and got["queued_keys"] < key_cap, got
        assert "server.client_memory_bytes" in got["queue_busy_message"] or \
            "server.max_client_memory_per_connection" in got["queue_busy_message"], got
        assert got["lease_busy"] >= 1, got
        # Resident growth within the stated total (the tenant alone may not
        # even reach it: its part and the shared rest are less).
        stated = CLIENT_MEMORY + CONNECTIONS * CONNECTION_BASE
        assert grown <= stated, f"kvtierd grew {grown >> 20} MiB holding {got}; the stated bound is {stated >> 20} MiB"

        # The other tenant keeps its part: it connects, puts, gets and queues.
        b = client(d, BETA, "get")
        assert "error" not in b and b["exact"] == 8, b
        b = client(d, BETA, "put", n=16)  # 8 new blocks
        assert "error" not in b and b["exact"] == 16, b
        queued = client(d, BETA, "enqueue")
        assert "error" not in queued, queued
    finally:
        hoarder.communicate("go\n", timeout=60)

    # Closing its connections gives everything back.
    stats = subprocess.run([sys.executable, "-c", "import kvtier,json,sys; "
                            "print(json.dumps(kvtier.Client(sys.argv[1], []).stats()))", d.socket_path],
                           capture_output=True, text=True, timeout=60)
    assert stats.returncode == 0, stats.stderr
    counters = json.loads(stats.stdout)
    assert counters["server.client_memory_refusals"] >= 2, counters
