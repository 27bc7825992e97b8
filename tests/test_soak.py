"""python -m benchmarks soak on a CPU LocalCluster with tiny settings (every result checked, memory after the
warm-up flat, throughput reported), its checker, its memory summary and argument checks; and our caches stay
bounded under a stream of distinct inputs."""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest

pytest.importorskip("distributed")
pytest.importorskip("psutil")

import dask  # noqa: E402
import dask.array as da  # noqa: E402

import multireduce as mr  # noqa: E402

# as a module of the benchmarks package, not from a file spec: the spawned client processes unpickle
# benchmarks.soak._client_main
soak = importlib.import_module("benchmarks.soak")
api = importlib.import_module("multireduce.api")
operators = importlib.import_module("multireduce.operators")


@pytest.mark.slow
def test_soak_cpu_small():
    # one size class (1 KB) keeps the warm-up at one request per (dtype, operation)
    out = soak.run(clients=2, requests=9, rounds=3, min_bytes=1, max_bytes=1024, cpu=True, seed=3,
                   throughput_requests=3)
    assert out["errors"] == [] and out["done"] == 18, out
    assert out["leaks"] == {} and out["unbounded_cache_growth"] == {}, out
    assert out["ok"] and out["warmup_requests"] == len(soak.warmup_grid(False, 1, 1024))
    assert out["complete"] and not out["stopped_at_deadline"]
    assert len(out["round_seconds"]) == 3 and len(out["growth_bytes"]) == 2
    for worker, growth in out["growth_bytes"].items():
        assert set(growth) == {"rss"} and growth["rss"] <= soak.RSS_TOL, (worker, growth)
        assert "rss" in out["slope_bytes_per_round"][worker]
    assert set(out["small_request_per_s"]) == {"multireduce.sum", "dask.array.sum"}
    assert all(v > 0 for v in out["small_request_per_s"].values())


@pytest.mark.slow
def test_soak_deadline_reports_the_rounds_done():
    # a device call that runs out of time returns nothing, so past the deadline no new round starts and the
    # report still comes back, marked incomplete (no warm-up requests: the first stage is what matters)
    lines = []
    out = soak.run(clients=2, requests=6, rounds=3, min_bytes=1, max_bytes=1024, cpu=True, seed=4,
                   throughput_requests=0, warmup=False, deadline=0.0, progress=lines.append)
    assert out["stopped_at_deadline"] and not out["complete"], out
    assert out["errors"] == [] and out["done"] == 0 and out["round_seconds"] == [], out
    assert len(lines) == 1 and lines[0].startswith("soak: warm-up done in"), lines


def test_warmup_grid_touches_every_dtype_operation_and_size_class():
    grid = soak.warmup_grid(gpu=False, min_bytes=1, max_bytes=10**9)
    assert {d for d, _, _ in grid} == set(soak.DTYPES)
    assert {op for _, op, _ in grid} == set(soak.OPS)
    assert {nb for _, _, nb in grid} == set(soak.SIZE_CLASSES.values())
    assert len(grid) == len(set(grid)) == sum(len(soak.ops_for(d)) for d in soak.DTYPES) * len(soak.SIZE_CLASSES)
    gpu = soak.warmup_grid(gpu=True, min_bytes=4096, max_bytes=10**5)
    assert not any(np.dtype(d).kind == "c" for d, _, _ in gpu)
    assert {nb for _, _, nb in gpu} == {4096, 64 * 2**10, 10**5}  # clipped to the run's range


def test_soak_checker_catches_a_wrong_result():
    rng = np.random.default_rng(0)
    host = np.arange(1, 34, dtype=np.int32)
    soak._check("sum", host.sum(dtype=np.int64), host)
    with pytest.raises(AssertionError):
        soak._check("sum", host.sum(dtype=np.int64) + 1, host)
    x = rng.standard_normal(1025).astype(np.float32)
    with pytest.raises(AssertionError):
        soak._check("cumsum", np.cumsum(x) * 1.01, x)
    soak._check("argmax", np.argmax(x), x)
    with pytest.raises(AssertionError):
        soak._check("argmax", np.argmax(x) + 1, x)
    soak._check("var", x.astype(np.float64).var(), x)
    with pytest.raises(AssertionError):
        soak._check("var", x.astype(np.float64).var() * 1.001, x)
    y = soak._data(rng, "float64", 1023, "nansum")
    assert np.isnan(y).any()
    soak._check("nansum", np.nansum(y), y)
    with pytest.raises(AssertionError):
        soak._check("nansum", np.nansum(y) + 1e-3, y)


def _samples(rss, gpu=None, caches=None):
    out = []
    for r, value in enumerate(rss):
        s = {"rss": value, "caches": (caches or [{}] * len(rss))[r]}
        if gpu is not None:
            s.update(gpu_used=gpu[r], pool_used=0)
        out.append({"w": s})
    return out


def test_summary_flags_growth_past_the_bound_and_unbounded_caches():
    mib = 2**20
    flat = soak.summarize(_samples([100 * mib, 101 * mib, 100 * mib, 101 * mib]), 64 * mib, 64 * mib)
    assert flat["leaks"] == {} and flat["growth_bytes"]["w"]["rss"] == mib
    steady = soak.summarize(_samples([100 * mib + 30 * mib * r for r in range(5)]), 64 * mib, 64 * mib)
    assert steady["leaks"] == {"w": {"rss": 120 * mib}}
    assert steady["slope_bytes_per_round"]["w"]["rss"] == pytest.approx(30 * mib)
    gpu = soak.summarize(_samples([0, 0, 0], gpu=[5 * mib, 80 * mib, 80 * mib]), 64 * mib, 64 * mib)
    assert gpu["leaks"] == {"w": {"gpu_used": 75 * mib}}
    one = soak.summarize(_samples([0, 0], gpu=[5 * mib, 80 * mib]), 64 * mib, 64 * mib)
    assert one["leaks"] == {"w": {"gpu_used": 75 * mib}}  # one round: its sample decides
    # driver-level use must persist over the last two rounds: a reservation that comes back is not a leak,
    # growth that stays is, wherever the peak was, and so is a leak that starts late
    transient = soak.summarize(_samples([0] * 6, gpu=[0, 4000 * mib, 2000 * mib, 0, 300 * mib, 8 * mib]), mib,
                               64 * mib)
    assert transient["leaks"] == {} and transient["gpu_used_peak_bytes"]["w"] == 4000 * mib
    leak = soak.summarize(_samples([0] * 6, gpu=[0, 70 * mib, 90 * mib, 66 * mib, 300 * mib, 80 * mib]), mib, 64 * mib)
    assert leak["leaks"] == {"w": {"gpu_used": 80 * mib}} and leak["gpu_used_persisted_bytes"]["w"] == 80 * mib
    late = soak.summarize(_samples([0] * 11, gpu=[0] * 9 + [200 * mib, 200 * mib]), mib, 64 * mib)
    assert late["leaks"] == {"w": {"gpu_used": 200 * mib}}
    caches = [{"a.bounded": (3, 8), "a.free": (2, None)}, {"a.bounded": (8, 8), "a.free": (2, None)},
              {"a.bounded": (8, 8), "a.free": (5, None)}]
    grown = soak.summarize(_samples([0, 0, 0], caches=caches), mib, mib)
    assert grown["unbounded_cache_growth"] == {"w": {"a.free": (2, 5)}} and grown["leaks"] == {}


@pytest.mark.parametrize("argv", [["--clients", "0"], ["--requests", "0"], ["--rounds", "0"],
                                  ["--requests", "2", "--rounds", "3"], ["--min-bytes", "10", "--max-bytes", "5"]])
def test_soak_rejects_bad_arguments(argv):
    with pytest.raises(SystemExit):
        soak.main(argv + ["--cpu"])


def _workload(rng, sizes, fresh_operators=0):
    """NumPy and Dask inputs of the given sizes through every soak operation, plus 2-D axis reductions;
    each call checked against NumPy so that a cache serving a stale entry would show."""
    for n in sizes:
        for dtype in ("int16", "float32", "float64", "bool"):
            host = soak._data(rng, dtype, n, "sum")
            for op in soak.ops_for(dtype):
                if op in ("argmax",) and n == 0:
                    continue
                soak._check(op, getattr(mr, op)(host), host)
                lazy = da.from_array(host, chunks=max(n // 3, 1))
                soak._check(op, getattr(mr, op)(lazy).compute(), host)
        grid = rng.standard_normal((3, n + 1))
        np.testing.assert_allclose(mr.sum(grid, axis=1), grid.sum(axis=1), rtol=1e-12)
        np.testing.assert_allclose(mr.cumsum(grid, axis=1), np.cumsum(grid, axis=1), rtol=1e-12, atol=1e-12)
    base = operators.get_operator("sum")
    host = rng.standard_normal(33)
    for _ in range(fresh_operators):  # an operator object built per call, not registered by name
        assert np.isclose(mr.reduce(host, dataclasses.replace(base)), host.sum())


def test_caches_stay_bounded_under_distinct_inputs():
    rng = np.random.default_rng(5)
    with dask.config.set(scheduler="sync"):
        _workload(rng, [1, 31, 1025])
        warm = soak.cache_sizes()
        assert warm, "no cache found: the check would pass vacuously"
        assert "multireduce.api._default_plans" in warm and warm["multireduce.api._default_plans"][1] is not None
        # distinct sizes, shapes and array names (each from_array is a new name), new operator objects
        _workload(rng, [2, 33, 1023, 4097, 40_000], fresh_operators=api._MAX_DEFAULT_PLANS + 40)
    after = soak.cache_sizes()
    for name, (entries, bound) in after.items():
        if bound is None:
            assert entries <= warm.get(name, (0, None))[0], f"{name} grew from {warm.get(name)} to {entries}"
        else:
            assert entries <= bound, (name, entries, bound)


def test_kernel_memos_are_bounded_caches(monkeypatch):
    """The memos of compiled kernels hold one entry per (device, operator, kernel group) or (device,
    statistic, dtype, expression): a small set for the built-in operators, loaded as a worker first meets
    each (a Dask graph's combining tasks land where Dask puts them, so not always in the warm-up). Both
    start again past a bound, which the soak reads as bounded; a program that makes operators in a loop
    does not keep every module it compiled."""
    from multireduce import kernels
    from multireduce.backends import cupy_stats

    sizes = soak.cache_sizes()
    assert sizes["multireduce.kernels._modules"][1] == kernels._MAX_MODULES
    assert sizes["multireduce.backends.cupy_stats._loaded"][1] == cupy_stats._MAX_LOADED
    monkeypatch.setattr(kernels, "_modules", {})
    monkeypatch.setattr(kernels, "_MAX_MODULES", 4)
    made = [kernels._memoized(("device", i), lambda i=i: {"module": i}) for i in range(10)]
    assert [m["module"] for m in made] == list(range(10))
    assert 0 < len(kernels._modules) <= 4
    assert kernels._memoized(("device", 9), lambda: {"module": "again"}) == {"module": 9}  # still memoized
