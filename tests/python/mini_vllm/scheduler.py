"""The scheduler (scheduler.py @00f4240e, FCFS, one or several KV cache groups), its async-scheduling
subclass (AsyncScheduler: vllm/v1/core/sched/async_scheduler.py @014b2350, the placeholder handling of
scheduler.py @00024d31) and its per-step outputs.

Recurrent-state (Mamba) groups in mamba_cache_mode "align" (scheduler.py as stored in copies of
vLLM 0.28/0.29; the upstream file at b4622cf9 predates it, so no upstream commit is named):
  _mamba_block_aligned_split  a prefill chunk ends on a block boundary (a multiple of the block
      size, or the last boundary of the request) unless it is the prompt's last chunk; a chunk
      cut to 0 tokens is not scheduled (running: the next request; waiting: the loop stops).
  boundary-state offers  in each step, a request whose scheduled tokens end on a block boundary
      (num_computed + num_scheduled a multiple of the block size) offers the block holding that
      state as (group_id, block_id, boundary_tokens), per Mamba group, to a producer-side
      connector (kv_transfer_config.is_kv_producer, as vLLM drains its hand-offs only for one),
      spelled per VllmConfig.vllm_version (scheduler_output.py). The offered block is pinned
      (ref count) until update_from_output of that step, so it stays allocated through the step's
      forward and wait_for_save whatever happens to the request meanwhile (vLLM pins its
      hand-offs too, until the request's blocks are freed). Simplified: vLLM 0.28 hands off only
      producers' prompt-tail boundaries through copy-on-write blocks; here every boundary a step
      ends on is offered, from the block table itself.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from .config import VllmConfig
from .connector_api import KVConnectorOutput, supports_hma
from .kv_cache import KVCacheManager, cdiv
from .kv_cache_interface import KVCacheConfig, MambaSpec
from .request import PlaceholderRange, Request, RequestStatus, StreamingUpdate
from .scheduler_output import (CachedRequestData, KVConnectorBlockState, NewRequestData, SchedulerOutput,
                               SchedulerOutputV028, scheduler_output_class)


# --------------------------------------------------------------------------
# Scheduler (scheduler.py @00f4240e, FCFS; block ids are one list per KV cache group).
# --------------------------------------------------------------------------

@dataclass
class ModelRunnerOutput:
    req_ids: list
    req_id_to_index: dict
    sampled_token_ids: list  # per request: [token] or [] (partial prefill)
    kv_connector_output: Optional[KVConnectorOutput] = None
    # Mini-engine extensions (not in vLLM): logits [n_new, vocab] and positions of each request.
    logits: dict = field(default_factory=dict)
    positions: dict = field(default_factory=dict)


@dataclass
class EngineCoreOutput:
    request_id: str
    new_token_ids: list
    finish_reason: Optional[str] = None
    kv_transfer_params: Optional[dict] = None


def check_stop(request: Request, max_model_len: int) -> bool:
    if request.num_tokens >= max_model_len or request.num_output_tokens >= request.max_tokens:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    last = request.output_token_ids[-1]
    if request.eos_token_id is not None and last == request.eos_token_id:
        request.status = RequestStatus.FINISHED_STOPPED
        return True
    if last in (request.sampling_params.stop_token_ids or ()):
        request.status = RequestStatus.FINISHED_STOPPED
        request.stop_reason = last
        return True
    return False


class Scheduler:
    def __init__(self, vllm_config: VllmConfig, kv_cache_config: KVCacheConfig, connector: Any = None):
        self.vllm_config = vllm_config
        self.scheduler_config = vllm_config.scheduler_config
        self.kv_cache_config = kv_cache_config
        self.block_size = vllm_config.cache_config.block_size
        self.max_model_len = vllm_config.model_config.max_model_len
        self.max_num_running_reqs = self.scheduler_config.max_num_seqs
        self.max_num_scheduled_tokens = self.scheduler_config.max_num_batched_tokens
        self.connector = connector
        self.recompute_kv_load_failures = True
        self.requires_kv_delivery = False
        if connector is not None:
            ktc = vllm_config.kv_transfer_config
            self.recompute_kv_load_failures = ktc.kv_load_failure_policy == "recompute"
            self.requires_kv_delivery = bool(getattr(connector, "requires_kv_delivery", False))
        self.requests: dict = {}
        self.waiting: deque = deque()
        self.running: list = []
        self.finished_req_ids: set = set()
        self.reset_preempted_req_ids: set = set()
        self.prev_step_scheduled_req_ids: set = set()
        self.finished_recving_kv_req_ids: set = set()
        self.failed_recving_kv_req_ids: set = set()
        # Mini-engine bookkeeping (not in vLLM): the scheduled requests whose output the last
        # update_from_output ignored (finished before it came back, or a stale async frame).
        self.ignored_req_ids: set = set()
        self.kv_cache_manager = KVCacheManager(kv_cache_config, self.max_model_len,
                                               vllm_config.cache_config.enable_prefix_caching)
        # Mamba groups in "align" mode: chunks split at block boundaries, boundary states offered.
        self.mamba_align_group_ids = [i for i, g in enumerate(kv_cache_config.kv_cache_groups)
                                      if isinstance(g.kv_cache_spec, MambaSpec)
                                      and g.kv_cache_spec.mamba_cache_mode == "align"]
        self.need_mamba_block_aligned_split = bool(self.mamba_align_group_ids)
        self.offers_boundary_states = connector is not None and vllm_config.kv_transfer_config.is_kv_producer
        self.scheduler_output_class = scheduler_output_class(vllm_config.vllm_version)
        self._boundary_state_pins: dict = {}  # id(scheduler output) -> offered blocks pinned until its update
        self.num_waiting_for_streaming_input = 0  # sessions parked in `waiting` until their next chunk
        if connector is not None:
            if hasattr(connector, "bind_kv_cache_manager"):
                connector.bind_kv_cache_manager(self.kv_cache_manager)
            elif hasattr(connector, "bind_gpu_block_pool"):
                connector.bind_gpu_block_pool(self.kv_cache_manager.block_pool)

    # ---- requests in and out ----
    def add_request(self, request: Request) -> None:
        existing = self.requests.get(request.request_id)
        if existing is not None:  # streaming input: the next chunk of a session (scheduler.py @6cf7b26b)
            update = StreamingUpdate.from_request(request)
            if existing.status != RequestStatus.WAITING_FOR_STREAMING_REQ:
                assert existing.streaming_queue is not None, "duplicate request id"
                existing.streaming_queue.append(update)  # taken when the running chunk stops
            elif update is not None:
                self._update_request_as_session(existing, update)
            else:
                self.finish_requests(request.request_id, RequestStatus.FINISHED_ABORTED)
            return
        if request.resumable:
            request.streaming_queue = deque()
        self.waiting.append(request)
        self.requests[request.request_id] = request
        if self.connector is not None and hasattr(self.connector, "on_new_request"):
            self.connector.on_new_request(request)

    def finish_requests(self, request_ids, finished_status: RequestStatus) -> list:
        """Abort path (EngineCore.abort_requests -> finish_requests), callable at any time."""
        assert RequestStatus.is_finished(finished_status)
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        valid = []
        for req_id in request_ids:
            request = self.requests.get(req_id)
            if request is None or request.is_finished():
                continue
            valid.append(request)
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
        for request in valid:
            delay_free_blocks = False
            if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                delay_free_blocks = request.request_id not in self.finished_recving_kv_req_ids
                self.finished_recving_kv_req_ids.discard(request.request_id)
                self.failed_recving_kv_req_ids.discard(request.request_id)
            if request.status == RequestStatus.WAITING_FOR_STREAMING_REQ:
                self.num_waiting_for_streaming_input -= 1
            request.status = finished_status
            self._free_request(request, delay_free_blocks=delay_free_blocks)
        return valid

    def _handle_stopped_request(self, request: Request) -> bool:
        """True if the stopped request is finished. A resumable one (streaming input) is not: it
        takes its next queued chunk, or parks as WAITING_FOR_STREAMING_REQ, keeping its blocks and
        computed tokens, and the caller puts it back in the waiting queue (scheduler.py @6cf7b26b)."""
        if not request.resumable:
            return True
        assert request.num_output_placeholders == 0, "streaming input under async scheduling is not modelled"
        if request.streaming_queue:
            update = request.streaming_queue.popleft()
            if update is None:
                return True
            self._update_request_as_session(request, update)
        else:
            request.status = RequestStatus.WAITING_FOR_STREAMING_REQ
            self.num_waiting_for_streaming_input += 1
        return False

    def _update_request_as_session(self, session: Request, update: StreamingUpdate) -> None:
        """The session's next chunk (scheduler.py @6cf7b26b): the output tokens whose KV was computed
        join the prompt, the last sampled one (never computed) is dropped, the new input follows;
        the request keeps its blocks and num_computed_tokens and waits to be scheduled again, as a
        new request without a prefix lookup."""
        computed = session.num_computed_tokens
        kept = session._all_token_ids[session.num_prompt_tokens:computed]
        del session._all_token_ids[computed:]
        del session.block_hashes[computed // self.block_size:]  # a hashed block held the dropped token
        session._output_token_ids.clear()
        session.prompt_token_ids.extend(kept)
        if update.mm_features:
            base = len(session._all_token_ids)
            for f in update.mm_features:
                f.mm_position = PlaceholderRange(f.mm_position.offset + base, f.mm_position.length)
            session.mm_features.extend(update.mm_features)
        session._all_token_ids.extend(update.prompt_token_ids)
        session.prompt_token_ids.extend(update.prompt_token_ids)
        session.update_block_hashes()
        session.num_prompt_tokens = len(session.prompt_token_ids)
        session.sampling_params = update.sampling_params
        session.max_tokens = update.sampling_params.max_tokens
        session.resumable = update.resumable
        if session.status == RequestStatus.WAITING_FOR_STREAMING_REQ:
            self.num_waiting_for_streaming_input -= 1
        session.status = RequestStatus.WAITING

    def preempt_request(self, req_id: str) -> None:
        """Forces the preemption the scheduler does when allocation fails (test hook, between steps)."""
        request = self.requests[req_id]
        assert request.status == RequestStatus.RUNNING, "Only running requests can be preempted"
        self.running.remove(request)
        self._preempt_request(request)
        # Resumed requests must then be sent with all_token_ids (as after reset_prefix_cache).
        self.prev_step_scheduled_req_ids.discard(req_id)

    def _preempt_request(self, request: Request) -> None:
        assert request.status == RequestStatus.RUNNING, "Only running requests can be preempted"
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.spec_token_ids = []
        request.num_preemptions += 1
        self.waiting.appendleft(request)
        self.reset_preempted_req_ids.add(request.request_id)

    def _free_request(self, request: Request, delay_free_blocks: bool = False) -> Optional[dict]:
        assert request.is_finished()
        connector_delay_free, kv_xfer_params = self._connector_finished(request)
        self.finished_req_ids.add(request.request_id)
        if not (delay_free_blocks or connector_delay_free):
            self._free_blocks(request)
        return kv_xfer_params

    def _free_blocks(self, request: Request) -> None:
        assert request.is_finished()
        self.kv_cache_manager.free(request)
        del self.requests[request.request_id]

    def _connector_finished(self, request: Request) -> tuple:
        if self.connector is None:
            return False, None
        self.kv_cache_manager.remove_skipped_blocks(request.request_id, request.num_computed_tokens,
                                                    request.num_prompt_tokens)
        block_ids = self.kv_cache_manager.get_block_ids_for_computed_tokens(request.request_id,
                                                                            request.num_computed_tokens)
        if not supports_hma(self.connector):
            assert len(self.kv_cache_config.kv_cache_groups) == 1
            return self.connector.request_finished(request, block_ids[0])
        return self.connector.request_finished_all_groups(request, block_ids)

    # ---- schedule ----
    def schedule(self) -> SchedulerOutput:
        kvm = self.kv_cache_manager
        scheduled_new, scheduled_resumed, scheduled_running, preempted = [], [], [], []
        req_to_new_blocks: dict = {}
        num_scheduled: dict = {}
        token_budget = self.max_num_scheduled_tokens
        has_sync_kv_loads = False
        threshold = self.scheduler_config.long_prefill_token_threshold

        # First, the RUNNING requests.
        req_index = 0
        while req_index < len(self.running) and token_budget > 0:
            request = self.running[req_index]
            # Async scheduling (placeholders are 0 otherwise): a request whose step in flight already
            # brings it to max_tokens gets no further step (scheduler.py @00024d31).
            if (request.num_output_placeholders > 0 and request.num_computed_tokens + 2
                    - request.num_output_placeholders >= request.num_prompt_tokens + request.max_tokens):
                req_index += 1
                continue
            # The tokens of steps in flight count as known: their KV is computed by those steps.
            num_new = request.num_tokens_with_spec + request.num_output_placeholders - request.num_computed_tokens
            if 0 < threshold < num_new:
                num_new = threshold
            num_new = min(num_new, token_budget, self.max_model_len - request.num_computed_tokens - 1)
            if self.need_mamba_block_aligned_split:
                num_new = self._mamba_block_aligned_split(request, num_new)
            if num_new <= 0:
                req_index += 1
                continue
            while True:
                new_blocks = kvm.allocate_slots(request, num_new)
                if new_blocks is not None:
                    break
                if self.connector is not None and getattr(self.connector, "has_pending_block_frees", lambda: False)():
                    break
                preempted_req = self.running.pop()
                self._preempt_request(preempted_req)
                preempted.append(preempted_req)
                if preempted_req is request:
                    break
            if new_blocks is None:
                break
            scheduled_running.append(request)
            req_to_new_blocks[request.request_id] = new_blocks
            num_scheduled[request.request_id] = num_new
            token_budget -= num_new
            req_index += 1

        # Next, the WAITING requests (not in a step that preempted).
        if not preempted:
            skipped: deque = deque()
            while self.waiting and token_budget > 0:
                if len(self.running) >= self.max_num_running_reqs:
                    break
                request = self.waiting[0]
                if request.status == RequestStatus.WAITING_FOR_STREAMING_REQ:
                    skipped.append(self.waiting.popleft())  # parked until its next input chunk
                    continue
                if request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                    if request.request_id not in self.finished_recving_kv_req_ids:
                        skipped.append(self.waiting.popleft())
                        continue
                    self._update_waiting_for_remote_kv(request)
                    request.status = RequestStatus.PREEMPTED if request.num_preemptions else RequestStatus.WAITING

                num_external = 0
                load_kv_async = False
                if request.num_computed_tokens == 0:
                    new_computed_blocks, num_local = kvm.get_computed_blocks(request)
                    if self.connector is not None:
                        block_aligned_local = num_local - num_local % self.block_size
                        ext_tokens, load_kv_async = self.connector.get_num_new_matched_tokens(
                            request, block_aligned_local)
                        if request.skip_reading_prefix_cache:
                            ext_tokens, load_kv_async = 0, False
                        if ext_tokens is None:
                            # The connector could not tell yet: ask again in a later step.
                            skipped.append(self.waiting.popleft())
                            continue
                        num_external = ext_tokens
                    num_computed = num_local + num_external
                    assert num_computed <= request.num_tokens
                else:
                    new_computed_blocks, num_local = kvm.empty_kv_cache_blocks, 0
                    num_computed = request.num_computed_tokens

                if load_kv_async:
                    assert num_external > 0
                    num_new = 0
                else:
                    num_new = request.num_tokens - num_computed
                    if 0 < threshold < num_new:
                        num_new = threshold
                    if not self.scheduler_config.enable_chunked_prefill and num_new > token_budget:
                        break
                    num_new = min(num_new, token_budget)
                    if self.need_mamba_block_aligned_split:
                        num_new = self._mamba_block_aligned_split(request, num_new, num_local, num_external)
                        if num_new == 0:
                            break  # not enough budget for a block-aligned chunk
                    # A sync hit must leave at least one token to compute (vLLM asserts the same).
                    assert num_new > 0

                new_blocks = kvm.allocate_slots(request, num_new, num_new_computed_tokens=num_local,
                                                new_computed_blocks=new_computed_blocks,
                                                num_external_computed_tokens=num_external,
                                                delay_cache_blocks=load_kv_async)
                if new_blocks is None:
                    break
                if self.connector is not None:
                    self.connector.update_state_after_alloc(request, kvm.get_blocks(request.request_id), num_external)
                if load_kv_async:
                    request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                    request.num_computed_tokens = num_computed
                    skipped.append(self.waiting.popleft())
                    continue

                self.waiting.popleft()
                self.running.append(request)
                if num_external > 0:
                    has_sync_kv_loads = True
                if request.status == RequestStatus.WAITING:
                    scheduled_new.append(request)
                elif request.status == RequestStatus.PREEMPTED:
                    scheduled_resumed.append(request)
                else:
                    raise RuntimeError(f"Invalid request status: {request.status}")
                req_to_new_blocks[request.request_id] = kvm.get_blocks(request.request_id)
                num_scheduled[request.request_id] = num_new
                token_budget -= num_new
                request.status = RequestStatus.RUNNING
                request.num_computed_tokens = num_computed
            self.waiting.extendleft(reversed(skipped))

        total = sum(num_scheduled.values())
        assert total <= self.max_num_scheduled_tokens and token_budget >= 0
        offers, pins = self._take_boundary_state_offers(num_scheduled)
        so = self.scheduler_output_class(
            scheduled_new_reqs=[NewRequestData.from_request(r, req_to_new_blocks[r.request_id].get_block_ids())
                                for r in scheduled_new],
            scheduled_cached_reqs=self._make_cached_request_data(scheduled_running, scheduled_resumed,
                                                                 req_to_new_blocks),
            num_scheduled_tokens=num_scheduled, total_num_scheduled_tokens=total, scheduled_spec_decode_tokens={},
            scheduled_encoder_inputs={}, num_common_prefix_blocks=[0], preempted_req_ids=self.reset_preempted_req_ids,
            finished_req_ids=self.finished_req_ids, free_encoder_mm_hashes=[], has_sync_kv_loads=has_sync_kv_loads,
            **self._offer_fields(offers, num_scheduled))
        if pins:
            self._boundary_state_pins[id(so)] = pins
        self.prev_step_scheduled_req_ids = set(num_scheduled)
        if self.connector is not None:
            so.kv_connector_metadata = self.connector.build_connector_meta(so)
        self._update_after_schedule(so)
        return so

    def _mamba_block_aligned_split(self, request: Request, num_new_tokens: int, num_new_local_computed_tokens: int = 0,
                                   num_external_computed_tokens: int = 0) -> int:
        """vLLM's split in "align" mode: while the request prefills (its prompt, or the tokens a
        resumed request recomputes), a chunk that ends before the request's last block boundary is
        cut to whole blocks (possibly 0), one that crosses that boundary ends on it, and the tail
        after it is scheduled as is."""
        num_computed = request.num_computed_tokens + num_new_local_computed_tokens + num_external_computed_tokens
        if num_computed < max(request.num_prompt_tokens, request.num_tokens - 1):
            bs = self.block_size
            last_cache_position = request.num_tokens - request.num_tokens % bs
            after = num_computed + num_new_tokens
            if after < last_cache_position:
                num_new_tokens = num_new_tokens // bs * bs
            elif num_computed < last_cache_position < after:
                num_new_tokens = last_cache_position - num_computed
        return num_new_tokens

    def _take_boundary_state_offers(self, num_scheduled: dict) -> tuple:
        """({req_id: [(group_id, block_id, boundary_tokens)]}, the offered blocks, pinned): for a
        producer-side connector, the state block of every Mamba "align" group of each request
        whose scheduled tokens end on a block boundary. Called before _update_after_schedule
        (request.num_computed_tokens is the step's start)."""
        offers, pins = {}, []
        if not (self.offers_boundary_states and self.mamba_align_group_ids):
            return offers, pins
        kvm = self.kv_cache_manager
        for req_id, n in num_scheduled.items():
            end = self.requests[req_id].num_computed_tokens + n
            if end % self.block_size:
                continue
            tables = kvm.get_blocks(req_id).blocks
            for g in self.mamba_align_group_ids:
                block = tables[g][end // self.block_size - 1]
                assert not block.is_null, f"{req_id}: no state block at boundary {end} of group {g}"
                offers.setdefault(req_id, []).append((g, block.block_id, end))
                pins.append(block)
        kvm.block_pool.touch(pins)
        return offers, pins

    def _offer_fields(self, offers: dict, num_scheduled: dict) -> dict:
        """The SchedulerOutput fields that carry the offers in this vLLM version (none without a
        producer-side connector): 0.28 partial_tail_offloads (None when empty), 0.29
        kv_connector_block_state (with snapshots of the tables of the scheduled and offering
        requests)."""
        if not self.offers_boundary_states:
            return {}
        if issubclass(self.scheduler_output_class, SchedulerOutputV028):
            return {"partial_tail_offloads": offers or None}
        kvm = self.kv_cache_manager
        block_ids = {req_id: kvm.get_block_ids(req_id) for req_id in list(num_scheduled) + list(offers)}
        return {"kv_connector_block_state": KVConnectorBlockState(block_ids=block_ids, boundary_state_offloads=offers)}

    def _make_cached_request_data(self, running_reqs: list, resumed_reqs: list, req_to_new_blocks: dict):
        data = CachedRequestData.make_empty()
        for idx, req in enumerate(list(running_reqs) + list(resumed_reqs)):
            req_id = req.request_id
            data.req_ids.append(req_id)
            if idx >= len(running_reqs):
                data.resumed_req_ids.add(req_id)
            if req_id not in self.prev_step_scheduled_req_ids:
                data.all_token_ids[req_id] = req.all_token_ids.copy()
            data.new_block_ids.append(req_to_new_blocks[req_id].get_block_ids(allow_none=True))
            data.num_computed_tokens.append(req.num_computed_tokens)
            data.num_output_tokens.append(req.num_output_tokens + req.num_output_placeholders)
        return data

    def _update_after_schedule(self, so: SchedulerOutput) -> None:
        for req_id, n in so.num_scheduled_tokens.items():
            self.requests[req_id].num_computed_tokens += n
        # New sets, not clear(): the scheduler output keeps the old ones.
        self.finished_req_ids = set()
        self.reset_preempted_req_ids = set()

    def _update_waiting_for_remote_kv(self, request: Request) -> None:
        if request.request_id in self.failed_recving_kv_req_ids:
            if request.num_computed_tokens:
                self.kv_cache_manager.cache_blocks(request, request.num_computed_tokens)
            else:
                self.kv_cache_manager.free(request)
            self.failed_recving_kv_req_ids.remove(request.request_id)
        else:
            self.kv_cache_manager.cache_blocks(request, request.num_computed_tokens)
        if request.num_computed_tokens == request.num_tokens:
            if self.mamba_align_group_ids:
                # Resuming one token earlier needs the state before the last block, which an align
                # table does not hold: recompute from token 0 (connectors leave a token to compute).
                self.kv_cache_manager.free(request)
                request.num_computed_tokens = 0
            else:
                request.num_computed_tokens = request.num_tokens - 1
        self.finished_recving_kv_req_ids.remove(request.request_id)

    # ---- outputs ----
    def update_from_output(self, so: SchedulerOutput, out: ModelRunnerOutput) -> tuple:
        """Returns (list of EngineCoreOutput, set of req ids whose step output was discarded)."""
        kv_out = out.kv_connector_output
        failed: set = set()
        if kv_out and kv_out.failed_recving:
            failed |= self._handle_failed_recving(kv_out.failed_recving)
        if kv_out and kv_out.invalid_block_ids:
            failed |= self._handle_invalid_blocks(kv_out.invalid_block_ids, so.num_scheduled_tokens)
        outputs = []
        stopped_running, stopped_preempted = set(), set()
        self.ignored_req_ids = set()
        for req_id, n in so.num_scheduled_tokens.items():
            assert n > 0
            request = self.requests.get(req_id)
            if req_id in failed:
                continue
            if request is None or request.is_finished():
                # Aborted between schedule() and the worker pass, or (async scheduling) finished
                # by the output of the step before this one.
                self.ignored_req_ids.add(req_id)
                continue
            new_token_ids = list(out.sampled_token_ids[out.req_id_to_index[req_id]])
            kv_transfer_params, is_stopped = None, False
            status_before = request.status
            if new_token_ids:
                new_token_ids, is_stopped = self._update_request_with_output(request, new_token_ids)
            finish_reason = request.get_finished_reason()
            if is_stopped:
                if self._handle_stopped_request(request):
                    kv_transfer_params = self._free_request(request)
                    # Async scheduling: a request preempted while this step was in flight stops from
                    # the waiting queue.
                    (stopped_running if status_before == RequestStatus.RUNNING else stopped_preempted).add(request)
                elif status_before == RequestStatus.RUNNING:  # a streaming session: back to waiting
                    stopped_running.add(request)
                    self.waiting.append(request)
            if new_token_ids or is_stopped:
                outputs.append(EngineCoreOutput(req_id, new_token_ids, finish_reason, kv_transfer_params))
        if stopped_running:
            self.running = [r for r in self.running if r not in stopped_running]
        if stopped_preempted:
            self.waiting = deque(r for r in self.waiting if r not in stopped_preempted)
        if failed and not self.recompute_kv_load_failures:
            for request in self.finish_requests(failed, RequestStatus.FINISHED_ERROR):
                outputs.append(EngineCoreOutput(request.request_id, [], request.get_finished_reason()))
        if kv_out:
            self._update_from_kv_xfer_finished(kv_out)
        if self.connector is not None:
            if hasattr(self.connector, "get_kv_connector_stats"):
                self.connector.get_kv_connector_stats()
            if hasattr(self.connector, "take_events"):
                list(self.connector.take_events() or ())
        pins = self._boundary_state_pins.pop(id(so), None)
        if pins:  # the step's forward and wait_for_save have run: the offered blocks may go
            self.kv_cache_manager.block_pool.free_blocks(pins)
        return outputs, failed

    def _update_from_kv_xfer_finished(self, kv_out: KVConnectorOutput) -> None:
        if self.connector is not None and hasattr(self.connector, "update_connector_output"):
            self.connector.update_connector_output(kv_out)
        for req_id in kv_out.finished_recving or ():
            assert req_id in self.requests, f"finished_recving for unknown request {req_id}"
            req = self.requests[req_id]
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                self.finished_recving_kv_req_ids.add(req_id)
            else:
                assert RequestStatus.is_finished(req.status)
                self._free_blocks(req)
        for req_id in kv_out.finished_sending or ():
            assert req_id in self.requests, f"finished_sending for unknown request {req_id}"
            self._free_blocks(self.requests[req_id])

    def _update_request_with_output(self, request: Request, new_token_ids: list) -> tuple:
        """Appends the sampled tokens up to the first stop; returns (tokens kept, stopped)."""
        for i, tok in enumerate(new_token_ids, 1):
            request.append_output_token_ids(tok)
            if check_stop(request, self.max_model_len):
                del new_token_ids[i:]
                return new_token_ids, True
        return new_token_ids, False

    def _handle_failed_recving(self, failed_req_ids: set) -> set:
        affected = set()
        for req_id in failed_req_ids:
            request = self.requests.get(req_id)
            if request is not None and request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                affected.add(req_id)
                if self.recompute_kv_load_failures:
                    request.num_computed_tokens = 0
                    self.failed_recving_kv_req_ids.add(req_id)
        return set() if self.recompute_kv_load_failures else affected

    def _update_requests_with_invalid_blocks(self, requests: Iterable[Request], invalid_block_ids: set,
                                             num_scheduled_tokens: dict, evict_blocks: bool) -> tuple:
        affected, marked, to_evict = set(), set(), set()
        for request in requests:
            is_affected = marked_here = False
            # vLLM @00f4240e reads one group ("TODO: add support for hybrid memory allocator"); here a
            # block index fails when its block fails in any group (null blocks never do).
            group_ids = self.kv_cache_manager.get_block_ids(request.request_id)
            req_num_computed = request.num_computed_tokens - num_scheduled_tokens.get(request.request_id, 0)
            for idx in range(cdiv(req_num_computed, self.block_size)):
                failed = [ids[idx] for ids in group_ids if idx < len(ids) and ids[idx] != 0
                          and ids[idx] in invalid_block_ids]
                if not failed:
                    continue
                is_affected = True
                if all(bid in marked for bid in failed):
                    continue
                marked.update(failed)
                if marked_here:
                    continue
                marked_here = True
                request.num_computed_tokens = idx * self.block_size  # truncate at the first failed block
                if evict_blocks:
                    to_evict.update(bid for ids in group_ids for bid in ids[idx:] if bid != 0)
            if is_affected:
                if not marked_here:
                    request.num_computed_tokens = req_num_computed
                if self.mamba_align_group_ids:
                    # A Mamba "align" table holds no state before the hit's last block (nulls), so no
                    # point before the failed block can be resumed from: recompute from token 0
                    # (or from a local prefix hit holding its state, once the request is restarted;
                    # see _restart_for_recurrent_state). This applies to a failed block of any group.
                    request.num_computed_tokens = 0
                affected.add(request.request_id)
        return affected, to_evict

    def _handle_invalid_blocks(self, invalid_block_ids: set, num_scheduled_tokens: dict) -> set:
        async_reqs = [r for r in self.waiting if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS]
        async_failed, _ = self._update_requests_with_invalid_blocks(async_reqs, invalid_block_ids,
                                                                    num_scheduled_tokens, evict_blocks=False)
        sync_failed, to_evict = self._update_requests_with_invalid_blocks(list(self.running), invalid_block_ids,
                                                                          num_scheduled_tokens, evict_blocks=True)
        if not (async_failed or sync_failed):
            return set()
        if to_evict and not self.recompute_kv_load_failures:
            self.kv_cache_manager.evict_blocks(to_evict)
        if not self.recompute_kv_load_failures:
            return async_failed | sync_failed
        self.failed_recving_kv_req_ids |= async_failed
        if self.mamba_align_group_ids and sync_failed:
            # The restarted requests' blocks from the failed one on were cached at schedule time and
            # are not rewritten in place: they leave the prefix cache.
            self.kv_cache_manager.evict_blocks(to_evict)
            for req_id in sync_failed:
                self._restart_for_recurrent_state(req_id)
        return sync_failed

    def _restart_for_recurrent_state(self, req_id: str) -> None:
        """A running request with Mamba "align" groups whose loaded blocks failed recomputes from
        token 0: the attention groups keep their blocks when vLLM truncates num_computed_tokens
        (the recompute rewrites them), but a Mamba table cannot go back (MambaManager allocates
        forward only, and the sliding-window nulls before the hit would have to be real blocks
        again), so the request is restarted as a preemption restarts it: its blocks freed, back at
        the front of the waiting queue, resumed with a new table (and a new local-cache lookup and
        get_num_new_matched_tokens). Harness choice: vLLM @00f4240e reads one group here ("TODO:
        add support for hybrid memory allocator") and does not handle this case."""
        self.preempt_request(req_id)

    # ---- liveness ----
    def get_num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running) - self.num_waiting_for_streaming_input

    def has_finished_requests(self) -> bool:
        if self.finished_req_ids:
            return True
        return self.connector is not None and len(self.requests) > len(self.waiting) + len(self.running)

    def has_requests(self) -> bool:
        return bool(self.get_num_unfinished_requests() or self.has_finished_requests() or (
            self.connector is not None and getattr(self.connector, "has_pending_push_work", lambda: False)()))


class AsyncScheduler(Scheduler):
    """vLLM's AsyncScheduler (vllm/v1/core/sched/async_scheduler.py @014b2350, no speculative
    decoding or pipeline parallelism): schedule() for step N+1 runs before update_from_output of
    step N, so a request's sampled token of a step in flight is a placeholder
    (num_output_placeholders) until its output comes back. Each scheduled step that ends a
    prefill or decodes adds one; each token that comes back removes one. The KV of the tokens
    known when the output arrives is cached then (allocate_slots could not hash the blocks that
    held placeholders)."""

    def _update_after_schedule(self, so: SchedulerOutput) -> None:
        super()._update_after_schedule(so)
        for req_id in so.num_scheduled_tokens:
            request = self.requests[req_id]
            request.is_prefill_chunk = request.num_computed_tokens < (request.num_tokens
                                                                      + request.num_output_placeholders)
            if not request.is_prefill_chunk:
                request.num_output_placeholders += 1  # one sampled token per step, no spec tokens

    def _update_request_with_output(self, request: Request, new_token_ids: list) -> tuple:
        if request.async_tokens_to_discard > 0:
            # A frame computed before a forced preemption: dropped (the resumed request recomputes it).
            request.async_tokens_to_discard -= 1
            self.ignored_req_ids.add(request.request_id)
            return [], False
        status_before = request.status
        new_token_ids, stopped = super()._update_request_with_output(request, new_token_ids)
        request.num_output_placeholders -= len(new_token_ids)
        assert request.num_output_placeholders >= 0
        if status_before == RequestStatus.RUNNING:  # a preempted request's blocks are gone
            self.kv_cache_manager.cache_blocks(request, request.num_computed_tokens - request.num_output_placeholders)
        return new_token_ids, stopped

    def preempt_request(self, req_id: str) -> None:
        """The test hook, between engine steps, so with a step in flight: the request may be resumed
        by the very next schedule(), before that step's output is back. As vLLM's
        reset_prefix_cache(reset_running_requests=True) does for the same case (scheduler.py
        @00024d31), its placeholders are dropped and the in-flight outputs discarded when they come."""
        request = self.requests[req_id]
        super().preempt_request(req_id)
        request.async_tokens_to_discard += request.num_output_placeholders
        request.num_output_placeholders = 0
