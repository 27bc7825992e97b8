"""``python -m benchmarks stats --cpu``: the CPU rows run without a GPU, every statistic checked against
NumPy's of float64 data, one row per (statistic, input, dtype)."""

from __future__ import annotations

from benchmarks import bench_stats


def test_cpu_rows_are_checked_and_complete(capsys):
    rows = bench_stats.main(["--cpu", "--quick"])
    names = [name for name, _ in bench_stats.CPU_STATS]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        *((name, "numpy", "float32") for name in names), ("var", "dask, 4 chunks", "float32"),
        ("nanmean", "dask, 4 chunks", "float32"),
        *((name, "numpy", "float64") for name in names), ("var", "dask, 4 chunks", "float64"),
        ("nanmean", "dask, 4 chunks", "float64")]
    assert all(r[-1] is True for r in rows), [r for r in rows if r[-1] is not True]
    assert all(float(r[4]) > 0 and float(r[5]) > 0 for r in rows)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("| statistic | input | dtype |") and len(printed) == len(rows) + 2
