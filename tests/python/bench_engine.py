"""What a user gains, end to end: multi-turn conversations served by the mini
vLLM engine with the tiny real model, with and without kvtier.

A benchmark program, not a test (the name does not match test_*.py; it
asserts no timing). It:

- generates a multi-round QA workload with kvtier's own generator
  (`kvtier trace gen multi-round-qa`, LMCache's benchmark: a shared system
  prompt, each user's history, and every earlier question and answer in each
  round's prompt) and turns each request into token ids by that recipe;
- serves the requests in the trace's order, one at a time, through three
  engines of the mini vLLM harness (tests/python/mini_vllm) running
  TinyDecoder (tests/python/tiny_model.py) on CPU tensors, each with a GPU
  cache too small to keep every user's history:
    * "vLLM, no kvtier": vLLM's own prefix cache only;
    * "vLLM + kvtier host": the vLLM connector over a kvtierd whose host
      tier holds everything;
    * "vLLM + kvtier NVMe": the connector over a kvtierd with a host tier too
      small for the workload and an NVMe tier (a file in the build
      directory's file system), so most hits come from NVMe;
- and through three engines of the SGLang stand-in
  (tests/python/mini_sglang.py: HiRadixCache's device and host pools, both
  evicting, and HiCacheController's storage calls) running the same model
  with a device pool of as many pages as the vLLM GPU cache has blocks and
  a host pool of --host-ratio times that (SGLang's hicache_ratio, 2 by
  default), also too small for every history:
    * "SGLang, no kvtier": SGLang's own radix cache and host pool only;
    * "SGLang + kvtier host" and "SGLang + kvtier NVMe": KvtierStorage (the
      backend SGLang loads by its dynamic factory) over kvtierds configured
      as the vLLM rows' are;
- checks that every request's first token is the same in every engine (the
  same model on the same tokens, greedy);
- prints, per engine: prefill tokens computed and saved, TTFT p50/p99 as
  measured here (the tiny model on a CPU: milliseconds of harness and
  connector work, not a real model's), and what the saved tokens are worth
  on a real model: a reference Qwen3-8B prefill cost, not measured here
  (856 ms per 8K tokens on an A100), times the tokens saved, beside the cost of loading
  their KV (Qwen3-8B: 36 layers x 8 KV heads x 128 x 2 x bf16 = 144 KiB a
  token) at this machine's memcpy bandwidth, measured in the same run.

    PYTHONPATH=build/release/python:tests/python KVTIERD=build/release/daemon/kvtierd \\
    KVTIER_TOOL=build/release/tools/kvtier OMP_NUM_THREADS=1 /usr/bin/python3 tests/python/bench_engine.py

--engines vllm or --engines sglang serves through one of the two only.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from conftest import Daemon  # noqa: E402  (the suite's kvtierd child)
from mini_sglang import MiniSGLang  # noqa: E402
from mini_vllm import MiniEngine, make_kv_cache_config, make_vllm_config  # noqa: E402
from sglang_fakes import fresh_adapter, load_dynamic_backend, storage_config  # noqa: E402
from tiny_model import TinyDecoder, make_deterministic  # noqa: E402
from vllm_harness import BLOCK_TOKENS, computed_at_start, kvtier_engine, run_request  # noqa: E402

QWEN3_8B_PREFILL_MS_PER_TOKEN = 856.0 / 8192   # a reference figure, not measured here: 8K tokens in 856 ms, A100
QWEN3_8B_KV_BYTES_PER_TOKEN = 36 * 8 * 128 * 2 * 2
SGLANG_MODULE = "kvtier.integrations.sglang"
# the two kvtierd configurations: (row suffix, host tier bytes, NVMe tier bytes)
TIERS = (("kvtier host", 256 << 20, 0), ("kvtier NVMe", 1 << 20, 256 << 20))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--users", type=int, default=16)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--system-tokens", type=int, default=96)
    p.add_argument("--history-tokens", type=int, default=160)
    p.add_argument("--question-tokens", type=int, default=24)
    p.add_argument("--answer-tokens", type=int, default=24)
    p.add_argument("--gpu-blocks", type=int, default=160,
                   help="engine blocks of 4 tokens in each engine's GPU cache (default: about 1.5 conversations); "
                        "SGLang's device pool has as many pages")
    p.add_argument("--host-ratio", type=float, default=2.0,
                   help="SGLang's host pool in device pools (hicache_ratio; default 2, SGLang's)")
    p.add_argument("--engines", default="vllm,sglang",
                   help="which frameworks serve the workload: vllm, sglang or both (default vllm,sglang)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not args.engines or set(args.engines) - {"vllm", "sglang"}:
        p.error("--engines takes vllm, sglang or vllm,sglang")
    return args


def generate_trace(args, path):
    """The multi-round QA trace from kvtier's generator (think time fixed: the
    bench serves in the trace's order and ignores arrival times)."""
    tool = os.environ.get("KVTIER_TOOL", "build/release/tools/kvtier")
    # Users start close together (0.9 of the most they can send at one round
    # a second), so each user's next round comes after every other user's.
    qps = 0.9 * args.users * args.rounds / max(1, args.rounds - 1)
    subprocess.run([tool, "trace", "gen", "multi-round-qa", "--out", str(path), "--users", str(args.users),
                    "--rounds", str(args.rounds), "--qps", str(qps), "--think", "fixed", "--think-s", "1",
                    "--system-tokens", str(args.system_tokens), "--history-tokens", str(args.history_tokens),
                    "--question-tokens", str(args.question_tokens), "--answer-tokens", str(args.answer_tokens),
                    "--block-tokens", str(BLOCK_TOKENS), "--seed", str(args.seed)],
                   check=True, stdout=subprocess.DEVNULL)
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def piece_seed(seed, user, round_, kind):
    """A seed of its own for each piece of each user's conversation."""
    return ((seed * 100_003 + user) * 1_009 + round_) * 3 + kind + 1


def prompts_of(trace, args, vocab):
    """Token ids of each request, by the generator's recipe: system prompt,
    the user's history, then questions and answers of earlier rounds and this
    round's question. Each piece is seeded token ids, so equal pieces are
    equal tokens."""
    def tokens(seed, n):
        return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
    system = tokens(args.seed, args.system_tokens)
    out = []
    for r in trace:
        user, k = r["session"], r["turn"]
        p = system + tokens(piece_seed(args.seed, user, 0, 2), args.history_tokens)
        for j in range(1, k + 1):
            p += tokens(piece_seed(args.seed, user, j, 0), args.question_tokens)
            if j < k:
                p += tokens(piece_seed(args.seed, user, j, 1), args.answer_tokens)
        assert len(p) == r["input_length"], (len(p), r)
        out.append((f"u{user}r{k}", p))
    return out


def memcpy_gbps(nbytes=64 << 20, reps=5):
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9


def serve(engine, requests):
    """Each request alone through the vLLM engine: (first token, TTFT s,
    prefill tokens computed) per request."""
    out = []
    for req_id, p in requests:
        t = time.perf_counter()
        toks, _ = run_request(engine, p, 1, req_id)
        ttft = time.perf_counter() - t
        computed = len(p) - (computed_at_start(engine, req_id) or 0)
        out.append((toks[0], ttft, computed))
    return out


def serve_sglang(engine, requests):
    """Each request alone through MiniSGLang: (first token, TTFT s, prefill
    tokens computed) per request, and the tokens reused from each pool."""
    out, reused = [], {"device_hit_tokens": 0, "host_hit_tokens": 0, "storage_hit_tokens": 0}
    for _, p in requests:
        t = time.perf_counter()
        toks, _ = engine.generate(p, 1)
        ttft = time.perf_counter() - t
        out.append((toks[0], ttft, len(p) - engine.last["computed_tokens"]))
        reused["device_hit_tokens"] += engine.last["local_hit_tokens"]
        reused["host_hit_tokens"] += engine.last["host_hit_tokens"]
        reused["storage_hit_tokens"] += engine.last["storage_hit_tokens"]
    return out, reused


def sglang_engine(model, args, daemon=None):
    """MiniSGLang with a device pool of --gpu-blocks pages (page 0 padded,
    as vLLM's null block) and a host pool --host-ratio times that; with a
    daemon, KvtierStorage loaded as SGLang's dynamic factory does
    (interface_v1: the zero-copy calls)."""
    e = MiniSGLang(model, device_pages=args.gpu_blocks, host_pages=int(args.host_ratio * args.gpu_blocks))
    if daemon is not None:
        extra = dict(backend_name="kvtier", module_path=SGLANG_MODULE, class_name="KvtierStorage", interface_v1=1,
                     socket_path=daemon.socket_path, model_revision="bench", reconnect_interval_s=0)
        config = storage_config(extra, model=f"tiny/{type(model).__name__}")
        e.storage = load_dynamic_backend(extra, config, e.host_pool)
    return e


def sglang_figures(engine, reused):
    return dict(reused, device_evicted_pages=engine.evicted["device"], host_evicted_pages=engine.evicted["host"])


def tier_counters(daemon):
    """Which tier the daemon's hits came from (blocks), and how many blocks
    went down to NVMe and came back up."""
    import kvtier
    with kvtier.Client(daemon.socket_path, [], client_name="bench") as c:
        s = c.stats()
    return {"host_hit_blocks": s.get('tier.hits{tier="host"}', 0), "nvme_hit_blocks": s.get('tier.hits{tier="nvme"}', 0),
            "demotions": s.get("engine.demotions", 0), "promotions": s.get("engine.promotions", 0)}


def figures(name, requests, served, gbps):
    prompt_tokens = sum(len(p) for _, p in requests)
    computed = sum(c for _, _, c in served)
    saved = prompt_tokens - computed
    ttft = sorted(t * 1e3 for _, t, _ in served)
    return {
        "engine": name, "requests": len(requests), "prompt_tokens": prompt_tokens,
        "prefill_tokens_computed": computed, "prefill_tokens_saved": saved,
        "saved_share": saved / prompt_tokens,
        "ttft_ms_p50": statistics.median(ttft), "ttft_ms_p99": ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))],
        "qwen3_8b_prefill_s": computed * QWEN3_8B_PREFILL_MS_PER_TOKEN / 1e3,
        "qwen3_8b_saved_compute_s": saved * QWEN3_8B_PREFILL_MS_PER_TOKEN / 1e3,
        "qwen3_8b_load_s_at_memcpy": saved * QWEN3_8B_KV_BYTES_PER_TOKEN / (gbps * 1e9),
    }


def main(argv=None):
    """Runs the bench; returns its rows (one dict per engine)."""
    args = parse_args(argv)
    make_deterministic()
    model = TinyDecoder(seed=0)
    root = Path(tempfile.mkdtemp(prefix="kvtier-bench-engine-"))
    daemons = []
    try:
        trace = generate_trace(args, root / "mrqa.jsonl")
        requests = prompts_of(trace, args, model.vocab)
        gbps = memcpy_gbps()

        def daemon_for(name, host_bytes, nvme_bytes):
            directory = root / name.replace(" ", "_").replace(",", "").replace("+", "")
            directory.mkdir()
            daemons.append(Daemon(directory, host_bytes, nvme_bytes, ""))
            return daemons[-1]

        results, extras = [], {}
        if "vllm" in args.engines:
            baseline = MiniEngine(model, make_vllm_config(model, kv_connector=None),
                                  make_kv_cache_config(model, args.gpu_blocks))
            results.append(("vLLM, no kvtier", serve(baseline, requests)))
            for suffix, host_bytes, nvme_bytes in TIERS:
                name = f"vLLM + {suffix}"
                daemon = daemon_for(name, host_bytes, nvme_bytes)
                engine = kvtier_engine(model, daemon, num_blocks=args.gpu_blocks)
                results.append((name, serve(engine, requests)))
                engine.shutdown()
                extras[name] = tier_counters(daemon)
        if "sglang" in args.engines:
            with pytest.MonkeyPatch.context() as mp:
                adapter = fresh_adapter(mp, SGLANG_MODULE)  # fake SGLang modules, the backend imported afresh
                next(adapter)
                try:
                    engine = sglang_engine(model, args)
                    served, reused = serve_sglang(engine, requests)
                    results.append(("SGLang, no kvtier", served))
                    extras["SGLang, no kvtier"] = sglang_figures(engine, reused)
                    for suffix, host_bytes, nvme_bytes in TIERS:
                        name = f"SGLang + {suffix}"
                        daemon = daemon_for(name, host_bytes, nvme_bytes)
                        engine = sglang_engine(model, args, daemon)
                        served, reused = serve_sglang(engine, requests)
                        results.append((name, served))
                        extras[name] = dict(sglang_figures(engine, reused), **tier_counters(daemon))
                finally:
                    next(adapter, None)
        reference_name, reference = results[0][0], [t for t, _, _ in results[0][1]]
        for name, served in results[1:]:
            if [t for t, _, _ in served] != reference:
                sys.exit(f"bench_engine: {name} served another first token than {reference_name}")
        rows = [dict(figures(name, requests, served, gbps), **extras.get(name, {})) for name, served in results]
        report(args, rows, gbps)
        if args.json:
            Path(args.json).write_text(json.dumps({"args": vars(args), "memcpy_gbps": gbps, "rows": rows}, indent=1))
        return rows
    finally:
        for d in daemons:
            d.stop()
        shutil.rmtree(root, ignore_errors=True)


def report(args, rows, gbps):
    engines = " and ".join({"vllm": "mini vLLM", "sglang": "mini SGLang"}[e] for e in args.engines)
    host = (f", SGLang host pool {int(args.host_ratio * args.gpu_blocks) * 4} tokens"
            if "sglang" in args.engines else "")
    print(f"kvtier engine bench: multi-round QA, {args.users} users x {args.rounds} rounds, system "
          f"{args.system_tokens} + history {args.history_tokens} + question {args.question_tokens} / answer "
          f"{args.answer_tokens} tokens; {engines} + TinyDecoder on CPU, GPU cache {args.gpu_blocks * 4} tokens"
          f"{host}, kvtier blocks of {BLOCK_TOKENS} tokens; first tokens equal across engines: yes")
    print(f"memcpy on this machine: {gbps:.1f} GB/s (the load projection's ceiling)\n")
    print(f"{'engine':<22}{'prompt tok':>11}{'computed':>10}{'saved':>9}{'TTFT p50 ms':>13}{'p99 ms':>9}"
          f"{'Qwen3-8B prefill s':>20}{'saved s':>9}{'load s @memcpy':>16}")
    for r in rows:
        print(f"{r['engine']:<22}{r['prompt_tokens']:>11}{r['prefill_tokens_computed']:>10}"
              f"{r['saved_share']:>8.1%} {r['ttft_ms_p50']:>12.2f}{r['ttft_ms_p99']:>9.2f}"
              f"{r['qwen3_8b_prefill_s']:>20.2f}{r['qwen3_8b_saved_compute_s']:>9.2f}"
              f"{r['qwen3_8b_load_s_at_memcpy']:>16.3f}")
    for r in rows:
        if "device_evicted_pages" in r:
            print(f"{r['engine']}: prefix tokens reused from the device pool {r['device_hit_tokens']}, from the "
                  f"host pool {r['host_hit_tokens']}, from kvtier {r['storage_hit_tokens']}; pages evicted from "
                  f"the device pool {r['device_evicted_pages']}, from the host pool {r['host_evicted_pages']}")
    for r in rows:
        if "host_hit_blocks" in r:
            print(f"{r['engine']}: kvtier hits from host {r['host_hit_blocks']}, from NVMe {r['nvme_hit_blocks']}; "
                  f"demoted to NVMe {r['demotions']}, promoted back {r['promotions']}")
    if any("host_hit_blocks" in r and "device_evicted_pages" in r for r in rows):
        print("(kvtier counts objects: an SGLang page of 4 tokens is two, its K half and its V half)")
    print("\nTTFT here is the tiny model's on a CPU (harness and connector work, including the asynchronous "
          "lookup's extra scheduler step); the Qwen3-8B columns scale the prefill tokens computed and saved by "
          "856 ms per 8K tokens (A100) and the saved tokens' KV (144 KiB a token) by this machine's memcpy.")


if __name__ == "__main__":
    main()
