"""Recurrent state (Mamba/GDN layers of hybrid models) for the kvtier vLLM
connector's workers.

In vLLM's Mamba "align" prefix-caching mode a recurrent layer keeps its
state after the first k blocks of a request in engine block ``table[k-1]``
of its KV cache group, and vLLM offers the blocks of states committed at a
block boundary to connectors (``boundary_state_offloads``; see
_vllm_plan.step_offers). Each layer's cache is a 4-D view
``[num_blocks, 1, 1, state_bytes]`` (one head slot, one state per block; a
padded page only widens the block stride). kvtier stores the state after
kvtier block b - 1 under key b - 1 of a namespace of object_kind
``recurrent_state``: per layer a span of the namespace's
``block_tokens * bytes_per_token_per_layer`` bytes, the state first and
zeros after it.

A state is never read from a position in the block table: the table is
not append-only in "align" mode (superseded states are freed and nulled),
so saves use only vLLM's offers, and a load writes the one block vLLM
allocated at the end of the hit.

Saves run in wait_for_save, after the forward pass that may have written
the state; loads run in start_load_kv, before the forward pass (vLLM's
recurrent layers do not call the per-layer connector hooks). Both copy a
few hundred kilobytes per request and layer at most.

Thread: vLLM's worker thread calls everything here; commits go to the
worker's committer thread.
"""

import logging
import warnings

import torch

import kvtier
from kvtier.integrations._kv_layout import Unsupported

logger = logging.getLogger("kvtier.vllm")


def describe_state(tensor, num_blocks, state_bytes):
    """Checks one recurrent layer's cache: a 4-D view [num_blocks, 1, 1, C]
    whose blocks hold `state_bytes` bytes each; Unsupported otherwise (older
    vLLM handed such layers a list of conv and SSM tensors)."""
    if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4:
        shape = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise Unsupported(f"a recurrent-state cache of form {shape} (kvtier stores the 4-D per-block state views "
                          f"of vLLM 0.28 and later)")
    if tensor.shape[0] != num_blocks or tensor.shape[1] != 1 or tensor.shape[2] != 1:
        raise Unsupported(f"a recurrent-state view of shape {tuple(tensor.shape)} is not one state per block of "
                          f"{num_blocks} blocks")
    block_bytes = tensor.shape[3] * tensor.element_size()
    if block_bytes != state_bytes or tensor.stride(3) != 1:
        raise Unsupported(f"a recurrent-state block of {block_bytes} bytes (stride {tensor.stride(3)}), the "
                          f"MambaSpec's state is {state_bytes}")


def _block_bytes(tensor, block_id):
    """The bytes of one block's state, as a uint8 view of the engine tensor."""
    return tensor[block_id].reshape(-1).view(torch.uint8)


def _span_tensor(span):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only spans: we only read them
        return torch.frombuffer(span, dtype=torch.uint8)


class StateMover:
    """Saves and loads the recurrent-state groups of one worker."""

    def __init__(self, worker):
        self._worker = worker
        self._layers = {}  # group -> [tensor of each layer, in the group's layer order]

    @property
    def groups(self):
        return list(self._layers)

    def register(self, group, kv_caches, num_blocks):
        """Checks and keeps the caches of one state group's layers."""
        tensors = []
        for name in group.layer_names:
            describe_state(kv_caches[name], num_blocks, group.page_bytes)
            tensors.append(kv_caches[name])
        self._layers[group.index] = tensors

    def save(self, state_saves):
        """Copies each offered state into reserved arena space and hands the
        commit to the committer thread. A state that cannot be saved is a
        later miss, never an error of the step."""
        w = self._worker
        for spec in state_saves:
            keys = spec.keys[w._ns(spec.group)]
            tensors = self._layers.get(spec.group)
            client = w.client_for(spec.adapter)
            if not keys or tensors is None or client is None:
                continue
            try:
                save = client.begin_save(spec.group, keys, chain=False)
            except kvtier.Error as e:
                logger.warning("kvtier: state save of %s not started: %s", spec.req_id, e)
                continue
            if not save.status(0).ok:  # already stored, or no space
                save.abort()
                continue
            try:
                for layer, tensor in enumerate(tensors):
                    dst = _span_tensor(save.layer_span(0, layer))
                    src = _block_bytes(tensor, spec.block_id)
                    dst[:src.numel()].copy_(src)  # a device tensor copies to the host here
                    dst[src.numel():].zero_()
                    del dst  # the span's memoryview must be free before the commit
                    save.layer_written(layer)
            except kvtier.Error as e:
                logger.warning("kvtier: state save of %s dropped: %s", spec.req_id, e)
                save.abort()
                continue
            w.account_save(spec.group, 1)
            w.commit(save, spec.req_id)

    def load(self, loads):
        """Copies the state after each load's last block into the engine
        block vLLM allocated for it, before the forward pass. Returns the
        loads that failed (their every engine block is to be recomputed)."""
        failed = []
        for spec in loads:
            for group, tensors in self._layers.items():
                span = spec.groups[group]
                if not span.block_ids or not self._load_one(spec, group, span.block_ids[-1][-1], tensors):
                    failed.append(spec)
                    break
        return failed

    def _load_one(self, spec, group, block_id, tensors):
        w = self._worker
        keys = spec.keys[w._ns(group)]
        client = w.client_for(spec.adapter)
        if client is None or len(keys) != 1:
            return False
        try:
            load = client.begin_load(group, keys, deadline=w._g.load_deadline)
        except kvtier.Error as e:
            logger.warning("kvtier: state load of %s failed: %s", spec.req_id, e)
            return False
        try:
            for layer, tensor in enumerate(tensors):
                load.wait_layer(layer)
                if not load.status(0).ok:
                    return False
                dst = _block_bytes(tensor, block_id)
                src = _span_tensor(load.layer_span(0, layer))
                dst.copy_(src[:dst.numel()])
                del src
            ok = load.status(0).ok
        except kvtier.Error as e:
            logger.warning("kvtier: state load of %s failed: %s", spec.req_id, e)
            ok = False
        finally:
            try:
                load.end()
            except kvtier.Error:
                pass  # the pins ended with the connection
        if ok:
            w.account_load(group, 1)
        return ok

