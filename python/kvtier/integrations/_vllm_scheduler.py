"""The scheduler side of the kvtier vLLM connector: keys, asynchronous
lookups, the per-step plan for the workers, queue hints, events.

Nothing here waits on kvtierd beyond a small bound: a lookup is answered
None ("ask again") while it is in flight and counts as a miss after
`lookup_timeout` (_vllm_lookup.py); queue hints go out from a background
thread in batches (_vllm_hints.py: fire and forget, for every rank's
namespace); a daemon that is down is retried every `reconnect_interval`
seconds. Keys come from the token ids and what _vllm_keys.py adds. Thread:
vLLM's scheduler thread calls every method; the hint thread only sends.
"""

import itertools
import logging
import time

import kvtier
from kvtier.integrations import _vllm_handoff as handoff
from kvtier.integrations import _vllm_tier_events as tier_events
from kvtier.integrations._vllm_events import AllBlocksCleared, BlockRemoved, BlockStored
from kvtier.integrations._vllm_hints import HintSender, hint_id
from kvtier.integrations._vllm_keys import adapter_of, key_extras, opt_out
from kvtier.integrations._vllm_lookup import PrefixLookup
from kvtier.integrations._vllm_plan import (GroupSpan, KvtierConnectorMetadata, LoadSpec, RequestState, plan_load,
                                            plan_save, plan_state_saves, step_offers)

logger = logging.getLogger("kvtier.vllm")


def _known_tokens(state, request):
    """Tokens of `request` whose kvtier keys are known: the prompt, and what
    save_decode keyed of its output (at most what the request holds now)."""
    total = getattr(request, "num_tokens", None)
    known = len(state.context())
    return known if total is None else min(known, total)


class _Scope:
    """The base model's or one adapter's namespaces (one per rank), hashers
    and client (None while kvtierd cannot be reached)."""

    def __init__(self, namespaces, hashers):
        self.namespaces, self.hashers, self.client = namespaces, hashers, None
        self.next_connect = 0.0


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
        self._lookups = PrefixLookup(geometry, stats)
        self._events = []
        self._medium = "CPU"
        self._forward_tiers = False  # configure_events
        self._media = tier_events.default_media()
        self._forwarder = None  # a TierEventForwarder once kvtierd's events are subscribed
        self._reconnects_seen = 0
        self._step = 0  # build_connector_meta calls so far
        self._steps_ahead = geometry.steps_ahead
        self._unreported = {}  # req_id -> RequestState (live or finished) with saves not yet in events
        self._async_loads = []  # LoadSpec of hand-off loads vLLM holds in WAITING_FOR_REMOTE_KVS, for the next plan
        self._sends = []        # req ids whose free vLLM delays until the workers report their saves committed
        # Async loads need every group moved by the copy threads: recurrent states load on the forward thread.
        self._async_ok = not any(group.state for group in geometry.groups)
        self._scope(None)

    @property
    def base_scope(self):
        return self._scopes[None]

    def configure_events(self, medium="CPU", forward_tiers=True, media=None):
        """`medium`: of the events this connector makes itself (and of
        kvtierd's host tier when forwarded). `forward_tiers`: forward
        kvtierd's own events, one medium per kvtier tier
        (_vllm_tier_events.py), when kvtierd publishes them and pyzmq
        and a msgpack decoder are there; `media` overrides the medium
        names, keyed by kvtierd's (GPU, CPU_PINNED, DISK, REMOTE)."""
        self._medium = str(medium)
        self._forward_tiers = bool(forward_tiers)
        self._media = tier_events.default_media(self._medium)
        unknown = set(media or {}) - set(tier_events.DAEMON_MEDIA)
        if unknown:
            logger.warning("kvtier: event_media keys %s are not kvtierd media %s; ignored", sorted(unknown),
                           list(tier_events.DAEMON_MEDIA))
        self._media.update({k: str(v) for k, v in (media or {}).items() if k in tier_events.DAEMON_MEDIA})
        for scope in self._scopes.values():
            self._follow_events(scope)

    def _follow_events(self, scope):
        """Subscribes to kvtierd's events once a scope is connected, and
        counts the scope's first namespace (rank 0's) in."""
        if not self._forward_tiers or scope.client is None:
            return
        try:
            fingerprint = scope.client.fingerprints[0].canonical()
            if self._forwarder is None:
                endpoints = scope.client.events_endpoints
                if endpoints is None or not tier_events.available():
                    if endpoints is not None:
                        logger.info("kvtier: pyzmq or msgpack is missing: vLLM's events name kvtier's host "
                                    "tier only")
                    self._forward_tiers = False
                    return
                self._forwarder = tier_events.TierEventForwarder(endpoints, [], self._media, BlockStored,
                                                                 BlockRemoved)
            self._forwarder.add_namespace(fingerprint)
        except Exception as e:  # noqa: BLE001 - events are never worth failing the engine
            logger.warning("kvtier: cannot follow kvtierd's KV events (%s): vLLM's events name kvtier's "
                           "host tier only", e)
            self._forward_tiers = False
            self._forwarder = None

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
            self._follow_events(scope)
        return scope

    def _state(self, request):
        state = self._requests.get(request.request_id)
        if state is not None and len(request.prompt_token_ids or ()) != len(state.tokens):
            self._prompt_changed(state, request)
        if state is None:
            tokens = list(request.prompt_token_ids or [])
            adapter = adapter_of(request)
            scope = self._scope(adapter)
            salt, extras = key_extras(request, len(tokens), self._g.block_tokens)
            load, save = opt_out(request)
            state = RequestState(request.request_id, next(self._hint_ids), tokens,
                                 [h.keys(tokens, cache_salt=salt, extras=extras) for h in scope.hashers],
                                 adapter=adapter, may_load=load, may_save=save,
                                 engine_hashes=getattr(request, "block_hashes", None),
                                 lora_id=getattr(getattr(request, "lora_request", None), "lora_int_id", None),
                                 request=request, handoff=handoff.handoff_of(request))
            self._requests[request.request_id] = state
            self._hint_all(state, lambda c, i, keys: c.enqueue(hint_id(state, i), i, keys))
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
        state.tokens, state.keys, state.saved, state.generated = tokens, keys, kept, []
        state.hits, state.pending, state.load = None, None, None
        state.engine_hashes = getattr(request, "block_hashes", None)

    def _hint_all(self, state, call):
        """One hint per rank's KV namespace (recurrent states, stored at a
        few boundaries only, are not hinted), sent in the background."""
        scope = self._scope(state.adapter)
        if scope.client is None or not state.keys[0]:
            return
        for i, keys in enumerate(state.keys):
            if self._lookups.kind(i) == "state":
                continue
            self._hints.submit(scope.client, lambda c, i=i, keys=keys: call(c, i, keys))

    def flush_hints(self, timeout=10.0):
        return self._hints.flush(timeout)

    def on_new_request(self, request):
        self._state(request)

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """(tokens kvtier loads beyond num_computed_tokens, load_async), or
        (None, False) while the lookup is out. A prefill/decode hand-off
        (P's kv_transfer_params) waits up to handoff_wait for the blocks P
        announced and loads asynchronously (handoff_async)."""
        g = self._g
        state = self._state(request)
        # Leave a token to compute. The context: a request resumed after a
        # preemption may load the blocks its decoding saved (save_decode).
        usable = (_known_tokens(state, request) - 1) // g.block_tokens
        client = self._scope(state.adapter).client
        if state.handoff is not None and not state.handoff.checked:
            self._check_handoff(state, client)
        if client is None or not state.may_load or usable * g.block_tokens <= num_computed_tokens:
            state.handoff = None  # nothing to load: served as any other request
            return 0, False
        if state.hits is None:
            state.hits = self._lookups.lookup(state, client, usable)
            if state.hits is None:
                return None, False  # ask again next step
            if state.handoff is not None and not self._handoff_arrived(state, usable):
                state.hits = None
                return None, False  # P's blocks are on their way (a commit, a peer's answer): ask again
        matched = min(state.hits, usable) * g.block_tokens
        new = max(0, matched - num_computed_tokens)
        state.load_async = bool(state.handoff is not None and new and g.handoff_async and self._async_ok)
        return new, state.load_async

    def _check_handoff(self, state, client):
        """D: refuses (one warning, the request served as any other) a
        hand-off whose namespace or keys differ from this engine's: another
        model, revision, parallel layout, block size or prompt."""
        h = state.handoff
        h.checked = True
        scope = self._scope(state.adapter)
        reason = None
        if client is None:
            reason = "this engine's kvtierd is not reachable"
        elif h.block_tokens != self._g.block_tokens:
            reason = f"P's kvtier blocks are of {h.block_tokens} tokens, this engine's of {self._g.block_tokens}"
        elif h.namespace != scope.namespaces[0].fingerprint().hex():
            reason = ("P's namespace differs from this engine's (model, revision, dtype, block size, tensor/pipeline "
                      "parallel layout or LoRA adapter)")
        elif h.blocks > len(state.keys[0]) or (h.blocks and h.last_key != state.keys[0][h.blocks - 1].hex()):
            reason = "P keyed another prompt (token ids, cache salt or multimodal inputs differ)"
        if reason is not None:
            logger.warning("kvtier: hand-off of request %s from engine %s refused: %s; served as any other request",
                           state.req_id, h.engine_id, reason)
            self._stats.add("handoff_refused", 1)
            state.handoff = None

    def _handoff_arrived(self, state, usable):
        """Whether the lookup found every block P announced (up to what this
        request can load), or handoff_wait has passed since the first
        lookup (then what was found is loaded, the rest recomputed)."""
        h = state.handoff
        now = time.monotonic()
        if h.since is None:
            h.since = now
        want = min(h.blocks, usable)
        if state.hits >= want:
            return True
        if now - h.since < self._g.handoff_wait:
            return False
        logger.warning("kvtier: hand-off of request %s from engine %s (peer %s): %d of the %d blocks P saved found "
                       "within %.1f s; the rest is recomputed", state.req_id, h.engine_id, h.peer, state.hits, want,
                       self._g.handoff_wait)
        self._stats.add("handoff_missed_blocks", want - state.hits)
        return True

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        state = self._requests.get(request.request_id)
        if state is None:
            return
        load_async, state.load_async = state.load_async, False
        handed, state.handoff = state.handoff, None  # one hand-off per request: a recompute after it looks up afresh
        if not num_external_tokens or state.hits is None:
            return
        g = self._g
        end = min(state.hits, (_known_tokens(state, request) - 1) // g.block_tokens)
        local = end * g.block_tokens - num_external_tokens
        state.block_ids = [list(ids) for ids in blocks.get_block_ids()]
        state.load = (local // g.block_tokens, end, (local % g.block_tokens) // g.engine_block)
        state.saved = max(state.saved, end)
        if self._forwarder is not None:
            self._name_blocks(state, 0, end)  # held by kvtier: its tier changes now reach vLLM's events
        # The answer is used: should vLLM ask again (the load failed and it
        # recomputes, a preemption), look up afresh rather than promise
        # blocks that may be gone.
        state.hits = None
        self._stats.add("hit_tokens", num_external_tokens)
        if handed is not None:
            self._stats.add("handoff_tokens", num_external_tokens)
        if load_async:
            # vLLM holds the request (WAITING_FOR_REMOTE_KVS) until every worker
            # reports it loaded: the load goes out with the next plan.
            self._async_loads.append(self._async_load(state))

    def _async_load(self, state):
        """The LoadSpec of an async load, planned now from the blocks vLLM
        allocated. One that cannot be planned (never expected) still goes
        out, as engine blocks to report failed, so vLLM recomputes them
        rather than wait for it forever."""
        first, end, _ = state.load
        load = plan_load(state, self._g)
        if load is None:
            logger.warning("kvtier: the async load of %s could not be planned; recomputed", state.req_id)
            per = self._g.per_block
            failed = sorted({i for table in state.block_ids for i in table[first * per:end * per] if i})
            load = LoadSpec(state.req_id, first, [[] for _ in state.keys],
                            [GroupSpan(first, []) for _ in self._g.groups], state.adapter, failed)
        return load

    def build_connector_meta(self, scheduler_output):
        self._flush_events()
        self._step += 1
        meta = KvtierConnectorMetadata(layer_counts=[ns.layer_count for ns in self.base_scope.namespaces])
        self.pending_transfers(meta)
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
            self._hint_all(state, lambda c, i, keys: c.started(hint_id(state, i)))
        load = plan_load(state, g)
        if load is not None:
            meta.loads.append(load)
        if not state.may_save:
            return
        if g.save_decode:
            self._key_generated(state, computed_tokens)
        save = plan_save(state, computed_tokens, g)
        if save is not None:
            save.handoff = g.handoff_free and handoff.wants_remote_decode(state.request)
            meta.saves.append(save)
            state.stored_pending.append((save.first, state.saved, self._step))
            self._unreported[state.req_id] = state

    def _key_generated(self, state, computed_tokens):
        """save_decode: keys the kvtier blocks decoding filled, so that
        plan_save saves them as it saves the prompt's: the full blocks of
        the request's tokens (vLLM's all_token_ids: the prompt, then its
        output) whose KV this step computes. The keys are the chain of the
        whole context, those a lookup of prompt + output computes."""
        ids = getattr(state.request, "all_token_ids", None)
        if ids is None or len(state.keys) == 0 or getattr(state.request, "prompt_embeds", None) is not None:
            return  # (a prompt of embeddings: its output has no embeddings to key it with)
        b = self._g.block_tokens
        full = min(computed_tokens, len(ids)) // b
        if full <= len(state.keys[0]) or full * b <= len(state.tokens):
            return
        context = list(ids[:full * b])
        if context[:len(state.tokens)] != state.tokens:
            return  # not this prompt's continuation (never expected): leave the keys alone
        scope = self._scope(state.adapter)
        salt, extras = key_extras(state.request, len(context), b)
        state.generated = context[len(state.tokens):]
        state.keys = [h.keys(context, cache_salt=salt, extras=extras) for h in scope.hashers]

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

    def pending_transfers(self, meta):
        """Puts the async loads and delayed frees not yet sent into `meta`
        (a disabled connector sends them too: vLLM waits for them)."""
        meta.async_loads.extend(self._async_loads)
        meta.handoff_sends.extend(self._sends)
        self._async_loads, self._sends = [], []

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
        Delays the free only for a prefill/decode hand-off: every copy out
        of a request's engine blocks ends in the step that reads them
        (wait_for_save waits for it), but P keeps a hand-off's blocks until
        its workers report its saves committed (finished_sending)."""
        state = self._requests.pop(request.request_id, None)
        if state is None:
            return False, None
        if not state.started:
            self._hint_all(state, lambda c, i, keys: c.finished(hint_id(state, i)))
        self._emit_stored(state, through_step=self._executed_through())
        if not state.stored_pending:  # else a save of a step still in flight: its event waits for it
            self._unreported.pop(request.request_id, None)
        return self._offer_handoff(request, state)

    def _offer_handoff(self, request, state):
        """P: (delay_free, kv_transfer_params) of a request the proxy sent
        with do_remote_decode, (False, None) for any other. Params go out
        for a request that ran to its end (max_tokens 1 from the proxy, or a
        stop); an aborted one offers none, as in NixlConnector."""
        if not handoff.wants_remote_decode(request) or not handoff.finished_normally(request):
            return False, None
        g = self._g
        blocks = min(state.saved, len(state.keys[0])) if state.may_save else 0
        namespace = self._scope(state.adapter).namespaces[0]
        params = handoff.producer_params(request, g.engine_id, g.peer, namespace.fingerprint().hex(),
                                         g.block_tokens, blocks, state.keys[0][blocks - 1].hex() if blocks else None)
        self._stats.add("handoff_offered_blocks", blocks)
        if blocks:
            self._sends.append(request.request_id)
        return bool(blocks), params

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
            if self._forwarder is not None:  # kvtierd's own events say where the blocks are
                self._name_blocks(state, first, end)
                continue
            self._events.append(BlockStored(
                block_hashes=list(hashes[lo:hi]), parent_block_hash=hashes[lo - 1] if lo > 0 else None,
                token_ids=list(state.context()[lo * b:hi * b]), block_size=b, lora_id=state.lora_id,
                medium=self._medium, lora_name=state.adapter[0] if state.adapter else None))
        state.stored_pending = left

    def _name_blocks(self, state, first, end):
        """Tells the forwarder which vLLM block hashes kvtier blocks
        [first, end) of `state` (rank 0's keys) cover, where vLLM has them."""
        hashes = state.engine_hashes or []
        per, b = self._g.per_block, self._g.engine_block
        for i in range(first, min(end, len(state.keys[0]), len(hashes) // per)):
            lo, hi = i * per, (i + 1) * per
            self._forwarder.name(state.keys[0][i].canonical(), tier_events.BlockNames(
                hashes[lo:hi], hashes[lo - 1] if lo > 0 else None, state.context()[lo * b:hi * b], b,
                state.lora_id, state.adapter[0] if state.adapter else None))

    def take_events(self):
        events, self._events = self._events, []
        if self._forwarder is not None:
            try:
                reconnects = sum(s.client.reconnects for s in self._scopes.values() if s.client is not None)
                if reconnects != self._reconnects_seen:
                    self._reconnects_seen = reconnects
                    self._forwarder.resync()  # another run of kvtierd: its contents afresh
                events.extend(self._forwarder.poll())
            except Exception as e:  # noqa: BLE001 - never into vLLM's step
                logger.warning("kvtier: stopped forwarding kvtierd's KV events (%s)", e)
                self._forwarder.close()
                self._forwarder, self._forward_tiers = None, False
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
