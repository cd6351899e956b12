"""kvtierd's own KV events, forwarded into vLLM's event stream.

kvtierd publishes what each of its tiers holds (BlockStored / BlockRemoved /
AllBlocksCleared per medium, over ZeroMQ: docs/OPERATIONS.md, "KV events"),
named by kvtier's block keys. vLLM's KV-aware routers index vLLM's own block
hashes, so the connector names each kvtier block it knows (one it saved, or
loaded) with the vLLM hashes of the engine blocks it covers, and forwards
the daemon's events through take_events() with those hashes and a medium
per kvtier tier: vLLM's stream then says "this prefix is in kvtier's host
tier", "it moved to NVMe", "it left", not only what vLLM's GPU holds.

Media (the `event_media` option overrides any of them):
    kvtierd's GPU (the HBM tier)  -> "KVTIER_HBM" (spare GPU memory, not vLLM's
                                     own cache: a removal there must not
                                     read as vLLM's GPU block leaving)
    kvtierd's CPU_PINNED (host)   -> the connector's `event_medium` ("CPU")
    kvtierd's DISK (NVMe)         -> "DISK"
    kvtierd's REMOTE (Redis)      -> "REMOTE"

Contract:
- Only events of the namespaces given (one per scope: rank 0's KV
  namespace, the one every request's keys are computed for first) count.
- A block's events and its naming may come in either order: the daemon's
  "stored" can arrive before the step that saved it reports; what the daemon
  holds of a block is kept until it is named, then reported at once.
- A daemon's AllBlocksCleared (its start) removes what it held, tier by
  tier (vLLM's AllBlocksCleared would clear vLLM's GPU index too).
- It joins as docs/OPERATIONS.md ("KV events") says a late subscriber
  does: a snapshot of the daemon's contents first, then the stream after
  it. A gap in the sequence numbers is asked again from the replay
  socket; one the replay cannot fill (`gaps`, warned about once), numbers
  that go back, or a reconnect of the connector's client (resync(): another
  run of kvtierd) take a snapshot again, whose differences from what was
  known become events. Live batches wait while the replay socket answers
  (at most MAX_HELD_BATCHES, ANSWER_TIMEOUT_S before asking again). A
  stream quiet for QUIET_CHECK_S asks for anything after its last batch:
  batches lost with none after them leave no gap to see.
- At most `capacity` named blocks are tracked (least recently touched
  forgotten first: `forgotten`), and as many the daemon holds that are
  not named yet (another engine's, or a naming still to come); poll()
  reads at most `max_batches` live batches and as many answer frames per
  call (a big snapshot takes several).
- A subscription kvtierd refuses (events.max_subscribers reached) is
  warned about once and connected again every REFUSED_RETRY_S.
- Nothing here blocks: every socket call is non-blocking; a missing pyzmq
  or msgpack decoder leaves the connector's own events in place.

Thread: vLLM's scheduler thread calls everything.
"""

import collections
import itertools
import logging
import time

logger = logging.getLogger("kvtier.vllm")

try:
    import zmq
except ImportError:  # pyzmq is a vLLM dependency; without it nothing is forwarded
    zmq = None

try:
    import msgpack

    def _unpack(payload):
        return msgpack.unpackb(payload, raw=False, strict_map_key=False)
except ImportError:
    try:
        import msgspec

        _decoder = msgspec.msgpack.Decoder()

        def _unpack(payload):
            return _decoder.decode(payload)
    except ImportError:
        _unpack = None

DAEMON_MEDIA = ("GPU", "CPU_PINNED", "DISK", "REMOTE")
_END = -1  # the replay socket's end-of-answer sequence number
ANSWER_TIMEOUT_S = 2.0  # a replay or snapshot not answered by then is asked again or given up
MAX_HELD_BATCHES = 4096  # live batches held back while one is asked, at most
REFUSED_RETRY_S = 5.0  # a subscription kvtierd refused connects again after this
QUIET_CHECK_S = 1.0  # a stream quiet this long is checked against the replay socket
_SNAPSHOT = object()  # what _ask asks for: the contents (else a sequence number to replay from)
_SNAPSHOT_REQUEST = b"\x81\xa4type\xa8snapshot"  # msgpack {"type": "snapshot"}
_FIELDS_STORED = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium")


def available():
    """Whether this Python can subscribe (pyzmq and a msgpack decoder)."""
    return zmq is not None and _unpack is not None


def default_media(host_medium="CPU"):
    return {"GPU": "KVTIER_HBM", "CPU_PINNED": str(host_medium), "DISK": "DISK", "REMOTE": "REMOTE"}


class BlockNames:
    """What vLLM calls one kvtier block: the hashes of the engine blocks it
    covers, in order, and what a BlockStored of them carries."""

    __slots__ = ("hashes", "parent", "token_ids", "block_size", "lora_id", "lora_name")

    def __init__(self, hashes, parent, token_ids, block_size, lora_id, lora_name=None):
        self.hashes, self.parent, self.token_ids = list(hashes), parent, list(token_ids)
        self.block_size, self.lora_id, self.lora_name = block_size, lora_id, lora_name


class _Asking:
    """A request to the replay socket in flight, and the live batches that
    wait for its answer."""

    def __init__(self, what):
        self.what, self.since, self.held = what, time.monotonic(), []
        self.contents = {}  # a snapshot's: 16-byte key -> daemon media
        self.unnamed = 0  # of them, blocks the connector has not named
        self.through = -1  # a snapshot's S: the last sequence number it includes


class _Tracked:
    __slots__ = ("names", "held")

    def __init__(self):
        self.names = None  # BlockNames once the connector named the block
        self.held = set()  # daemon media holding it


def _event_fields(event):
    """(type, fields dict) of one decoded event in the map or array form."""
    if isinstance(event, dict):
        return event.get("type"), event
    if isinstance(event, (list, tuple)) and event:
        kind = event[0]
        if kind == "BlockStored":
            values = dict(zip(_FIELDS_STORED, event[1:7]))
            values["kvtier_namespace"] = event[-1] if len(event) > 7 else None
            return kind, values
        if kind == "BlockRemoved":
            return kind, {"block_hashes": event[1] if len(event) > 1 else [],
                          "medium": event[2] if len(event) > 2 else None,
                          "kvtier_namespace": event[-1] if len(event) > 3 else None}
        return kind, {}
    return None, {}


def _batch_events(batch):
    if isinstance(batch, dict):
        return batch.get("events") or []
    if isinstance(batch, (list, tuple)) and len(batch) > 1:
        return batch[1] or []
    return []


class TierEventForwarder:
    """Subscribes to kvtierd's events and turns them into vLLM events.

    `make_stored(**fields)` / `make_removed(**fields)` build vLLM's event
    objects (_vllm_events.py). `namespaces`: 16-byte fingerprints."""

    def __init__(self, endpoints, namespaces, media, make_stored, make_removed, capacity=1 << 18,
                 max_batches=256):
        publish, replay = endpoints
        self._namespaces = set(namespaces)
        self._media = dict(media)
        self._stored, self._removed = make_stored, make_removed
        self._capacity = max(1, int(capacity))
        self._max_batches = max(1, int(max_batches))
        # 16-byte key -> _Tracked, least recently touched first: the blocks
        # the connector named, and those it has not (yet), each capped.
        self._named = collections.OrderedDict()
        self._pending = collections.OrderedDict()
        self._out = []
        self._last = None  # the last sequence number applied
        self._asking = None  # an _Asking while the replay socket is asked
        self._quiet_since = time.monotonic()  # when a live batch last came
        self._just_adopted = False  # a snapshot applied, no batch after it yet
        self.gaps = 0
        self.forgotten = 0
        self._warned_gap = False
        self._ctx = zmq.Context.instance()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"")
        self._refusals = None  # the SUB socket's monitor: kvtierd refusing it (events.max_subscribers)
        refused = getattr(zmq, "EVENT_HANDSHAKE_FAILED_AUTH", 0)
        if refused:
            self._refusals = self._sub.get_monitor_socket(refused)
        self._sub.connect(publish)
        self._publish = publish
        self._retry_at = None  # when a refused subscription connects again
        self.refused = 0
        self._replay_endpoint = replay
        self._dealer = None

    def close(self):
        if self._refusals is not None:
            self._sub.disable_monitor()
            self._refusals.close(linger=0)
        for s in (self._sub, self._dealer):
            if s is not None:
                s.close(linger=0)
        self._sub = self._dealer = self._refusals = None

    def _mind_refusals(self):
        """kvtierd refuses subscribers past events.max_subscribers, and
        ZeroMQ does not reconnect a refused one: connect again every
        REFUSED_RETRY_S, then take the contents afresh (what was missed)."""
        if self._refusals is not None:
            while self._refusals.poll(0):
                self._refusals.recv_multipart()
                self.refused += 1
                if self._retry_at is None:
                    logger.warning("kvtier: kvtierd refused this KV-event subscriber (events.max_subscribers "
                                   "reached); trying again every %.0f s", REFUSED_RETRY_S)
                self._retry_at = time.monotonic() + REFUSED_RETRY_S
        if self._retry_at is not None and time.monotonic() >= self._retry_at:
            self._retry_at = None
            self._sub.disconnect(self._publish)
            self._sub.connect(self._publish)
            self.resync()

    def add_namespace(self, fingerprint):
        self._namespaces.add(bytes(fingerprint))

    @property
    def tracked(self):
        """(named, not yet named) blocks tracked now."""
        return len(self._named), len(self._pending)

    # -- naming -----------------------------------------------------------

    def name(self, key, names):
        """The connector knows kvtier block `key` (16 bytes) as `names`
        (BlockNames); what the daemon already holds of it is reported."""
        key = bytes(key)
        if key in self._named:
            self._named.move_to_end(key)
            return
        t = self._pending.pop(key, None) or _Tracked()
        t.names = names
        self._named[key] = t
        if len(self._named) > self._capacity:
            self._named.popitem(last=False)
            self.forgotten += 1
        for medium in sorted(t.held):
            self._emit_stored([t], medium)

    # -- the stream -------------------------------------------------------

    def resync(self):
        """Takes the daemon's contents afresh (the connector saw its client
        reconnect: another run of kvtierd, whose first events may have gone
        before this subscriber reconnected)."""
        if self._sub is not None and (self._asking is None or self._asking.what is not _SNAPSHOT):
            held = self._asking.held if self._asking is not None else []
            self._ask(_SNAPSHOT)
            self._asking.held = held

    def poll(self):
        """Reads what has arrived (non-blocking) and returns the vLLM events
        it makes, oldest first."""
        if self._sub is None:
            return []
        self._mind_refusals()
        if self._last is None and self._asking is None:
            self._ask(_SNAPSHOT)  # a late joiner: the contents first, then the stream after them
        now = time.monotonic()
        for _ in range(self._max_batches):
            try:
                frames = self._sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(frames) == 3 and len(frames[1]) == 8:
                self._quiet_since = now
                self._live(int.from_bytes(frames[1], "big", signed=True), frames[2])
        if self._asking is None and self._last is not None and now - self._quiet_since > QUIET_CHECK_S:
            # Batches lost with nothing after them show no gap (the SUB socket
            # still reconnecting to a new run, the last ones past its queue):
            # a quiet stream asks the replay socket for anything after the last.
            self._quiet_since = now
            self._ask(self._last + 1)
        self._read_answer()
        out, self._out = self._out, []
        return out

    def _live(self, seq, payload):
        if self._asking is not None:
            self._asking.held.append((seq, payload))
        elif seq <= self._last and self._just_adopted:
            pass  # published before the snapshot was taken, delivered after it: in it already
        elif seq <= self._last:
            logger.info("kvtier: kvtierd's KV events restarted (sequence %d after %d): taking its contents",
                        seq, self._last)
            self._ask(_SNAPSHOT)
            self._asking.held.append((seq, payload))
        elif seq > self._last + 1:
            self._ask(self._last + 1)  # a gap: ask the replay socket for it
            self._asking.held.append((seq, payload))
        else:
            self._apply(seq, payload)

    def _ask(self, what):
        """Asks the replay socket for a snapshot or a replay from a sequence
        number; live batches wait until it is answered."""
        if self._dealer is None:
            self._dealer = self._ctx.socket(zmq.DEALER)
            self._dealer.setsockopt(zmq.LINGER, 0)
            self._dealer.connect(self._replay_endpoint)
        body = _SNAPSHOT_REQUEST if what is _SNAPSHOT else what.to_bytes(8, "big", signed=True)
        try:
            self._dealer.send_multipart([b"", body], zmq.NOBLOCK)
        except zmq.Again:
            pass  # not connected yet: the timeout below asks again
        self._asking = _Asking(what)

    def _read_answer(self):
        a = self._asking
        for _ in range(self._max_batches if a is not None else 0):  # a big snapshot over several polls
            if self._asking is not a:
                break
            try:
                frames = self._dealer.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(frames) != 3 or len(frames[1]) != 8:
                continue
            seq = int.from_bytes(frames[1], "big", signed=True)
            if seq == _END:
                self._answered()
            elif a.what is _SNAPSHOT:
                a.through = seq
                self._snapshot_part(frames[2])
            elif seq > self._last:
                self._apply(seq, frames[2])
        a = self._asking
        if a is not None and (time.monotonic() - a.since > ANSWER_TIMEOUT_S or len(a.held) > MAX_HELD_BATCHES):
            self._dealer.close(linger=0)  # a late answer must not be read as the next one's
            self._dealer = None
            if a.what is _SNAPSHOT:
                self._ask(_SNAPSHOT)  # the daemon may be starting: ask again, keeping what is held
                self._asking.held = a.held[-MAX_HELD_BATCHES:]
            else:
                self._answered()

    def _answered(self):
        """The answer is in: a snapshot replaces what was known; then the
        live batches held meanwhile. A gap neither covers (a replay that no
        longer had them) is filled from a snapshot."""
        a, self._asking = self._asking, None
        if a.what is _SNAPSHOT:
            self._adopt(a.contents)
            self._last, self._just_adopted = a.through, True
        held = [(seq, payload) for seq, payload in a.held if seq > self._last]
        for i, (seq, payload) in enumerate(held):
            if seq > self._last + 1:
                self._gap(self._last + 1, seq)
                if a.what is not _SNAPSHOT:
                    self._ask(_SNAPSHOT)
                    self._asking.held = held[i:]
                    return
            self._apply(seq, payload)

    def _gap(self, first, end):
        self.gaps += 1
        if not self._warned_gap:
            self._warned_gap = True
            logger.warning("kvtier: kvtierd's KV events %d..%d were lost and its replay buffer no longer has "
                           "them: taking its contents afresh (warned once)", first, end - 1)

    def _snapshot_part(self, payload):
        """Collects a snapshot's contents: every named block's media, and
        those of at most `capacity` others (a daemon of millions of blocks
        must not make the scheduler hold them all)."""
        a = self._asking
        for kind, fields in self._events_of(payload):
            if kind != "BlockStored":
                continue
            for key in fields["keys"]:
                held = a.contents.get(key)
                if held is None:
                    if key not in self._named:
                        if a.unnamed >= self._capacity:
                            continue
                        a.unnamed += 1
                    held = a.contents[key] = set()
                held.add(fields["medium"])

    def _adopt(self, contents):
        """What the daemon holds now (a snapshot) replaces what was known:
        the differences become events."""
        removed = collections.defaultdict(list)
        added = collections.defaultdict(list)
        for key, t in self._named.items():
            now = contents.pop(key, set())
            for medium in t.held - now:
                removed[medium].extend(t.names.hashes)
            for medium in now - t.held:
                added[medium].append(t)
            t.held = now
        self._pending = collections.OrderedDict()  # what the daemon holds unnamed: kept for a naming to come
        for key, media in itertools.islice(contents.items(), self._capacity):
            self._pending[key] = _Tracked()
            self._pending[key].held = media
        for medium in DAEMON_MEDIA:
            if removed.get(medium):
                self._out.append(self._removed(block_hashes=removed[medium], medium=self._media[medium]))
            self._emit_stored(added.get(medium, []), medium)

    def _apply(self, seq, payload):
        self._last, self._just_adopted = seq, False
        for kind, fields in self._events_of(payload):
            if kind == "AllBlocksCleared":
                self._cleared()
            elif kind == "BlockStored":
                self._on_stored(fields["keys"], fields["medium"])
            else:
                self._on_removed(fields["keys"], fields["medium"])

    def _events_of(self, payload):
        """(kind, {"keys", "medium"}) of a batch's events that concern these
        namespaces; a batch kvtier cannot read yields nothing."""
        try:
            batch = _unpack(payload)
        except Exception:  # noqa: BLE001 - never raised into vLLM
            return
        for event in _batch_events(batch):
            kind, fields = _event_fields(event)
            if kind == "AllBlocksCleared":
                yield kind, {}
                continue
            if kind not in ("BlockStored", "BlockRemoved"):
                continue
            ns, medium = fields.get("kvtier_namespace"), fields.get("medium")
            if not isinstance(ns, (bytes, bytearray)) or bytes(ns) not in self._namespaces or medium not in self._media:
                continue
            keys = [bytes(k) for k in fields.get("block_hashes") or () if isinstance(k, (bytes, bytearray))]
            yield kind, {"keys": keys, "medium": medium}

    def _on_stored(self, keys, medium):
        named = []
        for key in keys:
            t = self._touch(key)
            if medium in t.held:
                continue
            t.held.add(medium)
            if t.names is not None:
                named.append(t)
        self._emit_stored(named, medium)

    def _on_removed(self, keys, medium):
        hashes = []
        for key in keys:
            t = self._named.get(key) or self._pending.get(key)
            if t is None or medium not in t.held:
                continue
            t.held.discard(medium)
            if t.names is not None:
                hashes.extend(t.names.hashes)
            elif not t.held:
                del self._pending[key]
        if hashes:
            self._out.append(self._removed(block_hashes=hashes, medium=self._media[medium]))

    def _cleared(self):
        by_medium = collections.defaultdict(list)
        for t in self._named.values():
            for medium in t.held:
                by_medium[medium].extend(t.names.hashes)
            t.held.clear()
        for medium in DAEMON_MEDIA:
            if by_medium.get(medium):
                self._out.append(self._removed(block_hashes=by_medium[medium], medium=self._media[medium]))
        self._pending.clear()

    def _emit_stored(self, tracked, medium):
        """One BlockStored per run of blocks that chain (each one's parent is
        the previous one's last engine hash), as vLLM's own events group."""
        run = []
        for t in tracked:
            if run and not (run[-1].names.hashes and t.names.parent == run[-1].names.hashes[-1]):
                self._stored_run(run, medium)
                run = []
            run.append(t)
        if run:
            self._stored_run(run, medium)

    def _stored_run(self, run, medium):
        first = run[0].names
        hashes, tokens = [], []
        for t in run:
            hashes.extend(t.names.hashes)
            tokens.extend(t.names.token_ids)
        self._out.append(self._stored(block_hashes=hashes, parent_block_hash=first.parent, token_ids=tokens,
                                      block_size=first.block_size, lora_id=first.lora_id,
                                      medium=self._media[medium], lora_name=first.lora_name))

    def _touch(self, key):
        """The tracked block `key`, made recently touched; a new one is not
        named yet."""
        for tracked in (self._named, self._pending):
            t = tracked.get(key)
            if t is not None:
                tracked.move_to_end(key)
                return t
        t = self._pending[key] = _Tracked()
        if len(self._pending) > self._capacity:
            self._pending.popitem(last=False)
        return t
