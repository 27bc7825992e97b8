"""groupby_reduce on Dask input: cohorts against map-reduce bit for bit where NaN-skipping minima and
maxima meet signed zeros, the refusal of cohorts on sorted labels, the check of ``method``, and
integer means."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest

import multireduce as mr

pytestmark = pytest.mark.usefixtures("synchronous_scheduler")


@pytest.mark.parametrize("func", ["nanmin", "nanmax"])
def test_cohorts_give_the_bits_of_map_reduce_for_nan_skipping_extremes_of_signed_zeros(func):
    labels = np.arange(40) // 2
    x = da.from_array(np.tile([0.0, -0.0], 20), chunks=3)
    cohorts, _ = mr.groupby_reduce(x, labels, func, method="cohorts")
    tree, _ = mr.groupby_reduce(x, labels, func, method="map-reduce")
    got, want = cohorts.compute(), tree.compute()
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes(), (np.signbit(got).astype(int), np.signbit(want).astype(int))


def test_cohorts_on_sorted_labels_with_a_group_over_many_chunks_do_not_blame_the_labels():
    x = da.ones(200, chunks=2)
    labels = np.repeat([0, 1], 100)
    try:
        got, _ = mr.groupby_reduce(x, labels, "sum", method="cohorts", split_every=4)
    except ValueError as exc:
        assert "got labels that do not" not in str(exc), str(exc)
        assert "split_every" in str(exc), str(exc)
    else:
        np.testing.assert_array_equal(got.compute(), [100.0, 100.0])


def test_an_array_of_methods_is_refused_naming_the_argument():
    x = da.from_array(np.arange(8.0), chunks=2)
    with pytest.raises(ValueError, match="argument 'method'"):
        mr.groupby_reduce(x, np.arange(8) // 2, "sum", method=np.array(["cohorts", "map-reduce"]))


@pytest.mark.parametrize("method", ["map-reduce", "cohorts"])
def test_mean_with_an_integer_dtype_is_numpys_or_refused_at_the_call(method):
    values = np.arange(8, dtype=np.int32)
    labels = np.arange(8) // 2
    try:
        result, _ = mr.groupby_reduce(da.from_array(values, chunks=3), labels, "mean", dtype=np.int64, method=method)
    except TypeError as exc:
        assert "argument 'dtype'" in str(exc)
        return
    want = np.array([np.mean(values[labels == g], dtype=np.int64) for g in range(4)])
    np.testing.assert_array_equal(result.compute(), want)
