"""The GPU group-by path that keeps a chunk's rows in place (grouped axis not the last: a field by month
or by day), without a GPU: the planning of runs, pieces and the fold of runs per group, with the
row-segment kernel (kernels/segment_rows.cuh) replaced by a NumPy model of what it computes. Its GPU
test is tests/gpu/test_gpu_groupby_rows.py."""

from __future__ import annotations

import numpy as np
import pytest

import multireduce as mr
from multireduce import groupby
from multireduce.backends import cupy_segment


def _kernel_model(x3, starts, op, acc):
    """What one launch of segment_reduce_rows computes: each segment's rows folded in order, in acc."""
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
