"""Namespace registrations through a real kvtierd: listings paged past one
page, model ids cut for metric labels on a character boundary, and Hellos
that are refused leaving nothing behind (docs/RELIABILITY.md, the limits on
what a Hello registers)."""

import json
import os
import sys
import textwrap
import urllib.request

import pytest

import kvtier
from conftest import test_namespace
from test_metrics import metrics_url, parse
from test_tenants import BETA, cli, make_tenancy, run_as

PAGE = 256          # namespaces in one ListNamespaces page (RequestHandler::kMaxListPageNamespaces)
PER_HELLO = 64      # namespaces one Hello may register


def ls(d):
    r = cli(d, None, "ls", "--json")
    assert r.returncode == 0, r.stderr
    listed = json.loads(r.stdout)
    return listed["namespaces"] if isinstance(listed, dict) else listed


def test_ls_lists_every_namespace_past_one_page(make_daemon):
    d = make_daemon()
    connections = 5  # 5 x 64 = 320 namespaces: two pages
    clients, expected = [], set()
    try:
        for c in range(connections):
            namespaces = [test_namespace(revision=f"conn{c}-ns{i}") for i in range(PER_HELLO)]
            client = kvtier.Client(d.socket_path, namespaces, use_directory=False)
            clients.append(client)
            expected |= {f.hex() for f in client.fingerprints}
        assert len(expected) == connections * PER_HELLO > PAGE
        listed = ls(d)  # while the connections hold their registrations
        fingerprints = [n["fingerprint"] for n in listed]
        assert len(fingerprints) == len(set(fingerprints)), "a namespace listed twice across pages"
        assert set(fingerprints) == expected, (len(fingerprints), len(expected))
        revisions = {n["model_revision"] for n in listed}
        assert revisions == {f"conn{c}-ns{i}" for c in range(connections) for i in range(PER_HELLO)}
    finally:
        for client in clients:
            client.close()


def test_a_model_id_cut_inside_a_character_keeps_metrics_and_stats_valid(make_daemon):
    d = make_daemon()
    # 127 ASCII bytes, then a 2-byte character over bytes 127..128, then more:
    # a cut at 128 bytes falls inside the character.
    model = "m" * 127 + "\u00e9" + "-tail"
    assert len(model.encode()) > 129
    ns = kvtier.Namespace(model_id=model, model_revision="rev-1", kv_dtype="fp32", block_tokens=16,
                          layer_count=4, bytes_per_token_per_layer=64)
    with kvtier.Client(d.socket_path, [ns], use_directory=False) as c:
        key = kvtier.ChainHasher(ns).keys(list(range(16)))[0]
        c.put(0, key, bytes(ns.block_bytes))
        with urllib.request.urlopen(metrics_url(d), timeout=10) as r:
            raw = r.read()
        text = raw.decode("utf-8")  # strict: raises on a cut character
        _, samples = parse(text)
        models = {dict(labels).get("model") for name, labels in samples if name == "kvtier_namespace_bytes"}
        assert "m" * 127 in models, models  # cut before the character, not inside it
        stats = c.stats()
        assert stats, "the Stats request answers"
    r = cli(d, None, "stats")
    assert r.returncode == 0, r.stderr
    assert "m" * 127 + '"' in r.stdout
    r = cli(d, None, "ls", "--json")
    assert r.returncode == 0, r.stderr
    assert [n["model_id"] for n in json.loads(r.stdout)] == [model], "the listing keeps the whole id"


# Run as a tenant: sends argv[2] Hellos of each kind, each on a fresh
# connection, and prints how many the daemon refused. Raw frames, because the
# client library refuses over-long descriptors before sending them: protobuf
# by hand, field numbers of proto/kvtier/v1/kvtier.proto.
HELLOS = textwrap.dedent('''
    import json, socket, struct, sys
    def varint(n):
        out = bytearray()
        while True:
            byte, n = n & 0x7F, n >> 7
            out.append(byte | (0x80 if n else 0))
            if not n:
                return bytes(out)
    def field(number, value):
        if isinstance(value, int):
            return varint(number << 3) + varint(value)
        data = value.encode() if isinstance(value, str) else value
        return varint(number << 3 | 2) + varint(len(data)) + data
    def descriptor(model, revision, adapter=""):
        adapter_fields = field(3, adapter) + field(4, "v" * 250) if adapter else b""
        return b"".join([field(1, model), field(2, revision), adapter_fields, field(5, "fp32"), field(6, 16),
                         field(7, 4), field(8, "layer_major_kv"), field(9, 64), field(11, 1), field(13, 1),
                         field(14, 1), field(15, "kv")])
    def hello_frame(descriptors):
        hello = field(1, 2) + field(2, "refused-hello") + b"".join(field(3, d) for d in descriptors)
        request = field(1, 1) + field(2, hello)
        return struct.pack("<I", len(request)) + request
    def answer(frame):
        """The daemon's answer frame (the bytes that came, if it closed first)."""
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(30)
        s.connect(sys.argv[1])
        s.sendall(frame)
        got = b""
        while len(got) < 4 or len(got) < 4 + struct.unpack("<I", got[:4])[0]:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
        s.close()
        return got
    refused = 0
    for i in range(int(sys.argv[2])):
        tag = "%06d" % i
        # 63 namespaces the tenant may register, with long strings, then one
        # model its list refuses: the whole Hello is refused.
        unlisted = [descriptor("test/model", tag + "r" * 250, "a" * 500) for _ in range(63)]
        unlisted.append(descriptor("other/model", tag))
        # One descriptor past its byte limit (model_id: 512).
        too_long = [descriptor("test/model", tag), descriptor("x" * 600, tag)]
        for frame in (hello_frame(unlisted), hello_frame(too_long)):
            reply = answer(frame)
            refused += b"may not cache model" in reply or b"model_id" in reply
    print(json.dumps({"refused": refused}))
''')


def resident_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run clients as other uids (setpriv)")
def test_refused_hellos_leave_no_registration_and_no_memory(make_daemon):
    d = make_tenancy(make_daemon)
    (d.directory / "hellos.py").write_text(HELLOS)
    os.chmod(d.directory / "hellos.py", 0o644)

    def hellos(n):
        r = run_as(d, BETA, [sys.executable, str(d.directory / "hellos.py"), d.socket_path, str(n)])
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout.strip().splitlines()[-1])["refused"]

    assert hellos(20) == 40  # warm-up: the allocator's arenas, the first connections
    listed_before = ls(d)
    rss_before = resident_bytes(d.proc.pid)
    n = 200  # each 63 x ~1000 bytes of strings: ~12.6 MB if the refused ones were kept
    assert hellos(n) == 2 * n, "every one of those Hellos is refused"
    rss_after = resident_bytes(d.proc.pid)
    listed_after = ls(d)
    assert listed_after == listed_before == [], listed_after[:3]
    assert rss_after - rss_before < 4 << 20, (rss_before, rss_after)
    # The daemon still serves the tenant.
    r = run_as(d, BETA, [sys.executable, "-c", textwrap.dedent(f'''
        import kvtier
        ns = kvtier.Namespace(model_id="test/model", model_revision="ok", kv_dtype="fp32", block_tokens=16,
                              layer_count=4, bytes_per_token_per_layer=64)
        with kvtier.Client("{d.socket_path}", [ns]) as c:
            print(c.lookup(0, kvtier.ChainHasher(ns).keys(list(range(16)))).prefix_blocks)
    ''')])
    assert r.returncode == 0 and r.stdout.strip() == "0", r.stderr
