"""Elementwise steps read into a reduction's or scan's loads (multireduce.fusion), on the CPU: which graphs
are read, what the steps compute, and that a plan reading through them gives the unfused bits on every
path (the graph, ``compute=True``, held chunks on a cluster, scans). On NumPy chunks the steps are
normally left to NumPy; these tests route them through the fused operator's NumPy load, the same logic
the GPU kernels run (tests/gpu/test_gpu_fusion.py)."""

from __future__ import annotations

import dataclasses

import dask
import dask.array as da
import numpy as np
import pytest

import multireduce as mr
from multireduce import api, fusion
from multireduce.operators import get_operator

RNG = np.random.default_rng(20261126)
CHUNKS = (100, 333, 0, 567, 31, 1, 1023)  # awkward, one empty
N = sum(CHUNKS)


def _data(dtype=np.float32, n=N):
    x = (RNG.standard_normal(n) * 1e3).astype(dtype)
    x[::97] = -x[::97]
    x[7] = -0.0
    return x


def _bits(a):
    a = np.asarray(a)
    return a.dtype, a.shape, a.tobytes()


EXPRESSIONS = {
    "x * 2 + 1": lambda x: x * 2 + 1,
    "(x + 0.1) / 3": lambda x: (x + 0.1) / 3,
    "where(x > 0, x * 2, -0.0)": lambda x: da.where(x > 0, x * 2, -0.0),
    "abs(x) * 3 - x": lambda x: abs(x) * 3 - x,
    "x * x + x": lambda x: x * x + x,
    "-x - 1e30": lambda x: -x - 1e30,
}


@pytest.mark.parametrize("name", list(EXPRESSIONS))
def test_the_steps_are_read_and_compute_what_dask_computes(name):
    xn = _data()
    x = da.from_array(xn, chunks=(CHUNKS,))
    e = EXPRESSIONS[name](x)
    below, steps = fusion.split_steps(e)
    assert below.name == x.name and below.chunks == x.chunks and below.dtype == x.dtype
    with np.errstate(all="ignore"):
        assert _bits(steps.evaluate(xn)) == _bits(e.compute())
    code = steps.cuda("float")
    assert "*" not in code.replace("(-", "") or "__fmul_rn" in code  # every product rounded on its own
    assert " + " not in code and " / " not in code  # no operator NVRTC could contract into a multiply-add


def test_only_one_input_at_each_chunks_position_with_python_numbers_is_read():
    x = da.from_array(_data(), chunks=(CHUNKS,))
    y = da.from_array(_data(), chunks=(CHUNKS,))
    w = da.from_array(_data(n=N), chunks=N)  # other chunks: a rechunk of y to x's
    assert fusion.split_steps(x) is None  # no step
    assert fusion.split_steps(x * y) is None  # two arrays
    below, steps = fusion.split_steps((x * y) * 2)  # the product is the input of the step above it
    assert below.name == (x * y).name and steps.tree == ("multiply", fusion.LEAF, ("constant", 2))
    assert fusion.split_steps(x * np.float32(2)) is None  # a NumPy scalar is not weak: NumPy promotes by it
    assert fusion.split_steps(x * w) is None
    assert fusion.split_steps(np.exp(x)) is None  # transcendental: CuPy's bits are CuPy's
    assert fusion.split_steps(x ** 2) is None
    assert fusion.split_steps(x.astype(np.float64) * 2) is not None  # float64 times an int: float64 in
    assert fusion.split_steps(abs(x) * 3) is None  # a complex input gives float32 too
    assert fusion.split_steps(da.where(x > 0, x, 0)) is None  # float32 passed through: its subnormals


def test_an_input_dtype_the_graph_leaves_open_is_not_guessed():
    x64 = da.from_array(_data(np.float64), chunks=(CHUNKS,))
    i32 = da.from_array(np.arange(N, dtype=np.int32), chunks=(CHUNKS,))
    assert fusion.split_steps(x64 * 2) is not None
    # an int32 input divided by 2 is float64 too: the input could be either
    assert fusion.split_steps(x64 / 2) is None and fusion.split_steps(i32 / 2) is None
    assert fusion.split_steps(x64 * 0.5) is None
    assert fusion.split_steps(i32 * 2) is None  # integers: not fused
    x32 = da.from_array(_data(), chunks=(CHUNKS,))
    assert fusion.split_steps(x32 * 0.5) is not None  # nothing but float32 gives float32 here
    assert fusion.split_steps(da.sqrt(abs(x32))) is None  # int16 input: sqrt gives float32 too


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("func", ["sum", "nansum", "prod", "max", "nanmin", "mean"])
def test_a_plan_reading_through_the_steps_gives_the_unfused_bits(func, dtype):
    xn = _data(dtype)
    xn[5] = np.nan if func.startswith("nan") else xn[5]
    x = da.from_array(xn, chunks=(CHUNKS,))
    # a float constant leaves a float64 input open (an integer input would give float64 too)
    zero = -0.0 if dtype == np.float32 else 0
    for e in (x * 2 + 1, da.where(x > 0, x * 2, zero), abs(x) * 3 - x):
        below, steps = fusion.split_steps(e)
        op = get_operator("sum" if func == "mean" else func)
        plans, _, _, fan_in = api._resolve_reduction("dask-numpy", op, e.dtype, 1, None, None, False, 4, "auto",
                                                     func == "mean", None, "test")
        fused = dataclasses.replace(plans[0], op=fusion.fused_operator(op, steps, e.dtype))
        from multireduce import graph

        with np.errstate(all="ignore"):
            assert _bits(graph.reduction(below, fused, fan_in).compute()) == \
                _bits(graph.reduction(e, plans[0], fan_in).compute())


@pytest.fixture
def fusing(monkeypatch):
    """The API reads the steps into its plans on NumPy chunks too, and counts the operators it makes."""
    made = []
    make = fusion.fused_operator
    monkeypatch.setattr(fusion, "worth_fusing", lambda x: True)
    monkeypatch.setattr(fusion, "fused_operator", lambda *a: made.append(a) or make(*a))
    return made


def _calls(e):
    with np.errstate(all="ignore"):
        return [mr.sum(e).compute(), mr.mean(e, compute=True), mr.max(e, axis=0).compute(),
                mr.cumsum(e).compute(), mr.nancumsum(e).compute(), mr.sum(e, split_every=2).compute()]


def test_the_api_reads_the_steps_and_gives_the_unfused_bits(fusing):
    x = da.from_array(_data(), chunks=(CHUNKS,))
    e = x * 2 + 1
    with dask.config.set({"multireduce.fuse-elementwise": False}):
        want = _calls(e)
    assert not fusing
    got = _calls(e)
    assert len(fusing) == len(got)
    assert [_bits(g) for g in got] == [_bits(w) for w in want]


def test_numpy_chunks_keep_their_steps_by_default():
    x = da.from_array(_data(), chunks=(CHUNKS,))
    plan = api._resolve_reduction("dask-numpy", get_operator("sum"), x.dtype, 1, None, None, False, 4, "auto",
                                  False, None, "test")[0][0]
    assert fusion.fused(x * 2, plan) is None


def test_held_chunks_are_reduced_and_scanned_through_the_steps_on_a_cluster(fusing):
    distributed = pytest.importorskip("distributed")
    xn = _data()
    with distributed.LocalCluster(n_workers=3, threads_per_worker=1, processes=False, dashboard_address=None,
                                  scheduler_port=0) as cluster, distributed.Client(cluster) as client:
        x = client.persist(da.from_array(xn, chunks=(CHUNKS,)))
        distributed.wait(x)
        e = x * 2 + 1
        with dask.config.set({"multireduce.fuse-elementwise": False}):
            want = [mr.sum(e).compute(), mr.cumsum(e).persist().compute(), client.compute(mr.mean(e)).result()]
        assert not fusing
        held = mr.sum(e)
        assert type(held).__name__ == "WholeOfHeld"  # the held path, over x itself
        got = [held.compute(), mr.cumsum(e).persist().compute(), client.compute(mr.mean(e)).result()]
        assert len(fusing) == 3
        assert [_bits(g) for g in got] == [_bits(w) for w in want]


def test_the_steps_of_an_expression_over_held_chunks_are_read_once_per_name(fusing, monkeypatch):
    """The same expression made again as a new array over the same persisted chunks is not read again:
    its steps and the array they read come back as read the first time (no future kept in between), and
    the reductions through them give the bits read anew; an expression without steps is remembered as
    such."""
    distributed = pytest.importorskip("distributed")
    reads = []
    real = fusion.read_steps
    monkeypatch.setattr(fusion, "read_steps", lambda x, any_input=False: reads.append(x.name)
                        or real(x, any_input=any_input))
    xn = _data()
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None,
                                  scheduler_port=0) as cluster, distributed.Client(cluster) as client:
        x = client.persist(da.from_array(xn, chunks=(CHUNKS,)))
        distributed.wait(x)
        first = fusion.split_steps(x * 2 + 1)
        again = fusion.split_steps(x * 2 + 1)
        assert reads == [(x * 2 + 1).name]
        assert again[0].name == first[0].name == x.name and again[1] == first[1]
        assert again[0].chunks == x.chunks and again[0].dtype == x.dtype
        assert dict(again[0].__dask_graph__()) == dict(x.__dask_graph__())  # the held futures themselves
        got = [mr.sum(x * 2 + 1).compute() for _ in range(2)]
        with dask.config.set({"multireduce.fuse-elementwise": False}):
            want = mr.sum(x * 2 + 1).compute()
        assert all(_bits(g) == _bits(want) for g in got)
        reads.clear()
        stacked = da.concatenate([x, x])  # no steps at the top
        assert fusion.split_steps(stacked) is None and fusion.split_steps(da.concatenate([x, x])) is None
        assert len(reads) == 1
        assert fusion.split_steps(x * 2 + 1, any_input=True) is not None and len(reads) == 2  # read apart


STATISTICS = {
    "var": lambda e: mr.var(e).compute(), "std_axis0": lambda e: mr.std(e, axis=0, ddof=1).compute(),
    "nanvar": lambda e: mr.nanvar(e).compute(), "nanmean": lambda e: mr.nanmean(e).compute(),
    "argmax": lambda e: mr.argmax(e).compute(), "nanargmin": lambda e: mr.nanargmin(e).compute(),
    "nanmax": lambda e: mr.nanmax(e).compute(),
}


@pytest.mark.parametrize("name", sorted(STATISTICS))
def test_statistics_read_the_steps_and_give_the_unfused_bits(monkeypatch, name):
    """A statistic of elementwise steps reads the array under them, its plan carrying the steps (the GPU's
    kernels read each element through them; NumPy's chunk functions take the steps' values first)."""
    make = fusion.fused_statistic
    monkeypatch.setattr(fusion, "worth_fusing", lambda x: True)
    x = da.from_array(_data(), chunks=(CHUNKS,))
    e = abs(x) * 3 - x if name.startswith("nan") else x * 2 + 1
    if name == "std_axis0":
        x = da.from_array(_data()[: (N // 8) * 8].reshape(-1, 8), chunks=((100, 0, 106, 50), (3, 5)))
        e = x * 2 + 1
    with np.errstate(all="ignore"):
        with dask.config.set({"multireduce.fuse-elementwise": False}):
            want = STATISTICS[name](e)
        made = []
        with monkeypatch.context() as m:
            m.setattr(fusion, "fused_statistic", lambda x, plan: made.append(make(x, plan)) or made[-1])
            got = STATISTICS[name](e)
    assert made and made[0] is not None and made[0][1].steps is not None
    assert _bits(got) == _bits(want)


def test_statistics_the_kernels_cannot_read_so_keep_their_steps(monkeypatch):
    monkeypatch.setattr(fusion, "worth_fusing", lambda x: True)
    x = da.from_array(_data(), chunks=(CHUNKS,))
    from multireduce.statistics import StatPlan

    for stat in ("any", "all", "count_nonzero"):
        assert fusion.fused_statistic(x * 2, StatPlan(stat, (0,), False, np.dtype(bool))) is None
    plan = StatPlan("var", (0,), False, np.dtype(x.dtype))
    with dask.config.set({"multireduce.fuse-elementwise": False}):
        assert fusion.fused_statistic(x * 2, plan) is None
    below, fused = fusion.fused_statistic(x * 2, plan)
    assert below.name == x.name and fused.steps == fusion.split_steps(x * 2)[1]
    assert fusion.fused_statistic(below, fused) is None  # read once
    name, source = fusion.stat_reading_steps("mr::MomentsStat<float, false>", fused.steps, np.float32)
    assert name.startswith("mr_user::stat_fused_") and name.split("::")[1] in source
    assert "Plain::visit(s, step(v), at)" in source and "__fmul_rn(e, __uint_as_float(0x40000000u))" in source
    assert dask.base.tokenize(fused) != dask.base.tokenize(plan)


class _ReadingBackend:
    """numpy_stats taking ``steps`` as a GPU backend does (READS_STEPS), recording the dtype of each chunk
    read through them; the steps' values computed first, as NumPy would."""

    READS_STEPS = True

    def __init__(self):
        self.read = []

    def __getattr__(self, name):
        from multireduce.backends import numpy_stats

        real = getattr(numpy_stats, name)
        if not name.endswith("_chunk"):
            return real

        def chunk(block, *args, steps=None):
            if steps is not None:
                self.read.append(np.dtype(block.dtype))
                block = steps.evaluate(block)
            return real(block, *args)

        return chunk


@pytest.mark.parametrize("stat", ["argmax", "nanargmin", "var", "nanmax"])
def test_statistics_of_steps_that_other_input_dtypes_also_give_read_only_chunks_of_that_dtype(monkeypatch, stat):
    """``abs(x)`` is float32 for float32 and for complex64 chunks, and the graph does not say which: a
    statistic reads the steps in its kernels for chunks of the dtype it assumed, and computes them apart
    for any other, with NumPy's result either way."""
    from multireduce import statistics

    reading = _ReadingBackend()
    monkeypatch.setattr(fusion, "worth_fusing", lambda x: True)
    monkeypatch.setattr(statistics, "_backend", lambda block: reading)
    fn = getattr(mr, stat)
    x = _data()
    z = (x + 1j * _data()).astype(np.complex64)
    for data, read_in_kernels in ((x, True), (z, False)):
        reading.read.clear()
        d = da.from_array(data, chunks=(CHUNKS,))
        e = abs(d) if stat != "var" else da.sqrt(abs(d)) * 2  # sqrt: int16 chunks give float32 too
        assert e.dtype == np.float32 and fusion.split_steps(e) is None  # not for reductions: any input dtype
        assert fusion.split_steps(e, any_input=True) is not None
        with np.errstate(all="ignore"):
            got = fn(e).compute()
            with dask.config.set({"multireduce.fuse-elementwise": False}):
                want = fn(e).compute()
            numpy_value = getattr(np, stat)(np.sqrt(np.abs(data)) * 2 if stat == "var" else np.abs(data))
        assert _bits(got) == _bits(want)
        assert np.asarray(got) == numpy_value or np.isclose(got, numpy_value, rtol=1e-5)
        assert set(reading.read) == ({np.dtype(np.float32)} if read_in_kernels else set())


def test_a_subnormal_float32_constant_is_left_to_cupy():
    """Our runtime-compiled kernels flush float32 subnormals (-ftz): such a constant would read as zero."""
    x = da.from_array(_data(np.float32), chunks=(CHUNKS,))
    assert fusion.read_steps(da.where(x > 0, x * 0, 1e-40)) is None
    assert fusion.read_steps(x * 2 + 1e-44) is None
    assert fusion.read_steps(da.where(x > 0, x * 0, 1e-30)) is not None  # a normal float32 constant
    assert fusion.read_steps(x + 0.0) is not None and fusion.read_steps(x * -0.0) is not None
    assert fusion.read_steps(x * 1e-50) is not None  # zero in float32, as NumPy takes it: not subnormal


def test_a_statistic_whose_kernels_fail_to_build_runs_the_steps_apart(monkeypatch):
    """A generated policy the compiler refuses costs speed, not the result: one warning, the steps computed
    first, the unfused bits, and no second try."""
    from multireduce import statistics
    from multireduce.backends import numpy_stats
    from multireduce.kernels import KernelError

    tried = []

    class Refusing:
        READS_STEPS = True

        def __getattr__(self, name):
            return getattr(numpy_stats, name)

        @staticmethod
        def moments_chunk(block, axes, skipnan, steps=None):
            if steps is not None:
                tried.append(steps)
                raise KernelError("compiling the policy failed (refused by the test)")
            return numpy_stats.moments_chunk(block, axes, skipnan)

    monkeypatch.setattr(fusion, "worth_fusing", lambda x: True)
    monkeypatch.setattr(statistics, "_backend", lambda block: Refusing())
    monkeypatch.setattr(statistics, "_REFUSED", set())
    x = da.from_array(_data(), chunks=(CHUNKS,))
    e = x * 2 + 1
    with dask.config.set({"multireduce.fuse-elementwise": False}):
        want = mr.var(e).compute()
    assert not tried
    with pytest.warns(RuntimeWarning, match="var kernels reading through elementwise steps failed to build"):
        got = mr.var(e).compute()
    assert len(tried) == 1 and _bits(got) == _bits(want)
    assert _bits(mr.var(e).compute()) == _bits(want) and len(tried) == 1  # not tried again
