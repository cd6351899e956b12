"""bench_engine.py keeps running (a benchmark program: nothing here is
timed): a small multi-round QA workload through the six engines (vLLM and
SGLang, each without kvtier, with kvtier's host tier and with NVMe), the
same first tokens everywhere, and kvtier saving prefill that each
framework's own caches cannot, with hits from NVMe where the host tier is
too small."""

import bench_engine

VLLM = ("vLLM, no kvtier", "vLLM + kvtier host", "vLLM + kvtier NVMe")
SGLANG = ("SGLang, no kvtier", "SGLang + kvtier host", "SGLang + kvtier NVMe")


def test_the_engine_bench_runs_and_kvtier_saves_prefill(capsys):
    rows = {r["engine"]: r for r in bench_engine.main(["--users", "10", "--rounds", "3", "--gpu-blocks", "120"])}
    assert set(rows) == set(VLLM + SGLANG)
    assert "first tokens equal across engines: yes" in capsys.readouterr().out  # all six, vLLM and SGLang alike
    assert len({r["prompt_tokens"] for r in rows.values()}) == 1

    base, host, nvme = (rows[n] for n in VLLM)
    assert host["prefill_tokens_computed"] < base["prefill_tokens_computed"]
    assert nvme["prefill_tokens_computed"] == host["prefill_tokens_computed"]
    assert host["nvme_hit_blocks"] == 0 and host["host_hit_blocks"] > 0
    assert nvme["nvme_hit_blocks"] > 0 and nvme["demotions"] > 0  # 1 MiB of host tier: NVMe serves

    base, host, nvme = (rows[n] for n in SGLANG)
    # the pools are too small for every user: both evict, and SGLang alone
    # reuses only what they still hold
    assert base["device_evicted_pages"] > 0 and base["host_evicted_pages"] > 0
    assert base["storage_hit_tokens"] == 0
    assert host["prefill_tokens_computed"] < base["prefill_tokens_computed"]
    assert host["storage_hit_tokens"] > 0
    assert host["prefill_tokens_computed"] + host["storage_hit_tokens"] <= base["prefill_tokens_computed"]
    assert nvme["prefill_tokens_computed"] == host["prefill_tokens_computed"]
    assert host["nvme_hit_blocks"] == 0 and host["host_hit_blocks"] > 0
    assert nvme["nvme_hit_blocks"] > 0 and nvme["demotions"] > 0


def test_one_framework_alone(capsys):
    rows = bench_engine.main(["--engines", "sglang", "--users", "3", "--rounds", "2", "--gpu-blocks", "120"])
    assert [r["engine"] for r in rows] == list(SGLANG)
    assert "first tokens equal across engines: yes" in capsys.readouterr().out
