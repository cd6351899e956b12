#!/usr/bin/env python3
"""The vLLM connector's cost in the forward step, in the mini vLLM harness, on CPU tensors or
(--device cuda) on a GPU.

Not a test (pytest never collects it: the name does not start with test_). Run from the
repository root:

    PYTHONPATH=build/release/python:tests/python KVTIERD=build/release/daemon/kvtierd \\
        OMP_NUM_THREADS=1 /usr/bin/python3 tests/python/bench_vllm_step.py [--json FILE]

What it measures (docs/BENCHMARKS.md, "vLLM connector: the forward step"): the time of
MiniEngine.execute_model (the runner's connector lifecycle, bind .. start_load_kv .. forward with
the per-layer hooks .. wait_for_save .. get_finished) for one prefill step of BenchModel, a cheap
stand-in for a transformer whose per-layer compute is set by --d:

  base       no connector, a fresh prompt of --prompt tokens (the whole prefill in one step);
  miss       the kvtier connector, a fresh prompt: the lookup misses, the step saves every whole
             kvtier block of the prompt (layerwise, and again with layerwise=false);
  recompute  no connector, prompt + --suffix tokens, computed in full;
  local hit  no connector, vLLM's own prefix cache holds the prompt: only the suffix is computed
             (the floor of any hit: nothing to load);
  hit        a second engine with a fresh connector, prompt + suffix: kvtier holds the prompt's
             blocks (saved by the miss engine), the step loads them and computes the suffix.

Ceilings, measured in the same run on the same bytes: the connector moves, per step, the prompt's
kvtier blocks (every layer) between the engine's 4-D KV views and kvtierd's arena. "gather" is
the same strided torch.index_select of the same engine blocks, per kvtier block and layer, into a
preallocated buffer (what the save does, without kvtier); "scatter" the same index_copy_ back into
a cache of the same layout (what the load does); "memcpy" one contiguous torch copy_ of as many
bytes. Every figure is a median over --reps repetitions; the cases of one repetition run
interleaved (their order rotating), after --warmup untimed repetitions.

--device cuda: the model's weights, activations and the engine's KV caches live on the GPU (the
harness allocates them under torch.device("cuda"), torch 2.0 or later), so the connector takes its
CUDA path (side streams, per-layer events, the CUDA-registered arena). Each step ends with a
synchronize, as a real engine's sampling does. The ceilings are then the same operations between
the GPU and page-locked host memory: "gather" is the device-side index_select plus the copy to the
host, "scatter" the copy to the device plus index_copy_, and "memcpy" one contiguous copy of as many
bytes device to host (the save's ceiling) and host to device (the load's), i.e. the PCIe copy
bandwidth of the same bytes in the same run.
"""

import argparse
import contextlib
import cProfile
import gc
import io
import json
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from conftest import Daemon  # noqa: E402  (the suite's kvtierd child; skips only under pytest)
from kvtier.integrations.vllm import KvtierConnector  # noqa: E402
from mini_vllm import MiniEngine, make_kv_cache_config, make_vllm_config  # noqa: E402
from mini_vllm.kv_cache_interface import allocate_kv_caches  # noqa: E402
from tiny_model import AttnMetadata  # noqa: E402

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
WORKER_HOOKS = ("bind_connector_metadata", "start_load_kv", "wait_for_layer_load", "save_kv_layer",
                "wait_for_save", "get_finished", "get_block_ids_with_load_errors", "get_kv_connector_stats",
                "clear_connector_metadata")
SCHEDULER_HOOKS = ("on_new_request", "get_num_new_matched_tokens", "update_state_after_alloc",
                   "build_connector_meta", "update_connector_output", "request_finished", "take_events")


class BenchModel:
    """A realistic-shape, cheap-to-write stand-in for a decoder's forward pass (the interface of
    tiny_model.TinyDecoder that MiniEngine drives). Per layer, for all new tokens of the step at
    once: the wait hook; a K/V projection x @ W_kv [d, H * (head_size + head_size_v)] written into
    the layer's 4-D cache view [B, H, N, C] at the tokens' slots (one advanced-indexing write per
    shard, no loop per token); a [n, d] x [d, d] matmul standing for the rest of the layer; the save
    hook. The K/V of a token depend only on the token (no attention): a loaded prefix must hold the
    very bytes the saving engine computed, which the benchmark checks. Logits: the last token's
    hidden state times W_out, broadcast over the step's tokens (the runner samples the last row)."""

    use_mla = False

    def __init__(self, n_layers, n_kv_heads, head_size, d, block_size, max_positions, dtype, vocab=128, seed=0,
                 device="cpu"):
        self.n_layers, self.n_kv_heads, self.head_size, self.head_size_v = n_layers, n_kv_heads, head_size, head_size
        self.d, self.block_size, self.max_positions, self.vocab, self.seed = d, block_size, max_positions, vocab, seed
        self.kv_dtype = dtype
        self.device = torch.device(device)
        self.attention_layer_names = [f"model.layers.{i}.self_attn.attn" for i in range(n_layers)]
        g = torch.Generator().manual_seed(seed)  # the same weights on every device
        width = n_kv_heads * (head_size + self.head_size_v)
        self.embed = torch.randn(vocab, d, generator=g).to(dtype).to(self.device)
        self.w_kv = [(torch.randn(d, width, generator=g) * d ** -0.5).to(dtype).to(self.device)
                     for _ in range(n_layers)]
        self.w = [(torch.randn(d, d, generator=g) * d ** -0.5).to(dtype).to(self.device) for _ in range(n_layers)]
        self.w_out = (torch.randn(d, vocab, generator=g) * d ** -0.5).to(dtype).to(self.device)
        self._bufs = {}
        self.forward_ms = self.compute_ms = 0.0

    @property
    def num_tp_heads(self):
        return self.n_kv_heads

    def layer_flops(self, tokens):
        return 2 * tokens * self.d * (self.d + self.w_kv[0].shape[1])

    def _slots(self, seq):
        positions = torch.arange(int(seq.positions[0]), int(seq.positions[-1]) + 1)
        table = torch.as_tensor(list(seq.block_table), dtype=torch.int64)
        return table[positions // self.block_size] * self.block_size + positions % self.block_size

    def _buffers(self, n):
        """Preallocated activations for a step of n tokens (two hidden states, the K/V rows), so
        that no step allocates (and page-faults) megabytes of fresh tensors."""
        bufs = self._bufs.get(n)
        if bufs is None:
            width = self.w_kv[0].shape[1]
            bufs = self._bufs[n] = [torch.zeros(n, self.d, dtype=self.kv_dtype, device=self.device),
                                    torch.zeros(n, self.d, dtype=self.kv_dtype, device=self.device),
                                    torch.zeros(n, width, dtype=self.kv_dtype, device=self.device)]
        return bufs

    @torch.no_grad()
    def forward_batch(self, seqs, shards):
        t0 = time.perf_counter()
        cuda = self.device.type == "cuda"
        tokens = torch.cat([torch.as_tensor(list(s.token_ids), dtype=torch.int64) for s in seqs]).to(self.device)
        slots = torch.cat([self._slots(s) for s in seqs]).to(self.device)
        default_meta = AttnMetadata(slots)
        n = len(tokens)
        x, y, kv_rows = self._buffers(n)
        torch.index_select(self.embed, 0, tokens, out=x)
        kv = kv_rows.view(n, self.n_kv_heads, self.head_size + self.head_size_v)
        writes = []  # per shard: (kernel block, token in it) of every new token, the same every layer
        for shard in shards:
            per_block = next(iter(shard.kv_caches.values())).shape[2]  # N of [B, H, N, C]
            writes.append((slots // per_block, slots % per_block))
        compute = 0.0
        spans = []  # CUDA: (start, end) events of each layer's compute, read after the synchronize
        for layer, name in enumerate(self.attention_layer_names):
            for shard in shards:
                if shard.hooks is not None:
                    shard.hooks.wait_for_layer_load(name)
            c0 = time.perf_counter()
            if cuda:
                spans.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
                spans[-1][0].record()
            torch.mm(x, self.w_kv[layer], out=kv_rows)
            for shard, (blocks, offsets) in zip(shards, writes):
                cells = shard.kv_caches[name].transpose(1, 2)  # [B, N, H, C], a view of the engine's tensor
                cells[blocks, offsets] = kv[:, shard.kv_head_start:shard.kv_head_end]
            torch.mm(x, self.w[layer], out=y)
            x, y = y, x
            if cuda:
                spans[-1][1].record()
            compute += time.perf_counter() - c0
            for shard in shards:
                if shard.hooks is not None:
                    shard.hooks.save_kv_layer(name, shard.kv_caches[name], shard.metadata_for(name, default_meta))
        out, start = [], 0
        for s in seqs:
            k = len(s.token_ids)
            last = (x[start + k - 1] @ self.w_out).float()
            out.append(last.expand(k, self.vocab))
            start += k
        if cuda:  # the step's end, as a real engine's sampling waits for it
            torch.cuda.synchronize(self.device)
            compute = sum(a.elapsed_time(b) for a, b in spans) / 1e3
        self.forward_ms = 1e3 * (time.perf_counter() - t0)
        self.compute_ms = 1e3 * compute  # the layers' matmuls and K/V writes, without the hooks
        return out


class HookTimer:
    """Wraps a connector's hooks (instance attributes shadow the class's) to add up the time spent
    in each while `on`, optionally under one cProfile.Profile."""

    def __init__(self):
        self.on = False
        self.ms = {}
        self.profile = None

    def wrap(self, connector, names, prefix):
        for name in names:
            method = getattr(connector, name, None)
            if method is not None:
                setattr(connector, name, self._timed(method, prefix + name))

    def _timed(self, method, key):
        def hook(*args, **kwargs):
            if not self.on:
                return method(*args, **kwargs)
            if self.profile is not None:
                self.profile.enable()
            t0 = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.ms[key] = self.ms.get(key, 0.0) + 1e3 * (time.perf_counter() - t0)
                if self.profile is not None:
                    self.profile.disable()
        return hook

    def take(self):
        ms, self.ms = self.ms, {}
        return ms


class Case:
    """One engine and the samples of its timed steps."""

    def __init__(self, name, engine, timer=None):
        self.name, self.engine, self.timer = name, engine, timer
        self.samples = []  # dicts: exec_ms, schedule_ms, update_ms, other_steps, commit_wait_ms, hooks
        self.last_req = None

    def run(self, prompt, expect_tokens, record):
        """Runs one request of `prompt` (one output token) to the end; returns the sample of the
        step that computed its tokens (the prefill), which must compute `expect_tokens`."""
        engine = self.engine
        req = engine.add_request(prompt, max_tokens=1)
        self.last_req = req.request_id
        sample, other_steps = None, 0
        if self.timer is not None:
            self.timer.take()
        gc.collect()
        while engine.has_requests():
            if self.timer is not None:
                self.timer.on = record or self.timer.profile is not None
            t0 = time.perf_counter()
            so = engine.schedule()
            t1 = time.perf_counter()
            out = engine.execute_model(so)
            t2 = time.perf_counter()
            engine.update_from_output(so, out)
            t3 = time.perf_counter()
            if self.timer is not None:
                self.timer.on = False
            tokens = so.num_scheduled_tokens.get(req.request_id, 0)
            if tokens:
                if tokens != expect_tokens:
                    raise SystemExit(f"{self.name}: the step computed {tokens} tokens, expected {expect_tokens} "
                                     f"(a hit that did not load, or a prompt split over steps)")
                sample = {"exec_ms": 1e3 * (t2 - t1), "forward_ms": engine.model.forward_ms,
                          "compute_ms": engine.model.compute_ms, "schedule_ms": 1e3 * (t1 - t0),
                          "update_ms": 1e3 * (t3 - t2),
                          "hooks": self.timer.take() if self.timer is not None else {}}
                t4 = time.perf_counter()
                for w in engine.worker_connectors:  # the commits of this step's saves (committer thread)
                    if w is not None:
                        w._worker.committer.submit(lambda: None).result(30)
                sample["commit_wait_ms"] = 1e3 * (time.perf_counter() - t4)
            else:
                other_steps += 1
        if sample is None:
            raise SystemExit(f"{self.name}: the request was never scheduled")
        sample["other_steps"] = other_steps
        if record:
            self.samples.append(sample)
        return sample

    def median(self, key):
        return statistics.median(s[key] for s in self.samples)

    def hook_median(self, key):
        return statistics.median(s["hooks"].get(key, 0.0) for s in self.samples)

    def hook_keys(self):
        keys = []
        for s in self.samples:
            keys += [k for k in s["hooks"] if k not in keys]
        return keys


def nhc_view(cache, num_blocks):
    """[num_blocks, r, N, H, C] of a [B, H, N, C] view: what the connector's nhc gather indexes."""
    return cache.permute(0, 2, 1, 3).unflatten(0, (num_blocks, -1))


class Ceilings:
    """Copies of the bytes the connector moves per step, outside kvtier, in the same run."""

    def __init__(self, kv_config, layout, n_layers, per_block, kv_block_bytes):
        self.kv_config, self.n_layers, self.per_block = kv_config, n_layers, per_block
        self.num_blocks = kv_config.num_blocks
        self.scratch = allocate_kv_caches(kv_config, layout=layout)  # a cache of the engine's layout
        self.kv_block_bytes = kv_block_bytes
        self.buffers = {}
        self.samples = {"gather_ms": [], "scatter_ms": [], "scatter_put_ms": [], "scatter_loop_ms": [],
                        "memcpy_ms": [], "h2d_ms": []}

    def _buffer(self, nbytes, key):
        buf = self.buffers.get((key, nbytes))
        if buf is None:
            buf = self.buffers[(key, nbytes)] = torch.ones(nbytes, dtype=torch.uint8)  # pre-faulted
        return buf

    def measure(self, caches, block_ids, dtype, record):
        """block_ids: the engine blocks of the prompt (a multiple of per_block long)."""
        groups = [torch.as_tensor(block_ids[i:i + self.per_block], dtype=torch.int64)
                  for i in range(0, len(block_ids), self.per_block)]
        layer_bytes = self.kv_block_bytes // self.n_layers  # one kvtier block, one layer
        total = layer_bytes * len(groups) * self.n_layers
        device = next(iter(caches.values())).device
        if device.type == "cuda":
            return self._measure_cuda(caches, groups, dtype, layer_bytes, total, device, record)
        dst = self._buffer(total, "dst")
        src = self._buffer(total, "src")
        names = list(caches)
        t0 = time.perf_counter()
        i = 0
        for name in names:  # the save: engine view -> buffer, one index_select per kvtier block and layer
            view = nhc_view(caches[name], self.num_blocks)
            for ids in groups:
                out = dst[i * layer_bytes:(i + 1) * layer_bytes].view(dtype).view(len(ids), *view.shape[1:])
                torch.index_select(view, 0, ids, out=out)
                i += 1
        t1 = time.perf_counter()
        i = 0
        for name in names:  # the load: buffer -> a cache of the same layout, index_copy_
            view = nhc_view(self.scratch[name], self.num_blocks)
            for ids in groups:
                view.index_copy_(0, ids, dst[i * layer_bytes:(i + 1) * layer_bytes].view(dtype)
                                 .view(len(ids), *view.shape[1:]))
                i += 1
        t2 = time.perf_counter()
        src.copy_(dst)  # memcpy of as many bytes
        t3 = time.perf_counter()
        i = 0
        for name in names:  # the load's bytes by advanced-index assignment (index_put_)
            view = nhc_view(self.scratch[name], self.num_blocks)
            for ids in groups:
                view[ids] = dst[i * layer_bytes:(i + 1) * layer_bytes].view(dtype).view(len(ids), *view.shape[1:])
                i += 1
        t4 = time.perf_counter()
        i = 0
        lists = [ids.tolist() for ids in groups]
        for name in names:  # the load's bytes by one copy_ per engine block
            view = nhc_view(self.scratch[name], self.num_blocks)
            for ids in lists:
                rows = dst[i * layer_bytes:(i + 1) * layer_bytes].view(dtype).view(len(ids), *view.shape[1:])
                for j, b in enumerate(ids):
                    view[b].copy_(rows[j])
                i += 1
        t5 = time.perf_counter()
        if record:
            self.samples["gather_ms"].append(1e3 * (t1 - t0))
            self.samples["scatter_ms"].append(1e3 * (t2 - t1))
            self.samples["memcpy_ms"].append(1e3 * (t3 - t2))
            self.samples["scatter_put_ms"].append(1e3 * (t4 - t3))
            self.samples["scatter_loop_ms"].append(1e3 * (t5 - t4))
        return total

    def _measure_cuda(self, caches, groups, dtype, layer_bytes, total, device, record):
        """The same operations between the GPU and page-locked host memory (what the registered arena
        is), each timed from a synchronize to a synchronize."""
        host, spare = (self.buffers.get((key, total)) for key in ("pinned", "pinned spare"))
        if host is None:
            host = self.buffers[("pinned", total)] = torch.ones(total, dtype=torch.uint8).pin_memory()
            spare = self.buffers[("pinned spare", total)] = torch.ones(total, dtype=torch.uint8).pin_memory()
        flat = self.buffers.get(("device", total))
        if flat is None:
            flat = self.buffers[("device", total)] = torch.ones(total, dtype=torch.uint8, device=device)
        groups = [ids.to(device) for ids in groups]
        names = list(caches)

        def rows(i, ids, view):
            return host[i * layer_bytes:(i + 1) * layer_bytes].view(dtype).view(len(ids), *view.shape[1:])

        def timed(fn):
            torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize(device)
            return 1e3 * (time.perf_counter() - t0)

        def each(cache_set, op):
            i = 0
            for name in names:
                view = nhc_view(cache_set[name], self.num_blocks)
                for ids in groups:
                    op(view, ids, rows(i, ids, view))
                    i += 1

        def loop(view, ids, host_rows):
            dev_rows = host_rows.to(device, non_blocking=True)
            for j, b in enumerate(ids.tolist()):
                view[b].copy_(dev_rows[j])

        t = {"gather_ms": timed(lambda: each(caches, lambda v, ids, r: r.copy_(torch.index_select(v, 0, ids),
                                                                                non_blocking=True))),
             "scatter_ms": timed(lambda: each(self.scratch, lambda v, ids, r: v.index_copy_(
                 0, ids, r.to(device, non_blocking=True)))),
             "memcpy_ms": timed(lambda: spare.copy_(flat, non_blocking=True)),  # device to host
             "h2d_ms": timed(lambda: flat.copy_(spare, non_blocking=True)),
             "scatter_put_ms": timed(lambda: each(self.scratch, lambda v, ids, r: v.index_put_(
                 (ids,), r.to(device, non_blocking=True)))),
             "scatter_loop_ms": timed(lambda: each(self.scratch, loop))}
        if record:
            for k, v in t.items():
                self.samples[k].append(v)
        return total

    def median(self, key):
        return statistics.median(self.samples[key]) if self.samples[key] else float("nan")


def allocating_on(device):
    """Where mini vLLM's runner allocates the engine's KV caches: it names no device, so under
    torch.device("cuda") (torch 2.0 or later) they are made on the GPU; on CPU nothing changes."""
    return contextlib.nullcontext() if device == "cpu" else torch.device(device)


def bench_engine(model, socket_path, block_tokens, total, num_blocks, connector=True, prefix_caching=True,
                 layerwise=True, device="cpu"):
    """A mini vLLM engine of `model` with the kvtier connector (connector=False: without), configured
    as the bench's cases are; its KV caches on `device`."""
    cfg = make_vllm_config(
        model, kv_connector="KvtierConnector" if connector else None,
        kv_connector_module_path="kvtier.integrations.vllm",
        kv_connector_extra_config=dict(socket_path=socket_path, block_tokens=block_tokens, layerwise=layerwise),
        kv_load_failure_policy="recompute", enable_prefix_caching=prefix_caching,
        max_num_batched_tokens=total, model_name="kvtier-bench/bench-model")
    with allocating_on(device):
        return MiniEngine(model, cfg, make_kv_cache_config(model, num_blocks), KvtierConnector if connector else None)


def kv_tokens(engine, req_id, n_tokens, model):
    """The K/V bytes of a finished request's first n_tokens, every layer: [layers, tokens, H, C]."""
    ids = engine.finished_block_ids[req_id]
    pos = torch.arange(n_tokens)
    slots = torch.as_tensor(ids, dtype=torch.int64)[pos // model.block_size] * model.block_size + pos % model.block_size
    out = []
    for cache in engine.kv_caches.values():
        slots = slots.to(cache.device)
        cells = cache.transpose(1, 2)
        out.append(cells[slots // cells.shape[1], slots % cells.shape[1]])
    return torch.stack(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-size", type=int, default=64)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16",
                   help="KV cache and compute dtype (bfloat16 matmuls use oneDNN; this torch's float32 BLAS is slow)")
    p.add_argument("--d", type=int, default=1024, help="width of the per-layer [n, d] x [d, d] matmul")
    p.add_argument("--block", type=int, default=16, help="engine (vLLM) block size, tokens")
    p.add_argument("--block-tokens", type=int, default=256, help="kvtier block, tokens")
    p.add_argument("--prompt", type=int, default=2048, help="prompt tokens (saved on a miss, loaded on a hit)")
    p.add_argument("--suffix", type=int, default=256, help="tokens after the prompt that a hit computes")
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--host-bytes", type=int, default=0, help="kvtierd host tier (0: what every save fits in)")
    p.add_argument("--no-whole", action="store_true", help="skip the layerwise=false cases")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="after the timed reps, N more miss and hit steps (layerwise) with cProfile on the "
                        "connector's hooks; prints the top functions by own time")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the model and the KV caches live (cuda: the connector's GPU path, torch 2.0+)")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    if not os.environ.get("KVTIERD"):
        raise SystemExit("set KVTIERD to the kvtierd binary (build/release/daemon/kvtierd)")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device cuda: torch {torch.__version__} here has no usable CUDA device")
    if args.prompt % args.block_tokens or args.block_tokens % args.block:
        raise SystemExit("--prompt must be a multiple of --block-tokens, --block-tokens of --block")
    dtype = DTYPES[args.dtype]
    torch.set_num_threads(1)
    total = args.prompt + args.suffix
    model = BenchModel(args.layers, args.kv_heads, args.head_size, args.d, args.block, total + args.block, dtype,
                       device=args.device)
    per_block = args.block_tokens // args.block
    blocks_per_req = -(-total // args.block) + 1
    num_blocks = 2 * blocks_per_req + 2
    elem = torch.empty((), dtype=dtype).element_size()
    token_layer_bytes = args.kv_heads * 2 * args.head_size * elem
    kv_block_bytes = args.block_tokens * args.layers * token_layer_bytes
    prompt_blocks = args.prompt // args.block_tokens
    modes = [("layerwise", True)] + ([] if args.no_whole else [("whole-block", False)])
    reps = args.warmup + args.reps + args.profile
    # Every block saved in the run fits (each rep saves the prompt's blocks on a miss and the suffix's
    # whole blocks on a hit, per mode): nothing is evicted, so every hit is a hit of the host tier.
    saved = reps * len(modes) * (prompt_blocks + args.suffix // args.block_tokens) * kv_block_bytes
    host_bytes = args.host_bytes or max(256 << 20, saved * 5 // 4 + (64 << 20))

    root = Path(tempfile.mkdtemp(prefix="kvtier-bench-"))
    daemon = Daemon(root, host_bytes, 0, "")
    engines = []
    try:
        def engine(connector, prefix_caching=True, layerwise=True):
            e = bench_engine(model, daemon.socket_path, args.block_tokens, total, num_blocks, connector=connector,
                             prefix_caching=prefix_caching, layerwise=layerwise, device=args.device)
            engines.append(e)
            return e

        timer = HookTimer()

        def connected(name, layerwise):
            e = engine(True, layerwise=layerwise)
            for c in e.worker_connectors:
                timer.wrap(c, WORKER_HOOKS, "worker.")
            timer.wrap(e.scheduler_connector, SCHEDULER_HOOKS, "scheduler.")
            return Case(name, e, timer)

        base = Case("base", engine(False, prefix_caching=False))  # also the recompute engine
        local = Case("local hit", engine(False, prefix_caching=True))
        miss = {m: connected(f"miss {m}", lw) for m, lw in modes}
        hit = {m: connected(f"hit {m}", lw) for m, lw in modes}
        recompute = Case("recompute", base.engine)
        for e in engines:
            for c in e.worker_connectors + [e.scheduler_connector]:
                if c is not None and c.disabled_reason is not None:
                    raise SystemExit(f"the connector is disabled: {c.disabled_reason}")
        with allocating_on(args.device):
            ceilings = Ceilings(make_kv_cache_config(model, num_blocks), None, args.layers, per_block,
                                kv_block_bytes)
        gen = torch.Generator().manual_seed(1)

        def fresh(n):
            return torch.randint(0, model.vocab, (n,), generator=gen).tolist()

        mismatches = 0
        started = time.time()
        for rep in range(args.warmup + args.reps):
            record = rep >= args.warmup
            prompts = {m: fresh(args.prompt) for m, _ in modes}
            suffix = fresh(args.suffix)
            # Stage 1: the prefill of a fresh prompt, without the connector and with it (a miss).
            stage1 = [(base, prompts["layerwise"], args.prompt)]
            stage1 += [(miss[m], prompts[m], args.prompt) for m, _ in modes]
            for k in range(len(stage1)):
                case, prompt, n = stage1[(k + rep) % len(stage1)]
                case.run(prompt, n, record)
            # Ceilings on the blocks the layerwise miss just saved.
            ids = miss["layerwise"].engine.finished_block_ids[miss["layerwise"].last_req][:prompt_blocks * per_block]
            ceilings.measure(miss["layerwise"].engine.kv_caches, ids, dtype, record)
            # Stage 2: prompt + suffix: recompute, vLLM's own prefix cache, a kvtier hit.
            local.run(prompts["layerwise"], args.prompt, False)  # fills the local prefix cache
            stage2 = [(recompute, prompts["layerwise"] + suffix, total),
                      (local, prompts["layerwise"] + suffix, args.suffix)]
            stage2 += [(hit[m], prompts[m] + suffix, args.suffix) for m, _ in modes]
            for k in range(len(stage2)):
                case, prompt, n = stage2[(k + rep) % len(stage2)]
                case.run(prompt, n, record)
            for m, _ in modes:  # the loaded prefix holds the bytes the miss engine computed
                a = kv_tokens(miss[m].engine, miss[m].last_req, args.prompt, model)
                b = kv_tokens(hit[m].engine, hit[m].last_req, args.prompt, model)
                mismatches += 0 if torch.equal(a, b) else 1
        elapsed = time.time() - started

        profile_text = None
        if args.profile:
            prof = cProfile.Profile()
            timer.profile = prof
            for _ in range(args.profile):
                prompt, suffix = fresh(args.prompt), fresh(args.suffix)
                miss["layerwise"].run(prompt, args.prompt, False)
                hit["layerwise"].run(prompt + suffix, args.suffix, False)
            timer.profile = None
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
            profile_text = s.getvalue()

        for e in engines:
            for c in e.worker_connectors + [e.scheduler_connector]:
                if c is not None and c.disabled_reason is not None:
                    raise SystemExit(f"the connector was disabled during the run: {c.disabled_reason}")
    finally:
        for e in engines:
            try:
                e.shutdown()
            except Exception as err:  # noqa: BLE001 - report and keep stopping
                print(f"shutdown: {err!r}", file=sys.stderr)
        daemon.stop()
        shutil.rmtree(root, ignore_errors=True)

    report(args, model, modes, base, local, miss, hit, recompute, ceilings, token_layer_bytes, kv_block_bytes,
           prompt_blocks, mismatches, elapsed, profile_text, host_bytes)
    return 0 if mismatches == 0 else 1


def report(args, model, modes, base, local, miss, hit, recompute, ceilings, token_layer_bytes, kv_block_bytes,
           prompt_blocks, mismatches, elapsed, profile_text, host_bytes):
    L = args.layers
    moved = prompt_blocks * kv_block_bytes
    mib = 1 << 20
    gather, scatter, memcpy = (ceilings.median(k) for k in ("gather_ms", "scatter_ms", "memcpy_ms"))
    cuda = args.device == "cuda"
    h2d = ceilings.median("h2d_ms") if cuda else memcpy  # the load's contiguous ceiling
    layer_kv_memcpy = memcpy / L  # the prompt's K/V of one layer
    b_ms = base.median("exec_ms")
    where = f"GPU {torch.cuda.get_device_name()}" if cuda else "CPU"
    print(f"kvtier vLLM connector, forward step (mini vLLM, {where}): {L} layers, {args.kv_heads} KV heads x "
          f"{args.head_size}, {args.dtype}, engine block {args.block}, kvtier block {args.block_tokens} tokens, "
          f"prompt {args.prompt} + suffix {args.suffix}, d {args.d}; median of {args.reps} reps "
          f"({args.warmup} warm-up), {elapsed:.1f} s")
    print(f"machine: {os.cpu_count()} CPUs, torch {torch.__version__} ({torch.get_num_threads()} thread), "
          f"python {sys.version.split()[0]}")
    print(f"KV: {token_layer_bytes} B per token and layer; {kv_block_bytes / mib:.2f} MiB per kvtier block; "
          f"{moved / mib:.1f} MiB moved per miss or hit step ({prompt_blocks} blocks x {L} layers); "
          f"kvtierd host tier {host_bytes / mib:.0f} MiB")
    print(f"per-layer compute of the base step: {model.layer_flops(args.prompt) / 1e9:.2f} GFLOP, "
          f"{b_ms / L:.2f} ms = {b_ms / L / layer_kv_memcpy:.1f}x a {'device-to-host ' if cuda else ''}memcpy of "
          f"the layer's prompt K/V ({layer_kv_memcpy:.3f} ms)")
    print()
    rows = []

    def row(label, case, ref, ref_label):
        ms = case.median("exec_ms")
        added = (ms - ref) / L
        rows.append({"case": label, "step_ms": ms, "forward_ms": case.median("forward_ms"),
                     "compute_ms": case.median("compute_ms"), "per_layer_ms": ms / L,
                     "ref": ref_label,
                     "added_per_layer_ms": added, "ratio_to_ref": ms / ref,
                     "schedule_ms": case.median("schedule_ms"), "update_ms": case.median("update_ms"),
                     "commit_wait_ms": case.median("commit_wait_ms"),
                     "samples_ms": [s["exec_ms"] for s in case.samples]})
        return ms

    row(f"no connector, prefill {args.prompt}", base, b_ms, "itself")
    for m, _ in modes:
        row(f"kvtier miss, {m}", miss[m], b_ms, "no connector")
    r_ms = row(f"recompute {args.prompt + args.suffix} (no connector)", recompute, b_ms, "prefill")
    l_ms = row(f"vLLM prefix-cache hit, suffix {args.suffix}", local, r_ms, "recompute")
    for m, _ in modes:
        row(f"kvtier hit, {m}", hit[m], r_ms, "recompute")
    print(f"{'case':<40} {'step ms':>9} {'min-max':>13} {'forward':>9} {'compute':>9} {'ms/layer':>9} "
          f"{'added ms/layer':>15} {'x ref':>7}  ref"
          f"{'':<10} {'sched ms':>9} {'commit ms':>10}")
    for r in rows:
        added = "" if r["ref"] == "itself" else f"{r['added_per_layer_ms']:+.3f}"
        spread = f"{min(r['samples_ms']):.1f}-{max(r['samples_ms']):.1f}"
        print(f"{r['case']:<40} {r['step_ms']:>9.2f} {spread:>13} {r['forward_ms']:>9.2f} {r['compute_ms']:>9.2f} "
              f"{r['per_layer_ms']:>9.3f} {added:>15} "
              f"{r['ratio_to_ref']:>6.3f}x  {r['ref']:<12} {r['schedule_ms']:>9.2f} {r['commit_wait_ms']:>10.2f}")
    print()
    put, loop = ceilings.median("scatter_put_ms"), ceilings.median("scatter_loop_ms")
    print(f"Bytes moved per step ({moved / mib:.1f} MiB) vs ceilings, torch copies of the same bytes in the same run"
          f"{' (GPU <-> page-locked host memory)' if cuda else ''}:")
    ceiling_lines = [("gather: index_select per kvtier block and layer (the save's op)", gather),
                     ("scatter: index_copy_ per kvtier block and layer (the load's op)", scatter),
                     ("scatter by index_put_ (view[ids] = rows)", put),
                     ("scatter by one copy_ per engine block", loop)]
    if cuda:
        ceiling_lines += [("memcpy: one contiguous copy_, device to host", memcpy),
                          ("memcpy: one contiguous copy_, host to device", h2d)]
    else:
        ceiling_lines += [("memcpy: one contiguous copy_", memcpy)]
    for label, t in ceiling_lines:
        print(f"  {label:<66} {t:>7.2f} ms {moved / t / 1e6:>6.2f} GB/s")
    ceil_rows = []
    for m, _ in modes:
        save = miss[m].median("exec_ms") - b_ms
        load = hit[m].median("exec_ms") - l_ms
        for op, t, c, cname, mc in (("save (miss - no connector)", save, gather, "gather", memcpy),
                                    ("load (hit - prefix-cache hit)", load, scatter, "scatter", h2d)):
            ceil_rows.append({"mode": m, "op": op, "added_ms": t, "ceiling": cname, "ceiling_ms": c,
                              "x_ceiling": t / c, "memcpy_ms": mc, "x_memcpy": t / mc})
    print(f"{'mode':<12} {'op':<30} {'added ms':>9} {'ceiling':>8} {'ceil ms':>8} {'x ceil':>7} {'x memcpy':>9}")
    for r in ceil_rows:
        print(f"{r['mode']:<12} {r['op']:<30} {r['added_ms']:>9.2f} {r['ceiling']:>8} {r['ceiling_ms']:>8.2f} "
              f"{r['x_ceiling']:>6.2f}x {r['x_memcpy']:>8.2f}x")
    print()
    print("Time in the connector's hooks per step (median ms; worker hooks run inside the step above, "
          "scheduler hooks inside schedule/update):")
    cases = [miss[m] for m, _ in modes] + [hit[m] for m, _ in modes]
    keys = []
    for c in cases:
        keys += [k for k in c.hook_keys() if k not in keys]
    hooks = {}
    print(f"{'hook':<42}" + "".join(f"{c.name:>20}" for c in cases))
    for k in keys:
        vals = [c.hook_median(k) for c in cases]
        hooks[k] = {c.name: v for c, v in zip(cases, vals)}
        print(f"{k:<42}" + "".join(f"{v:>20.3f}" for v in vals))
    sums = [statistics.median(sum(v for k, v in s["hooks"].items() if k.startswith("worker."))
                              for s in c.samples) for c in cases]
    print(f"{'worker hooks, total':<42}" + "".join(f"{v:>20.3f}" for v in sums))
    print()
    print("Goals:")
    goals = []
    bf_ms = base.median("forward_ms")
    for m, _ in modes:
        ms = miss[m].median("exec_ms")
        frac, frac_fwd = (ms - b_ms) / b_ms, (ms - b_ms) / bf_ms
        met = frac_fwd < 0.05
        goals.append({"goal": f"miss ({m}) adds < 5% per layer", "added_per_layer_ms": (ms - b_ms) / L,
                      "fraction_of_step": frac, "fraction_of_forward": frac_fwd, "met": met})
        print(f"  miss, {m}: {(ms - b_ms) / L:+.3f} ms per layer = {100 * frac:+.1f}% of the step's "
              f"{b_ms / L:.3f} ms per layer, {100 * frac_fwd:+.1f}% of the forward's {bf_ms / L:.3f} "
              f"({'met' if met else 'NOT met'}: goal < 5%, judged on the forward)")
    for m, _ in modes:
        ms = hit[m].median("exec_ms")
        goals.append({"goal": f"hit ({m}) vs recompute", "ratio": ms / r_ms, "floor_ratio": l_ms / r_ms})
        print(f"  hit, {m}: {ms:.2f} ms against recompute {r_ms:.2f} ms = {ms / r_ms:.3f}x "
              f"(the prefix-cache hit's floor: {l_ms / r_ms:.3f}x)")
    print(f"  loaded prefix == the miss engine's K/V bytes: {'yes' if mismatches == 0 else f'NO ({mismatches})'}")
    if profile_text:
        print()
        print(f"cProfile of the connector's hooks ({args.profile} miss + {args.profile} hit steps, layerwise):")
        print(profile_text)
    if args.json:
        data = {"args": vars(args), "host_bytes": host_bytes, "bytes_moved_per_step": moved,
                "token_layer_bytes": token_layer_bytes, "kv_block_bytes": kv_block_bytes,
                "layer_gflop": model.layer_flops(args.prompt) / 1e9, "cases": rows,
                "ceilings": {"gather_ms": gather, "scatter_ms": scatter, "memcpy_ms": memcpy, "h2d_ms": h2d,
                             "scatter_put_ms": put, "scatter_loop_ms": loop,
                             "samples": ceilings.samples},
                "moved_vs_ceilings": ceil_rows, "hooks_ms": hooks, "goals": goals, "mismatches": mismatches,
                "elapsed_s": elapsed, "profile": profile_text}
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
