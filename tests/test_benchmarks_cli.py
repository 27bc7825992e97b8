"""python -m benchmarks: the suite listing, every suite's --help without a GPU, the multigpu suite's options,
and its paths run end to end on a CPU LocalCluster at the smallest size (every row checked against a float64
reference, the tables well formed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import harness as h
from benchmarks import multigpu, multigpu_profile
from benchmarks.__main__ import OTHER, SUITES, main

ROOT = Path(__file__).resolve().parent.parent


def _bench(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def _cells(line: str) -> list[str]:
    assert line.startswith("| ") and line.endswith(" |"), line
    return [c.strip() for c in line[2:-2].split(" | ")]


def _tables(text: str) -> list[list[list[str]]]:
    """The Markdown tables in ``text``: header, then rows (the separator line dropped)."""
    tables, current = [], None
    for line in text.splitlines():
        if line.startswith("|"):
            if current is None:
                current = []
                tables.append(current)
            if not set(line) <= set("|-"):
                current.append(_cells(line))
        else:
            current = None
    return tables


def test_help_lists_every_suite_with_one_line_each():
    run = _bench("--help")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "usage: python -m benchmarks <suite> [options]"
    for name in [*SUITES, *OTHER]:
        listed = [line for line in lines if line.split()[:1] == [name]]
        assert len(listed) == 1 and len(listed[0].split()) > 3, (name, listed)
    assert {"reduce", "scan", "stats", "segments", "exact", "cub", "first-call", "multigpu", "multigpu-stats", "soak",
            "sweep-scan", "sweep-exact-scan", "fusion", "groupby"} == set(SUITES)


@pytest.mark.parametrize("suite", [*SUITES, *OTHER])
def test_each_suite_helps_without_a_gpu(suite, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "cupy", None)  # any import of CuPy fails, as on a machine without one
    with pytest.raises(SystemExit) as stop:
        main([suite, "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: python -m benchmarks {suite} ")
    if suite in ("reduce", "scan", "stats", "segments", "exact", "multigpu"):
        assert "--profile" in out


def test_an_unknown_suite_is_refused_by_name(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["reduction"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "<suite>" in err and "'reduction'" in err and "multigpu-stats" in err


def test_multigpu_presets_and_explicit_options():
    cpu = multigpu.parse(["--cpu"])
    assert (cpu.gpus, cpu.per_gpu_gib, cpu.chunk_log2, cpu.paths) == ("1,2", "0.01", "18", multigpu.PATHS)
    assert cpu.field_shape == (9, 16) and cpu.dask_cumsum_methods == "sequential"
    full = multigpu.parse([])
    assert (full.gpus, full.per_gpu_gib, full.chunk_log2, full.placements) == ("all", "8", "24,26,28",
                                                                              ("dask", "contiguous"))
    assert full.field_shape == (721, 1440) and full.field_chunk_steps == 166
    assert 8760 * 721 * 1440 <= full.field_gib * 4 * 2**30 // 4 < 8761 * 721 * 1440  # 8760 steps on 4 GPUs
    quick = multigpu.parse(["--quick", "--gpus", "2"])
    assert (quick.gpus, quick.paths, quick.budget_s, quick.timeout_s) == ("2", ("held",), 170.0, 10.0)
    scaling = multigpu.parse(["--scaling", "--cpu"])
    assert (scaling.gpus, scaling.per_gpu_gib, scaling.placements) == ("1,2", "0.004,0.008", ("dask", "balanced"))
    assert multigpu.parse(["--scaling"]).per_gpu_gib == "8,24,32"
    held = multigpu.parse(["--cpu", "--profile", "held"])
    assert (held.profile, held.per_gpu_gib, held.chunk_log2) == ("held", "0.01", "18")
    assert multigpu.parse(["--profile"]).profile == "phases" and multigpu.parse(["--cpu", "--profile"]).gpus == "4"
    assert full.protocols == ("tcp",) and multigpu.parse(["--protocols", "tcp,ucx"]).protocols == ("tcp", "ucx")
    # no --allocators: each transport's kind (UCX cannot map the asynchronous allocator's memory)
    assert multigpu.allocators_for(cpu, "tcp") == ("cupy",)
    assert multigpu.allocators_for(full, "ucx") in (("pool",), ("cupy",))  # ("cupy",) where rmm is missing
    assert multigpu.allocators_for(full, "tcp") == (h.default_allocator(False),)
    chosen = multigpu.parse(["--protocols", "ucx", "--allocators", "cupy,async"])
    assert multigpu.allocators_for(chosen, "ucx") == ("cupy", "async")


@pytest.mark.parametrize("argv, named", [(["--paths", "held,axis"], "--paths"), (["--paths", ""], "--paths"),
                                         (["--placements", "lazy"], "--placements"), (["--repeats", "0"], "--repeats"),
                                         (["--field-shape", "721"], "--field-shape"), (["--profile", "x"], "--profile"),
                                         (["--gpus", "2,x"], "--gpus"), (["--gpus", "0"], "--gpus"),
                                         (["--per-gpu-gib", "-1"], "--per-gpu-gib"), (["--chunk-log2", "2.5"], "--chunk-log2"),
                                         (["--tall-cols", "0"], "--tall-cols"), (["--timeout-s", "0"], "--timeout-s"),
                                         (["--dask-cumsum-methods", "scan"], "--dask-cumsum-methods"),
                                         (["--protocols", "tcp,quic"], "--protocols"),
                                         (["--cpu", "--protocols", "ucx"], "--protocols")])
def test_multigpu_bad_options_are_refused_before_any_work(argv, named, capsys):
    with pytest.raises(SystemExit):
        multigpu.parse(argv)
    assert named in capsys.readouterr().err


def test_worker_counts():
    assert multigpu.worker_counts("powers", 4) == [1, 2, 4]
    assert multigpu.worker_counts("powers", 6) == [1, 2, 4, 6]
    assert multigpu.worker_counts("powers", 8) == [1, 2, 4, 8]
    assert multigpu.worker_counts("all,1", 3) == [3, 1]
    assert multigpu.worker_counts("1,2,16,2", 4) == [1, 2]


def test_table_rows_have_the_headers_cells():
    assert h.md_table(("a", "b"), [(1, "x|y")]).splitlines() == ["| a | b |", "|---|---|", "| 1 | x\\|y |"]
    with pytest.raises(ValueError, match="3 cells, its header 2"):
        h.md_table(("a", "b"), [(1, 2, 3)])
    phases = {k: 1.0 for k in multigpu_profile.PHASES}
    for found in (phases, {"total": 2.0, "best": 1.5}):  # a call timed whole leaves the phase cells empty
        row = multigpu_profile.phase_cells(4, 64, "mr.sum", found)
        assert len(row) == len(multigpu_profile.PHASE_HEADER)
        assert len(_cells(h.md_table(multigpu_profile.PHASE_HEADER, [row]).splitlines()[-1])) == len(row)


def test_a_step_names_how_it_runs():
    with pytest.raises(ValueError, match="how='collect'"):
        h.Step(None, "collect", lambda: None)


EXPECTED = {
    "expr": {"mr.sum(x * 2).compute()", "da.sum(x * 2).compute()", "mr.var(x + 1).compute()",
             "da.var(x + 1).compute()", "mr.argmax(abs(x)).compute()", "da.argmax(abs(x)).compute()",
             "mr.cumsum(x * 2).persist()", "da.cumsum(x * 2).persist()",
             "mr.sum(x * 2).compute() unfused", "mr.argmax(abs(x)).compute() unfused",
             "mr.cumsum(x * 2).persist() unfused",
             "x * 2 alone: b * 2 on each held chunk, summed per worker (slowest)",
             "mr.sum().compute()", "dask.array.sum"},  # the held bare call and its peer
    "graph": {"client.compute(mr.sum())", "dask.compute(mr.sum(x), mr.max(x))", "dask.compute(da.sum(x), da.max(x))",
              "floor: client.submit(trivial task).result()"},
    "lazy": {"mr.sum(lz).compute()", "da.sum(lz).compute()", "floor: one task per worker makes and sums its chunks",
             "mr.cumsum(lz).persist()", "da.cumsum(lz).persist()"},
    "memory": {"peak memory: mr.sum(lz).compute()", "peak memory: da.sum(lz).compute()"},
    "axes": {"mr.sum(m, axis=1).persist()", "da.sum(m, axis=1).persist()", "mr.mean(f, axis=0).compute()",
             "da.mean(f, axis=0).compute()", "mr.mean(f, axis=0, dtype=float64).compute()",
             "da.mean(f, axis=0, dtype=float64).compute()", "mr.groupby_reduce(f, month, 'mean', axis=0)",
             "the same, method='map-reduce' (one tree over every chunk's partial)",
             "per month: da.stack([f[month == m].mean(axis=0)])", "mr.groupby_reduce(f, day, 'max', axis=0).persist()",
             "mr.sum(f).compute()", "da.sum(f).compute()"},
}


@pytest.mark.slow
def test_multigpu_paths_on_a_cpu_cluster(tmp_path):
    """The new paths at the smallest size (4 chunks) on two CPU workers: each row's value right, each
    comparison row's dask.array peer in the same configuration, the tables' rows as wide as their headers.
    (The held path's own rows: tests/test_direct.py runs them through --profile held.)"""
    run = _bench("multigpu", "--cpu", "--gpus", "2", "--repeats", "1", "--per-gpu-gib", "0.0005", "--chunk-log2",
                 "16", "--field-gib", "0.0002", "--placements", "dask", "--no-task-stream",
                 "--paths", "expr,axes,lazy,graph,memory", env={"OUT": str(tmp_path)})
    assert run.returncode == 0, run.stderr[-3000:]
    rows = json.loads((tmp_path / "bench_multigpu_latest.json").read_text())["rows"]
    by_path = {}
    for r in rows:
        by_path.setdefault(r["path"], set()).add(r["impl"])
    # dask.array.sum runs once, under the first path that compares with it (expr), not again under graph
    assert by_path == EXPECTED, by_path
    assert [r for r in rows if not r["ok"]] == []
    assert all(r["gpus"] == 2 and r["ms"] > 0 for r in rows)
    config = ("gpus", "gib_per_gpu", "chunk", "placement")
    for r in rows:
        if r["peer"]:
            assert any(q["impl"] == r["peer"] and all(q[k] == r[k] for k in config) for q in rows), r
    assert {r["chunks_per_worker"] for r in rows if r["chunk"] == "2^16"} <= {"0/4", "1/3", "2/2", "3/1", "4/0"}
    memory = [r for r in rows if r["path"] == "memory"]
    assert all(r["peak_rss"] >= 0 and len(r["memory_above_baseline"]) == 2 for r in memory)
    field = next(r for r in rows if r["impl"] == "mr.mean(f, axis=0).compute()")
    assert field["chunk"] == "166x9x16"  # 745 time steps: 4 chunks of 166 and one of 81
    # the short table printed last: one line per timed row, as wide as its header
    short = _tables(run.stdout)[-1]
    assert short[0] == ["workers", "GiB/worker", "chunk", "placement", "chunks/worker", "allocator", "protocol",
                        "impl", "ms", "first ms", "x dask", "ok"]
    assert {r["allocator"] for r in rows} == {"cupy"}  # CPU workers: no device allocator to choose
    assert {r["protocol"] for r in rows} == {"tcp"}
    assert len(short) - 1 == len(rows) - len(memory)
    assert all(len(line) == len(short[0]) and line[-1] == "True" for line in short[1:])
    full, mem = _tables((tmp_path / "bench_multigpu_latest.md").read_text())
    assert len(full) - 1 == len(rows) - len(memory) and len(mem) - 1 == len(memory)
    assert all(len(line) == len(table[0]) for table in (full, mem) for line in table)


@pytest.mark.slow
def test_multigpu_phases_profile_on_a_cpu_cluster():
    """``--profile phases`` on four CPU workers: every row of its table, the eager alternatives' rows too
    (each checks its sum against the held call's bits before it is timed)."""
    run = _bench("multigpu", "--cpu", "--profile", "phases", "--repeats", "1")
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [r for r in _tables(run.stdout)[-1][1:]]
    impls = {r[2] for r in rows}
    assert {"dask.array.sum", "mr.sum", "mr.sum(compute=True) [client.run]", "eager via client.submit"} <= impls


@pytest.mark.slow
def test_multigpu_tall_profile_on_a_cpu_cluster():
    """``--profile tall`` on four CPU workers: the persisted row sums with and without lineage beside
    dask.array's, each checked against float64 row sums before it is timed, neither held row declined,
    and every phase a number of milliseconds."""
    run = _bench("multigpu", "--cpu", "--profile", "tall", "--repeats", "1", "--per-gpu-gib", "0.002",
                 "--chunk-log2", "13")
    assert run.returncode == 0, run.stderr[-3000:]
    table = _tables(run.stdout)[-1]  # each row printed as it came, then the whole table
    header, *rows = table[table.index(list(multigpu_profile.HEADER_TALL)):]
    assert [r[2] for r in rows] == ["mr.sum(m, axis=1).persist()",
                                    "the same, outputs registered as data only (no lineage)",
                                    "da.sum(m, axis=1).persist()"]
    assert all(r[-1] == "-" for r in rows)
    assert all(float(c) >= 0 for r in rows for c in r[3:-1])
    assert float(rows[0][7]) > 0 and float(rows[0][4]) > 0  # the lineage's registration and the direct call
