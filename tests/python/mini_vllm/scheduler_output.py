"""Scheduler output (vllm/v1/core/sched/output.py @00e8f1fd) and yield_req_data.

The Mamba "align" boundary-state offers ({req_id: [(group_id, block_id, boundary_tokens)]}, see
Scheduler) have two spellings, one per vLLM version (VllmConfig.vllm_version):
  0.28  SchedulerOutput.partial_tail_offloads (None when there are none), a plain field;
  0.29  SchedulerOutput.kv_connector_block_state: KVConnectorBlockState(block_ids,
        boundary_state_offloads), "Scheduler-local; always None by the time this reaches a
        worker".
Read from stored copies of vllm/v1/core/sched/output.py of those versions (the store names no
upstream commit for either; 0.29's KVConnectorBlockState is stored in two forms, block_ids as a
dict of snapshots or resolved on access through get_block_ids: this one has both). Each version's
SchedulerOutput has only its own field (SchedulerOutputV028, SchedulerOutputV029), so a connector
that probes for one spelling sees what that vLLM has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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


@dataclass
class KVConnectorBlockState:
    """Scheduler-local block state offered to a producer-side KV connector (vLLM 0.29):
    block_ids, snapshots of the current block tables (one list per group) of the requests
    scheduled in the step and of those with an offer; boundary_state_offloads, the exact Mamba
    "align" boundary-state hand-offs {req_id: [(group_id, block_id, boundary_tokens)]}."""
    block_ids: dict = field(default_factory=dict)
    boundary_state_offloads: dict = field(default_factory=dict)

    def get_block_ids(self, req_id: str) -> Optional[tuple]:
        return self.block_ids.get(req_id)


@dataclass
class SchedulerOutputV028(SchedulerOutput):
    """vLLM 0.28: the boundary-state offers as partial_tail_offloads."""
    partial_tail_offloads: Optional[dict] = None


@dataclass
class SchedulerOutputV029(SchedulerOutput):
    """vLLM 0.29: the offers (and table snapshots) in the scheduler-local kv_connector_block_state."""
    kv_connector_block_state: Optional[KVConnectorBlockState] = None


VLLM_VERSIONS = ("0.28", "0.29")


def scheduler_output_class(vllm_version: str) -> type:
    """The SchedulerOutput class of a vLLM version of VLLM_VERSIONS."""
    if vllm_version == "0.28":
        return SchedulerOutputV028
    if vllm_version == "0.29":
        return SchedulerOutputV029
    raise ValueError(f"vllm_version {vllm_version!r} is not one of {VLLM_VERSIONS}")


def yield_req_data(scheduler_output: SchedulerOutput) -> Iterator[tuple]:
    """kv_connector/utils.py @00f4240e: (req_id, new_block_id_groups, preempted) for every scheduled request."""
    for req_data in scheduler_output.scheduled_new_reqs:
        yield req_data.req_id, req_data.block_ids, False
    cached = scheduler_output.scheduled_cached_reqs
    yield from zip(cached.req_ids, cached.new_block_ids, (r in cached.resumed_req_ids for r in cached.req_ids))
