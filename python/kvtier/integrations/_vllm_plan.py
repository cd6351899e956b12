"""The scheduler side's bookkeeping of the kvtier vLLM connector and the
per-step plan it sends to the workers (KvtierConnectorMetadata).

Token positions are grouped into kvtier blocks of B tokens, each `f = B /
block_size` engine blocks. Only whole kvtier blocks are keyed, looked up,
loaded and saved; a partial kvtier block is never stored.
"""

from dataclasses import dataclass, field

try:  # vLLM's marker base class, when vLLM is installed
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata
except ImportError:  # pragma: no cover - exercised where vLLM is absent
    class KVConnectorMetadata:  # noqa: D401 - mirrors vLLM's empty marker
        """vLLM's empty metadata marker (base.py), for running without vLLM."""


@dataclass
class LoadSpec:
    """Load kvtier blocks [first, first + len(keys[r])) of a request into its
    engine blocks. block_ids[i] are the engine blocks of kvtier block
    first + i; the first `skip` engine blocks of the first one were computed
    locally and are not written."""
    req_id: str
    first: int
    keys: list          # per rank namespace: list[kvtier.Key]
    block_ids: list     # list[list[int]], one list of f engine blocks per kvtier block
    skip: int = 0
    adapter: tuple = None  # the LoRA's (name, path), or None


@dataclass
class SaveSpec:
    """Save kvtier blocks [first, first + len(keys[r])) of a request from its
    engine blocks, layer by layer during this step's forward pass."""
    req_id: str
    first: int
    keys: list          # per rank namespace: list[kvtier.Key]
    parents: list       # per rank namespace: the key before keys[r][0], or None
    block_ids: list     # list[list[int]]
    adapter: tuple = None  # the LoRA's (name, path), or None


@dataclass
class KvtierConnectorMetadata(KVConnectorMetadata):
    """One step's plan for every worker (picklable)."""
    loads: list = field(default_factory=list)
    saves: list = field(default_factory=list)


@dataclass
class RequestState:
    """What the scheduler side knows of one request."""
    req_id: str
    hint_id: int
    tokens: list          # the prompt's token ids
    keys: list            # per rank namespace: keys of every whole kvtier block of the prompt
    pending: list = None  # kvtier.PendingLookup per rank while a lookup is in flight
    hits: int = None      # kvtier blocks every rank holds, once looked up
    load: tuple = None    # (first kvtier block, end, engine skip) after allocation
    block_ids: list = field(default_factory=list)  # the engine block table (group 0)
    saved: int = 0        # kvtier blocks saved or known cached
    saves_planned: bool = False
    started: bool = False
    adapter: tuple = None  # the LoRA's (name, path), or None: which namespaces
    may_load: bool = True  # the request's opt-out (kv_transfer_params, skip_reading_prefix_cache)
    may_save: bool = True
    engine_hashes: list = None  # vLLM's block hashes of the request (for KV events), when it has them
    lora_id: int = None
    pending_since: float = 0.0  # when the lookup in flight was sent (time.monotonic)
    stored_pending: list = field(default_factory=list)  # (first, end) kvtier blocks saved, not yet reported


def engine_blocks(state, first, end, per_block):
    """Engine block ids of kvtier blocks [first, end), or None when the
    block table does not reach that far."""
    if len(state.block_ids) < end * per_block:
        return None
    return [state.block_ids[i * per_block:(i + 1) * per_block] for i in range(first, end)]


def plan_save(state, computed_tokens, per_block, block_tokens):
    """The SaveSpec for kvtier blocks the step completes, or None."""
    full = min(computed_tokens, len(state.tokens)) // block_tokens
    if full <= state.saved:
        return None
    ids = engine_blocks(state, state.saved, full, per_block)
    if ids is None:
        return None
    first = state.saved
    spec = SaveSpec(state.req_id, first, [k[first:full] for k in state.keys],
                    [k[first - 1] if first > 0 else None for k in state.keys], ids, state.adapter)
    state.saved = full
    state.saves_planned = True
    return spec


def plan_load(state, per_block):
    """The LoadSpec decided at allocation, or None."""
    if state.load is None:
        return None
    first, end, skip = state.load
    state.load = None
    ids = engine_blocks(state, first, end, per_block)
    if ids is None or end <= first:
        return None
    return LoadSpec(state.req_id, first, [k[first:end] for k in state.keys], ids, skip, state.adapter)
