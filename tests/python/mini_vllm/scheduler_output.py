"""Scheduler output (vllm/v1/core/sched/output.py @00e8f1fd) and yield_req_data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Optional

from .connector_api import KVConnectorMetadata
from .request import LoRARequest, Request, SamplingParams


# --------------------------------------------------------------------------
# Scheduler output (vllm/v1/core/sched/output.py @00e8f1fd).
# --------------------------------------------------------------------------

@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: Optional[list]
    mm_features: list
    sampling_params: Optional[SamplingParams]
    pooling_params: Any
    block_ids: tuple  # one list per KV-cache group; ALL blocks of the request (local hit + new)
    num_computed_tokens: int  # before this step (local + external hit)
    lora_request: Optional[LoRARequest]
    prompt_embeds: Any = None
    prefill_token_ids: Optional[list] = None

    @classmethod
    def from_request(cls, request: Request, block_ids: tuple) -> "NewRequestData":
        return cls(req_id=request.request_id, prompt_token_ids=list(request.prompt_token_ids),
                   mm_features=list(request.mm_features), sampling_params=request.sampling_params,
                   pooling_params=request.pooling_params, block_ids=block_ids,
                   num_computed_tokens=request.num_computed_tokens, lora_request=request.lora_request)


@dataclass
class CachedRequestData:
    req_ids: list
    resumed_req_ids: set  # for these, new_block_ids is the full block list (replace, not append)
    new_token_ids: list  # pipeline parallel only: empty here
    all_token_ids: dict  # req_id -> all tokens, only for requests not scheduled in the prior step
    new_block_ids: list  # per req: tuple of lists, or None when no new blocks
    num_computed_tokens: list  # before this step
    num_output_tokens: list

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    @classmethod
    def make_empty(cls) -> "CachedRequestData":
        return cls([], set(), [], {}, [], [], [])


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict
    scheduled_encoder_inputs: dict
    num_common_prefix_blocks: list
    finished_req_ids: set  # finished since the previous step (abort, stop, length)
    free_encoder_mm_hashes: list
    preempted_req_ids: Optional[set] = None
    has_sync_kv_loads: bool = False
    has_structured_output_requests: bool = False
    new_block_ids_to_zero: Optional[list] = None
    kv_connector_metadata: Optional[KVConnectorMetadata] = None


def yield_req_data(scheduler_output: SchedulerOutput) -> Iterator[tuple]:
    """kv_connector/utils.py @00f4240e: (req_id, new_block_id_groups, preempted) for every scheduled request."""
    for req_data in scheduler_output.scheduled_new_reqs:
        yield req_data.req_id, req_data.block_ids, False
    cached = scheduler_output.scheduled_cached_reqs
    yield from zip(cached.req_ids, cached.new_block_ids, (r in cached.resumed_req_ids for r in cached.req_ids))
