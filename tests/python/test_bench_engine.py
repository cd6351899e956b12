"""bench_engine.py keeps running (a benchmark program: nothing here is
timed): a small multi-round QA workload through the three engines, the
same first tokens, and kvtier saving prefill that vLLM's own prefix cache
cannot, with hits from NVMe where the host tier is too small."""

import bench_engine


def test_the_engine_bench_runs_and_kvtier_saves_prefill(capsys):
    rows = {r["engine"]: r for r in bench_engine.main(["--users", "10", "--rounds", "3", "--gpu-blocks", "120"])}
    assert set(rows) == {"no kvtier", "kvtier host", "kvtier NVMe"}
    base, host, nvme = rows["no kvtier"], rows["kvtier host"], rows["kvtier NVMe"]
    assert base["prompt_tokens"] == host["prompt_tokens"] == nvme["prompt_tokens"]
    assert host["prefill_tokens_computed"] < base["prefill_tokens_computed"]
    assert nvme["prefill_tokens_computed"] == host["prefill_tokens_computed"]
    assert host["nvme_hit_blocks"] == 0 and host["host_hit_blocks"] > 0
    assert nvme["nvme_hit_blocks"] > 0 and nvme["demotions"] > 0  # 1 MiB of host tier: NVMe serves
    assert "first tokens equal across engines: yes" in capsys.readouterr().out
