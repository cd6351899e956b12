"""The vLLM connector forwards kvtierd's own KV events through take_events:
vLLM's event stream names the kvtier tier a block is in (host, NVMe) with
vLLM's own block hashes, follows it when kvtier demotes it, drops it, and
restarts, and never names vLLM's GPU medium for kvtier's tiers. The mini
vLLM engine runs against a real kvtierd that publishes events (its
default); the connector subscribes through python3-zmq and python3-msgpack.
"""

import tempfile
import time

import msgpack
import pytest
import zmq

import kvtier
from kvtier.integrations import _vllm_tier_events as tier_events
from kvtier.integrations._vllm_events import BlockRemoved, BlockStored
from conftest import block_bytes
from model_fixtures import model  # noqa: F401 (fixture)
from vllm_harness import BLOCK_TOKENS, kvtier_engine, prompt

HOST = "KVTIER_HOST"  # the test's event_medium: kvtierd's host tier
FILLER = kvtier.Namespace(model_id="test/filler", model_revision="1", kv_dtype="fp32", block_tokens=16,
                          layer_count=4, bytes_per_token_per_layer=1024)  # 64 KiB blocks


class Stream:
    """What vLLM publishes: take_events() after every step, kept in order."""

    def __init__(self, engine):
        connector = engine.scheduler_connector
        take = connector.take_events
        self.events = []
        # What the engine takes each step, and what pump() takes between runs.
        self.take = connector.take_events = lambda: self.events.extend(taken := list(take())) or taken

    def pump(self, until, timeout=20.0):
        deadline = time.monotonic() + timeout
        while True:
            self.take()
            if until(self) or time.monotonic() > deadline:
                return until(self)
            time.sleep(0.02)

    def held(self, medium):
        """vLLM block hashes the stream says `medium` holds now."""
        out = set()
        for e in self.events:
            kind = type(e).__name__.lstrip("_")
            if kind == "AllBlocksCleared":
                out.clear()
            elif getattr(e, "medium", None) == medium:
                (out.update if kind == "BlockStored" else out.difference_update)(e.block_hashes)
        return out


def run(engine, tokens, req_id):
    request = engine.add_request(tokens, 1, req_id)
    engine.run_until_done()
    return request


def fill_host(daemon, count=48, seed=0):
    """Puts `count` 64 KiB blocks of another namespace: more than a 2 MiB
    host tier holds, so older blocks go down to NVMe."""
    with kvtier.Client(daemon.socket_path, [FILLER], client_name="filler", use_directory=False) as c:
        keys = kvtier.ChainHasher(FILLER).keys(list(range(seed, seed + 16 * count)))
        for i in range(0, count, 8):
            c.put_batch(0, keys[i:i + 8], [block_bytes(FILLER, seed + j) for j in range(i, min(i + 8, count))], chain=True)


def test_vllms_events_follow_a_block_down_kvtiers_tiers_and_out(model, make_daemon):  # noqa: F811
    daemon = make_daemon(host_bytes=2 << 20, nvme_bytes=32 << 20)
    a = kvtier_engine(model, daemon, event_medium=HOST)
    stream = Stream(a)
    p = prompt(7, 2 * BLOCK_TOKENS + 3)
    request = run(a, p, "r1")
    engine_blocks = 2 * BLOCK_TOKENS // model.block_size
    saved = list(request.block_hashes[:engine_blocks])

    # The daemon's host-tier event, named with vLLM's hashes, tokens and block size.
    assert stream.pump(lambda s: set(saved) <= s.held(HOST)), stream.events
    stored = [e for e in stream.events if type(e).__name__.lstrip("_") == "BlockStored" and e.medium == HOST]
    assert [h for e in stored for h in e.block_hashes] == saved
    assert [t for e in stored for t in e.token_ids] == p[:2 * BLOCK_TOKENS]
    assert stored[0].parent_block_hash is None and all(e.block_size == model.block_size for e in stored)

    # Demoted to NVMe: stored on DISK, then gone from the host.
    fill_host(daemon)
    assert stream.pump(lambda s: set(saved) <= s.held("DISK") and not set(saved) & s.held(HOST)), \
        [(type(e).__name__, e.medium, len(e.block_hashes)) for e in stream.events]

    # reset_cache drops the namespaces: gone from every kvtier tier.
    assert a.scheduler_connector.reset_cache() is True
    assert stream.pump(lambda s: not set(saved) & s.held("DISK")), stream.events[-5:]
    media = {getattr(e, "medium", None) for e in stream.events} - {None}
    assert media <= {HOST, "DISK"}, media  # never "GPU": that is vLLM's own cache
    a.shutdown()


def test_after_a_daemon_restart_vllms_events_say_what_survived(model, make_daemon):  # noqa: F811
    daemon = make_daemon(host_bytes=2 << 20, nvme_bytes=32 << 20)
    a = kvtier_engine(model, daemon, event_medium=HOST)
    stream = Stream(a)
    request = run(a, prompt(8, 2 * BLOCK_TOKENS + 3), "r1")
    saved = set(request.block_hashes[:2 * BLOCK_TOKENS // model.block_size])
    assert stream.pump(lambda s: saved <= s.held(HOST))
    fill_host(daemon)
    assert stream.pump(lambda s: saved <= s.held("DISK") and not saved & s.held(HOST))

    daemon.restart()  # the host tier is empty again; the NVMe tier's blocks come back
    fill_host(daemon, count=4, seed=10_000)  # something happens in the new run
    # The connector's clients reconnect on their first calls after the
    # restart; a save that meets the dead connection is dropped (the engine
    # goes on without it), so new requests run until one's blocks are stored.
    for attempt in range(10):
        later = run(a, prompt(20 + attempt, 2 * BLOCK_TOKENS + 3), f"r{attempt + 2}")
        fresh = set(later.block_hashes[:2 * BLOCK_TOKENS // model.block_size])
        if stream.pump(lambda s: fresh <= s.held(HOST), timeout=5):
            break
    assert fresh <= stream.held(HOST), stream.events[-5:]
    assert saved <= stream.held("DISK") and not saved & stream.held(HOST)
    a.shutdown()


def test_forwarding_off_keeps_the_connectors_own_events(model, make_daemon):  # noqa: F811
    daemon = make_daemon()
    a = kvtier_engine(model, daemon, event_medium=HOST, forward_tier_events="false")
    stream = Stream(a)
    request = run(a, prompt(9, 2 * BLOCK_TOKENS + 1), "r1")
    saved = list(request.block_hashes[:2 * BLOCK_TOKENS // model.block_size])
    assert stream.pump(lambda s: set(saved) <= s.held(HOST), timeout=5)
    assert a.scheduler_connector._scheduler._forwarder is None
    a.shutdown()


def test_event_media_renames_kvtiers_tiers(model, make_daemon):  # noqa: F811
    daemon = make_daemon(host_bytes=2 << 20, nvme_bytes=32 << 20)
    a = kvtier_engine(model, daemon, event_media={"CPU_PINNED": "kvtier-dram", "DISK": "kvtier-ssd", "BOGUS": "x"})
    stream = Stream(a)
    request = run(a, prompt(10, 2 * BLOCK_TOKENS + 1), "r1")
    saved = set(request.block_hashes[:2 * BLOCK_TOKENS // model.block_size])
    assert stream.pump(lambda s: saved <= s.held("kvtier-dram"))
    fill_host(daemon)
    assert stream.pump(lambda s: saved <= s.held("kvtier-ssd"))
    a.shutdown()


def test_a_refused_subscription_connects_again_once_there_is_room(model, make_daemon, monkeypatch):  # noqa: F811
    """events.max_subscribers = 1, taken by another subscriber: the
    connector's subscription is refused (ZeroMQ does not reconnect it);
    once the other leaves, it connects again and vLLM's events flow."""
    monkeypatch.setattr(tier_events, "REFUSED_RETRY_S", 0.5)
    daemon = make_daemon(extra="[events]\nmax_subscribers = 1\n")
    ctx = zmq.Context()
    other = ctx.socket(zmq.SUB)
    other.setsockopt(zmq.SUBSCRIBE, b"")
    other.connect(f"ipc://{daemon.directory}/kvtierd-events.sock")
    time.sleep(0.3)
    try:
        a = kvtier_engine(model, daemon, event_medium=HOST)
        stream = Stream(a)
        forwarder = a.scheduler_connector._scheduler._forwarder
        assert stream.pump(lambda s: forwarder.refused >= 1, timeout=10)
        other.close(linger=0)
        request = run(a, prompt(11, 2 * BLOCK_TOKENS + 1), "r1")
        saved = set(request.block_hashes[:2 * BLOCK_TOKENS // model.block_size])
        assert stream.pump(lambda s: saved <= s.held(HOST))
        a.shutdown()
    finally:
        ctx.destroy(linger=0)


class FakeDaemon:
    """kvtierd's event sockets as docs/OPERATIONS.md ("KV events") gives
    them, driven by the test: an XPUB (it sees the subscriber join) and a
    ROUTER whose answers the test chooses."""

    NS = bytes(range(16))

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="kvtier-ev-")
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.bind(f"ipc://{self.dir}/pub")
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.bind(f"ipc://{self.dir}/replay")
        self.endpoints = (f"ipc://{self.dir}/pub", f"ipc://{self.dir}/replay")
        self.kept = {}

    def close(self):
        self.ctx.destroy(linger=0)

    @staticmethod
    def event(kind, key, medium):
        e = {"type": kind, "block_hashes": [key], "medium": medium, "kvtier_namespace": FakeDaemon.NS}
        if kind == "BlockStored":
            e.update(parent_block_hash=None, token_ids=[], block_size=16, lora_id=None, lora_name=None)
        return e

    def batch(self, *events):
        return msgpack.packb({"ts": time.time(), "events": list(events)})

    def publish(self, seq, *events, lost=False):
        self.kept[seq] = self.batch(*events)
        if not lost:
            self.pub.send_multipart([b"", seq.to_bytes(8, "big", signed=True), self.kept[seq]])

    def answer(self, forwarder, snapshot_through=None, contents=()):
        """Polls the forwarder until it asks; answers a replay from what was
        kept, a snapshot with `contents` [(key, medium)] at `snapshot_through`."""
        for _ in range(500):
            forwarder.poll()
            if self.router.poll(10):
                break
        identity, _, body = self.router.recv_multipart()
        end = (-1).to_bytes(8, "big", signed=True)
        if len(body) == 8:
            start = int.from_bytes(body, "big", signed=True)
            for seq in sorted(self.kept):
                if seq >= start:
                    self.router.send_multipart([identity, b"", seq.to_bytes(8, "big", signed=True), self.kept[seq]])
            self.router.send_multipart([identity, b"", end, b""])
            return "replay", start
        assert msgpack.unpackb(body) == {"type": "snapshot"}
        events = [self.event("BlockStored", k, m) for k, m in contents]
        self.router.send_multipart([identity, b"", snapshot_through.to_bytes(8, "big", signed=True),
                                    self.batch(*events)])
        self.router.send_multipart([identity, b"", end, b""])
        return "snapshot", snapshot_through


def names(i):
    return tier_events.BlockNames([f"h{i}a", f"h{i}b"], f"h{i - 1}b" if i else None, list(range(8)), 4, None)


def drained(forwarder, count, timeout=15.0):
    """The events the forwarder makes until `count` have come (at most
    `timeout` s: a loaded machine delivers late), then those that follow
    within 50 ms."""
    out = []

    def take():
        out.extend((type(e).__name__.lstrip("_"), e.medium, list(e.block_hashes)) for e in forwarder.poll())
        time.sleep(0.005)
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        take()
    for _ in range(10):
        take()
    return out


def test_the_forwarder_joins_by_snapshot_replays_gaps_and_resyncs_a_restart(monkeypatch):
    monkeypatch.setattr(tier_events, "QUIET_CHECK_S", 3600.0)  # every request here is one the test expects
    d = FakeDaemon()
    k0, k1, k2 = (bytes([i]) * 16 for i in range(3))
    media = tier_events.default_media("HOST")
    f = tier_events.TierEventForwarder(d.endpoints, [FakeDaemon.NS], media, BlockStored, BlockRemoved)
    try:
        assert d.pub.poll(5000) and d.pub.recv() == b"\x01"  # subscribed
        # Joining: the snapshot (k0 in NVMe, k2 of nobody's naming yet) at S = 4.
        assert d.answer(f, snapshot_through=4, contents=[(k0, "DISK"), (k2, "CPU_PINNED")]) == ("snapshot", 4)
        f.name(k0, names(0))
        assert drained(f, 1) == [("BlockStored", "DISK", ["h0a", "h0b"])]
        # The stream after S; a batch from before S is ignored.
        d.publish(4, d.event("BlockRemoved", k0, "DISK"))
        d.publish(5, d.event("BlockStored", k1, "CPU_PINNED"))
        f.name(k1, names(1))
        assert drained(f, 1) == [("BlockStored", "HOST", ["h1a", "h1b"])]
        # A lost batch (6) is replayed from the replay socket, in order.
        d.publish(6, d.event("BlockStored", k1, "DISK"), lost=True)
        d.publish(7, d.event("BlockRemoved", k1, "CPU_PINNED"))
        assert d.answer(f) == ("replay", 6)
        assert drained(f, 2) == [("BlockStored", "DISK", ["h1a", "h1b"]), ("BlockRemoved", "HOST", ["h1a", "h1b"])]
        # A block named after the daemon reported it: reported at the naming.
        f.name(k2, names(2))
        assert drained(f, 1) == [("BlockStored", "HOST", ["h2a", "h2b"])]
        # Lost batches the replay no longer has: a snapshot, whose differences are events.
        d.publish(9, d.event("BlockStored", k0, "REMOTE"))
        d.kept.clear()  # 8 was lost and nothing before 10 is kept any more
        assert d.answer(f) == ("replay", 8)
        assert d.answer(f, snapshot_through=9, contents=[(k1, "DISK"), (k0, "REMOTE")]) == ("snapshot", 9)
        assert sorted(drained(f, 3)) == sorted([("BlockRemoved", "HOST", ["h2a", "h2b"]),
                                             ("BlockRemoved", "DISK", ["h0a", "h0b"]),
                                             ("BlockStored", "REMOTE", ["h0a", "h0b"])])
        assert f.gaps == 1
        d.publish(10, d.event("BlockStored", k2, "DISK"))
        assert drained(f, 1) == [("BlockStored", "DISK", ["h2a", "h2b"])]
        # Another run of the daemon: numbers go back, a snapshot says what survived.
        d.kept.clear()
        d.publish(0, {"type": "AllBlocksCleared"})
        assert d.answer(f, snapshot_through=0, contents=[(k1, "DISK")]) == ("snapshot", 0)
        assert sorted(drained(f, 2)) == [("BlockRemoved", "DISK", ["h2a", "h2b"]),
                                      ("BlockRemoved", "REMOTE", ["h0a", "h0b"])]
        # Other namespaces and unknown media are not this connector's.
        other = dict(d.event("BlockStored", k0, "DISK"), kvtier_namespace=b"x" * 16)
        d.publish(1, other, d.event("BlockStored", k0, "TAPE"))
        assert drained(f, 0) == []
    finally:
        f.close()
        d.close()


def test_a_quiet_stream_asks_for_what_came_after_its_last_batch(monkeypatch):
    """A last batch lost with nothing after it shows no gap: a stream quiet
    for QUIET_CHECK_S asks the replay socket for anything after its last."""
    monkeypatch.setattr(tier_events, "QUIET_CHECK_S", 0.2)
    d = FakeDaemon()
    k0 = bytes([7]) * 16
    f = tier_events.TierEventForwarder(d.endpoints, [FakeDaemon.NS], tier_events.default_media("HOST"),
                                       BlockStored, BlockRemoved)
    try:
        assert d.pub.poll(5000) and d.pub.recv() == b"\x01"
        assert d.answer(f, snapshot_through=3) == ("snapshot", 3)
        f.name(k0, names(0))
        d.publish(4, d.event("BlockStored", k0, "DISK"), lost=True)
        assert d.answer(f) == ("replay", 4)
        assert drained(f, 1) == [("BlockStored", "DISK", ["h0a", "h0b"])]
        assert d.answer(f) == ("replay", 5)  # quiet again: asks again, nothing new
        assert drained(f, 0) == []
    finally:
        f.close()
        d.close()


def test_the_forwarder_tracks_a_bounded_number_of_blocks(monkeypatch):
    monkeypatch.setattr(tier_events, "QUIET_CHECK_S", 3600.0)
    d = FakeDaemon()
    f = tier_events.TierEventForwarder(d.endpoints, [FakeDaemon.NS], tier_events.default_media(), BlockStored,
                                       BlockRemoved, capacity=4)
    try:
        for i in range(10):
            f.name(bytes([i]) * 16, names(i))
        assert f.forgotten == 6 and f.tracked == (4, 0)
        # A snapshot of many blocks nobody named: only `capacity` of them are kept.
        assert d.pub.poll(5000) and d.pub.recv() == b"\x01"
        many = [(bytes([200, i]) * 8, "DISK") for i in range(50)] + [(bytes([9]) * 16, "DISK")]
        assert d.answer(f, snapshot_through=0, contents=many) == ("snapshot", 0)
        assert drained(f, 1) == [("BlockStored", "DISK", ["h9a", "h9b"])]  # a named one is never left out
        assert f.tracked == (4, 4)
    finally:
        f.close()
        d.close()


if __name__ == "__main__":
    pytest.main([__file__])
