"""The GPU group-by path that keeps a chunk's rows in place (grouped axis not the last: a field by month
or by day), without a GPU: the planning of runs, pieces and the fold of runs per group, with the
row-segment kernel (kernels/segment_rows.cuh) replaced by a NumPy model of what it computes. Its GPU
test is tests/gpu/test_gpu_groupby_rows.py."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import multireduce as mr
from multireduce import groupby
from multireduce.backends import cupy_segment
from multireduce.operators import get_operator


def _kernel_model(x3, starts, op, acc):
    """What one launch of segment_reduce_rows computes: each segment's rows folded in order, in acc. Like
    the kernel, it takes no float16 accumulator (``mr::half`` is bits without arithmetic or comparisons:
    float16 data are folded in float32) and only starts that run in order from 0 to the rows' end."""
    assert np.dtype(acc) != np.float16, "the row-segment kernel has no float16 accumulator"
    starts = np.asarray(starts)
    assert starts.dtype == np.int64 and starts.size >= 1 and starts[0] == 0 and starts[-1] == x3.shape[1]
    assert np.all(np.diff(starts) >= 0)
    pre, _, post = x3.shape
    out = np.empty((pre, len(starts) - 1, post), dtype=acc)
    for s in range(len(starts) - 1):
        rows = x3[:, starts[s]:starts[s + 1], :]
        if rows.shape[1] == 0:
            out[:, s, :] = op.identity(acc)
        else:
            with np.errstate(all="ignore"):
                out[:, s, :] = op.ufunc.reduce(op.load(rows).astype(acc), axis=1)
    return out


def _rows_model(x3, starts, op, acc):
    """segment_reduce_rows with the kernel modelled: the same pieces, the same second fold."""
    cut = cupy_segment.row_pieces(starts)
    if cut is None:
        return _kernel_model(x3, starts, op, acc)
    cuts, piece_starts = cut
    return _kernel_model(_kernel_model(x3, cuts, op, acc), piece_starts, op.partials, acc)


def _shifted_kernel_model(x3, starts, group_of, shift, skipnan):
    """What one launch of segment_shifted_squares_rows computes: per segment and column, the float64
    sums of d = x - shift[group] and of d * d (each rounded), in row order; NaN as d = 0 with skipnan."""
    starts, group_of = np.asarray(starts), np.asarray(group_of)
    assert starts.dtype == group_of.dtype == np.int64 and group_of.size == starts.size - 1
    assert shift.dtype == np.float64 and shift.shape[0] == x3.shape[0] and shift.shape[2] == x3.shape[2]
    assert np.all((group_of >= 0) & (group_of < shift.shape[1])), "every segment reads a shift of its own group"
    pre, _, post = x3.shape
    total, squares = (np.zeros((pre, len(starts) - 1, post)) for _ in range(2))
    for s in range(len(starts) - 1):
        with np.errstate(all="ignore"):
            d = x3[:, starts[s]:starts[s + 1], :].astype(np.float64) - shift[:, group_of[s]:group_of[s] + 1, :]
            if skipnan:
                d[np.isnan(d)] = 0.0
            for i in range(d.shape[1]):  # row by row, as the kernel adds
                total[:, s, :] += d[:, i, :]
                squares[:, s, :] += d[:, i, :] * d[:, i, :]
    return total, squares


def _shifted_model(x3, starts, group_of, shift, skipnan):
    """segment_shifted_squares_rows with the kernel modelled: the same pieces, each piece reading its
    segment's shift, the pieces then summed in order."""
    cut = cupy_segment.row_pieces(starts)
    if cut is None:
        return _shifted_kernel_model(x3, starts, group_of, shift, skipnan)
    cuts, piece_starts = cut
    found = _shifted_kernel_model(x3, cuts, np.repeat(group_of, np.diff(piece_starts)), shift, skipnan)
    add = get_operator("sum").partials
    return tuple(_kernel_model(a, piece_starts, add, np.float64) for a in found)


@pytest.mark.parametrize("lengths", [  # in pieces of P rows
    lambda P: [0], lambda P: [1], lambda P: [P], lambda P: [P + 1], lambda P: [3, 0, 3 * P + 7, P, 1],
    lambda P: [2 * P + 1, 0, 0]])
def test_pieces_cover_each_segment_in_order(lengths):
    lengths = lengths(cupy_segment.ROWS_PIECE)
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    cut = cupy_segment.row_pieces(starts)
    if max(lengths) <= cupy_segment.ROWS_PIECE:
        assert cut is None
        return
    cuts, piece_starts = cut
    assert cuts[0] == 0 and cuts[-1] == starts[-1] and np.all(np.diff(cuts) >= 0)
    assert np.all(np.diff(cuts) <= cupy_segment.ROWS_PIECE)
    for s in range(len(lengths)):  # a segment's pieces are its rows, in order, and nobody else's
        first, last = piece_starts[s], piece_starts[s + 1]
        assert last - first >= 1
        assert cuts[first] == starts[s] and cuts[last] == starts[s + 1]


@pytest.fixture
def rows_on_host(monkeypatch):
    """NumPy chunks take the rows path, with the kernel modelled in NumPy."""
    monkeypatch.setattr(groupby, "_keeps_rows", lambda xp, block, axis, flat: not flat and axis < block.ndim - 1)
    monkeypatch.setattr(cupy_segment, "segment_reduce_rows", _rows_model)
    monkeypatch.setattr(cupy_segment, "segment_shifted_squares_rows", _shifted_model)


def _labels(kind: str, n: int, rng):
    if kind == "sorted runs":
        return np.repeat(np.arange(7), -(-n // 7))[:n]
    if kind == "months of hours, two years":
        days = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]) * 24
        return np.resize(np.repeat(np.arange(12), days), n)
    if kind == "unsorted":
        return rng.integers(0, 9, n)
    return np.where(rng.random(n) < 0.2, np.nan, rng.integers(0, 5, n).astype(float))  # NaN labels: no group


@pytest.mark.parametrize("kind", ["sorted runs", "months of hours, two years", "unsorted", "with NaN labels"])
@pytest.mark.parametrize("func", ["sum", "nansum", "mean", "nanmean", "max", "nanmin", "var", "nanstd", "count",
                                  "any", "prod"])
def test_rows_path_matches_the_flat_path(rows_on_host, kind, func):
    rng = np.random.default_rng(3)
    n = 17520 if kind.startswith("months") else 300
    x = rng.standard_normal((2, n, 5, 3))
    if func.startswith("nan") or func == "count":
        x[rng.random(x.shape) < 0.1] = np.nan
    if func == "prod":
        x = 1 + x / 50
    labels = _labels(kind, n, rng)
    got, groups = mr.groupby_reduce(x, labels, func, axis=1)
    with pytest.MonkeyPatch.context() as undo:
        undo.setattr(groupby, "_keeps_rows", lambda *a: False)
        want, want_groups = mr.groupby_reduce(x, labels, func, axis=1)
    assert np.array_equal(groups, want_groups) and got.shape == want.shape == (2, 5, 3, groups.size)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10, equal_nan=True)


def test_rows_path_with_expected_groups_and_empty_ones(rows_on_host):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((40, 6))
    labels = np.repeat([3, 1, 3, 7], 10)  # group 3 in two runs, 5 in none
    got, groups = mr.groupby_reduce(x, labels, "sum", axis=0, expected_groups=[1, 3, 5, 7])
    want = np.stack([x[labels == g].sum(axis=0) for g in (1, 3)] + [np.full(6, np.nan)]
                    + [x[labels == 7].sum(axis=0)], axis=-1)
    np.testing.assert_allclose(got, want, equal_nan=True)
    assert list(groups) == [1, 3, 5, 7]


@pytest.mark.parametrize("labels", [
    np.array([3, 1, 3, 7, 7, 0]), np.array([-5, 2, -5, 9], dtype=np.int8), np.arange(300, dtype=np.uint8) % 7,
    np.array([np.iinfo(np.int64).max, np.iinfo(np.int64).min, 0]),  # a span too wide for a table
    np.array([2**62, 2**62 + 3, 2**62]), np.array([], dtype=np.int32).reshape(0), np.array([4], dtype=np.uint64),
    np.array([-128, 127, 0, -128], dtype=np.int8), np.array([2**64 - 1, 2**64 - 3], dtype=np.uint64),
    np.array([-2**63, -2**63 + 2])])
def test_integer_labels_factorize_as_sorted_distinct_labels(labels):
    codes, groups = groupby.factorize(labels, labels.size, None, "test")
    want = np.unique(labels)
    assert groups.dtype == labels.dtype and np.array_equal(groups, want)
    assert codes.dtype == np.int64 and np.array_equal(groups[codes], labels)


def _both_paths(x, labels, func, **kwargs):
    """(rows path, flat path) results of one call; NumPy's warnings for empty groups silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = mr.groupby_reduce(x, labels, func, **kwargs)
        with pytest.MonkeyPatch.context() as undo:
            undo.setattr(groupby, "_keeps_rows", lambda *a: False)
            want = mr.groupby_reduce(x, labels, func, **kwargs)
    return got, want


def _assert_same(got, want, atol=1e-10):
    """Integers and bools equal; floats close (the two paths add in different orders)."""
    (got, groups), (want, want_groups) = got, want
    assert np.array_equal(groups, want_groups)
    assert got.shape == want.shape and got.dtype == want.dtype
    if want.dtype.kind == "f":
        rtol = 1e-3 if want.dtype == np.float16 else 1e-10
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol,
                                   equal_nan=True)
    else:
        np.testing.assert_array_equal(got, want)


def _typed(dtype, shape, rng):
    """Data of ``dtype`` with its extremes (integers), NaN and both infinities (floats)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.choice(np.array([info.min, info.max, 0, 1, info.max // 3], dtype=dtype), shape)
    x = rng.standard_normal(shape).astype(dtype)
    x[rng.random(shape) < 0.15] = np.nan
    x.flat[::17] = np.inf
    x.flat[5::23] = -np.inf
    return x


@pytest.mark.parametrize("dtype", [np.bool_, np.uint8, np.int8, np.int64, np.uint64, np.float16, np.float32])
@pytest.mark.parametrize("func", groupby.FUNCS)
def test_rows_path_matches_the_flat_path_for_every_dtype(rows_on_host, dtype, func):
    """float16 min and max are folded in float32 (the kernel has no float16 accumulator) and rounded back,
    as the flat path's segment kernels do; integers wrap and compare exactly."""
    rng = np.random.default_rng(7)
    x = _typed(dtype, (2, 60, 3), rng)
    labels = rng.integers(0, 4, 60)  # unsorted: many runs per group
    # float64 sums of int64 extremes cancel: their rounding differs by up to a few ulps of the largest
    atol = 1e-10 if x.dtype.kind == "f" else 64 * np.finfo(np.float64).eps * float(np.abs(x.astype(float)).max())
    _assert_same(*_both_paths(x, labels, func, axis=1), atol=atol)


@pytest.mark.parametrize("func", groupby.FUNCS)
@pytest.mark.parametrize("expected", [None, [1, 2]])
def test_rows_path_along_an_empty_axis(rows_on_host, func, expected):
    """No row along the grouped axis (a chunk of length 0, expected_groups naming groups): no run to fold,
    every group empty, as on the flat path."""
    x = np.zeros((2, 0, 3))
    labels = np.array([], dtype=np.int64)
    _assert_same(*_both_paths(x, labels, func, axis=1, expected_groups=expected))


@pytest.mark.parametrize("layout", ["fortran", "strided", "no lead rows", "one row", "axis first"])
@pytest.mark.parametrize("func", ["sum", "nanmax", "var", "count"])
def test_rows_path_layouts(rows_on_host, layout, func):
    rng = np.random.default_rng(8)
    x = _typed(np.float64, (3, 20, 8), rng)
    labels = rng.integers(0, 3, 20).astype(float)
    labels[::7] = np.nan
    axis = 1
    if layout == "fortran":
        x = np.asfortranarray(x)
    elif layout == "strided":
        x = x[:, :, ::3]
    elif layout == "no lead rows":
        x = x[:0]
    elif layout == "one row":
        x, labels = x[:, 4:5], labels[4:5]
    else:
        x, axis = np.moveaxis(x, 1, 0), 0
    kwargs = {"ddof": 1} if func == "var" else {}
    _assert_same(*_both_paths(x, labels, func, axis=axis, **kwargs))


def test_which_chunks_keep_their_rows():
    """Only GPU chunks grouped along an axis that is not the last, with ROWS_MIN_COLUMNS elements or more
    after it, keep their rows in place."""
    gpu = object()  # any array module but NumPy
    wide = np.empty((2, 5, groupby.ROWS_MIN_COLUMNS))
    assert groupby._keeps_rows(gpu, wide, 1, False)
    assert not groupby._keeps_rows(np, wide, 1, False)
    assert not groupby._keeps_rows(gpu, wide, 1, True)  # the flat path asked for
    assert not groupby._keeps_rows(gpu, wide, 2, False)  # the last axis
    assert not groupby._keeps_rows(gpu, wide[..., 1:], 1, False)  # too few columns after the axis


@pytest.mark.parametrize("labels", [np.array([5, 3, 5, -2], dtype=">i4"), np.array([7, 7, 1], dtype=">u8"),
                                    np.array([2**63 + 5, 2**63, 2**63 + 5], dtype=np.uint64)])
def test_integer_labels_of_any_byte_order_factorize_as_sorted_distinct_labels(labels):
    codes, groups = groupby.factorize(labels, labels.size, None, "test")
    want = np.unique(labels)
    assert groups.dtype == labels.dtype and np.array_equal(groups, want)
    assert codes.dtype == np.int64 and np.array_equal(groups[codes], labels)


def test_short_runs_are_put_in_group_order_first(rows_on_host, monkeypatch):
    """Labels that change every row or two (hour of day): the rows path gathers the rows into group order
    once, so its first fold makes one partial row per group, not one per run; the result is unchanged."""
    folded = []
    real = cupy_segment.segment_reduce_rows

    def recording(x3, starts, op, acc):
        folded.append(len(starts) - 1)
        return real(x3, starts, op, acc)

    monkeypatch.setattr(cupy_segment, "segment_reduce_rows", recording)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((240, 7))
    hour = np.arange(240) % 24
    got, _ = mr.groupby_reduce(x, hour, "mean", axis=0)
    np.testing.assert_allclose(got, np.stack([x[hour == h].mean(axis=0) for h in range(24)], axis=-1))
    assert folded and max(folded) <= 24 + 1, folded  # one run per group, not 240
    folded.clear()
    months = np.repeat(np.arange(12), 20)  # long runs stay where they are: 12 runs, one fold
    mr.groupby_reduce(x, months, "sum", axis=0)
    assert folded == [12], folded


@pytest.mark.parametrize("kind", ["sorted runs", "months of hours, two years", "unsorted", "with NaN labels",
                                  "hours"])
@pytest.mark.parametrize("func", ["var", "nanvar", "std", "nanstd"])
def test_rows_moments_in_two_reads_give_the_bits_of_the_deviations_copy(rows_on_host, kind, func):
    """The rows path's variance reads the data twice (anchors, then the deviations' sums and squares in
    one kernel) instead of making a float64 copy and passing over it four times; every rounding is the
    same, so the bits are: runs in pieces, runs of a group out of order, runs in no group, short runs."""
    rng = np.random.default_rng(9)
    n = 17520 if kind.startswith("months") else 300
    x = rng.standard_normal((2, n, 5)) * 3 + 100  # float64: a float32 result would round away a wrong anchor
    x[rng.random(x.shape) < 0.05] = np.nan
    x[0, 7, 1] = np.inf
    labels = np.arange(n) % 24 if kind == "hours" else _labels(kind, n, rng)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got, _ = mr.groupby_reduce(x, labels, func, axis=1, ddof=1)
        with pytest.MonkeyPatch.context() as undo:
            undo.setattr(groupby, "_moments_of_rows", lambda *a: pytest.fail("the copy's path was asked for"))
            undo.setattr(groupby, "_reads_moments_twice", lambda dtype: False)  # the float64 copy, four passes
            want, _ = mr.groupby_reduce(x, labels, func, axis=1, ddof=1)
    assert got.dtype == want.dtype == np.float64
    np.testing.assert_array_equal(got, want)
