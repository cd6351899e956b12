"""SGLang storage backend: copies and throughput per host pool layout.

A benchmark program, not a test (the name does not match test_*.py; it
asserts no timing). For each host pool layout KvtierStorage serves that
sglang_fakes.py has a stand-in for (MHA page_first, page_first_direct and
layer_first; MLA page_first; there is no page_head pool there, so it is not
measured), against a private kvtierd (conftest.Daemon), it measures:

- batch_set_v1 and batch_get_v1 of `--pages` pages per call (the reader is
  a second backend with its own pool and connection, reading into other
  slots): GB/s of page bytes (1e9 bytes/s), the best of `--reps` timed
  calls, beside numpy.copyto of as many bytes between two pre-faulted
  buffers (best of as many copies, interleaved with them), as a ratio;
- bytes copied per page byte by a set and by a get, counted, not assumed:
  one untimed round runs with the backend's byte-moving calls wrapped
  (CopyCounter): every (dst, src, n) of _copy_pieces, sorted by whether
  source and destination lie in the client's arena; Client.put_batch, put,
  get_batch, get and get_layers, each one copy of its buffers' bytes in
  the C++ client. pin and reserve copy nothing themselves: their bytes are
  listed as leased;
- that every round trip is exact: each page read back equals the page set.

Run from the repository root, after `cmake --build build/release -j2`:

    PYTHONPATH=build/release/python:tests/python KVTIERD=$PWD/build/release/daemon/kvtierd \\
      OMP_NUM_THREADS=1 /usr/bin/python3 tests/python/bench_sglang_copy.py [--json PATH]

The exit status is 1 when a round trip was wrong or a call moved fewer
bytes than a page holds (a copy path the counter does not see). Figures:
docs/BENCHMARKS.md "SGLang storage backend".
"""

import argparse
import collections
import contextlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import kvtier  # noqa: E402
import kvtier._kvtier as native  # noqa: E402
from conftest import Daemon  # noqa: E402  (the suite's kvtierd child)
from kvtier.integrations import sglang as backend_module  # noqa: E402
from sglang_fakes import (MHATokenToKVPoolHost, MLATokenToKVPoolHost, host_indices, load_dynamic_backend,  # noqa: E402
                          page_keys, storage_config)

CASES = (("page_first", "MHA"), ("page_first_direct", "MHA"), ("layer_first", "MHA"), ("page_first", "MLA"))
COPYING_CALLS = ("put_batch", "put", "get_batch", "get", "get_layers")  # each copies its buffers once
LEASING_CALLS = ("pin", "reserve")  # arena space handed out, no copy


class CopyCounter:
    """While entered, wraps the calls through which the backend moves bytes
    and counts them: moved[path] = bytes copied, leased[call] = bytes pinned
    or reserved. Restores every wrapped name on exit."""

    def __init__(self):
        self.moved, self.leased, self.arenas, self._saved = collections.Counter(), collections.Counter(), set(), []

    def __enter__(self):
        for name in COPYING_CALLS + LEASING_CALLS:
            self._patch(kvtier.Client, name, self._client_call(name, getattr(kvtier.Client, name)))
        for module in (backend_module, native):
            self._patch(module, "_copy_pieces", self._copy_pieces(getattr(module, "_copy_pieces")))
        return self

    def __exit__(self, *exc):
        while self._saved:
            setattr(*self._saved.pop())

    def _patch(self, owner, name, wrapper):
        self._saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, wrapper)

    def _client_call(self, name, original):
        def call(client, *args, **kwargs):
            self.arenas.add((client.arena_address, client.arena_bytes))
            result = original(client, *args, **kwargs)
            third = args[2] if len(args) > 2 else kwargs.get("sizes" if name == "reserve" else "data")
            if name == "put_batch":
                self.moved[name] += sum(_nbytes(d) for d, s in zip(third, result) if s.ok)
            elif name == "put":
                self.moved[name] += _nbytes(third)
            elif name in ("get_batch", "get_layers"):
                self.moved[name] += sum(s.value for s in result if s.ok)
            elif name == "get":
                self.moved[name] += result
            elif name == "pin":
                self.leased[name] += sum(len(v) for v in result if v.ok)
            else:
                self.leased[name] += sum(third)
            return result
        return call

    def _copy_pieces(self, original):
        def call(moves):
            moves = list(moves)
            for dst, src, n in moves:
                self.moved[f"_copy_pieces {self._side(src)}->{self._side(dst)}"] += n
            return original(moves)
        return call

    def _side(self, address):
        return "arena" if any(a <= address < a + n for a, n in self.arenas) else "host"


def _nbytes(buffer):
    return buffer[1] if isinstance(buffer, tuple) else memoryview(buffer).nbytes


def make_pool(layout, kind, args, pages=None):
    pages = pages or args.pages
    if kind == "MLA":  # DeepSeek-V3's latent: 512 + 64 rope dims, one head
        return MLATokenToKVPoolHost(page_num=pages, page_size=args.page_size, layer_num=args.mla_layers,
                                    kv_lora_rank=args.kv_lora_rank, qk_rope_head_dim=args.rope_dim)
    return MHATokenToKVPoolHost(layout, page_num=pages, page_size=args.page_size, layer_num=args.layers,
                                head_num=args.heads, head_dim=args.head_dim)


def fill(pool, seed):
    """A distinct 8-byte word everywhere (an odd multiplier is a bijection
    mod 2^64), fast enough for GiBs."""
    words = pool.kv_buffer.view(torch.int16).numpy().reshape(-1).view(np.uint64)
    np.multiply(np.arange(seed * words.size, (seed + 1) * words.size, dtype=np.uint64),
                np.uint64(0x9E3779B97F4A7C15), out=words)


def make_backend(socket_path, pool, kind):
    extra = dict(backend_name="kvtier", module_path=backend_module.__name__, class_name="KvtierStorage",
                 interface_v1=1, socket_path=socket_path, model_revision="bench", reconnect_interval_s=0)
    return load_dynamic_backend(extra, storage_config(extra, is_mla=kind == "MLA", layout=pool.layout), pool)


def pages_equal(a, b, a_slots, b_slots):
    ps = a.page_size
    return all(torch.equal(a.get_data_page(s * ps, flat=False).view(torch.int16),
                           b.get_data_page(d * ps, flat=False).view(torch.int16)) for s, d in zip(a_slots, b_slots))


def measure(socket_path, layout, kind, args, src, dst):
    """One row: the counted round, then args.reps timed rounds."""
    pools = make_pool(layout, kind, args), make_pool(layout, kind, args)
    fill(pools[0], seed=1)
    writer, reader = (make_backend(socket_path, p, kind) for p in pools)
    keys = page_keys(list(range(args.pages * args.page_size)), args.page_size)
    slots = list(range(args.pages)), list(reversed(range(args.pages)))  # read back into other slots
    indices = [host_indices(s, args.page_size) for s in slots]
    page_bytes = pools[0].get_size_per_token() * args.page_size
    total = args.pages * page_bytes
    counts, times, exact = None, collections.defaultdict(list), True
    for rnd in range(args.reps + 1):
        writer.clear()  # every set writes all its pages
        pools[1].kv_buffer.zero_()
        counters = (CopyCounter(), CopyCounter()) if rnd == 0 else (contextlib.nullcontext(),) * 2
        with counters[0]:
            t0 = time.perf_counter()
            stored = writer.batch_set_v1(keys, indices[0])
            t1 = time.perf_counter()
        with counters[1]:
            t2 = time.perf_counter()
            read = reader.batch_get_v1(keys, indices[1])
            t3 = time.perf_counter()
        t4 = time.perf_counter()
        np.copyto(dst[:total], src[:total])
        t5 = time.perf_counter()
        exact = exact and all(stored) and all(read) and pages_equal(pools[0], pools[1], *slots)
        if rnd == 0:
            counts = counters
        else:
            times["set"].append(t1 - t0)
            times["get"].append(t3 - t2)
            times["memcpy"].append(t5 - t4)
    writer.clear()
    gbps = {op: total / min(ts) / 1e9 for op, ts in times.items()}
    row = dict(layout=layout, pool=kind, page_bytes=page_bytes, pages=args.pages, reps=args.reps,
               statistic="best", set_gbps=gbps["set"], get_gbps=gbps["get"], memcpy_gbps=gbps["memcpy"],
               set_vs_memcpy=gbps["set"] / gbps["memcpy"], get_vs_memcpy=gbps["get"] / gbps["memcpy"],
               round_trip_exact=exact)
    for op, counter in zip(("set", "get"), counts):
        row[f"{op}_copies_per_byte"] = sum(counter.moved.values()) / total
        row[f"{op}_paths"] = {p: n / total for p, n in sorted(counter.moved.items())}
        row[f"{op}_leased_per_byte"] = {p: n / total for p, n in sorted(counter.leased.items())}
    return row


def print_table(rows):
    print("| layout | pool | page MiB | set GB/s | get GB/s | memcpy GB/s | set/memcpy | get/memcpy "
          "| copies/B set | copies/B get |")
    print("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        print(f"| {r['layout']} | {r['pool']} | {r['page_bytes'] / 2**20:.2f} | {r['set_gbps']:.2f} "
              f"| {r['get_gbps']:.2f} | {r['memcpy_gbps']:.2f} | {r['set_vs_memcpy']:.2f}x "
              f"| {r['get_vs_memcpy']:.2f}x | {r['set_copies_per_byte']:.2f} | {r['get_copies_per_byte']:.2f} |")
    print("\ncopies per page byte by path (leased: pinned or reserved, not copied):")
    for r in rows:
        for op in ("set", "get"):
            paths = ", ".join(f"{p} {v:.2f}" for p, v in r[f"{op}_paths"].items())
            leased = ", ".join(f"{p} {v:.2f}" for p, v in r[f"{op}_leased_per_byte"].items()) or "none"
            print(f"  {r['layout']:<17} {r['pool']} {op}: {paths}; leased: {leased}")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pages", type=int, default=64, help="pages per batch_set_v1 / batch_get_v1 call")
    p.add_argument("--reps", type=int, default=3, help="timed rounds per layout (the best is reported)")
    p.add_argument("--page-size", type=int, default=64, help="tokens per page")
    p.add_argument("--layers", type=int, default=32, help="MHA layers (8 KV heads x 128 dims, bf16: Llama-3-8B)")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--mla-layers", type=int, default=61, help="MLA layers (DeepSeek-V3: 61)")
    p.add_argument("--kv-lora-rank", type=int, default=512)
    p.add_argument("--rope-dim", type=int, default=64)
    p.add_argument("--json", help="also write the rows to this file")
    return p.parse_args(argv)


def main(argv=None):
    """Runs every case; prints the table; returns the rows."""
    args = parse_args(argv)
    largest = max(make_pool(*case, args, pages=1).get_size_per_token() for case in CASES) * args.page_size * args.pages
    src, dst = np.full(largest, 1, np.uint8), np.zeros(largest, np.uint8)
    dst.fill(2)  # fault both in before any timing
    root = Path(tempfile.mkdtemp(prefix="kvtier-bsc-"))
    try:
        (root / "d").mkdir()
        daemon = Daemon(root / "d", host_bytes=2 * largest + (64 << 20), nvme_bytes=0, extra="")
        try:
            rows = [measure(daemon.socket_path, layout, kind, args, src, dst) for layout, kind in CASES]
        finally:
            daemon.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{args.pages} pages per call, best of {args.reps} timed calls each; GB/s = 1e9 bytes/s of page bytes")
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    result = main()
    bad = [r for r in result if not r["round_trip_exact"] or min(r["set_copies_per_byte"], r["get_copies_per_byte"]) < 1]
    for r in bad:
        print(f"FAILED: {r['layout']} {r['pool']}: round trip exact {r['round_trip_exact']}, copies per byte "
              f"set {r['set_copies_per_byte']:.2f} / get {r['get_copies_per_byte']:.2f} (below 1: an uncounted path)")
    sys.exit(1 if bad else 0)
