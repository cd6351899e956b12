"""Parallel state (vllm.distributed.parallel_state): the current tensor-parallel rank lives here
and only here (`_PARALLEL`); the engine switches it with `_as_rank`."""

from __future__ import annotations

import contextlib


# --------------------------------------------------------------------------
# Parallel state (vllm.distributed.parallel_state). In vLLM each worker is its
# own process; here the engine sets the "current" rank around every call it
# makes on a worker-side connector (construction included).
# --------------------------------------------------------------------------

class _ParallelState:
    rank = 0
    world_size = 1


_PARALLEL = _ParallelState()


def get_tensor_model_parallel_rank() -> int:
    return _PARALLEL.rank


def get_tensor_model_parallel_world_size() -> int:
    return _PARALLEL.world_size


@contextlib.contextmanager
def _as_rank(rank: int, world_size: int):
    saved = (_PARALLEL.rank, _PARALLEL.world_size)
    _PARALLEL.rank, _PARALLEL.world_size = rank, world_size
    try:
        yield
    finally:
        _PARALLEL.rank, _PARALLEL.world_size = saved
