"""bench_sglang_copy.py keeps running (a benchmark program: nothing here is
timed): tiny pages through every host pool layout, exact round trips, and
the copies per byte the bench counts on the backend's paths: one each way
on every layout (layer_first's get scatters from pins, no staging)."""

import kvtier
from kvtier.integrations import sglang as backend_module

import bench_sglang_copy

TINY = ["--pages", "4", "--page-size", "16", "--layers", "4", "--heads", "2", "--head-dim", "64",
        "--mla-layers", "3", "--reps", "1"]


def test_the_sglang_copy_bench_runs_and_counts_one_copy_each_way(tmp_path):
    originals = kvtier.Client.get_batch, kvtier.Client.pin, backend_module._copy_pieces
    rows = {(r["layout"], r["pool"]): r for r in bench_sglang_copy.main(TINY + ["--json", str(tmp_path / "rows.json")])}
    assert set(rows) == set(bench_sglang_copy.CASES)
    assert all(r["round_trip_exact"] for r in rows.values())
    for case in [("page_first", "MHA"), ("page_first_direct", "MHA"), ("layer_first", "MHA"), ("page_first", "MLA")]:
        assert rows[case]["set_copies_per_byte"] == 1.0 and rows[case]["get_copies_per_byte"] == 1.0, case
    assert (kvtier.Client.get_batch, kvtier.Client.pin, backend_module._copy_pieces) == originals  # unwrapped
    assert (tmp_path / "rows.json").stat().st_size > 0
