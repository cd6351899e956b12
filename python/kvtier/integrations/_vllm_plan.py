"""The scheduler side's bookkeeping of the kvtier vLLM connector and the
per-step plan it sends to the workers (KvtierConnectorMetadata).

Token positions are grouped into kvtier blocks of B tokens, each `f = B /
block_size` engine blocks. Only whole kvtier blocks are keyed, looked up,
loaded and saved; a partial kvtier block is never stored.

A model may have several KV cache groups (vLLM's hybrid KV cache manager:
full-attention and sliding-window layers), each with its own block table
and one kvtier namespace per rank. Namespaces are indexed rank by rank,
groups within a rank (Geometry.ns_index). A sliding-window group loads only
the blocks its window reads, and saves only blocks whose engine blocks are
all still allocated: vLLM puts the null block (id 0) where it freed blocks
that fell out of the window.
"""

from dataclasses import dataclass, field

try:  # vLLM's marker base class, when vLLM is installed
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata
except ImportError:  # pragma: no cover - exercised where vLLM is absent
    class KVConnectorMetadata:  # noqa: D401 - mirrors vLLM's empty marker
        """vLLM's empty metadata marker (base.py), for running without vLLM."""

NULL_BLOCK = 0  # vLLM's null block: the block pool's first, never handed to a request


@dataclass
class GroupSpan:
    """One group's part of a load or save: kvtier blocks [first, first +
    len(block_ids)), block_ids[i] the f engine blocks of kvtier block
    first + i; for a load, the first `skip` engine blocks of the first one
    were computed locally and are not written."""
    first: int
    block_ids: list
    skip: int = 0


@dataclass
class LoadSpec:
    """Load a request's kvtier blocks into its engine blocks: groups[g] says
    which for group g; keys[j] are the keys of namespace j for exactly
    those blocks (the group of namespace j)."""
    req_id: str
    first: int
    keys: list          # per namespace: list[kvtier.Key]
    groups: list        # per group: GroupSpan
    adapter: tuple = None  # the LoRA's (name, path), or None
    failed: list = None    # engine blocks to report failed without loading (an async load that could not be planned)

    def engine_block_ids(self, group=None):
        """Every engine block this load writes (of one group, or all)."""
        spans = self.groups if group is None else [self.groups[group]]
        ids = set()
        for span in spans:
            for b, block in enumerate(span.block_ids):
                ids.update(i for i in (block[span.skip:] if b == 0 else block) if i != NULL_BLOCK)
        return ids


@dataclass
class SaveSpec:
    """Save a request's kvtier blocks from its engine blocks, layer by layer
    during this step's forward pass: groups[g] (None: nothing for group g),
    keys[j] / parents[j] per namespace."""
    req_id: str
    first: int
    keys: list          # per namespace: list[kvtier.Key]
    parents: list       # per namespace: the key before keys[j][0], or None
    groups: list        # per group: GroupSpan or None
    adapter: tuple = None  # the LoRA's (name, path), or None
    handoff: bool = False  # a hand-off to a decode engine that frees P's copy (handoff_free_source)


@dataclass
class StateSave:
    """Save the recurrent state of group `group` held in engine block
    `block_id` as the state after kvtier block `boundary` - 1 (its first
    `boundary` blocks): keys[j] is [the key] for each namespace j of that
    group, [] for the others. Saved after the step's forward pass, which
    may be the one that writes it."""
    req_id: str
    group: int
    block_id: int
    boundary: int
    keys: list
    adapter: tuple = None


@dataclass
class KvtierConnectorMetadata(KVConnectorMetadata):
    """One step's plan for every worker (picklable). layer_counts: the
    layer count of each namespace as the scheduler keys it, which every
    worker checks against its own. async_loads: loads of requests vLLM
    holds in WAITING_FOR_REMOTE_KVS (a prefill/decode hand-off): the
    workers copy them in the background and report them in get_finished's
    finished_recving. handoff_sends: requests whose blocks vLLM keeps
    after request_finished (delay_free) until every worker reports them in
    finished_sending, once their saves are committed."""
    loads: list = field(default_factory=list)
    saves: list = field(default_factory=list)
    state_saves: list = field(default_factory=list)
    layer_counts: list = None
    async_loads: list = field(default_factory=list)
    handoff_sends: list = field(default_factory=list)


@dataclass
class RequestState:
    """What the scheduler side knows of one request."""
    req_id: str
    hint_id: int
    tokens: list          # the prompt's token ids
    keys: list            # per namespace: keys of every whole kvtier block of the prompt (and of `generated`)
    pending: dict = None  # namespace j, or (j, boundary) for a state -> kvtier.PendingLookup in flight
    phase: int = 0        # 1: full-attention prefixes asked, 2: windows and states asked, 3: windows again
    candidate: int = 0    # the hit the phase's lookups check
    asked: dict = field(default_factory=dict)  # lookup in flight -> (first, end) kvtier blocks it asked
    hits: int = None      # kvtier blocks every rank and group holds, once looked up
    load: tuple = None    # (first kvtier block, end, engine skip) after allocation
    block_ids: list = field(default_factory=list)  # per group: the engine block table
    saved: int = 0        # kvtier blocks saved or known cached
    started: bool = False
    adapter: tuple = None  # the LoRA's (name, path), or None: which namespaces
    may_load: bool = True  # the request's opt-out (kv_transfer_params, skip_reading_prefix_cache)
    may_save: bool = True
    engine_hashes: list = None  # vLLM's block hashes of the request (for KV events), when it has them
    lora_id: int = None
    pending_since: float = 0.0  # when the lookups in flight were sent (time.monotonic)
    stored_pending: list = field(default_factory=list)  # (first, end, step) kvtier blocks saved, not yet in events
    request: object = None  # vLLM's Request (a streaming-input session grows its prompt in place)
    handoff: object = None  # D: the _vllm_handoff.Handoff P announced, until its load is decided
    load_async: bool = False  # the load decided at allocation goes to the workers as an async load
    generated: list = field(default_factory=list)  # save_decode: output token ids keyed after the prompt

    def context(self):
        """The token ids `keys` cover: the prompt, then what save_decode keyed of the output."""
        return self.tokens + self.generated if self.generated else self.tokens


def engine_blocks(table, first, end, per_block):
    """Engine block ids of kvtier blocks [first, end) from one group's block
    table, or None when the table does not reach that far."""
    if len(table) < end * per_block:
        return None
    return [table[i * per_block:(i + 1) * per_block] for i in range(first, end)]


def _group_of(geometry, j):
    return j % len(geometry.groups)


def plan_save(state, computed_tokens, geometry):
    """The SaveSpec for kvtier blocks the step completes, or None. A group
    whose oldest blocks were freed (out of a sliding window) saves the
    blocks after them."""
    full = min(computed_tokens, len(state.context())) // geometry.block_tokens
    if full <= state.saved or len(state.block_ids) != len(geometry.groups):
        return None
    spans = []
    for g, table in enumerate(state.block_ids):
        if geometry.groups[g].state:
            spans.append(None)  # states are saved from vLLM's offers (plan_state_saves), never from the table
            continue
        ids = engine_blocks(table, state.saved, full, geometry.per_block)
        if ids is None:
            return None
        start = 0
        for b, block in enumerate(ids):
            if NULL_BLOCK in block:
                start = b + 1
        spans.append(GroupSpan(state.saved + start, ids[start:]) if start < len(ids) else None)
    if all(span is None for span in spans):
        state.saved = full
        return None
    firsts = [span.first if span is not None else full for span in spans]
    keys = [k[firsts[_group_of(geometry, j)]:full] for j, k in enumerate(state.keys)]
    parents = [k[firsts[_group_of(geometry, j)] - 1] if firsts[_group_of(geometry, j)] > 0 else None
               for j, k in enumerate(state.keys)]
    spec = SaveSpec(state.req_id, state.saved, keys, parents, spans, state.adapter)
    state.saved = full
    return spec


def plan_load(state, geometry):
    """The LoadSpec decided at allocation, or None. A sliding-window group
    loads only the blocks its window reads at the end of the load."""
    if state.load is None:
        return None
    first, end, skip = state.load
    state.load = None
    if end <= first or len(state.block_ids) != len(geometry.groups):
        return None
    spans = []
    for g, table in enumerate(state.block_ids):
        start = max(first, geometry.first_read(g, end))
        ids = engine_blocks(table, start, end, geometry.per_block)
        if ids is None:
            return None
        if geometry.groups[g].state:
            # The state after `end` blocks goes into the last engine block of
            # the hit; vLLM allocates the null block for the others.
            ids = [[NULL_BLOCK] * (len(ids[-1]) - 1) + [ids[-1][-1]]]
            spans.append(GroupSpan(end - 1, ids))
            continue
        spans.append(GroupSpan(start, ids, skip if start == first else 0))
    keys = [k[spans[_group_of(geometry, j)].first:end] for j, k in enumerate(state.keys)]
    return LoadSpec(state.req_id, first, keys, spans, state.adapter)


def step_offers(scheduler_output):
    """vLLM's boundary-state hand-offs of this step, {req_id: [(vLLM group
    id, block id, boundary tokens), ...]}: the engine blocks that hold a
    recurrent state committed at a block boundary (Mamba "align" mode).
    vLLM 0.29 puts them in kv_connector_block_state.boundary_state_offloads,
    0.28 in partial_tail_offloads; either spelling is read."""
    block_state = getattr(scheduler_output, "kv_connector_block_state", None)
    offers = getattr(block_state, "boundary_state_offloads", None) if block_state is not None else None
    if offers is None:
        offers = getattr(scheduler_output, "partial_tail_offloads", None)
    return offers or {}


def plan_state_saves(state, offers, geometry):
    """The StateSaves of one request's offers: only states at a whole kvtier
    block boundary inside the keyed prompt, of a recurrent-state group, in a
    real (non-null) block."""
    saves = []
    for vllm_group, block_id, boundary_tokens in offers:
        group = geometry.group_of_vllm(vllm_group)
        if group is None or not geometry.groups[group].state or block_id == NULL_BLOCK or block_id < 0:
            continue
        boundary, rest = divmod(int(boundary_tokens), geometry.block_tokens)
        if rest or not 1 <= boundary <= len(state.keys[0]):
            continue
        keys = [k[boundary - 1:boundary] if _group_of(geometry, j) == group else [] for j, k in enumerate(state.keys)]
        saves.append(StateSave(state.req_id, group, int(block_id), boundary, keys, state.adapter))
    return saves
