"""Request (vllm/v1/request.py @003df296), its parameters, and block hashing
(vllm/v1/core/kv_cache_utils.py @003df296)."""

from __future__ import annotations

import enum
import hashlib
import os
import pickle
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence


# --------------------------------------------------------------------------
# Request (vllm/v1/request.py @003df296) and block hashing
# (vllm/v1/core/kv_cache_utils.py @003df296).
# --------------------------------------------------------------------------

class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    WAITING_FOR_STREAMING_REQ = enum.auto()  # a streaming-input session parked between input chunks
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    # Everything after PREEMPTED is a finished state.
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()

    @staticmethod
    def is_finished(status: "RequestStatus") -> bool:
        return status > RequestStatus.PREEMPTED


_FINISH_REASON = {RequestStatus.FINISHED_STOPPED: "stop", RequestStatus.FINISHED_LENGTH_CAPPED: "length",
                  RequestStatus.FINISHED_ABORTED: "abort", RequestStatus.FINISHED_IGNORED: "length",
                  RequestStatus.FINISHED_ERROR: "error", RequestStatus.WAITING_FOR_STREAMING_REQ: "stop"}


class ConstantList(Sequence):
    """Read-only view of a list (vllm.utils.ConstantList)."""

    def __init__(self, x: list):
        self._x = x

    def __getitem__(self, item):
        return self._x[item]

    def __len__(self):
        return len(self._x)

    def __iter__(self):
        return iter(self._x)

    def __contains__(self, item):
        return item in self._x

    def index(self, item, *args):
        return self._x.index(item, *args)

    def copy(self) -> list:
        return list(self._x)

    def __eq__(self, other):
        return list(self._x) == list(other)

    def __repr__(self):
        return f"ConstantList({self._x!r})"

    def _refuse(self, *args, **kwargs):
        raise TypeError("Cannot modify a ConstantList")

    append = extend = insert = pop = remove = clear = sort = reverse = __setitem__ = __delitem__ = _refuse


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0
    stop_token_ids: list = field(default_factory=list)
    prompt_logprobs: Optional[int] = None
    skip_reading_prefix_cache: Optional[bool] = None
    extra_args: Optional[dict] = None


@dataclass
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""


@dataclass
class PlaceholderRange:
    offset: int
    length: int


@dataclass
class MultiModalFeatureSpec:
    identifier: str
    mm_position: PlaceholderRange
    modality: str = "image"
    data: Any = None


BlockHash = bytes  # vLLM: NewType("BlockHash", bytes)


def sha256_hash(obj: Any) -> bytes:
    """vLLM's "sha256" prefix-caching hash: sha256 over a pickle of the object."""
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def init_none_hash(hash_fn: Callable = sha256_hash) -> bytes:
    """NONE_HASH (the parent of a request's first block): os.urandom(32) unless PYTHONHASHSEED is set.
    In vLLM it is one per process, so `request.block_hashes` differ between engine instances unless
    PYTHONHASHSEED is fixed; here each MiniEngine draws its own (or takes `none_hash=`)."""
    seed = os.environ.get("PYTHONHASHSEED")
    return os.urandom(32) if seed is None else hash_fn(seed)


def hash_block_tokens(hash_fn: Callable, parent_block_hash: Optional[bytes], curr_block_token_ids: Sequence[int],
                      extra_keys: Optional[tuple] = None, none_hash: bytes = b"") -> BlockHash:
    if not parent_block_hash:
        parent_block_hash = none_hash
    return hash_fn((parent_block_hash, tuple(curr_block_token_ids), extra_keys))


def generate_block_hash_extra_keys(request: "Request", start_token_idx: int, end_token_idx: int) -> Optional[tuple]:
    """LoRA name, (mm identifier, offset - block start) of overlapping mm items, cache_salt on block 0."""
    keys: list = []
    if request.lora_request is not None:
        keys.append(request.lora_request.lora_name)
    for f in request.mm_features:
        off, n = f.mm_position.offset, f.mm_position.length
        if off < end_token_idx and off + n > start_token_idx:
            keys.append((f.identifier, off - start_token_idx))
    if start_token_idx == 0 and request.cache_salt:
        keys.append(request.cache_salt)
    return tuple(keys) if keys else None


def get_request_block_hasher(block_size: int, hash_fn: Callable, none_hash: bytes) -> Callable:
    """Returns f(request) -> the hashes of the request's full blocks not hashed yet."""
    def request_block_hasher(request: "Request") -> list:
        start = len(request.block_hashes) * block_size
        parent = request.block_hashes[-1] if request.block_hashes else None
        new = []
        while start + block_size <= request.num_tokens:
            end = start + block_size
            extra = generate_block_hash_extra_keys(request, start, end)
            parent = hash_block_tokens(hash_fn, parent, request.all_token_ids[start:end], extra, none_hash)
            new.append(parent)
            start = end
        return new
    return request_block_hasher


class Request:
    """vllm/v1/request.py @003df296: the attributes a connector reads."""

    def __init__(self, request_id: str, prompt_token_ids: Sequence[int],
                 sampling_params: Optional[SamplingParams] = None, *, cache_salt: Optional[str] = None,
                 lora_request: Optional[LoRARequest] = None, mm_features: Optional[list] = None,
                 block_hasher: Optional[Callable] = None, priority: int = 0, arrival_time: float = 0.0,
                 eos_token_id: Optional[int] = None, client_index: int = 0, resumable: bool = False):
        self.request_id = request_id
        # Streaming input: a resumable request takes further input chunks under its id
        # (Scheduler.add_request); streaming_queue holds those that came while it ran.
        self.resumable = resumable
        self.streaming_queue = None
        self.client_index = client_index
        self.priority = priority
        self.arrival_time = arrival_time
        self.sampling_params = sampling_params or SamplingParams()
        self.pooling_params = None
        self.eos_token_id = eos_token_id
        self.lora_request = lora_request
        self.structured_output_request = None
        self.use_structured_output = False
        self.status = RequestStatus.WAITING
        self.stop_reason = None
        self.max_tokens = self.sampling_params.max_tokens
        extra = self.sampling_params.extra_args or {}
        self.kv_transfer_params: Optional[dict] = extra.get("kv_transfer_params")
        self.prompt_token_ids: list = list(prompt_token_ids)
        self.prompt_embeds = None
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self._output_token_ids: list = []
        self._all_token_ids: list = list(self.prompt_token_ids)
        # Async scheduling (vllm/v1/request.py, as AsyncScheduler @014b2350 reads it): output tokens of
        # steps in flight, and in-flight outputs to drop (after a forced preemption); whether the
        # last scheduled step was a partial prefill (no token sampled).
        self.num_output_placeholders = 0
        self.async_tokens_to_discard = 0
        self.is_prefill_chunk = False
        self.spec_token_ids: list = []
        self.num_computed_tokens = 0
        self.cache_salt = cache_salt
        self.mm_features: list = list(mm_features or [])
        self.has_encoder_inputs = False
        self.num_preemptions = 0
        self.block_hashes: list = []
        self._block_hasher = block_hasher
        self.skip_reading_prefix_cache = bool(self.sampling_params.skip_reading_prefix_cache) or (
            self.sampling_params.prompt_logprobs is not None)
        self.update_block_hashes()

    @property
    def output_token_ids(self) -> ConstantList:
        return ConstantList(self._output_token_ids)

    @property
    def all_token_ids(self) -> ConstantList:
        return ConstantList(self._all_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self._all_token_ids) + len(self.spec_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_token_ids)

    def update_block_hashes(self) -> None:
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))

    def append_output_token_ids(self, token_ids) -> None:
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        self._output_token_ids.extend(token_ids)
        self._all_token_ids.extend(token_ids)
        self.update_block_hashes()

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finished_reason(self) -> Optional[str]:
        return _FINISH_REASON.get(self.status)

    def __repr__(self):
        return f"Request({self.request_id!r}, status={self.status.name}, computed={self.num_computed_tokens})"


@dataclass
class StreamingUpdate:
    """The next input chunk of a streaming-input session (vllm/v1/request.py): a request sent
    again under the session's id. None stands for the end of the session. Simplified: the chunk's
    `resumable` says whether more chunks follow (vLLM closes a session with a final sentinel)."""
    prompt_token_ids: list
    mm_features: list
    sampling_params: SamplingParams
    resumable: bool

    @classmethod
    def from_request(cls, request: "Request") -> Optional["StreamingUpdate"]:
        if not request.prompt_token_ids:
            return None
        return cls(list(request.prompt_token_ids), list(request.mm_features), request.sampling_params,
                   request.resumable)
