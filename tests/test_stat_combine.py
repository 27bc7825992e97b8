"""A statistic's partials combined stacked (``StatPlan._combine_stacked``: each level of the pairwise tree as
one elementwise merge) against the same tree merged pair by pair: the same bits for every statistic, with
NaN, infinities, empty chunks and all-NaN slices among the partials, and odd counts at every level."""

from __future__ import annotations

import numpy as np
import pytest

from multireduce.backends import numpy_stats
from multireduce.statistics import StatPlan, _stacked

RNG = np.random.default_rng(20261127)


def _chunks(dtype, count: int, kept: tuple, empty_every: int = 0):
    """``count`` chunks of data with ``kept`` outputs each (reduced over axis 0), some empty."""
    out = []
    for i in range(count):
        rows = 0 if empty_every and i % empty_every == 1 else int(RNG.integers(1, 9))
        a = (RNG.standard_normal((rows, *kept)) * 10.0 ** RNG.integers(-3, 4)).astype(dtype)
        if np.dtype(dtype).kind == "f" and a.size:
            a.ravel()[RNG.integers(0, a.size, 2)] = [np.nan, np.inf][i % 2]
            if i % 5 == 0:
                a[:, 0] = np.nan  # an all-NaN slice
            a[:, -1] = np.round(a[:, -1])  # ties
        elif a.size:
            a //= 3  # ties among integers
        out.append(a)
    return out


def _partials(stat, chunks):
    partials, offset = [], 0
    for a in chunks:
        axes = (0,)
        if stat in ("argmax", "nanargmin"):
            p = numpy_stats.arg_chunk(a, axes, stat.endswith("max"), stat.startswith("nan"), (offset, 0), (0, 0))
            if len(partials) % 3 == 1:  # as a GPU chunk's (value, index) pair
                p = p[:2]
        elif stat in ("var", "nanvar"):
            p = numpy_stats.moments_chunk(a, axes, stat.startswith("nan"))
        elif stat in ("nanmax", "nanmin"):
            p = numpy_stats.extreme_chunk(a, axes, stat.endswith("max"))
        elif stat in ("any", "all"):
            p = numpy_stats.truth_chunk(a, axes, stat == "all")
        else:
            p = numpy_stats.count_chunk(a, axes)
        partials.append(tuple(np.asarray(m) for m in p))
        offset += a.shape[0]
    return partials


def _bits(partial):
    return [(m.dtype, m.shape, np.ascontiguousarray(m).tobytes()) for m in partial]


STATS = ["argmax", "nanargmin", "var", "nanvar", "nanmax", "nanmin", "any", "all", "count_nonzero"]


@pytest.mark.parametrize("count", [3, 5, 16, 17, 33])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
@pytest.mark.parametrize("stat", STATS)
def test_stacked_levels_give_the_pairwise_bits(stat, dtype, count):
    plan = StatPlan(stat, (0,), True, np.dtype(np.float64))
    for empty_every in (0, 4):
        partials = _partials(stat, _chunks(dtype, count, (3, 2), empty_every))
        with np.errstate(all="ignore"):
            want = plan._combine_pairwise(partials)
            stacked = _stacked(partials, stat in ("argmax", "nanargmin"))
            assert stacked is not None
            got = plan._combine_stacked(stacked)
            assert _bits(plan.combine(*partials)) == _bits(got)
        if len(want) == 2 and len(got) == 3:  # pairs only: the merge adds what it saw
            want = (*want, want[1] >= 0)
        assert _bits(got) == _bits(want), (stat, dtype, count, empty_every)


def test_partials_of_different_forms_merge_pair_by_pair():
    a = (np.ones((1, 3)), np.array([[4.0, 5.0, 6.0]]))
    b = (np.ones((1, 2)), np.array([[4.0, 5.0]]))
    assert _stacked([a, a, b], False) is None
    assert _stacked([a, (a[0].astype(np.float32), a[1]), a], False) is None
    assert _stacked([a, a, [np.ones(3)]], False) is None
    assert _stacked([a, a, a], False) is not None


@pytest.mark.parametrize("stat", STATS)
@pytest.mark.parametrize("count,size", [(48, 16), (37, 8), (5, 16), (9, 2), (64, 4)])
def test_a_levels_groups_merged_together_give_each_groups_pairwise_bits(stat, count, size):
    """``combine_groups`` (a level of graph.fold_in_order's tree) against each group merged pair by pair,
    and a whole fold against the fold of the same tree pair by pair."""
    from multireduce.graph import fold_in_order

    plan = StatPlan(stat, (0,), True, np.dtype(np.float64))
    partials = _partials(stat, _chunks(np.float32, count, (2, 3), empty_every=6))
    with np.errstate(all="ignore"):
        got = plan.combine_groups(partials, size)
        want = [plan._combine_pairwise(partials[j : j + size]) for j in range(0, count, size)]
        folded = fold_in_order(plan, size, partials)
        level = partials
        while len(level) > size:
            level = [plan._combine_pairwise(level[j : j + size]) for j in range(0, len(level), size)]
        folded_pairwise = plan.finalize(plan._combine_pairwise(level)) if stat not in ("nanmax", "nanmin") else None
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if len(w) == 2 and len(g) == 3:
            w = (*w, w[1] >= 0)
        assert _bits(g) == _bits(w)
    if folded_pairwise is not None:
        assert _bits((folded,)) == _bits((folded_pairwise,))


@pytest.mark.parametrize("stat", ["nanmin", "nanmax"])
def test_signed_zero_ties_do_not_depend_on_the_grouping(stat):
    """NumPy's fmin/fmax pick a zero's sign by where an element falls in their vector loops; the merge
    gives -0.0 for a minimum and +0.0 for a maximum of a tie, whichever side and however grouped."""
    plan = StatPlan(stat, (0,), True, np.dtype(np.float64))
    for k in (1, 3, 4, 9):
        for pattern in ([-0.0, 0.0, -0.0, -0.0, -0.0, -0.0], [0.0, -0.0, 0.0], [-0.0, -0.0, 0.0, -0.0, 0.0]):
            parts = [numpy_stats.extreme_chunk(np.full((1, k), v), (0,), stat == "nanmax") for v in pattern]
            got, want = plan.combine(*parts)[0], plan._combine_pairwise(parts)[0]
            assert got.tobytes() == want.tobytes()
            assert np.signbit(got).all() == (stat == "nanmin")


def test_complex_moments_whose_means_are_far_apart_keep_a_real_m2():
    """The moments' merge of finite means whose difference overflows uses |difference|^2: a real M2 for
    complex data too, in the groups that took that branch and in those merged beside them."""
    chunks = [np.array([[1e308 + 0j, 1.0 + 1j]]), np.array([[-1e308 + 0j, 2.0 + 0j]]), np.array([[0j, 3.0 + 0j]])]
    plan = StatPlan("var", (0,), True, np.dtype(np.float64))
    parts = [numpy_stats.moments_chunk(c, (0,), False) for c in chunks]
    with np.errstate(all="ignore"):
        assert plan.combine(*parts)[3].dtype == plan._combine_pairwise(parts)[3].dtype == np.float64
        assert all(p[3].dtype == np.float64 for p in plan.combine_groups(parts + parts[1:], 2))
