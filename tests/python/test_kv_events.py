"""KV events through a real kvtierd, read by an independent subscriber
(python3-zmq and python3-msgpack, none of kvtier's code): an index rebuilt
from a snapshot plus the stream, through evictions to NVMe, the NVMe tier's
reclaims, promotions, erases, a namespace drop and a restart, equals what
the tiers hold at the end, block for block and tier for tier, as `kvtier
ls --blocks` lists them, and `kvtier ls` counts the same blocks
(docs/OPERATIONS.md, "KV events")."""

import json
import os
import subprocess
import threading
import time
import urllib.request

import msgpack
import pytest
import zmq

import kvtier
from conftest import block_bytes, metrics_url

KVTIER_TOOL = os.environ.get("KVTIER_TOOL", "")
END = -1


def namespace(revision):
    # 64 KiB blocks: a 2 MiB host tier holds 32 of them.
    return kvtier.Namespace(model_id="test/events", model_revision=revision, kv_dtype="fp32", block_tokens=16,
                            layer_count=4, bytes_per_token_per_layer=1024)


class Subscriber:
    """A router's view of one node: the set of (medium, namespace, key)."""

    def __init__(self, directory):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(f"ipc://{directory}/kvtierd-events.sock")
        self.replay_endpoint = f"ipc://{directory}/kvtierd-events-replay.sock"
        self.index = set()
        self.last = None  # the last sequence number applied
        self.restarts = 0
        self.media = set()

    def close(self):
        self.ctx.destroy(linger=0)

    def request(self, body):
        """[(seq, payload)] up to the end marker, from a fresh DEALER."""
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.connect(self.replay_endpoint)
        dealer.send_multipart([b"", body])
        out = []
        try:
            while True:
                assert dealer.poll(10_000), "no answer from the replay socket"
                frames = dealer.recv_multipart()
                assert frames[0] == b"" and len(frames) == 3, frames
                seq = int.from_bytes(frames[1], "big", signed=True)
                if seq == END:
                    return out
                out.append((seq, frames[2]))
        finally:
            dealer.close(linger=0)

    def apply(self, payload):
        batch = msgpack.unpackb(payload, raw=False)
        assert isinstance(batch["ts"], float)
        for event in batch["events"]:
            kind = event["type"]
            if kind == "AllBlocksCleared":
                self.index.clear()
                continue
            medium, ns = event["medium"], event["kvtier_namespace"].hex()
            self.media.add(medium)
            keys = [k.hex() for k in event["block_hashes"]]
            assert all(len(k) == 32 for k in keys)
            if kind == "BlockStored":
                assert event["token_ids"] == [] and event["lora_id"] is None
                assert event["block_size"] in (0, 16)
                self.index.update((medium, ns, k) for k in keys)
            else:
                assert kind == "BlockRemoved", kind
                self.index.difference_update((medium, ns, k) for k in keys)

    def snapshot(self):
        """The daemon's current contents and the sequence number they include."""
        batches = self.request(msgpack.packb({"type": "snapshot"}))
        contents = Subscriber.__new__(Subscriber)
        contents.index, contents.media = set(), set()
        seq = None
        for s, payload in batches:
            seq = s if seq is None else seq
            assert s == seq  # every batch of a snapshot names the same point of the stream
            Subscriber.apply(contents, payload)
        return seq, contents.index

    def resync(self):
        seq, index = self.snapshot()
        self.index, self.last = index, seq

    def pump(self, quiet_s=0.5):
        """Applies the stream until nothing comes for `quiet_s`, replaying gaps."""
        while self.sub.poll(int(quiet_s * 1000)):
            _, seq_bytes, payload = self.sub.recv_multipart()
            seq = int.from_bytes(seq_bytes, "big")
            if self.last is not None and seq <= self.last:
                # A PUB stream never repeats a number: numbers that go back are another run of the daemon.
                self.restarts += 1
                self.resync()
                continue
            if self.last is not None and seq > self.last + 1:
                for s, p in self.request((self.last + 1).to_bytes(8, "big")):
                    if s < seq:
                        assert s == self.last + 1, "the replay buffer lost batches"
                        self.apply(p)
                        self.last = s
            self.apply(payload)
            self.last = seq


def ls_counts(d):
    r = subprocess.run([KVTIER_TOOL, "ls", "--json", "--socket", d.socket_path], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    listed = json.loads(r.stdout)
    rows = listed["namespaces"] if isinstance(listed, dict) else listed
    counts = {}
    for row in rows:
        for tier, use in row["tiers"].items():
            if use["blocks"]:
                counts[(tier, row["fingerprint"])] = use["blocks"]
    return counts


MEDIUM_TIER = {"CPU_PINNED": "host", "DISK": "nvme", "REMOTE": "remote", "GPU": "hbm"}


def index_counts(index):
    counts = {}
    for medium, ns, _ in index:
        k = (MEDIUM_TIER[medium], ns)
        counts[k] = counts.get(k, 0) + 1
    return counts


def ls_blocks(d):
    """`kvtier ls --blocks --json` as a set of (tier, namespace, key); each block listed once."""
    r = subprocess.run([KVTIER_TOOL, "ls", "--blocks", "--json", "--socket", d.socket_path], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    listed = [(row["tier"], row["namespace"], row["key"]) for row in rows]
    assert len(listed) == len(set(listed)), "a block listed twice"
    return set(listed)


def index_blocks(index):
    return {(MEDIUM_TIER[medium], ns, key) for medium, ns, key in index}


def settle(sub, d):
    """Waits until the daemon has published everything (two quiet pumps)."""
    for _ in range(3):
        sub.pump(quiet_s=0.5)


def test_an_index_rebuilt_from_the_events_equals_the_tiers(make_daemon):
    if not KVTIER_TOOL:
        pytest.skip("KVTIER_TOOL is not set: run the suite through ctest")
    d = make_daemon(host_bytes=2 << 20, nvme_bytes=24 << 20)
    sub = Subscriber(d.directory)
    try:
        time.sleep(0.3)  # the SUB socket joins before the snapshot is taken (ZeroMQ's slow joiner)
        sub.resync()
        a, b = namespace("a"), namespace("b")
        with kvtier.Client(d.socket_path, [a, b], use_directory=False) as c:
            fp_a, fp_b = c.fingerprints[0].hex(), c.fingerprints[1].hex()
            chains = []
            for chain in range(12):  # 12 x 16 blocks = 12 MiB through a 2 MiB host tier, NVMe reclaims
                keys = kvtier.ChainHasher(a).keys(list(range(chain * 10_000, chain * 10_000 + 16 * 16)))
                c.put_batch(0, keys, [block_bytes(a, chain * 100 + i) for i in range(16)], chain=True)
                chains.append(keys)
                sub.pump(quiet_s=0.01)
            keys_b = kvtier.ChainHasher(b).keys(list(range(8 * 16)))
            c.put_batch(1, keys_b, [block_bytes(b, 5000 + i) for i in range(8)], chain=True)
            # Promotions of blocks on NVMe, an erase, then the namespace b dropped.
            out = bytearray(a.block_bytes)
            for keys in chains[-4:-1]:
                for k in keys[:4]:
                    try:
                        c.get(0, k, out)
                    except kvtier.NotFoundError:
                        pass
            c.erase(0, chains[-1][:8])
            settle(sub, d)
        r = subprocess.run([KVTIER_TOOL, "drop", "--ns", fp_b, "--socket", d.socket_path], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        settle(sub, d)
        assert {"CPU_PINNED", "DISK"} <= sub.media, sub.media

        d.restart()  # the NVMe tier's blocks come back; the host tier's are gone
        with kvtier.Client(d.socket_path, [a], use_directory=False) as c:
            # Until the SUB socket has reconnected to the new run and seen it (what it missed, it resyncs).
            for attempt in range(100):
                keys = kvtier.ChainHasher(a).keys(list(range(900_000 + attempt * 100, 900_000 + attempt * 100 + 32)))
                c.put_batch(0, keys, [block_bytes(a, 9000 + attempt * 2 + i) for i in range(2)], chain=True)
                sub.pump(quiet_s=0.1)
                if sub.restarts:
                    break
        settle(sub, d)
        assert sub.restarts == 1

        _, truth = sub.snapshot()
        assert sub.index == truth, (len(sub.index - truth), len(truth - sub.index))
        assert any(m == "DISK" for m, _, _ in truth) and any(m == "CPU_PINNED" for m, _, _ in truth)
        assert not any(ns == fp_b for _, ns, _ in truth)
        assert index_counts(sub.index) == ls_counts(d)
        listed = ls_blocks(d)
        rebuilt = index_blocks(sub.index)
        assert rebuilt == listed, (sorted(rebuilt - listed)[:5], sorted(listed - rebuilt)[:5])
    finally:
        sub.close()


def test_a_late_joiner_gets_the_contents_then_the_stream_and_replays_gaps(make_daemon):
    d = make_daemon(host_bytes=8 << 20)
    a = namespace("late")
    with kvtier.Client(d.socket_path, [a], use_directory=False) as c:
        first = kvtier.ChainHasher(a).keys(list(range(16 * 6)))
        c.put_batch(0, first, [block_bytes(a, i) for i in range(6)], chain=True)
        time.sleep(0.2)
        sub = Subscriber(d.directory)
        try:
            time.sleep(0.3)
            sub.resync()
            fp = c.fingerprints[0].hex()
            assert {("CPU_PINNED", fp, k.hex()) for k in first} <= sub.index
            # Replay of a range the subscriber already has: every batch kept from that number, then the end.
            replayed = sub.request((0).to_bytes(8, "big"))
            assert [s for s, _ in replayed] == list(range(replayed[0][0], replayed[-1][0] + 1))
            second = kvtier.ChainHasher(a).keys(list(range(50_000, 50_000 + 16 * 3)))
            c.put_batch(0, second, [block_bytes(a, 100 + i) for i in range(3)], chain=True)
            sub.pump()
            assert {("CPU_PINNED", fp, k.hex()) for k in second} <= sub.index
            stored = [e for _, p in sub.request((0).to_bytes(8, "big"))
                      for e in msgpack.unpackb(p, raw=False)["events"] if e["type"] == "BlockStored"]
            chained = [e for e in stored if [k.hex() for k in e["block_hashes"]] == [k.hex() for k in second]]
            assert chained and chained[0]["parent_block_hash"] is None  # one event for the chain, root first
            assert chained[0]["block_size"] == 16
        finally:
            sub.close()


def test_long_answers_are_paced_by_their_reader_and_bounded_in_number(make_daemon):
    """A snapshot and a replay far longer than a peer's queue (send_hwm 2
    batches) arrive whole, end marker included, to a reader that takes its
    time (about 500 KB each, more than the socket buffers hold); past
    two snapshots in flight, a request is told the daemon is busy."""
    d = make_daemon(extra="[events]\nsend_hwm = 2\n")
    small = kvtier.Namespace(model_id="test/events", model_revision="small", kv_dtype="fp32", block_tokens=16,
                             layer_count=4, bytes_per_token_per_layer=16)  # 1 KiB blocks
    sub = Subscriber(d.directory)
    try:
        with kvtier.Client(d.socket_path, [small], use_directory=False) as c:
            keys = kvtier.ChainHasher(small).keys(list(range(16 * 12_000)))
            for i in range(0, 12_000, 100):  # batches of events, one per put at least
                c.put_batch(0, keys[i:i + 100], [block_bytes(small, j) for j in range(i, i + 100)], chain=True)
                time.sleep(0.005)
            fp = c.fingerprints[0].hex()
        settle(sub, d)
        dealer = sub.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.RCVHWM, 2)  # a small queue on this side too: the daemon must wait for the reader
        dealer.connect(sub.replay_endpoint)
        for _ in range(4):  # four snapshots asked at once, none read yet
            dealer.send_multipart([b"", msgpack.packb({"type": "snapshot"})])
        time.sleep(0.5)
        answers, busy, blocks = 0, 0, set()  # the two answers interleave: the same contents
        while answers + busy < 4:
            assert dealer.poll(10_000), (answers, busy)
            frames = dealer.recv_multipart()
            if len(frames) == 2:
                assert msgpack.unpackb(frames[1])["error"].startswith("busy"), frames
                busy += 1
                continue
            seq = int.from_bytes(frames[1], "big", signed=True)
            if seq == END:
                answers += 1
                continue
            for e in msgpack.unpackb(frames[2], raw=False)["events"]:
                blocks.update(k.hex() for k in e["block_hashes"] if e["kvtier_namespace"].hex() == fp)
            time.sleep(0.002)  # a slow reader: the daemon waits for it, drops nothing
        assert (answers, busy) == (2, 2)
        assert blocks == {k.hex() for k in keys}
        # A replay of every kept batch, read slowly: contiguous, then the end marker.
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        seqs = []
        while True:
            assert dealer.poll(10_000), seqs[-3:]
            frames = dealer.recv_multipart()
            seq = int.from_bytes(frames[1], "big", signed=True)
            if seq == END:
                break
            seqs.append(seq)
            time.sleep(0.001)
        assert len(seqs) > 20 and seqs == list(range(seqs[0], seqs[-1] + 1))
        dealer.close(linger=0)
    finally:
        sub.close()


def events_metrics(d):
    """The daemon's events.* samples from its Prometheus endpoint (the
    client's stats are the engine's only)."""
    text = urllib.request.urlopen(metrics_url(d), timeout=10).read().decode()
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line.startswith("kvtier_events_")}


def test_subscribers_past_the_cap_are_refused_until_one_leaves(make_daemon):
    """events.max_subscribers = 2: a third subscriber gets nothing (refused
    at its handshake, counted); once one of the first two has left, it is
    let in when it connects again."""
    d = make_daemon(extra="[events]\nmax_subscribers = 2\n")
    a = namespace("cap")
    ctx = zmq.Context()
    subs = []

    def peers_become(n):
        """Waits until the daemon counts `n` subscribers (a loaded machine connects late)."""
        deadline = time.monotonic() + 15
        while events_metrics(d).get("kvtier_events_peers") != n and time.monotonic() < deadline:
            time.sleep(0.05)
        return events_metrics(d).get("kvtier_events_peers") == n

    def subscribe():
        s = ctx.socket(zmq.SUB)
        s.setsockopt(zmq.SUBSCRIBE, b"")
        s.setsockopt(zmq.LINGER, 0)
        s.connect(f"ipc://{d.directory}/kvtierd-events.sock")
        subs.append(s)

    def got(sock, timeout_ms):
        if not sock.poll(timeout_ms):
            return False
        while sock.poll(0):
            sock.recv_multipart()
        return True

    for i in range(2):
        subscribe()
        assert peers_become(i + 1)

    try:
        with kvtier.Client(d.socket_path, [a], use_directory=False) as c:
            def put(n):
                keys = kvtier.ChainHasher(a).keys(list(range(n * 1000, n * 1000 + 16)))
                c.put(0, keys[0], block_bytes(a, n))
            # A subscriber's handshake and subscription reach the publisher a
            # moment after its connection is counted: put until both admitted
            # ones have heard. Only then does the third connect, so that it is
            # the one past the cap (a peer arriving while another's handshake
            # is open may be refused too: daemon/events/peer_cap.h).
            heard = [False, False]
            deadline = time.monotonic() + 15
            n = 1
            while not all(heard) and time.monotonic() < deadline:
                put(n)
                n += 1
                heard = [heard[i] or got(subs[i], 200) for i in range(2)]
            assert all(heard), heard
            subscribe()
            time.sleep(0.3)
            put(n)
            n += 1
            assert not got(subs[2], 1000)
            assert peers_become(2), events_metrics(d)  # the refused one's connection is closed
            metrics = events_metrics(d)
            assert metrics["kvtier_events_refused_peers_total"] >= 1, metrics
            subs[0].close(linger=0)
            # ZeroMQ does not retry a peer refused at its handshake: the subscriber connects again.
            subs[2].close(linger=0)
            time.sleep(0.3)
            subs[2] = ctx.socket(zmq.SUB)
            subs[2].setsockopt(zmq.SUBSCRIBE, b"")
            subs[2].connect(f"ipc://{d.directory}/kvtierd-events.sock")
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and not got(subs[2], 200):
                put(n)  # until it is in (its subscription takes a moment to arrive)
                n += 1
            assert time.monotonic() < deadline, "the third subscriber was never let in"
            assert got(subs[1], 1000)
    finally:
        ctx.destroy(linger=0)


def test_the_daemon_stops_cleanly_while_subscribers_ask(make_daemon):
    """SIGTERM while snapshots and estimates keep coming: the publisher's
    thread, which reads the engine, stops before the engine goes (a
    use-after-free otherwise, which the ASan suite reports)."""
    d = make_daemon()
    a = namespace("stop")
    with kvtier.Client(d.socket_path, [a], use_directory=False) as c:
        keys = kvtier.ChainHasher(a).keys(list(range(16 * 16)))
        c.put_batch(0, keys, [block_bytes(a, i) for i in range(16)], chain=True)
        fp = c.fingerprints[0].canonical()
    stop = threading.Event()
    ctx = zmq.Context()

    def ask():
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(f"ipc://{d.directory}/kvtierd-events-replay.sock")
        estimate = msgpack.packb({"type": "estimate", "namespace": fp, "keys": [k.canonical() for k in keys]})
        while not stop.is_set():
            dealer.send_multipart([b"", msgpack.packb({"type": "snapshot"})], zmq.NOBLOCK)
            dealer.send_multipart([b"", estimate], zmq.NOBLOCK)
            while dealer.poll(1):
                dealer.recv_multipart()
        dealer.close(linger=0)

    askers = [threading.Thread(target=ask) for _ in range(3)]
    try:
        for t in askers:
            t.start()
        time.sleep(0.5)
        d.stop()  # asserts exit status 0
    finally:
        stop.set()
        for t in askers:
            t.join()
        ctx.destroy(linger=0)


def test_bad_requests_get_an_error_and_the_daemon_serves_on(make_daemon):
    d = make_daemon()
    sub = Subscriber(d.directory)
    try:
        dealer = sub.ctx.socket(zmq.DEALER)
        dealer.connect(sub.replay_endpoint)
        for body in [b"\xc1", msgpack.packb({"type": "nonsense"}), b"12345"]:
            dealer.send_multipart([b"", body])
            assert dealer.poll(10_000)
            frames = dealer.recv_multipart()
            assert "error" in msgpack.unpackb(frames[-1], raw=False)
        dealer.close(linger=0)
        seq, _ = sub.snapshot()
        assert seq >= 0
    finally:
        sub.close()


def test_the_replay_socket_estimates_when_a_prefix_can_be_ready(make_daemon):
    d = make_daemon(host_bytes=2 << 20, nvme_bytes=24 << 20)
    a = namespace("estimate")
    with kvtier.Client(d.socket_path, [a], use_directory=False) as c:
        fp = c.fingerprints[0]
        old = kvtier.ChainHasher(a).keys(list(range(16 * 16)))
        c.put_batch(0, old, [block_bytes(a, i) for i in range(16)], chain=True)
        for chain in range(1, 4):  # pushes the first chain out of the 2 MiB host tier, onto NVMe
            keys = kvtier.ChainHasher(a).keys(list(range(chain * 10_000, chain * 10_000 + 16 * 16)))
            c.put_batch(0, keys, [block_bytes(a, chain * 100 + i) for i in range(16)], chain=True)
        fresh = keys
        unknown = kvtier.ChainHasher(a).keys(list(range(777_000, 777_000 + 32)))
        through_client = c.estimate_ready(0, old[:4])
    sub = Subscriber(d.directory)
    try:
        dealer = sub.ctx.socket(zmq.DEALER)
        dealer.connect(sub.replay_endpoint)

        def ask(keys, ns=bytes.fromhex(fp.hex())):
            dealer.send_multipart([b"", msgpack.packb({"type": "estimate", "namespace": ns,
                                                       "keys": [bytes.fromhex(k.hex()) for k in keys]})])
            assert dealer.poll(10_000)
            frames = dealer.recv_multipart()
            return msgpack.unpackb(frames[-1], raw=False)

        hot = ask(list(fresh[:4]) + list(unknown))
        assert hot["prefix_blocks"] == 4 and hot["media"] == ["CPU_PINNED"] * 4
        assert hot["host_ready_us"] == 0
        cold = ask(old[:4])
        assert cold["prefix_blocks"] == 4 and set(cold["media"]) == {"DISK"}, cold
        assert cold["host_ready_us"] > 0
        [disk] = [t for t in cold["tiers"] if t["medium"] == "DISK"]
        assert disk["blocks"] == 4 and disk["bytes"] == 4 * a.block_bytes
        assert cold["host_ready_us"] >= disk["bytes"] / disk["read_bytes_per_s"] * 1e6
        assert through_client.prefix_blocks == 4  # the client's answer places the same blocks
        assert "error" in ask(old[:4], ns=b"short")
        assert ask(unknown)["prefix_blocks"] == 0
        dealer.close(linger=0)
    finally:
        sub.close()
