"""`python -m kvtier doctor`: whether this interpreter's kvtier can serve an engine.

Prints the package (version, where it is, which Python), the kvtierd it
reaches (socket, version and health as the daemon reports them, its tiers
with capacity and use), and the vLLM and SGLang installed beside it with
whether the adapters support their versions. Returns 0 when all is well;
otherwise 1, after one `problem:` line per problem. An engine that is not
installed is not a problem; neither is a warning the daemon reports.
"""

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

DEFAULT_SOCKET = "/run/kvtier/kvtierd.sock"

# The engine versions the adapters serve, newest first (docs/INTEGRATIONS.md
# "Versions" and "SGLang versions"; the interfaces they were written against
# are in integrations/engine_interfaces.json): (first version of the row, or
# None for every older one, what those versions get). A version older than
# every row is unsupported, for the reason in ENGINE_UNSUPPORTED. vLLM has no
# lower bound: the connector itself serves without the cache, and says why at
# start, when vLLM gives it no KVCacheConfig (KV connector v1 before that).
# SGLang's bounds are the first releases after the pull requests that added
# what KvtierStorage needs (read from the PRs and release dates, not from a
# run: see INTEGRATIONS.md): 0.5.6 the dynamic backend's interface_v1 switch
# (sgl-project/sglang#13140; the dynamic backend itself is #10551), 0.5.10
# the HybridCacheController and the v2 interface (#20457).
ENGINE_SUPPORT = {
    "vllm": [
        ("0.28", "KV connector v1 with 4-D KV views; nothing to set"),
        (None, "5-D KV caches: set kv_connector_extra_config \"kv_layout\" "
               "(kv_first for FlashAttention, blocks_first for FlashInfer)"),
    ],
    "sglang": [
        ("0.5.10", "v1 + v2 hybrid: KV pages through batch_get_v1/batch_set_v1 (dynamic backend, "
                   "interface_v1 1) and, with the hybrid cache controller, Mamba/SWA/draft pools "
                   "through the v2 calls"),
        ("0.5.6", "v1 only: KV pages through batch_get_v1/batch_set_v1 (dynamic backend, interface_v1 1); "
                  "no hybrid cache controller, so kvtier's v2 half is never called"),
    ],
}
ENGINE_UNSUPPORTED = {
    "vllm": "no adapter for this version",
    "sglang": "before 0.5.6 the dynamic HiCache backend has no interface_v1 switch (sglang#13140), "
              "so batch_get_v1/batch_set_v1 are never called; upgrade to 0.5.6 or later",
}


def _version_tuple(text):
    return tuple(int(n) for n in re.findall(r"\d+", text)[:3])


def engine_support(name, version):
    """(supported, note) of `name` at `version` (a string)."""
    for first, note in ENGINE_SUPPORT[name]:
        if first is None or _version_tuple(version) >= _version_tuple(first):
            return True, note
    return False, ENGINE_UNSUPPORTED[name]


def installed_version(distribution):
    """The installed version of `distribution`, or None (without importing it)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _format_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def tiers_of(stats):
    """[(tier, capacity_bytes, used_bytes)] from Client.stats(), top tier
    first (the daemon lists its stack in order)."""
    tiers = []
    for name, value in stats.items():
        match = re.fullmatch(r'tier\.capacity_bytes\{tier="([^"]+)"\}', name)
        if match:
            tier = match.group(1)
            tiers.append((tier, value, stats.get(f'tier.used_bytes{{tier="{tier}"}}', 0)))
    return tiers


def daemon_health(client, socket_path):
    """The daemon's own health report as a dict (healthy, problems, warnings,
    version, uptime_s, tiers), or (None, why not). Asks the binding's
    Client.health, or with a binding older than it, the `kvtier` tool
    ($KVTIER_TOOL or on PATH), which asks the daemon the same."""
    health = getattr(client, "health", None)
    if callable(health):
        report = health()
        return (report if isinstance(report, dict) else
                {k: getattr(report, k) for k in ("healthy", "problems", "warnings", "version", "uptime_s", "tiers")}), None
    tool = os.environ.get("KVTIER_TOOL") or shutil.which("kvtier")
    if not tool:
        return None, "this binding has no Client.health and no kvtier tool is on PATH"
    try:
        out = subprocess.run([tool, "health", "--json", "--socket", socket_path],
                             capture_output=True, text=True, timeout=30)
        return json.loads(out.stdout.strip().splitlines()[-1]), None
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
        return None, f"{tool} health did not answer: {e}"


def check(socket_path, out=sys.stdout):
    """Runs every check, printing as it goes; returns the list of problems."""
    import kvtier  # late: a broken extension is itself a finding

    problems = []
    print(f"kvtier {kvtier.__version__} at {Path(kvtier.__file__).parent} "
          f"(Python {sys.version.split()[0]}, {sys.executable})", file=out)

    print(f"kvtierd: {socket_path}", file=out)
    try:
        with kvtier.Client(socket_path, []) as client:
            stats = client.stats()
            health, why_not = daemon_health(client, socket_path)
    except kvtier.Error as e:
        problems.append(f"kvtierd unreachable at {socket_path}: {e.code}: {e.message}")
        stats = None
    if stats is not None:
        if health is None:
            print(f"  version: unknown ({why_not})", file=out)
        else:
            print(f"  version: {health.get('version')}, up {health.get('uptime_s')} s, "
                  f"{'healthy' if health.get('healthy') else 'UNHEALTHY'}", file=out)
            for warning in health.get("warnings", []):
                print(f"  warning: {warning}", file=out)
            problems += [f"kvtierd: {p}" for p in health.get("problems", [])]
            if not health.get("healthy") and not health.get("problems"):
                problems.append("kvtierd reports itself unhealthy")
        tiers = tiers_of(stats)
        for tier, capacity, used in tiers:
            print(f"  tier {tier}: {_format_bytes(used)} used of {_format_bytes(capacity)}", file=out)
        if not tiers:
            problems.append("kvtierd reports no tiers")

    for name, label in (("vllm", "vLLM"), ("sglang", "SGLang")):
        version = installed_version(name)
        if version is None:
            print(f"{label}: not installed", file=out)
            continue
        supported, note = engine_support(name, version)
        print(f"{label}: {version}, {'supported' if supported else 'NOT supported'}: {note}", file=out)
        if not supported:
            problems.append(f"{label} {version} is not supported: {note}")

    for problem in problems:
        print(f"problem: {problem}", file=out)
    print("all well" if not problems else f"{len(problems)} problem(s)", file=out)
    return problems


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m kvtier doctor",
                                     description="Checks the kvtier package, the kvtierd it reaches and the "
                                                 "engines installed beside it; exit 0 when all is well.")
    parser.add_argument("--socket", default=DEFAULT_SOCKET, help=f"kvtierd socket (default {DEFAULT_SOCKET})")
    args = parser.parse_args(argv)
    return 1 if check(args.socket) else 0
