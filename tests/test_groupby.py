"""groupby_reduce against a NumPy reference (one NumPy reduction per group, float64), on NumPy and Dask
input: every function, skipna, unsorted labels, NaN labels, missing and NaN-only groups, groups that
straddle chunks, the GPU's flattened segment path replayed on NumPy, flox where it is installed, and the
checks of bad input."""

from __future__ import annotations

import pickle
import warnings

import dask
import dask.array as da
import numpy as np
import pytest

import multireduce as mr
from multireduce.groupby import FUNCS, factorize, reduce_codes
from multireduce import groupby as groupby_module

pytestmark = pytest.mark.usefixtures("synchronous_scheduler")

NUMPY = {"sum": np.sum, "nansum": np.nansum, "prod": np.prod, "nanprod": np.nanprod, "mean": np.mean,
         "nanmean": np.nanmean, "var": np.var, "nanvar": np.nanvar, "std": np.std, "nanstd": np.nanstd,
         "min": np.min, "nanmin": np.nanmin, "max": np.max, "nanmax": np.nanmax, "any": np.any, "all": np.all,
         "count": lambda a, axis: np.count_nonzero(~np.isnan(a), axis=axis)}


def reference(x, labels, func, groups, axis, ddof=0, fill=np.nan):
    """One NumPy reduction per group (in float64 for floating data), the group axis last; ``fill`` where
    no element has the label."""
    x = np.moveaxis(x, axis, -1)
    wide = x.astype(np.float64) if x.dtype.kind == "f" else x
    out = []
    for g in groups:
        members = wide[..., labels == g]
        if members.shape[-1] == 0:
            out.append(np.full(x.shape[:-1], fill, dtype=np.float64))
            continue
        kwargs = {"ddof": ddof} if func.endswith(("var", "std")) else {}
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)
            out.append(np.asarray(NUMPY[func](members, axis=-1, **kwargs)))
    return np.stack(out, axis=-1) if out else np.empty(x.shape[:-1] + (0,))


def assert_close(got, want, rtol=1e-12):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    if got.dtype.kind in "biu" and want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=0, equal_nan=True)


def data(rng, shape=(3, 37, 5), axis=1, dtype=np.float64):
    """Random data with NaN at scattered places and along one whole lane, and random unsorted labels
    (NaN among them) along ``axis``; a label (4) that only NaN values carry."""
    x = rng.uniform(-1, 1, shape)
    n = shape[axis]
    labels = rng.integers(0, 7, n).astype(np.float64)
    labels[labels == 4] = 5
    labels[[3, 11]] = 4
    labels[[8, 20]] = np.nan
    if np.dtype(dtype).kind == "f":
        x[rng.random(shape) < 0.1] = np.nan
        index = [slice(None)] * len(shape)
        index[axis] = [3, 11]
        x[tuple(index)] = np.nan  # label 4: NaN-only
        x[0, ...] = np.where(rng.random(x[0].shape) < 0.5, np.nan, x[0])
    else:
        x = rng.integers(-50, 50, shape)
    return x.astype(dtype), labels


@pytest.mark.parametrize("func", FUNCS)
def test_every_function_matches_numpy_per_group(func):
    rng = np.random.default_rng(1)
    x, labels = data(rng)
    groups_expected = np.unique(labels[~np.isnan(labels)])
    for flat in (False, True):  # True: the GPU's flattened segment path, run here on NumPy
        codes, groups = factorize(labels, x.shape[1], None, "test")
        got = reduce_codes(x, codes, groups.size, func, axis=1, flat=flat)
        np.testing.assert_array_equal(groups, groups_expected)
        assert_close(got, reference(x, labels, func, groups, axis=1))


@pytest.mark.parametrize("dtype", [np.int32, np.float32, np.uint8, np.bool_])
@pytest.mark.parametrize("func", ["sum", "prod", "mean", "var", "min", "max", "count", "any", "all"])
def test_dtypes_follow_numpy(func, dtype):
    rng = np.random.default_rng(2)
    x, labels = data(rng, shape=(4, 29), axis=1, dtype=np.float32 if dtype is np.float32 else np.int64)
    x = x.astype(dtype)
    got, groups = mr.groupby_reduce(x, labels, func)
    want = reference(x, labels, func, groups, axis=1)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        numpy_dtype = np.asarray(NUMPY[func](x[:, :3], axis=1)).dtype
    assert got.dtype == numpy_dtype, (got.dtype, numpy_dtype)
    assert_close(got, want, rtol=1e-6 if dtype is np.float32 else 1e-12)


@pytest.mark.parametrize("func", FUNCS)
def test_dask_groups_straddle_chunks_lazily(func):
    rng = np.random.default_rng(3)
    x, labels = data(rng)
    want, groups = mr.groupby_reduce(x, labels, func, axis=1)
    for chunks, split_every in [((2, 5, 3), 2), ((3, 37, 5), None), ((1, 4, 2), 3)]:
        d = da.from_array(x, chunks=chunks)
        with dask.config.set(scheduler=_refuse):  # building the graph computes nothing
            got, got_groups = mr.groupby_reduce(d, labels, func, axis=1, split_every=split_every)
        assert isinstance(got, da.Array)
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got_groups, groups)
        value = got.compute()
        assert value.dtype == want.dtype
        assert_close(value, want, rtol=1e-11)


def _refuse(*args, **kwargs):
    raise AssertionError("computed while building the graph")


def test_dask_flat_path_and_other_axes():
    rng = np.random.default_rng(4)
    x, labels = data(rng, shape=(23, 4, 3), axis=0)
    codes, groups = factorize(labels, 23, None, "test")
    d = da.from_array(x, chunks=(5, 3, 2))
    for func in ("nanmean", "nanvar", "max", "nanmin", "sum"):
        want = reference(x, labels, func, groups, axis=0)
        assert_close(reduce_codes(d, codes, groups.size, func, axis=0, flat=True).compute(), want, rtol=1e-11)
        assert_close(reduce_codes(d, codes, groups.size, func, axis=0).compute(), want, rtol=1e-11)


def test_sorted_labels_and_a_one_dimensional_input():
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, 101)
    labels = np.repeat(np.arange(9), [3, 20, 1, 0, 17, 30, 5, 24, 1])
    for func in ("sum", "mean", "std", "min", "count"):
        got, groups = mr.groupby_reduce(da.from_array(x, chunks=13), labels, func)
        assert_close(got.compute(), reference(x, labels, func, groups, axis=0))


def test_expected_groups_fill_missing_groups_and_drop_other_labels():
    rng = np.random.default_rng(6)
    x = rng.uniform(-1, 1, (2, 15))
    labels = np.array(list("abcabcabdabcabd"), dtype=object)
    expected = np.array(["d", "z", "a", "c"], dtype=object)  # b is dropped, z is missing
    for func in ("sum", "mean", "max", "var"):
        got, groups = mr.groupby_reduce(x, labels, func, expected_groups=expected)
        assert list(groups) == list(expected)
        assert_close(got, reference(x, labels, func, expected, axis=1))
    counts, _ = mr.groupby_reduce(x, labels, "count", expected_groups=expected)
    np.testing.assert_array_equal(counts, [[2, 0, 5, 3]] * 2)
    assert counts.dtype == np.intp
    anys, _ = mr.groupby_reduce(x, labels, "any", expected_groups=expected)
    alls, _ = mr.groupby_reduce(x, labels, "all", expected_groups=expected)
    np.testing.assert_array_equal(anys[0], [True, False, True, True])  # NumPy's values for nothing
    np.testing.assert_array_equal(alls[0], [True, True, True, True])


def test_missing_groups_promote_integers_and_fill_value():
    x = np.array([[5, 7, 9, 11]], dtype=np.int32)
    labels = np.array([0, 2, 0, 2])
    got, _ = mr.groupby_reduce(x, labels, "sum", expected_groups=[0, 1, 2])
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, [[14, np.nan, 18]])
    got, _ = mr.groupby_reduce(x, labels, "max", expected_groups=[0, 1, 2], fill_value=-1)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, [[9, -1, 11]])
    got, _ = mr.groupby_reduce(x, labels, "count", expected_groups=[0, 1, 2], fill_value=np.nan)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, [[2, np.nan, 2]])
    got, _ = mr.groupby_reduce(da.from_array(x, chunks=(1, 3)), labels, "sum", expected_groups=[2, 1, 0])
    assert got.dtype == np.float64  # known before any data is read
    np.testing.assert_array_equal(got.compute(), [[18, np.nan, 14]])


def test_nan_only_groups_and_min_count():
    x = np.array([[1.5, np.nan, np.nan, 2.5, np.inf]])
    labels = np.array([0, 1, 1, 0, 2])
    for func, want in [("nansum", [4.0, 0.0, np.inf]), ("sum", [4.0, np.nan, np.inf]),
                       ("nanmean", [2.0, np.nan, np.inf]),
                       ("nanmin", [1.5, np.nan, np.inf]), ("nanmax", [2.5, np.nan, np.inf]), ("count", [2, 0, 1]),
                       ("nanvar", [0.25, np.nan, np.nan]), ("nanprod", [3.75, 1.0, np.inf])]:
        for d in (x, da.from_array(x, chunks=(1, 2))):
            got, _ = mr.groupby_reduce(d, labels, func)
            np.testing.assert_array_equal(np.asarray(got), [want], err_msg=func)
    got, _ = mr.groupby_reduce(x, labels, "sum", skipna=True, min_count=2)
    np.testing.assert_array_equal(got, [[4.0, np.nan, np.nan]])
    got, _ = mr.groupby_reduce(np.array([[3, 4]]), [0, 1], "sum", min_count=1)
    assert got.dtype == np.float64  # where min_count can null a group, integers become float64


def test_skipna_overrides_the_name_and_ddof():
    rng = np.random.default_rng(7)
    x, labels = data(rng, shape=(2, 40), axis=1)
    codes, groups = factorize(labels, 40, None, "test")
    for func in ("sum", "mean", "var", "min"):
        ddof = 1 if func == "var" else 0
        a, _ = mr.groupby_reduce(x, labels, func, skipna=True, ddof=ddof)
        b, _ = mr.groupby_reduce(x, labels, "nan" + func, ddof=ddof)
        c, _ = mr.groupby_reduce(x, labels, "nan" + func, skipna=False, ddof=ddof)
        np.testing.assert_array_equal(a, b)
        assert_close(c, reference(x, labels, func, groups, axis=1, ddof=ddof))


def test_var_is_accurate_on_a_large_mean():
    rng = np.random.default_rng(8)
    x = 1e8 + rng.normal(0, 1, (3, 500))
    labels = rng.integers(0, 5, 500)
    got, groups = mr.groupby_reduce(da.from_array(x, chunks=(3, 37)), labels, "var")
    want = [[np.var(row[labels == g] - 1e8) for g in groups] for row in x]  # shifted: exact in float64
    np.testing.assert_allclose(got.compute(), want, rtol=1e-8)


def test_flox_agrees_where_installed():
    flox = pytest.importorskip("flox")
    rng = np.random.default_rng(9)
    x, labels = data(rng)
    x = np.moveaxis(x, 1, -1)
    for func in ("nansum", "nanmean", "nanvar", "nanmax", "count", "mean", "min"):
        got, groups = mr.groupby_reduce(da.from_array(x, chunks=(2, 2, 9)), labels, func)  # axis=-1
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            want, flox_groups = flox.groupby_reduce(x, labels, func=func)
        np.testing.assert_array_equal(groups, flox_groups)
        assert got.dtype == want.dtype, func
        assert_close(got.compute(), want)


def test_empty_axis_and_all_labels_nan():
    x = np.ones((2, 0))
    got, groups = mr.groupby_reduce(x, np.array([]), "sum")
    assert got.shape == (2, 0) and groups.size == 0
    got, _ = mr.groupby_reduce(x, np.array([]), "count", expected_groups=[1, 2])
    np.testing.assert_array_equal(got, [[0, 0], [0, 0]])
    got, groups = mr.groupby_reduce(np.ones((2, 3)), np.full(3, np.nan), "mean")
    assert got.shape == (2, 0)


@pytest.mark.parametrize("call, error, words", [
    (lambda x, b: mr.groupby_reduce(x, b, "median"), ValueError, "argument 'func'"),
    (lambda x, b: mr.groupby_reduce(x, b[:-1], "sum"), ValueError, "argument 'by'"),
    (lambda x, b: mr.groupby_reduce(x, da.from_array(b), "sum"), TypeError, "compute the labels first"),
    (lambda x, b: mr.groupby_reduce(x, b, "sum", expected_groups=[1, 1]), ValueError, "distinct"),
    (lambda x, b: mr.groupby_reduce(x, b, "sum", ddof=1), ValueError, "argument 'ddof'"),
    (lambda x, b: mr.groupby_reduce(x, b, "mean", min_count=1), ValueError, "argument 'min_count'"),
    (lambda x, b: mr.groupby_reduce(x, b, "sum", min_count=-1), ValueError, "argument 'min_count'"),
    (lambda x, b: mr.groupby_reduce(x, b, "count", dtype=np.float32), TypeError, "argument 'dtype'"),
    (lambda x, b: mr.groupby_reduce(x, b, "sum", dtype=np.int32), TypeError, "argument 'dtype'"),
    (lambda x, b: mr.groupby_reduce(x, b, "sum", axis=True), TypeError, "argument 'axis'"),
    (lambda x, b: mr.groupby_reduce(x, b, "sum", axis=2), np.exceptions.AxisError, "axis"),
    (lambda x, b: mr.groupby_reduce(x, b, "sum", skipna="yes"), TypeError, "argument 'skipna'"),
    (lambda x, b: mr.groupby_reduce(x, b, "sum", fill_value="x"), TypeError, "argument 'fill_value'"),
    (lambda x, b: mr.groupby_reduce(x.astype(str), b, "sum"), TypeError, "argument 'x'"),
    (lambda x, b: mr.groupby_reduce(x, b, "sum", split_every=1), ValueError, "argument 'split_every'"),
    (lambda x, b: mr.groupby_reduce(x, np.array(["a", 1, 2.0], dtype=object), "sum"), TypeError, "argument 'by'"),
])
def test_bad_input_is_refused_before_work(call, error, words):
    x = da.from_array(np.arange(6.0).reshape(2, 3), chunks=1)
    with dask.config.set(scheduler=_refuse), pytest.raises(error, match=words):
        call(x, np.array([0.0, 1.0, 0.0]))


def _through_the_gpu_branch(labels, expected):
    """groupby._factorize_labels taking its GPU branch (``xp is not np``: one dtype for both sides of the
    search, the groups' order moved to the device) with NumPy standing in for CuPy: the logic the GPU
    runs, on the CPU."""
    import types

    stand_in = types.ModuleType("numpy_as_an_array_module")
    stand_in.__dict__.update({k: getattr(np, k) for k in dir(np) if not k.startswith("__")})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(groupby_module, "_xp", lambda a: stand_in)
        return groupby_module._factorize_labels(labels, expected, "test")


@pytest.mark.parametrize("labels, expected, codes", [
    (np.array([2**60, 2**60 + 1, 5], dtype=np.uint64), [2**60, 2**60 + 1, 5], [0, 1, 2]),  # not merged in float64
    (np.array([2**60 + 1], dtype=np.uint64), [2**60], [-1]),
    (np.array([-3, 2**62 + 1], dtype=np.int64), np.array([2**62 + 1, 2**63 + 5], dtype=np.uint64), [-1, 0]),
    (np.array([2**53 + 1], np.int64), [float(2**53)], [0]),  # equal in float64, as NumPy compares them
    (np.array([0.5, 1.0, np.nan]), [1, 0], [-1, 0, -1]),
    (np.array([3, 200], np.uint8), [-1, 3, 200], [1, 2]),
    (np.array([1, 2], np.float16), [2.0, 1.0], [1, 0]),
    (np.array([np.nan, np.nan]), None, [-1, -1]),
    (np.array([], np.float64), None, []),
    (np.array([1.0, -0.0, 0.0, 7.5]), None, [1, 0, 0, 2]),
])
def test_labels_factorize_the_same_on_the_gpu_branch_and_the_host(labels, expected, codes):
    host_codes, host_groups = groupby_module._factorize_labels(labels, expected, "test")
    gpu_codes, gpu_groups = _through_the_gpu_branch(labels, expected)
    np.testing.assert_array_equal(host_codes, codes)
    np.testing.assert_array_equal(gpu_codes, codes)
    assert gpu_groups.dtype == host_groups.dtype and np.array_equal(gpu_groups, host_groups, equal_nan=True)


def test_which_labels_are_factorized_on_a_gpu():
    many = groupby_module.DEVICE_LABELS_MIN
    assert groupby_module._factorizes_on_gpu(np.zeros(many, np.int32), None)
    assert groupby_module._factorizes_on_gpu(np.zeros(many, np.float16), [1.5, 2])
    assert not groupby_module._factorizes_on_gpu(np.zeros(many - 1, np.int32), None)  # few: the host
    assert not groupby_module._factorizes_on_gpu(np.zeros(many, np.longdouble), None)  # no GPU type
    assert not groupby_module._factorizes_on_gpu(np.zeros(many, np.float32), np.array([1], np.longdouble))
    assert not groupby_module._factorizes_on_gpu(np.zeros(many, bool), None)
    assert not groupby_module._factorizes_on_gpu(np.zeros(many, "datetime64[s]"), None)
    assert not groupby_module._factorizes_on_gpu(np.zeros(many, np.int64), ["a"])


def _months_of_hours(n: int) -> np.ndarray:
    days = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]) * 24
    return np.resize(np.repeat(np.arange(12), days), n)


def test_a_chunk_partial_carries_only_the_groups_the_chunk_holds():
    """A chunk of 166 hours holds one or two months of twelve: its partial carries those, not twelve, and
    a mean's counts once per group, not once per row and group."""
    x = np.random.default_rng(50).standard_normal((8760, 3))
    codes = _months_of_hours(8760)
    plan = groupby_module.GroupByPlan("mean", 0, 12, np.dtype(np.float64), np.dtype(np.float64))
    for start in range(0, 8760, 166):
        chunk = groupby_module.Grouped(x[start:start + 166], codes[start:start + 166])
        part = plan.partial(chunk)
        assert type(part) is tuple  # a plain tuple: distributed sends its arrays one by one
        groups, (count, total) = groupby_module.states_of(part)
        np.testing.assert_array_equal(groups, np.unique(codes[start:start + 166]))
        # the counts once per group (every row has them), the sums per row
        assert count.shape == (1, groups.size) and total.shape == (3, groups.size)
    again = pickle.loads(pickle.dumps(part))
    assert type(again) is tuple and np.array_equal(groupby_module.states_of(again)[0], groups)
    assert all(np.array_equal(a, b) for a, b in zip(again[1:], part[1:]))
    rebuilt = type(part)(iter(part))  # as dask-cuda rebuilds a tuple it walked
    assert np.array_equal(groupby_module.states_of(rebuilt)[0], groups)
    distributed = pytest.importorskip("distributed")
    from distributed.protocol import deserialize, serialize

    # member by member, as distributed sends a tuple holding device arrays: the arrays by their own serializer
    header, frames = serialize(part, serializers=("dask", "pickle"), iterate_collection=True)
    assert [h["serializer"] for h in header["sub-headers"]][1:] == ["dask", "dask"]
    back = deserialize(header, frames, deserializers=("dask", "pickle"))
    assert np.array_equal(groupby_module.states_of(back)[0], groups)
    assert all(np.array_equal(a, b) for a, b in zip(back[1:], part[1:]))


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("split_every", [2, 3, 16])
def test_partials_of_the_groups_present_give_the_bits_of_full_ones(func, split_every):
    """Merging partials widened to each other's groups (absent ones as the identity state) is the merge of
    full partials group by group: the same bits, NaN, missing groups and all-NaN groups included."""
    rng = np.random.default_rng(51)
    n = 2000
    x = rng.standard_normal((n, 4)) * np.exp2(rng.integers(-8, 8, (n, 4)))
    x[:, 0], x[:, 1] = np.abs(x[:, 0]) + 1, -np.abs(x[:, 1]) - 1  # no identity hides behind a zero
    x[rng.random(x.shape) < 0.05] = np.nan
    x[(_months_of_hours(n * 4)[::4] == 1)[:, None] & (np.arange(4) == 2)] = np.nan  # a column all-NaN in a month
    labels = _months_of_hours(n * 4)[::4].astype(np.float64)  # two months and a half, in runs
    labels[rng.random(n) < 0.02] = np.nan
    kwargs = {"expected_groups": [0.0, 1.0, 2.0, 5.0]}  # a group no element falls in
    if func in ("sum", "nansum", "prod", "nanprod"):
        kwargs["min_count"] = 3
    if func in ("var", "std", "nanvar", "nanstd"):
        kwargs["ddof"] = 1
    data = x if func not in ("prod", "nanprod") else 1 + x / 1e3
    d = da.from_array(data, chunks=(97, 2))
    with dask.config.set(scheduler="synchronous"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got, _ = mr.groupby_reduce(d, labels, func, axis=0, split_every=split_every, **kwargs)
        got = got.compute()
        with pytest.MonkeyPatch.context() as patch:  # every partial full: a last axis of every group
            patch.setattr(groupby_module.GroupByPlan, "partial", groupby_module.GroupByPlan._full)
            want, _ = mr.groupby_reduce(d, labels, func, axis=0, split_every=split_every, **kwargs)
            want = want.compute()
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


@pytest.mark.slow
def test_partials_cross_between_worker_processes():
    """On a cluster of processes the partials (``group_states``) cross between workers: the result (months
    of hours, so folded by cohorts) is the threads' tree's, bit for bit."""
    distributed = pytest.importorskip("distributed")
    from multireduce.cluster import local_cluster

    x = np.random.default_rng(52).standard_normal((1500, 3))
    labels = _months_of_hours(1500 * 5)[::5]
    d = da.from_array(x, chunks=(100, 3))
    want = mr.groupby_reduce(d, labels, "var", axis=0, split_every=2, method="map-reduce")[0]
    want = want.compute(scheduler="threads")
    with local_cluster(n_workers=2, gpu=False, threads_per_worker=1, processes=True) as cluster, \
            distributed.Client(cluster) as client:
        got = client.compute(mr.groupby_reduce(d, labels, "var", axis=0, split_every=2)[0]).result()
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("ngroups", [0, 3, 255, 256, 65535, 65536, 70000])
def test_group_order_is_the_stable_sort_of_the_keys(ngroups):
    """Keys narrowed to the smallest unsigned type holding ngroups (a radix sort), the order unchanged:
    keys run 0..ngroups (ngroups is the key of labels in no group)."""
    key = np.random.default_rng(ngroups).integers(0, ngroups + 1, 5000).astype(np.int64)
    key[:3] = ngroups  # the largest key present
    np.testing.assert_array_equal(groupby_module._group_order(key, ngroups), np.argsort(key, kind="stable"))


def _cohort_data(rng, n=600):
    """Hours of 25 days in unequal chunks; -0.0 as a whole day's values, NaN, a day of NaN labels, a day
    no label names (missing) and a label past the data (expected_groups)."""
    x = rng.standard_normal((n, 3)) * np.exp2(rng.integers(-8, 8, (n, 3)))
    x[rng.random(x.shape) < 0.05] = np.nan
    x[48:72] = -0.0  # a day whose sum is -0.0 in its chunk, and 0.0 once merged with an empty state
    labels = (np.arange(n) // 24).astype(np.float64)
    labels[96:120] = np.nan
    labels[labels == 7] = 8  # day 7 missing, day 8 twice as long
    chunks = (50, 7, 90, 1, 120, 200, 132)
    return x, labels, chunks


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("split_every", [2, 3, 16])
def test_cohorts_give_the_bits_of_the_whole_tree(func, split_every):
    """Runs of days folded from their chunks alone give the bits of the tree over every chunk's partial:
    -0.0, NaN, missing groups, min_count and fill values included; the result is chunked by the runs."""
    x, labels, chunks = _cohort_data(np.random.default_rng(60))
    kwargs = {"expected_groups": np.arange(27.0), "axis": 0, "split_every": split_every}
    if func in ("sum", "nansum", "prod", "nanprod"):
        kwargs["min_count"] = 2
    data = x if func not in ("prod", "nanprod") else 1 + x / 1e3
    d = da.from_array(data, chunks=(chunks, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got, _ = mr.groupby_reduce(d, labels, func, method="cohorts", **kwargs)
        want, _ = mr.groupby_reduce(d, labels, func, method="map-reduce", **kwargs)
        assert len(got.chunks[-1]) > 2 and len(want.chunks[-1]) == 1
        got, want = got.compute(), want.compute()
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    if func == "sum":
        assert np.signbit(got[0, 2]) == np.signbit(want[0, 2]) == False  # noqa: E712 (-0.0 merged with 0.0)


def test_cohorts_keep_the_sign_of_a_group_every_chunk_holds():
    """A group that every chunk of the run holds meets no empty state in the tree: its -0.0 sum stays
    -0.0, while a group some chunk lacks becomes 0.0, in both methods."""
    x = np.array([-0.0, -0.0, -0.0, -0.0, -0.0, -0.0, 1.0])
    codes = np.array([0, 1, 1, 1, 1, 2, 2])
    d = da.from_array(x, chunks=((2, 2, 3),))
    assert groupby_module.cohorts(codes, (2, 2, 3), 3, 16) == [(0, 1, [0, 1, 2]), (2, 2, [2])]
    got = reduce_codes(d, codes, 3, "sum", method="cohorts").compute()
    want = reduce_codes(d, codes, 3, "sum", method="map-reduce").compute()
    assert got.tobytes() == want.tobytes()
    assert list(np.signbit(got)) == [False, True, False]


def test_cohorts_fold_each_run_from_its_own_chunks():
    """By day over chunks of a week and a bit: each output block reads the partials of one or two chunks,
    and no task reads them all."""
    hours = 24 * 60
    x = da.from_array(np.random.default_rng(61).standard_normal((hours, 4)), chunks=(166, 4))
    result, _ = mr.groupby_reduce(x, np.arange(hours) // 24, "max", axis=0, method="cohorts")
    graph = dict(result.__dask_graph__())
    folds = [task for key, task in graph.items() if isinstance(key, tuple) and "cohorts" in key[0]]
    assert len(folds) == x.numblocks[0]
    reads = [len(dask.core.get_dependencies(graph, task=task)) for task in folds]
    assert max(reads) <= 2 and min(reads) == 1, reads
    # of the chunk after a run's own only the run's groups travel: the day that straddles them
    runs = groupby_module.cohorts(np.arange(hours) // 24, x.chunks[0], 60, 16)
    pieces = [key for key in graph if isinstance(key, tuple) and "cohort-piece" in key[0]]
    assert pieces and all(len(runs[key[1]][2]) > 1 for key in pieces)
    for key in pieces:
        held = groupby_module.states_of(dask.get(graph, key))[0]
        first, last, _ = runs[key[1]]
        assert held.size == 1 and first <= held[0] <= last
    np.testing.assert_array_equal(result.compute(), reference(x.compute(), np.arange(hours) // 24, "max",
                                                              np.arange(60), 0))


def test_cohorts_where_the_labels_allow_them():
    """Runs where each chunk's codes start at or after the previous chunk's last; None where they fall
    back, where one run would hold every group, or where a run would span more than 4 x fan-in chunks."""
    runs = groupby_module.cohorts(np.array([0, 0, 1, 1, 1, 3, 3, -1, 4]), (3, 2, 4), 6, 16)
    assert runs == [(0, 1, [0, 1]), (2, 5, [2])]  # a chunk that brings no group opens no run
    assert groupby_module.cohorts(np.array([0, 1, 0, 1]), (2, 2), 2, 16) is None  # months of two years
    assert groupby_module.cohorts(np.array([0, 0, 0, 0]), (2, 2), 1, 16) is None
    assert groupby_module.cohorts(np.repeat([0, 1], 40), (1,) * 80, 2, 4) is None
    assert groupby_module.cohorts(np.repeat([0, 1], 40), (1,) * 80, 2, 16) is not None
    assert groupby_module.cohorts(np.array([-1, -1, 2, 5]), (2, 1, 1), 7, 16) == [(0, 2, [1]), (3, 6, [2])]


def test_method_is_checked_and_cohorts_refused_where_labels_fall_back():
    x = da.from_array(np.arange(8.0), chunks=4)
    with pytest.raises(ValueError, match="argument 'method'.*'cohorts'.*fall back"):
        mr.groupby_reduce(x, np.array([0, 1, 0, 1, 0, 1, 0, 1]), "sum", method="cohorts")
    with pytest.raises(ValueError, match="argument 'method' must be None, 'map-reduce' or 'cohorts'; got 'blockwise'"):
        mr.groupby_reduce(x, np.arange(8) // 2, "sum", method="blockwise")
    unsorted, _ = mr.groupby_reduce(x, np.array([0, 1, 0, 1, 0, 1, 0, 1]), "sum")
    assert unsorted.chunks == ((2,),)
    np.testing.assert_array_equal(unsorted.compute(), [12.0, 16.0])


def test_the_default_takes_cohorts_where_one_task_would_hold_more_than_half_a_chunk():
    """By day, a year's maxima over a 40 x 60 grid (365 x 2400 float32 states) outweigh a chunk of a week
    and a bit (166 x 2400 float32): cohorts; by month (12 groups) one tree; unsorted labels one tree; by
    day in chunks of 500 hours (states 0.73 of a chunk) cohorts."""
    hours = 8760
    x = da.zeros((hours, 40, 60), dtype=np.float32, chunks=(166, 40, 60))
    by_day, _ = mr.groupby_reduce(x, np.arange(hours) // 24, "max", axis=0)
    by_month, _ = mr.groupby_reduce(x, _months_of_hours(hours), "mean", axis=0)
    shuffled, _ = mr.groupby_reduce(x, np.random.default_rng(62).permutation(np.arange(hours) // 24), "max", axis=0)
    assert len(by_day.chunks[-1]) == x.numblocks[0]
    assert by_month.chunks[-1] == (12,) and shuffled.chunks[-1] == (365,)
    long_chunks, _ = mr.groupby_reduce(x.rechunk((500, 40, 60)), np.arange(hours) // 24, "max", axis=0)
    assert len(long_chunks.chunks[-1]) == 18


def test_each_chunks_codes_travel_inside_its_task():
    """No task of its own per slice of the codes: after Dask's optimisation, one task per chunk makes the
    chunk's partial, and the codes are in it."""
    x = da.from_array(np.random.default_rng(63).standard_normal((400, 3)), chunks=(50, 3))
    for method in ("cohorts", "map-reduce"):
        result, _ = mr.groupby_reduce(x, np.arange(400) // 30, "sum", axis=0, method=method)
        graph = dict(result.__dask_optimize__(result.__dask_graph__(), result.__dask_keys__()))
        names = {key[0] if isinstance(key, tuple) else key for key in graph}
        assert not any("codes" in name for name in names), names


def test_persisted_chunks_are_grouped_by_worker_on_a_cluster():
    """On a cluster, one tree over persisted chunks runs a task per worker that makes its chunks' partials
    where they are held (not one per chunk), with the bits of the task per chunk; lazily made chunks
    are grouped in runs."""
    distributed = pytest.importorskip("distributed")
    from multireduce.cluster import local_cluster

    month = _months_of_hours(8760)
    with local_cluster(n_workers=2, gpu=False, threads_per_worker=1, processes=False) as cluster, \
            distributed.Client(cluster) as client:
        made = da.random.default_rng(64).standard_normal((8760, 3, 4), chunks=(166, 3, 4))
        held = client.persist(made)
        distributed.wait(held)
        for x in (held, made):
            for func in ("mean", "nanvar", "max"):
                with dask.config.set({"multireduce.placement": False}), \
                        distributed.get_task_stream(client) as per_chunk:
                    want = mr.groupby_reduce(x, month, func, axis=0, method="map-reduce")[0].compute()
                with distributed.get_task_stream(client) as grouped:
                    got = mr.groupby_reduce(x, month, func, axis=0, method="map-reduce")[0].compute()
                assert got.tobytes() == want.tobytes()
                assert len(grouped.data) < len(per_chunk.data) / 4, (len(grouped.data), len(per_chunk.data))


def test_cohorts_of_other_fan_ins_are_other_results():
    """The fan-in shapes the fold (so the bits): results of two fan-ins never share a key."""
    d = da.from_array(np.random.default_rng(65).standard_normal(400), chunks=50)
    names = {mr.groupby_reduce(d, np.arange(400) // 30, "sum", method="cohorts", split_every=s)[0].name
             for s in (2, 3, 16)}
    assert len(names) == 3
