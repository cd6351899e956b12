"""`kvtier events` against a real kvtierd (docs/OPERATIONS.md, "KV events"):
`--rebuild` beside a workload (puts through a small host tier onto NVMe,
promotions, erases) prints at the end exactly what `kvtier ls --blocks`
lists, in text and in JSON, and a tail with `--json --count K` prints K
well-formed events."""

import json
import os
import re
import subprocess
import time

import pytest

import kvtier
from conftest import block_bytes

KVTIER_TOOL = os.environ.get("KVTIER_TOOL", "")
HEX32 = re.compile(r"^[0-9a-f]{32}$")

pytestmark = pytest.mark.skipif(not KVTIER_TOOL, reason="KVTIER_TOOL is not set: run the suite through ctest")


def namespace(revision):
    # 64 KiB blocks: a 2 MiB host tier holds 32 of them.
    return kvtier.Namespace(model_id="test/events-cli", model_revision=revision, kv_dtype="fp32", block_tokens=16,
                            layer_count=4, bytes_per_token_per_layer=1024)


def tool(*args, timeout=60):
    return subprocess.run([KVTIER_TOOL, *args], capture_output=True, text=True, timeout=timeout)


def workload(c, a, first_chain, chains):
    """Chains of 16 blocks through the host tier (onto NVMe), reads of some, an erase."""
    keys = []
    for chain in range(first_chain, first_chain + chains):
        k = kvtier.ChainHasher(a).keys(list(range(chain * 10_000, chain * 10_000 + 16 * 16)))
        c.put_batch(0, k, [block_bytes(a, chain * 100 + i) for i in range(16)], chain=True)
        keys.append(k)
    out = bytearray(a.block_bytes)
    for k in keys[:3]:
        for key in k[:4]:
            try:
                c.get(0, key, out)
            except kvtier.NotFoundError:
                pass
    c.erase(0, keys[-1][:4])


@pytest.mark.parametrize("form", ["json", "text"])
def test_a_rebuilt_index_equals_ls_blocks(make_daemon, form):
    d = make_daemon(host_bytes=2 << 20, nvme_bytes=24 << 20)
    a = namespace(form)
    json_flag = ["--json"] if form == "json" else []
    with kvtier.Client(d.socket_path, [a], use_directory=False) as c:
        workload(c, a, 0, 3)  # in the snapshot
        seconds = 8
        started = time.monotonic()
        events = subprocess.Popen([KVTIER_TOOL, "events", "--rebuild", *json_flag, "--seconds", str(seconds),
                                   "--socket", d.socket_path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        try:
            time.sleep(0.2)
            workload(c, a, 3, 5)  # around the snapshot and in the stream: promotions, demotions, NVMe reclaims
            time.sleep(0.5)
            workload(c, a, 8, 4)
            # The stream must be quiet well before the rebuild stops.
            assert time.monotonic() - started < seconds - 2, "the workload ran too long to compare"
            out, err = events.communicate(timeout=60)
        finally:
            if events.poll() is None:
                events.kill()
                events.wait()
    assert events.returncode == 0, err
    listed = tool("ls", "--blocks", *json_flag, "--socket", d.socket_path)
    assert listed.returncode == 0, listed.stderr
    if form == "json":
        rebuilt = {(r["tier"], r["namespace"], r["key"]) for r in json.loads(out)}
        truth = {(r["tier"], r["namespace"], r["key"]) for r in json.loads(listed.stdout)}
        assert rebuilt == truth, (sorted(rebuilt - truth)[:5], sorted(truth - rebuilt)[:5])
        assert {"host", "nvme"} <= {t for t, _, _ in truth}
    assert out == listed.stdout  # the same form, so the two diff clean


def test_a_json_tail_prints_count_well_formed_events(make_daemon):
    d = make_daemon(host_bytes=2 << 20, nvme_bytes=24 << 20)
    a = namespace("tail")
    count = 12
    events = subprocess.Popen([KVTIER_TOOL, "events", "--json", "--count", str(count), "--seconds", "60",
                               "--socket", d.socket_path], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)  # the SUB socket joins (ZeroMQ's slow joiner)
        with kvtier.Client(d.socket_path, [a], use_directory=False) as c:
            fp = c.fingerprints[0].hex()
            for round_ in range(40):
                workload(c, a, round_ * 8, 8)
                if events.poll() is not None:
                    break
                time.sleep(0.1)
        out, err = events.communicate(timeout=60)
    finally:
        if events.poll() is None:
            events.kill()
            events.wait()
    assert events.returncode == 0, err
    lines = out.splitlines()
    assert len(lines) == count, out
    last_seq = -1
    for line in lines:
        e = json.loads(line)
        assert isinstance(e["seq"], int) and e["seq"] >= last_seq
        last_seq = e["seq"]
        assert isinstance(e["ts"], float) and e["ts"] > 1e9
        assert e["kind"] in ("stored", "removed", "cleared"), e
        if e["kind"] == "cleared":
            continue
        assert e["medium"] in ("GPU", "CPU_PINNED", "DISK", "REMOTE")
        assert e["tier"] in ("hbm", "host", "nvme", "remote")
        assert e["namespace"] == fp
        assert e["keys"] and all(HEX32.match(k) for k in e["keys"])
        if e["kind"] == "stored":
            assert e["parent"] is None or HEX32.match(e["parent"])


def test_a_text_tail_and_bad_usage(make_daemon):
    d = make_daemon(host_bytes=8 << 20)
    a = namespace("text")
    events = subprocess.Popen([KVTIER_TOOL, "events", "--count", "1", "--seconds", "60", "--socket", d.socket_path],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        with kvtier.Client(d.socket_path, [a], use_directory=False) as c:
            fp = c.fingerprints[0].hex()
            keys = kvtier.ChainHasher(a).keys(list(range(16 * 2)))
            c.put_batch(0, keys, [block_bytes(a, i) for i in range(2)], chain=True)
            out, err = events.communicate(timeout=60)
    finally:
        if events.poll() is None:
            events.kill()
            events.wait()
    assert events.returncode == 0, err
    [line] = out.splitlines()
    assert re.match(r"^\d+ \d+\.\d+ stored CPU_PINNED ns=" + fp + r" parent=- keys=2 ", line), line
    assert line.endswith(keys[0].hex() + "," + keys[1].hex())
    assert tool("events", "--seconds", "-1", "--socket", d.socket_path).returncode == 2
    assert tool("events", "--bogus").returncode == 2
