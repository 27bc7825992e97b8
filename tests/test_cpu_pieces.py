"""The CPU's whole-array statistics, which run piece by piece (``numpy_backend.PIECE`` elements) in
cache: sizes on either side of a piece, NaN, inf and zeros on piece boundaries, a piece of NaN only,
overflow, layouts that are and are not one contiguous run, and Dask chunks of several pieces, against
NumPy (float64 or exactly rounded references)."""

from __future__ import annotations

import math
import warnings

import dask.array as da
import numpy as np
import pytest

import multireduce as mr
from multireduce.backends.numpy_backend import PIECE
from multireduce.statistics import VAR_BOUND

pytestmark = pytest.mark.usefixtures("synchronous_scheduler")

SIZES = [PIECE - 1, PIECE, PIECE + 1, 2 * PIECE + 1, 3 * PIECE]  # 3 pieces: an odd level in the merge tree
MOMENTS = {"var": np.var, "std": np.std, "nanvar": np.nanvar, "nanstd": np.nanstd, "nanmean": np.nanmean}


def _exact_moments(x, skipnan=False):
    """(mean, var) of float64 ``x`` from exactly rounded sums (math.fsum), NaNs dropped if ``skipnan``."""
    w = np.asarray(x, dtype=np.float64).ravel()
    if skipnan:
        w = w[~np.isnan(w)]
    mean = math.fsum(w) / w.size
    dev = w - mean
    return mean, math.fsum(dev * dev) / w.size


def _check_moment(name, got, x):
    mean, var = _exact_moments(x, skipnan=name.startswith("nan"))
    want = mean if name == "nanmean" else math.sqrt(var) if name.endswith("std") else var
    eps_out = float(np.finfo(np.asarray(got).dtype).eps)
    scale = abs(want) if name != "nanmean" else math.sqrt(var) + abs(mean)
    assert abs(float(got) - want) <= (VAR_BOUND + eps_out) * scale, (name, x.dtype, x.size, float(got), want)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.uint64, np.bool_],
                         ids=lambda d: np.dtype(d).name)
def test_moments_either_side_of_a_piece(dtype, n):
    rng = np.random.default_rng(n)
    if np.dtype(dtype).kind == "f":
        x = (3.0 + rng.standard_normal(n)).astype(dtype)
    elif dtype is np.bool_:
        x = rng.random(n) < 0.3
    else:
        x = rng.integers(0, 1 << 40, n).astype(dtype)
    before = x.copy()
    for name, ref in MOMENTS.items():
        got = getattr(mr, name)(x)
        assert np.asarray(got).dtype == np.asarray(ref(x)).dtype, name
        _check_moment(name, got, x)
    np.testing.assert_array_equal(x, before)


@pytest.mark.parametrize("dtype,offset", [(np.float64, 1e8), (np.float32, 1e4)], ids=["float64", "float32"])
def test_ill_conditioned_var_over_pieces_stays_within_the_bound(dtype, offset):
    """A mean far above the spread, over 3 pieces and a bit: the pieces' means differ by roundings, and
    the merge must not lose them (no worse than NumPy's two-pass var)."""
    rng = np.random.default_rng(11)
    x = (offset + rng.normal(0.0, 1.0, 3 * PIECE + 5)).astype(dtype)
    _, ref = _exact_moments(x)
    eps_out = float(np.finfo(dtype).eps)
    err = abs(float(mr.var(x)) - ref) / ref
    numpy_err = abs(float(np.var(x)) - ref) / ref
    assert err <= VAR_BOUND + eps_out and err <= numpy_err + 4 * eps_out, (err, numpy_err)
    err = abs(float(mr.var(da.from_array(x, chunks=PIECE + 7)).compute()) - ref) / ref
    assert err <= VAR_BOUND + eps_out, err


def _nan_cases(n, dtype, rng):
    """NaN at the edges of the first and last pieces, and (where there are three pieces) a piece of NaN
    only."""
    x = rng.standard_normal(n).astype(dtype)
    for i in (0, PIECE - 1, PIECE, n - 1):
        if i < n:
            x[i] = np.nan
    if n >= 3 * PIECE:
        x[PIECE : 2 * PIECE] = np.nan
    return x


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_nan_statistics_with_nan_on_piece_boundaries(dtype, n):
    rng = np.random.default_rng(n + 1)
    x = _nan_cases(n, dtype, rng)
    for name in MOMENTS:
        if name.startswith("nan"):
            _check_moment(name, getattr(mr, name)(x), x)
        else:  # a NaN anywhere: NaN, as NumPy
            assert np.isnan(getattr(mr, name)(x)), name
    wide = x.astype(np.float64)
    tol = 8 * float(np.finfo(dtype).eps) * math.sqrt(n)
    np.testing.assert_allclose(float(mr.nansum(x)), math.fsum(wide[~np.isnan(wide)]), rtol=tol,
                               atol=tol * np.nansum(np.abs(wide)))
    near_one = np.exp(rng.normal(0, 1 / math.sqrt(n), n)).astype(dtype)
    near_one[np.isnan(x)] = np.nan
    np.testing.assert_allclose(float(mr.nanprod(near_one)), np.nanprod(near_one.astype(np.float64)),
                               rtol=8 * float(np.finfo(dtype).eps) * n)
    assert mr.nanmin(x) == np.nanmin(x) and mr.nanmax(x) == np.nanmax(x)
    assert mr.nanmin(x).dtype == x.dtype and mr.nansum(x).dtype == np.nansum(x).dtype


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_all_nan_and_empty_follow_numpy(dtype):
    x = np.full(2 * PIECE + 1, np.nan, dtype)
    for name in ("nanvar", "nanstd", "nanmean"):
        with pytest.warns(RuntimeWarning):
            assert np.isnan(getattr(mr, name)(x))
    assert mr.nansum(x) == 0 and mr.nanprod(x) == 1
    for name in ("nanmin", "nanmax"):
        with pytest.warns(RuntimeWarning, match="All-NaN slice"):
            assert np.isnan(getattr(mr, name)(x))
    assert mr.count_nonzero(x) == x.size and mr.any(x) and mr.all(x)  # NaN is non-zero, as in NumPy
    empty = np.empty(0, dtype)
    with pytest.warns(RuntimeWarning):
        assert np.isnan(mr.var(empty)) and np.isnan(mr.nanmean(empty))
    assert mr.nansum(empty) == 0 and mr.count_nonzero(empty) == 0 and not mr.any(empty) and mr.all(empty)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_inf_and_overflow_over_pieces_follow_numpy(dtype):
    """inf data, inf and -inf in different pieces, and finite data whose squares overflow: the results
    NumPy gives (the piecewise pass hands these to the general path)."""
    rng = np.random.default_rng(2)
    n = 2 * PIECE + 1
    x = rng.standard_normal(n).astype(dtype)
    cases = {"inf in the last piece": (n - 1, np.inf), "-inf at a piece's start": (PIECE, -np.inf)}
    for label, (i, value) in cases.items():
        y = x.copy()
        y[i] = value
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for name, ref in MOMENTS.items():
                np.testing.assert_array_equal(getattr(mr, name)(y), ref(y), err_msg=f"{name}: {label}")
            assert mr.nansum(y) == np.nansum(y), label
    both = x.copy()
    both[3], both[n - 2] = np.inf, -np.inf
    assert np.isnan(mr.nansum(both)) and np.isnan(np.nansum(both))
    # finite data spread past the dtype's range: float64 squares overflow (the general path), float32
    # ones do not, and the variance rounds to inf in float32
    huge = (rng.uniform(-1, 1, n) * (float(np.finfo(dtype).max) / 2)).astype(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for name in ("var", "nanvar", "std") if dtype == np.float32 else ("var", "nanvar"):  # std: sqrt(var)
            # NumPy's var of it is NaN (its sum overflows): the var of the data scaled down, scaled back
            scale = float(np.finfo(dtype).max)
            scaled = MOMENTS[name](huge.astype(np.float64) / scale)
            want = np.asarray(scaled * scale * (1 if name == "std" else scale)).astype(dtype)
            np.testing.assert_allclose(getattr(mr, name)(huge), want, rtol=1e-6, err_msg=name)
        assert np.isposinf(mr.var(huge))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.bool_, np.complex64],
                         ids=lambda d: np.dtype(d).name)
def test_truth_and_counts_on_piece_boundaries(dtype, n):
    rng = np.random.default_rng(n + 2)
    x = (rng.random(n) < 0.5).astype(dtype)
    for name in ("count_nonzero", "any", "all"):
        ref = getattr(np, name)(x)
        assert getattr(mr, name)(x) == ref and type(getattr(mr, name)(x)) is type(ref), name
    zeros = np.zeros(n, dtype)
    ones = np.ones(n, dtype)
    for i in (0, PIECE - 1, PIECE, n - 1):
        if i >= n:
            continue
        one_on, one_off = zeros.copy(), ones.copy()
        one_on[i], one_off[i] = 1, 0
        assert mr.any(one_on) and not mr.all(one_on) and mr.count_nonzero(one_on) == 1, i
        assert mr.any(one_off) and not mr.all(one_off) and mr.count_nonzero(one_off) == n - 1, i
    assert not mr.any(zeros) and mr.all(ones) and mr.count_nonzero(zeros) == 0


def test_layouts_reduce_over_every_element():
    """C and Fortran order (one run in memory), a strided 1-D view and a non-contiguous 2-D view (the
    general path), misaligned data (the same bits as aligned)."""
    rng = np.random.default_rng(4)
    base = 5.0 + rng.standard_normal((3 * PIECE // 64 + 3, 64))
    base[7, 9] = np.nan
    views = {"C": base, "F": np.asfortranarray(base), "strided 1-D": base.ravel()[::2], "2-D view": base[:, ::2]}
    for label, x in views.items():
        for name in MOMENTS:
            if name.startswith("nan"):
                _check_moment(name, getattr(mr, name)(x), x)
        finite = np.nan_to_num(x, nan=1.0)
        _check_moment("var", mr.var(finite), finite)
        assert mr.count_nonzero(x) == np.count_nonzero(x), label
        assert mr.nanmax(x) == np.nanmax(x), label
        np.testing.assert_allclose(mr.nansum(x), np.nansum(x), rtol=1e-12, err_msg=label)
    raw = np.empty(base.nbytes + 1, np.uint8)
    odd = raw[1:].view(np.float64).reshape(base.shape)
    odd[...] = base
    assert not odd.flags.aligned
    for name in ("nanvar", "nanmean", "nansum"):
        assert np.asarray(getattr(mr, name)(odd)).tobytes() == np.asarray(getattr(mr, name)(base)).tobytes(), name


def test_dask_chunks_of_several_pieces_match_numpy_input():
    rng = np.random.default_rng(6)
    x = (2.0 + rng.standard_normal(5 * PIECE + 11)).astype(np.float32)
    x[PIECE] = np.nan
    d = da.from_array(x, chunks=2 * PIECE + 3)
    for name in ("nanvar", "nanstd", "nanmean"):
        _check_moment(name, getattr(mr, name)(d).compute(), x)
    finite = np.nan_to_num(x, nan=2.0)
    _check_moment("var", mr.var(da.from_array(finite, chunks=2 * PIECE + 3)).compute(), finite)
    assert mr.count_nonzero(d).compute() == np.count_nonzero(x)
    assert mr.nanmin(d).compute() == np.nanmin(x)
    np.testing.assert_allclose(mr.nansum(d).compute(), np.nansum(x.astype(np.float64)), rtol=1e-5)
