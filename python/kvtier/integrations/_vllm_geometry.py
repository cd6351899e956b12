"""What the scheduler side and every worker of the kvtier vLLM connector
derive from vLLM's configuration alone, so that the scheduler's keys and
the workers' namespaces agree without talking to each other.

Geometry raises Unsupported (a reason in words) for a configuration kvtier
cannot cache faithfully; the connector then serves without the cache.
Read against vllm-project/vllm: vllm/v1/kv_cache_interface.py (the newest
stored version: AttentionSpec with head_size_v, kv_quant_mode,
page_size_padded, tokens_per_state; MLAAttentionSpec with head_size_v = 0;
KVCacheTensor with layer_stride / block_stride), vllm/config/kv_transfer.py
and vllm/distributed/utils.py (get_pp_indices).
"""

import os
from dataclasses import dataclass

import kvtier
from kvtier.integrations._kv_layout import Unsupported

# kv_quant_mode values whose cache holds every byte a load needs: none, and
# fp8 with one scale per tensor (a layer constant, kept in the weights).
_STORABLE_QUANT_MODES = (0, 1)


def extra_config(vllm_config):
    config = vllm_config.kv_transfer_config
    return dict(getattr(config, "kv_connector_extra_config", None) or {})


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def _element_size(dtype):
    import torch
    return torch.empty((), dtype=dtype).element_size() if isinstance(dtype, torch.dtype) else int(dtype)


def _is_a(spec, class_name):
    return any(c.__name__ == class_name for c in type(spec).__mro__)


def unpadded_page_bytes(spec):
    """Bytes of one block of one layer, without page padding: from the spec
    as each vLLM version computes it (real_page_size_bytes where it exists)."""
    page = getattr(spec, "real_page_size_bytes", None)
    return int(page if page is not None else spec.page_size_bytes)


def _transferred_groups(kv_cache_config):
    return [g for g in kv_cache_config.kv_cache_groups if getattr(g, "enable_kv_transfer", True)]


def _layer_spec(spec):
    """The per-layer spec of a group (UniformTypeKVCacheSpecs wraps several
    equal ones), or Unsupported."""
    inner = getattr(spec, "kv_cache_specs", None)
    if inner is None:
        return spec
    specs = list(inner.values())
    if any(s != specs[0] for s in specs[1:]):
        raise Unsupported("the KV cache group mixes layer specs")
    return specs[0]


def pp_partition(total_layers, pp_size):
    """Decoder layers of each pipeline stage as vLLM splits them: vLLM's own
    get_pp_indices when vLLM is importable, else its rule (an even split;
    the remainder goes one layer each to the stages before the last,
    starting from the second to last; VLLM_PP_LAYER_PARTITION overrides)."""
    try:
        from vllm.distributed.utils import get_pp_indices
        return [(lambda r: r[1] - r[0])(get_pp_indices(total_layers, p, pp_size)) for p in range(pp_size)]
    except ImportError:
        pass
    explicit = os.environ.get("VLLM_PP_LAYER_PARTITION")
    if explicit:
        parts = [int(x) for x in explicit.split(",")]
        if len(parts) != pp_size or sum(parts) != total_layers:
            raise Unsupported(f"VLLM_PP_LAYER_PARTITION={explicit!r} does not split {total_layers} layers "
                              f"into {pp_size} stages")
        return parts
    parts = [total_layers // pp_size] * pp_size
    for i in range(2, total_layers % pp_size + 2):
        parts[-i] += 1
    return parts


@dataclass
class GroupGeometry:
    """One KV cache group of vLLM's (hybrid) KV cache manager: its layers,
    page, and the window of its attention (None: full attention)."""
    index: int
    layer_names: list
    page_bytes: int
    bytes_per_token: int
    dtype: str
    mla: bool
    window_tokens: int = None
    stage_layers: list = None  # KV layers of this group in each pipeline stage
    vllm_index: int = None     # the group's index among all of vLLM's KV cache groups
    state: bool = False        # recurrent state (Mamba/GDN): one state per block boundary, not per token

    @property
    def object_kind(self):
        return "recurrent_state" if self.state else "kv"


def state_bytes(spec):
    """Bytes of one recurrent state of one layer (a MambaSpec's shapes and
    dtypes; its page may be padded beyond them)."""
    import torch
    return sum(int(torch.Size(shape).numel()) * _element_size(dtype) for shape, dtype in zip(spec.shapes, spec.dtypes))


def _state_group(index, group, spec, cache_config, block_tokens):
    """The GroupGeometry of a recurrent-state (Mamba/GDN) group. Only vLLM's
    "align" prefix-caching mode keeps a state at block boundaries and offers
    it to connectors; any other mode is Unsupported."""
    mode = getattr(cache_config, "mamba_cache_mode", None) or getattr(spec, "mamba_cache_mode", None)
    if mode != "align":
        raise Unsupported(f"a {type(spec).__name__} KV cache group (recurrent state) needs vLLM's mamba_cache_mode "
                          f"'align' (prefix caching on), not {mode!r}")
    size = state_bytes(spec)
    if size <= 0:
        raise Unsupported(f"a {type(spec).__name__} KV cache group of no state bytes")
    dtype = "_".join(_dtype_name(d) for d in spec.dtypes)
    # One state per kvtier block, stored as the namespace's per-layer span
    # (block_tokens * bytes_per_token bytes, the state first, zeros after).
    return GroupGeometry(index, list(group.layer_names), size, -(-size // block_tokens), dtype, False, state=True)


def _group(index, group, cache_config, block_tokens):
    """The GroupGeometry of one transferred group, or Unsupported."""
    spec = _layer_spec(group.kv_cache_spec)
    if _is_a(spec, "MambaSpec"):
        return _state_group(index, group, spec, cache_config, block_tokens), spec
    if not hasattr(spec, "num_kv_heads") or not hasattr(spec, "head_size"):
        raise Unsupported(f"a {type(spec).__name__} KV cache group (only attention, MLA and Mamba-style "
                          f"recurrent state are stored)")
    quant = int(getattr(spec, "kv_quant_mode", 0) or 0)
    if quant not in _STORABLE_QUANT_MODES:
        raise Unsupported(f"KV quantization mode {quant} keeps scales kvtier does not store")
    if getattr(cache_config, "calculate_kv_scales", False):
        raise Unsupported("calculate_kv_scales: KV scales computed per run would not match stored blocks")
    if getattr(spec, "tokens_per_state", 1) != 1:
        raise Unsupported(f"{spec.tokens_per_state} tokens per stored state (compressed KV)")
    if getattr(spec, "attention_chunk_size", None):
        raise Unsupported("chunked local attention")
    page = unpadded_page_bytes(spec)
    if page % spec.block_size:
        raise Unsupported(f"a page of {page} bytes is no whole number of bytes per token")
    window = getattr(spec, "sliding_window", None) if _is_a(spec, "SlidingWindowSpec") else None
    return GroupGeometry(index, list(group.layer_names), page, page // spec.block_size, _dtype_name(spec.dtype),
                         _is_a(spec, "MLAAttentionSpec"), window), spec


class Geometry:
    """Everything both sides derive from the configuration alone. Raises
    Unsupported (one reason) for what kvtier cannot store faithfully: a
    group that is not attention, MLA or Mamba-style recurrent state,
    recurrent state outside vLLM's "align" mode, quantized KV with scales
    outside the cache, decode or prefill context parallelism, compressed
    states, chunked local attention, groups of different block sizes, or
    no model revision. Several groups (vLLM's hybrid KV cache manager: full
    attention, sliding window, recurrent state) get one namespace each; a
    recurrent-state group's namespace has object_kind "recurrent_state" and
    holds one state per kvtier block, the state after that block."""

    def __init__(self, vllm_config, kv_cache_config, pp_rank=0):
        """`kv_cache_config` is that of pipeline stage `pp_rank` (the
        scheduler's is stage 0's)."""
        extra = extra_config(vllm_config)
        model = vllm_config.model_config
        parallel = vllm_config.parallel_config
        self.revision = extra.get("model_revision") or getattr(model, "revision", None)
        if not self.revision:
            raise Unsupported("no model revision (set kv_connector_extra_config.model_revision or --revision): "
                              "a model update would be served stale KV")
        for name in ("decode_context_parallel_size", "prefill_context_parallel_size"):
            if getattr(parallel, name, 1) > 1:
                raise Unsupported(f"{name} = {getattr(parallel, name)} (context-parallel KV shards are not stored)")
        transferred = _transferred_groups(kv_cache_config)
        if not transferred:
            raise Unsupported("no KV cache group to transfer")
        specs = [_layer_spec(g.kv_cache_spec) for g in transferred]
        if len({s.block_size for s in specs}) != 1:
            raise Unsupported(f"KV cache groups of block sizes {sorted({s.block_size for s in specs})}")
        self.engine_block = specs[0].block_size
        self.num_blocks = kv_cache_config.num_blocks
        default_tokens = max(1, 256 // self.engine_block) * self.engine_block
        self.block_tokens = int(extra.get("block_tokens", default_tokens))
        if self.block_tokens <= 0 or self.block_tokens % self.engine_block:
            raise Unsupported(f"block_tokens {self.block_tokens} is not a multiple of vLLM's block size "
                              f"{self.engine_block}")
        self.per_block = self.block_tokens // self.engine_block
        self.groups = [_group(i, g, vllm_config.cache_config, self.block_tokens)[0] for i, g in enumerate(transferred)]
        all_groups = list(kv_cache_config.kv_cache_groups)
        for g, group in zip(self.groups, transferred):
            g.vllm_index = next(i for i, other in enumerate(all_groups) if other is group)
        attention = [g for g in self.groups if not g.state]
        if len({g.mla for g in attention}) > 1:
            raise Unsupported("MLA and non-MLA KV cache groups together")
        self.mla = any(g.mla for g in attention) or bool(getattr(model, "use_mla", False))
        self.form = self._form(kv_cache_config, extra)
        self.tp_size = getattr(parallel, "tensor_parallel_size", 1)
        self.pp_size = getattr(parallel, "pipeline_parallel_size", 1)
        self._stage_layer_counts(vllm_config, extra, pp_rank)
        self.model_id = model.model
        self.socket_path = extra.get("socket_path", "/run/kvtier/kvtierd.sock")
        self.call_timeout = float(extra.get("call_timeout", 30.0))
        self.connect_timeout = float(extra.get("connect_timeout", 5.0))
        self.lookup_timeout = float(extra.get("lookup_timeout", 2.0))
        # A load's deadline (s): blocks not in place by then fail and are
        # recomputed (about what recomputing 8k tokens takes on an A100); 0: none.
        self.load_deadline = float(extra.get("load_deadline", 1.0))
        if self.load_deadline < 0:
            raise Unsupported("kv_connector_extra_config.load_deadline must be >= 0 (seconds)")
        self.reconnect_s = float(extra.get("reconnect_interval", 5.0))
        self.use_directory = bool(extra.get("use_directory", True))
        self.verify_checksums = bool(extra.get("verify_checksums", False))
        self.layerwise = layerwise(extra)
        # Prefill/decode hand-off (_vllm_handoff.py): this node's peer address
        # named in P's kv_transfer_params, how long D waits for the blocks P
        # announced, whether D loads them asynchronously.
        self.peer = str(extra["peer"]) if extra.get("peer") else None
        self.handoff_wait = float(extra.get("handoff_wait", 1.0))
        self.handoff_async = flag(extra, "handoff_async", True)
        # P's side: a hand-off's blocks leave P's kvtierd once D has read them.
        self.handoff_free = flag(extra, "handoff_free_source", False)
        # Save the blocks decoding fills too, not only the prompt's.
        self.save_decode = flag(extra, "save_decode", False)
        self.engine_id = getattr(getattr(vllm_config, "kv_transfer_config", None), "engine_id", None)
        scheduler = getattr(vllm_config, "scheduler_config", None)
        concurrent = max(self.pp_size, 2 if getattr(scheduler, "async_scheduling", False) else 1)
        self.steps_ahead = concurrent - 1  # steps vLLM may schedule before it processes one's output

    @property
    def layer_names(self):
        """Every transferred layer, group by group."""
        return [name for g in self.groups for name in g.layer_names]

    def _form(self, kv_cache_config, extra):
        """The byte form of the tensors this vLLM hands the workers: current
        vLLM's KVCacheTensor has a layer stride and gives 4-D views (nhc);
        older vLLM gives 5-D tensors (kv_layout says which, FlashAttention's
        kv_first by default) or, for MLA, the 3-D form (nhc)."""
        tensors = getattr(kv_cache_config, "kv_cache_tensors", None) or []
        if self.mla or (tensors and hasattr(tensors[0], "layer_stride")):
            return "nhc"
        form = extra.get("kv_layout", "kv_first")
        if form not in ("kv_first", "blocks_first"):
            raise Unsupported(f"kv_layout {form!r} is not kv_first or blocks_first")
        return form

    def _stage_layer_counts(self, vllm_config, extra, own_stage):
        """Each group's KV layers in each pipeline stage. The scheduler's KV
        cache config is stage 0's, so other stages' counts come from vLLM's
        split of the decoder layers, with as many of the group's layers per
        decoder layer as this stage has (or from pp_layer_counts, one count
        per stage, for a model of one group)."""
        if self.pp_size == 1:
            for g in self.groups:
                g.stage_layers = [len(g.layer_names)]
            return
        explicit = extra.get("pp_layer_counts")
        if explicit is not None:
            counts = [int(c) for c in explicit]
            if len(counts) != self.pp_size or min(counts) <= 0 or len(self.groups) != 1:
                raise Unsupported(f"pp_layer_counts {explicit!r} does not give {self.pp_size} stages of one group")
            self.groups[0].stage_layers = counts
            return
        model = vllm_config.model_config
        total = (model.get_total_num_hidden_layers() if hasattr(model, "get_total_num_hidden_layers")
                 else getattr(getattr(model, "hf_text_config", None), "num_hidden_layers", None))
        if not total:
            raise Unsupported("the model's layer count is unknown: set pp_layer_counts")
        parts = pp_partition(int(total), self.pp_size)
        for g in self.groups:
            per_layer, rest = divmod(len(g.layer_names), parts[own_stage])
            if rest or not per_layer:
                raise Unsupported(f"stage {own_stage} has {len(g.layer_names)} KV layers of group {g.index} over "
                                  f"{parts[own_stage]} decoder layers: set pp_layer_counts")
            g.stage_layers = [per_layer * p for p in parts]

    @property
    def stage_layers(self):
        """KV layers of each pipeline stage, all groups together."""
        return [sum(g.stage_layers[p] for g in self.groups) for p in range(self.pp_size)]

    def namespace(self, tp_rank, pp_rank, adapter=None, group=0):
        """One rank's namespace of one group; `adapter` is a LoRA's (name,
        path), or None. MLA's latent cache is the same on every TP rank: one
        namespace for all of them. A model of several groups tags each
        group's namespace with its index."""
        if self.mla:
            tp_rank, tp_size = 0, 1
        else:
            tp_size = self.tp_size
        g = self.groups[group]
        form = "state" if g.state else self.form
        layout = f"vllm_{form}" if len(self.groups) == 1 else f"vllm_{form}_g{group}of{len(self.groups)}"
        ns = kvtier.Namespace(model_id=self.model_id, model_revision=self.revision, kv_dtype=g.dtype,
                              block_tokens=self.block_tokens, layer_count=g.stage_layers[pp_rank],
                              bytes_per_token_per_layer=g.bytes_per_token,
                              kv_layout=layout, tp_rank=tp_rank, tp_size=tp_size,
                              adapter_id=adapter[0] if adapter else "", adapter_revision=adapter[1] if adapter else "",
                              object_kind=g.object_kind)
        ns.pp_rank, ns.pp_size = pp_rank, self.pp_size
        return ns

    def rank_namespaces(self, tp_rank, pp_rank, adapter=None):
        """One rank's namespaces, one per group, in group order."""
        return [self.namespace(tp_rank, pp_rank, adapter, g) for g in range(len(self.groups))]

    def ranks(self):
        """(tp_rank, pp_rank) of every distinct rank namespace set, in index order."""
        tps = 1 if self.mla else self.tp_size
        return [(t, p) for p in range(self.pp_size) for t in range(tps)]

    def rank_index(self, tp_rank, pp_rank):
        """The index into ranks() of a worker's namespaces."""
        return pp_rank * (1 if self.mla else self.tp_size) + (0 if self.mla else tp_rank)

    def ns_index(self, rank_index, group):
        """The index of one rank's namespace of one group in the scheduler's
        namespace list (ranks() order, groups within a rank)."""
        return rank_index * len(self.groups) + group

    def first_read(self, group, end):
        """The first kvtier block the layers of `group` read when computing
        resumes after kvtier block `end`: 0 for full attention, the window's
        first block for sliding-window attention, and for recurrent state the
        state stored with block end - 1 (the state after `end` blocks)."""
        if self.groups[group].state:
            return max(0, end - 1)
        window = self.groups[group].window_tokens
        if not window:
            return 0
        return max(0, end * self.block_tokens - window + 1) // self.block_tokens

    @property
    def state_groups(self):
        """Indices of the recurrent-state groups."""
        return [g.index for g in self.groups if g.state]

    def group_of_vllm(self, vllm_index):
        """The index of the transferred group that is vLLM's group
        `vllm_index`, or None."""
        return next((g.index for g in self.groups if g.vllm_index == vllm_index), None)

    def saves_on(self, tp_rank):
        """Whether the worker of `tp_rank` saves: every rank has its own KV
        heads, but MLA's one latent copy is saved by TP rank 0 only."""
        return not self.mla or tp_rank == 0


def layerwise(extra):
    """Whether loads and saves run per layer inside the forward pass
    (kv_connector_extra_config.layerwise, default true); false moves whole
    blocks in start_load_kv and wait_for_save, which full CUDA graphs allow."""
    return flag(extra, "layerwise", True)


def flag(extra, name, default):
    """A true/false option of kv_connector_extra_config; "false", "0",
    "no" and "off" (any case) are false when given as strings."""
    value = extra.get(name, default)
    if isinstance(value, str):
        return value.strip().lower() not in ("0", "false", "no", "off")
    return bool(value)
