"""The scheduler side of the kvtier vLLM connector: keys, asynchronous
lookups, the per-step plan for the workers, queue hints, events.

Nothing here waits on kvtierd beyond a small bound: a lookup is answered
None ("ask again") while it is in flight and counts as a miss after
`lookup_timeout`; queue hints go out from a background thread in batches
(fire and forget, for every rank's namespace); a daemon that is down is
retried every `reconnect_interval` seconds. Thread: vLLM's scheduler
thread calls every method; the hint thread only sends.
"""

import collections
import hashlib
import itertools
import logging
import threading
import time

import kvtier
from kvtier.integrations._vllm_events import AllBlocksCleared, BlockStored
from kvtier.integrations._vllm_plan import (KvtierConnectorMetadata, RequestState, plan_load, plan_save,
                                            plan_state_saves, step_offers)

logger = logging.getLogger("kvtier.vllm")

# Hints waiting for the sender thread; beyond this the oldest are dropped
# (counted): a hint is advice, and the scheduler must never wait for it.
MAX_PENDING_HINTS = 4096


def opt_out(request):
    """(load, save) a request allows: vLLM's skip_reading_prefix_cache stops
    loads; kv_transfer_params {"kvtier": false} stops both and
    {"kvtier": {"load": false, "save": false}} either."""
    params = getattr(request, "kv_transfer_params", None) or {}
    choice = params.get("kvtier", True) if isinstance(params, dict) else True
    if isinstance(choice, dict):
        load, save = bool(choice.get("load", True)), bool(choice.get("save", True))
    else:
        load = save = bool(choice)
    if getattr(request, "skip_reading_prefix_cache", False):
        load = False
    return load, save


class _Scope:
    """The base model's or one adapter's namespaces (one per rank), hashers
    and client (None while kvtierd cannot be reached)."""

    def __init__(self, namespaces, hashers):
        self.namespaces, self.hashers, self.client = namespaces, hashers, None
        self.next_connect = 0.0


class HintSender:
    """Sends queue hints (enqueue / started / finished) from its own thread,
    oldest first, a batch per wake-up; never blocks the caller. Thread-safe."""

    def __init__(self):
        self._pending = collections.deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._stop = False
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="kvtier-hints", daemon=True)
        self._thread.start()

    def submit(self, client, call):
        with self._lock:
            if len(self._pending) >= MAX_PENDING_HINTS:
                self._pending.popleft()
                self.dropped += 1
            self._pending.append((client, call))
            self._idle.clear()
        self._wake.set()

    def flush(self, timeout=10.0):
        """Waits until every submitted hint was sent (tests and shutdown)."""
        return self._idle.wait(timeout)

    def close(self):
        self.flush(2.0)
        self._stop = True
        self._wake.set()
        self._thread.join(2.0)

    def _run(self):
        while not self._stop:
            self._wake.wait()
            self._wake.clear()
            while True:
                with self._lock:
                    if not self._pending:
                        self._idle.set()
                        break
                    client, call = self._pending.popleft()
                try:
                    call(client)
                except kvtier.NotFoundError:
                    pass  # the request was no longer queued
                except Exception as e:  # noqa: BLE001 - a hint never fails the engine
                    logger.debug("kvtier: queue hint failed: %s", e)


class SchedulerSide:
    """What the connector does in vLLM's scheduler process."""

    def __init__(self, geometry, connect, stats):
        self._g = geometry
        self._connect = connect
        self._stats = stats
        self._scopes = {}  # adapter (None for the base model) -> _Scope
        self._requests = {}
        self._hint_ids = itertools.count(1)
        self._hints = HintSender()
        self._events = []
        self._medium = "CPU"
        self._step = 0  # build_connector_meta calls so far
        self._steps_ahead = geometry.steps_ahead
        self._unreported = {}  # req_id -> RequestState (live or finished) with saves not yet in events
        self._scope(None)

    @property
    def base_scope(self):
        return self._scopes[None]

    def set_event_medium(self, medium):
        self._medium = str(medium)

    def _scope(self, adapter):
        """The namespaces, hashers and client of the base model (None) or of
        one LoRA adapter: namespaces are registered at connect, so each
        adapter gets its own connection on first use."""
        scope = self._scopes.get(adapter)
        if scope is None:
            namespaces = [ns for t, p in self._g.ranks() for ns in self._g.rank_namespaces(t, p, adapter)]
            scope = _Scope(namespaces, [kvtier.ChainHasher(ns) for ns in namespaces])
            self._scopes[adapter] = scope
        if scope.client is None and time.monotonic() >= scope.next_connect:
            scope.client = self._connect(scope.namespaces, retry=scope.next_connect > 0)
            scope.next_connect = time.monotonic() + self._g.reconnect_s
        return scope

    def _state(self, request):
        state = self._requests.get(request.request_id)
        if state is not None and len(request.prompt_token_ids or ()) != len(state.tokens):
            self._prompt_changed(state, request)
        if state is None:
            tokens = list(request.prompt_token_ids or [])
            adapter = _adapter_of(request)
            scope = self._scope(adapter)
            salt, extras = key_extras(request, len(tokens), self._g.block_tokens)
            load, save = opt_out(request)
            state = RequestState(request.request_id, next(self._hint_ids), tokens,
                                 [h.keys(tokens, cache_salt=salt, extras=extras) for h in scope.hashers],
                                 adapter=adapter, may_load=load, may_save=save,
                                 engine_hashes=getattr(request, "block_hashes", None),
                                 lora_id=getattr(getattr(request, "lora_request", None), "lora_int_id", None),
                                 request=request)
            self._requests[request.request_id] = state
            self._hint_all(state, lambda c, i, keys: c.enqueue(_hint_id(state, i), i, keys))
        return state

    def _prompt_changed(self, state, request):
        """vLLM's streaming input (resumable sessions) reuses a request for
        the next input chunk with a longer prompt: key the new prompt, keep
        what was saved while the old prompt is its prefix, look up again."""
        tokens = list(request.prompt_token_ids or [])
        scope = self._scope(state.adapter)
        salt, extras = key_extras(request, len(tokens), self._g.block_tokens)
        keys = [h.keys(tokens, cache_salt=salt, extras=extras) for h in scope.hashers]
        kept = 0
        while kept < min(state.saved, len(keys[0])) and all(k[kept] == old[kept] for k, old in zip(keys, state.keys)):
            kept += 1
        state.tokens, state.keys, state.saved = tokens, keys, kept
        state.hits, state.pending, state.load = None, None, None
        state.engine_hashes = getattr(request, "block_hashes", None)

    def _hint_all(self, state, call):
        """One hint per rank's KV namespace (recurrent states, stored at a
        few boundaries only, are not hinted), sent in the background."""
        scope = self._scope(state.adapter)
        if scope.client is None or not state.keys[0]:
            return
        for i, keys in enumerate(state.keys):
            if self._kind(i) == "state":
                continue
            self._hints.submit(scope.client, lambda c, i=i, keys=keys: call(c, i, keys))

    def flush_hints(self, timeout=10.0):
        return self._hints.flush(timeout)

    def on_new_request(self, request):
        self._state(request)

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        g = self._g
        state = self._state(request)
        usable = (len(state.tokens) - 1) // g.block_tokens  # leave a token to compute
        client = self._scope(state.adapter).client
        if client is None or not state.may_load or usable * g.block_tokens <= num_computed_tokens:
            return 0, False
        if state.hits is None:
            state.hits = self._lookup(state, client, usable)
            if state.hits is None:
                return None, False  # ask again next step
        matched = min(state.hits, usable) * g.block_tokens
        return max(0, matched - num_computed_tokens), False

    def _lookup(self, state, client, usable):
        """The kvtier blocks every rank and group holds, or None while an
        answer is out. Phase 1 asks each full-attention namespace for its
        prefix from block 0 (up to `usable`), giving a candidate n. Phase 2
        asks each sliding-window namespace for the blocks its window reads
        at n, and each recurrent-state namespace for the state after every
        block up to n (one key each). The hit is the largest m <= n whose
        state is stored in every state group and whose windows were seen
        stored; when the states end below the checked windows, phase 3 asks
        the windows at that m. An answer later than lookup_timeout counts as
        a miss."""
        g = self._g
        if state.pending is None:
            state.phase, state.candidate = 1, usable
            full = [j for j in range(len(state.keys)) if self._kind(j) == "full"]
            self._send(state, client, {j: (0, usable) for j in full})  # none: every block is a candidate
            self._stats.add("lookups", 1)
        answers = self._answers(state)
        if answers is None:
            return None
        if answers is False:
            return 0
        asked = state.asked
        state.pending = None
        if state.phase == 1:
            n = min([state.candidate] + [asked[j][0] + a for j, a in answers.items()])
            windows = [j for j in range(len(state.keys)) if self._kind(j) == "window"]
            states = [j for j in range(len(state.keys)) if self._kind(j) == "state"]
            if n == 0 or not (windows or states):
                return n
            state.phase, state.candidate = 2, n
            requests = {j: (g.first_read(j % len(g.groups), n), n) for j in windows}
            requests.update({(j, m): (m - 1, m) for j in states for m in range(1, n + 1)})
            self._send(state, client, requests)
            return self._lookup(state, client, usable)
        windows = {j: (asked[j][0], asked[j][0] + a) for j, a in answers.items() if not isinstance(j, tuple)}
        if state.phase == 2:
            states = {j for j in answers if isinstance(j, tuple)}
            namespaces = {j for j, _ in states}
            stored = [m for m in range(state.candidate, 0, -1)
                      if all(answers.get((j, m), 0) == 1 for j in namespaces)]
            for m in stored:
                if self._windows_hold(windows, m):
                    return m
            if not stored or not windows or stored[0] == state.candidate:
                return 0  # conservative: no point below a failed window was checked
            # The states end below the checked windows: ask the windows there.
            m = stored[0]
            state.phase, state.candidate = 3, m
            self._send(state, client, {j: (g.first_read(j % len(g.groups), m), m) for j in windows})
            return self._lookup(state, client, usable)
        return state.candidate if self._windows_hold(windows, state.candidate) else 0

    def _kind(self, j):
        """"full", "window" or "state": the kind of namespace j's group."""
        group = self._g.groups[j % len(self._g.groups)]
        return "state" if group.state else ("window" if group.window_tokens else "full")

    def _windows_hold(self, windows, m):
        """Whether every window group's stored run [first, end) covers what
        its window reads at m."""
        g = self._g
        return all(first <= g.first_read(j % len(g.groups), m) and m <= end for j, (first, end) in windows.items())

    def _answers(self, state):
        """{request: prefix blocks} once every lookup in flight answered,
        False when one failed or they took longer than lookup_timeout (a
        miss), None while they are out."""
        if not all(p.done() for p in state.pending.values()):
            if time.monotonic() - state.pending_since < self._g.lookup_timeout:
                return None
            logger.warning("kvtier: a lookup took over %.1f s; counted as a miss", self._g.lookup_timeout)
            state.pending = None
            return False
        try:
            return {j: p.result().prefix_blocks for j, p in state.pending.items()}
        except kvtier.Error as e:
            logger.warning("kvtier: lookup failed: %s", e)
            state.pending = None
            return False

    def _send(self, state, client, requests):
        """Asynchronous lookups: request r -> (first, end) asks namespace j
        (r itself, or r[0] for a state lookup (j, boundary)) for
        keys[j][first:end]."""
        state.asked = dict(requests)
        state.pending = {}
        for r, (first, end) in requests.items():
            j = r[0] if isinstance(r, tuple) else r
            state.pending[r] = client.lookup_async(j, state.keys[j][first:end])
        state.pending_since = time.monotonic()

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        state = self._requests.get(request.request_id)
        if state is None or not num_external_tokens or state.hits is None:
            return
        g = self._g
        end = min(state.hits, (len(state.tokens) - 1) // g.block_tokens)
        local = end * g.block_tokens - num_external_tokens
        state.block_ids = [list(ids) for ids in blocks.get_block_ids()]
        state.load = (local // g.block_tokens, end, (local % g.block_tokens) // g.engine_block)
        state.saved = max(state.saved, end)
        # The answer is used: should vLLM ask again (the load failed and it
        # recomputes, a preemption), look up afresh rather than promise
        # blocks that may be gone.
        state.hits = None
        self._stats.add("hit_tokens", num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        self._flush_events()
        self._step += 1
        meta = KvtierConnectorMetadata(layer_counts=[ns.layer_count for ns in self.base_scope.namespaces])
        scheduled = scheduler_output.num_scheduled_tokens
        for req in scheduler_output.scheduled_new_reqs:
            state = self._requests.get(req.req_id)
            if state is None:
                continue  # never looked up (no prompt ids)
            if state.request is not None:
                # A streaming-input session resumed with its next chunk is
                # scheduled as new, holding its blocks, without a lookup:
                # _state keys its grown prompt.
                state = self._state(state.request)
            state.block_ids = [list(ids) for ids in req.block_ids]
            self._plan(state, req.num_computed_tokens + scheduled.get(req.req_id, 0), meta)
        cached = scheduler_output.scheduled_cached_reqs
        resumed = getattr(cached, "resumed_req_ids", set()) or set()
        for i, req_id in enumerate(cached.req_ids):
            state = self._requests.get(req_id)
            if state is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in resumed:
                state.block_ids = [list(ids) for ids in new_ids] if new_ids else []
            elif new_ids:
                for table, ids in zip(state.block_ids, new_ids):
                    table.extend(ids)
            self._plan(state, cached.num_computed_tokens[i] + scheduled.get(req_id, 0), meta)
        for req_id in getattr(scheduler_output, "preempted_req_ids", None) or ():
            state = self._requests.get(req_id)
            # Preempted and resumed within this step: the table above is the
            # new one. Otherwise its blocks are gone and it is looked up
            # again on resume.
            if state is not None and req_id not in scheduled:
                state.hits, state.pending, state.load, state.block_ids = None, None, None, []
        for req_id, offers in step_offers(scheduler_output).items():
            state = self._requests.get(req_id)
            if state is not None and state.may_save:
                meta.state_saves.extend(plan_state_saves(state, offers, self._g))
        return meta

    def _plan(self, state, computed_tokens, meta):
        g = self._g
        if not state.started:
            state.started = True
            self._hint_all(state, lambda c, i, keys: c.started(_hint_id(state, i)))
        load = plan_load(state, g)
        if load is not None:
            meta.loads.append(load)
        if not state.may_save:
            return
        save = plan_save(state, computed_tokens, g)
        if save is not None:
            meta.saves.append(save)
            state.stored_pending.append((save.first, state.saved, self._step))
            self._unreported[state.req_id] = state

    def promised_loads(self, scheduler_output):
        """The loads vLLM was already promised for this step's requests
        (their external tokens count as computed): what a disabled
        connector still sends, so the workers load or report them."""
        loads = []
        ids = [r.req_id for r in scheduler_output.scheduled_new_reqs]
        ids += list(scheduler_output.scheduled_cached_reqs.req_ids)
        for req_id in ids:
            state = self._requests.get(req_id)
            if state is not None and state.load is not None:
                load = plan_load(state, self._g)
                if load is not None:
                    loads.append(load)
        return loads

    def forget(self, request):
        """request_finished of a disabled connector."""
        self._requests.pop(request.request_id, None)
        self._unreported.pop(request.request_id, None)
        return False, None

    def _executed_through(self):
        """The last step whose saves have surely run: vLLM processes a
        step's output with up to `steps_ahead` later steps already
        scheduled (async scheduling, pipeline stages)."""
        return self._step - self._steps_ahead

    def _flush_events(self):
        """BlockStored for every save that has run, of live requests and of
        finished ones whose last saves were still in flight."""
        done = self._executed_through()
        for state in self._unreported.values():
            self._emit_stored(state, through_step=done)
        self._unreported = {r: st for r, st in self._unreported.items() if st.stored_pending}

    def update_connector_output(self, connector_output):
        """After a step ran: the saves that have run are in the arena
        (committing), so they become BlockStored events."""
        self._flush_events()

    def request_finished(self, request, block_ids):
        """block_ids: group 0's, or one list per group (SupportsHMA).
        Never delays the free: every copy out of a request's engine blocks
        ends in the step that reads them (wait_for_save waits for it)."""
        state = self._requests.pop(request.request_id, None)
        if state is None:
            return False, None
        if not state.started:
            self._hint_all(state, lambda c, i, keys: c.finished(_hint_id(state, i)))
        self._emit_stored(state, through_step=self._executed_through())
        if not state.stored_pending:  # else a save of a step still in flight: its event waits for it
            self._unreported.pop(request.request_id, None)
        return False, None

    def _emit_stored(self, state, through_step):
        """BlockStored per engine block of the kvtier blocks whose saves ran
        (planned in steps up to `through_step`), with vLLM's own block
        hashes (what vLLM's KV-aware routers index) when the request has
        them."""
        hashes = state.engine_hashes or []
        b = self._g.engine_block
        left = []
        for first, end, step in state.stored_pending:
            if step > through_step:
                left.append((first, end, step))
                continue
            lo, hi = first * self._g.per_block, end * self._g.per_block
            if len(hashes) < hi:
                continue
            self._events.append(BlockStored(
                block_hashes=list(hashes[lo:hi]), parent_block_hash=hashes[lo - 1] if lo > 0 else None,
                token_ids=list(state.tokens[lo * b:hi * b]), block_size=b, lora_id=state.lora_id,
                medium=self._medium))
        state.stored_pending = left

    def take_events(self):
        events, self._events = self._events, []
        return events

    def reset_cache(self):
        """Drops every namespace this connector uses (all ranks, base model
        and adapters) from kvtierd: nothing stored before is served again.
        True when every drop succeeded."""
        ok = True
        for scope in self._scopes.values():
            if scope.client is None:
                ok = False
                continue
            try:
                scope.client.drop_namespaces(list(range(len(scope.namespaces))))
            except kvtier.Error as e:
                logger.warning("kvtier: reset_cache failed: %s", e)
                ok = False
        for state in self._requests.values():
            state.hits, state.pending, state.saved = None, None, 0
        self._events.append(AllBlocksCleared())
        return ok

    def close(self):
        self._hints.close()
        for scope in self._scopes.values():
            if scope.client is not None:
                scope.client.close()
                scope.client = None


def _hint_id(state, rank_index):
    """The queue-hint request id of one rank's namespace of a request."""
    return state.hint_id * len(state.keys) + rank_index


def key_extras(request, num_tokens, block_tokens):
    """The request's cache salt and per-block extra keys (docs/KEYS.md), as
    vLLM's own block hashes take them: the salt on block 0; each multimodal
    input's identifier, with its offset within the block, on every block it
    overlaps; a digest of the prompt embeddings of each block."""
    import torch
    salt = getattr(request, "cache_salt", None) or None
    blocks = num_tokens // block_tokens
    extras = [[] for _ in range(blocks)]
    for feature in getattr(request, "mm_features", None) or []:
        start, length = feature.mm_position.offset, feature.mm_position.length
        for b in range(start // block_tokens, min(blocks, -(-(start + length) // block_tokens))):
            extras[b].append((kvtier.ExtraKind.MULTIMODAL, f"{feature.identifier}@{start - b * block_tokens}"))
    embeds = getattr(request, "prompt_embeds", None)
    if embeds is not None:
        for b in range(blocks):
            rows = embeds[b * block_tokens:(b + 1) * block_tokens].detach().cpu().contiguous()
            digest = hashlib.sha256(rows.view(-1).view(torch.uint8).numpy().tobytes()).digest()
            extras[b].append((kvtier.ExtraKind.PROMPT_EMBEDS, digest))
    return salt, (extras if any(extras) else None)


def _adapter_of(request):
    """A LoRA request's (name, path): its place in the namespace (adapter_id,
    adapter_revision). Give each version of an adapter its own name or path."""
    lora = getattr(request, "lora_request", None)
    if lora is None:
        return None
    return (str(lora.lora_name), str(getattr(lora, "lora_path", "") or f"id-{lora.lora_int_id}"))
