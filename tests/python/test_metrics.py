"""kvtierd's Prometheus endpoint, scraped the way Prometheus does: over
HTTP with a real client (urllib), parsing the text exposition format and
checking names, types and values against what the test did."""

import re
import socket
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

import kvtier
from conftest import metrics_url, test_namespace

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')


def parse(text):
    """{family: type}, {(name, frozenset(labels)): value}; asserts the
    format's rules on the way (TYPE before samples, a family's samples
    together, no sample twice)."""
    types, samples, seen_families = {}, {}, []
    current = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name not in types, f"family {name} declared twice"
            assert kind in ("counter", "gauge", "histogram"), line
            types[name] = kind
            current = name
            seen_families.append(name)
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        name, labels, value = m.group(1), m.group(2) or "", m.group(3)
        family = re.sub(r"_(bucket|sum|count)$", "", name) if types.get(current) == "histogram" else name
        assert family == current, f"sample {name} outside its family's block ({current})"
        key = (name, frozenset(LABEL.findall(labels)))
        assert key not in samples, f"sample {line!r} appears twice"
        samples[key] = float(value)
    return types, samples


def value(samples, name, **labels):
    return samples[(name, frozenset(labels.items()))]


def scrape(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return parse(r.read().decode())


def blocks(ns, n, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, ns.block_bytes, dtype=np.uint8) for _ in range(n)]


def test_scrape_reports_tiers_admission_and_dwpd_with_their_types_and_values(make_daemon):
    # A host tier of 4 blocks over an NVMe tier: puts beyond it are evicted
    # and demoted, and a get of an evicted block is a promotion read.
    ns = test_namespace(block_tokens=16, layer_count=4, bytes_per_token_per_layer=1024)  # 64 KiB blocks
    d = make_daemon(host_bytes=1 << 20, nvme_bytes=64 << 20)
    url = metrics_url(d)
    types, before = scrape(url)
    assert types["kvtier_tier_hits_total"] == "counter"
    assert types["kvtier_tier_used_bytes"] == "gauge"
    assert types["kvtier_tier_capacity_bytes"] == "gauge"
    assert types["kvtier_tier_read_seconds"] == "histogram"
    assert types["kvtier_admission_refusals_total"] == "counter"
    assert types["kvtier_engine_prefetches_total"] == "counter"
    assert types["kvtier_engine_prefetches_late_total"] == "counter"
    assert value(before, "kvtier_tier_capacity_bytes", tier="host") == 1 << 20
    assert value(before, "kvtier_tier_capacity_bytes", tier="nvme") == 64 << 20
    assert value(before, "kvtier_tier_hits_total", tier="host") == 0
    assert [v for k, v in before.items() if k[0] == "kvtier_build_info" and dict(k[1]).get("version")] == [1]

    n = 40
    hasher = kvtier.ChainHasher(ns)
    keys = hasher.keys(np.arange(n * ns.block_tokens, dtype=np.uint32))
    data = blocks(ns, n, seed=1)
    with kvtier.Client(d.socket_path, [ns], use_directory=False) as c:
        for k, b in zip(keys, data):
            c.put(0, k, b)
        # The first blocks left the host tier: wait until they are on NVMe.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            hit = c.lookup(0, keys)
            if hit.prefix_blocks == n and kvtier.Tier.NVME in hit.tiers:
                break
            time.sleep(0.05)
        # A lookup of every key plus one nobody stored: one miss.
        extra = hasher.keys(np.arange((n + 1) * ns.block_tokens, dtype=np.uint32))
        hit = c.lookup(0, extra)
        assert hit.prefix_blocks == n
        on_nvme = [k for k, t in zip(keys, hit.tiers) if t == kvtier.Tier.NVME]
        assert on_nvme, "nothing was demoted; the test cannot measure the NVMe tier"
        out = bytearray(ns.block_bytes)
        i = list(keys).index(on_nvme[0])
        assert c.get(0, on_nvme[0], out) == ns.block_bytes
        assert bytes(out) == data[i].tobytes()
        host_hits_in_last_lookup = sum(1 for t in hit.tiers if t == kvtier.Tier.HOST)

    _, after = scrape(url)
    written_host = value(after, "kvtier_tier_written_bytes_total", tier="host")
    assert written_host >= n * ns.block_bytes, "every put is a commit into the host tier"
    assert value(after, "kvtier_tier_written_bytes_total", tier="nvme") >= ns.block_bytes
    assert value(after, "kvtier_tier_read_bytes_total", tier="nvme") >= ns.block_bytes
    assert value(after, "kvtier_tier_reads_total", tier="nvme") >= 1
    assert value(after, "kvtier_tier_hits_total", tier="nvme") >= len(on_nvme)
    assert value(after, "kvtier_tier_hits_total", tier="host") >= host_hits_in_last_lookup
    # The one key no tier held is a miss in each, and every NVMe hit was
    # a host miss first.
    assert value(after, "kvtier_tier_misses_total", tier="nvme") >= 1
    assert value(after, "kvtier_tier_misses_total", tier="host") == (
        value(after, "kvtier_tier_hits_total", tier="nvme") + value(after, "kvtier_tier_misses_total", tier="nvme"))
    assert value(after, "kvtier_tier_evictions_total", tier="host", reason="capacity") >= len(on_nvme)
    assert 0 < value(after, "kvtier_tier_used_bytes", tier="host") <= 1 << 20
    # Histograms: cumulative buckets ending in +Inf == _count, a sum in seconds.
    for op in ("read", "write"):
        name = f"kvtier_tier_{op}_seconds"
        buckets = sorted(((float(dict(k[1])["le"]), v) for k, v in after.items()
                          if k[0] == name + "_bucket" and dict(k[1]).get("tier") == "nvme"))
        assert len(buckets) > 2 and buckets[-1][0] == float("inf")
        assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:])), "buckets are cumulative"
        count = value(after, name + "_count", tier="nvme")
        assert buckets[-1][1] == count >= 1
        assert 0 < value(after, name + "_sum", tier="nvme") < 60 * count
    # The metrics and the Stats request read the same registry.
    with kvtier.Client(d.socket_path, [ns]) as c:
        stats = c.stats()
    assert stats['tier.hits{tier="nvme"}'] == value(after, "kvtier_tier_hits_total", tier="nvme")


def test_admission_refusals_by_class_and_the_dwpd_ledger(make_daemon, tmp_path):
    # DWPD admission refuses a block seen once (first_sighting): blocks put
    # once and evicted are refused, each counted under its class.
    ns = test_namespace(block_tokens=16, layer_count=4, bytes_per_token_per_layer=1024)
    d = make_daemon(host_bytes=1 << 20, extra=(
        f'[nvme]\npath = "{tmp_path / "nvme.dat"}"\ncapacity_bytes = "64MiB"\nregion_bytes = "4MiB"\n'
        f'admission = "dwpd"\ndwpd_drive_bytes = "1GiB"\ndwpd = 1.0\n'))
    url = metrics_url(d)
    types, before = scrape(url)
    assert types["kvtier_nvme_admission_written_today_bytes"] == "gauge"
    assert types["kvtier_nvme_admission_budget_bytes_per_day"] == "gauge"
    assert types["kvtier_nvme_admission_projected_life_days"] == "gauge"
    assert value(before, "kvtier_nvme_admission_budget_bytes_per_day") == 1 << 30
    classes = {dict(k[1])["class"] for k in before
               if k[0] == "kvtier_admission_refusals_total" and dict(k[1])["tier"] == "nvme"}
    assert classes == {"first_sighting", "closed_session", "below_cutoff", "no_budget", "parent_missing"}
    n = 40
    keys = kvtier.ChainHasher(ns).keys(np.arange(n * ns.block_tokens, dtype=np.uint32))
    with kvtier.Client(d.socket_path, [ns], use_directory=False) as c:
        for k, b in zip(keys, blocks(ns, n, seed=2)):
            c.put(0, k, b)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        _, after = scrape(url)
        refused = value(after, "kvtier_nvme_admission_rejected_first_sighting_total")
        if refused > 0:
            break
        time.sleep(0.05)
    labelled = after[("kvtier_admission_refusals_total", frozenset({"tier": "nvme", "class": "first_sighting"}.items()))]
    assert labelled == refused > 0
    assert value(after, "kvtier_tier_evictions_total", tier="host", reason="capacity") >= refused


def test_the_endpoint_answers_like_an_http_server(make_daemon):
    d = make_daemon()
    url = metrics_url(d)
    base = url[: -len("/metrics")]
    with urllib.request.urlopen(base + "/healthz", timeout=10) as r:
        assert r.status == 200 and r.read() == b"ok\n"
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(base + "/nope", timeout=10)
    assert e.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(url, data=b"x", method="POST"), timeout=10)
    assert e.value.code == 405
    head = urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10)
    assert head.status == 200 and head.read() == b"" and int(head.headers["Content-Length"]) > 0
    # Still serving after all that.
    types, _ = scrape(url)
    assert "kvtier_engine_lookups_total" in types


def test_metrics_can_be_switched_off(make_daemon):
    d = make_daemon()
    metrics_url(d)
    d.stop()
    announced = d.log.read_text().count("metrics: http")
    assert announced > 0
    text = d.config.read_text().replace("[metrics]\nport = 0\n", "[metrics]\nenabled = false\n")
    assert text != d.config.read_text()
    d.config.write_text(text)
    d.start()
    with kvtier.Client(d.socket_path, [test_namespace()]) as c:
        assert c.stats()["engine.lookups"] == 0  # serving
    assert d.log.read_text().count("metrics: http") == announced, "no endpoint when switched off"


def test_scrapes_are_answered_while_idle_connections_sit_open(daemon):
    url = metrics_url(daemon)
    host, port = re.match(r"http://([^:/]+):(\d+)/", url).groups()
    idle = [socket.create_connection((host, int(port)), timeout=10) for _ in range(40)]
    try:
        for _ in range(40):  # each may close the oldest idle one; the timeout is a failure bound
            _, samples = scrape(url)
            assert samples
    finally:
        for s in idle:
            s.close()
