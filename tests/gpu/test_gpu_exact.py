"""GPU: exact functions on CuPy input, and the deterministic look-back scan (kernels/scan.cuh)."""

from __future__ import annotations

import numpy as np
import pytest

import multireduce as mr
from multireduce import exact

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")


def bits(a):
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 1023, 1025, 4096 * 32 + 1])
def test_exact_sum_gpu_equals_cpu_bits(dtype, n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-40, 40, n))).astype(dtype)
    got = exact.sum(cupy.asarray(x))
    assert isinstance(got, cupy.ndarray)
    assert bits(cupy.asnumpy(got)) == bits(exact.sum(x))
    c = exact.cumsum(cupy.asarray(x[:2000]))
    assert np.array_equal(bits(cupy.asnumpy(c)), bits(exact.cumsum(x[:2000])))


# Look-back sizes that cross the fixed look-back's levels (kernels/scan.cuh: windows of 32 tiles,
# super-windows of 32 windows): tile counts around 1, 32 and 1024, and a ragged last tile.
def _tile(dtype, acc=None, out=None):
    from multireduce.backends.cupy_backend import _facts

    dtype = np.dtype(dtype)
    acc, out = np.dtype(acc or dtype), np.dtype(out or acc or dtype)
    return _facts()[1].scan_shape(dtype.itemsize, acc.itemsize, out.itemsize).tile(dtype.itemsize)


def _level_sizes(tile):
    return [1, 31, 33, tile - 1, tile + 1, 32 * tile - 1, 32 * tile + 1, 33 * tile + 7, 1024 * tile + 1,
            1025 * tile + 3 * 32 * tile + 5]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [(1 << 22) + 17, 1 << 24])
def test_lookback_scan_is_bitwise_repeatable(dtype, n):
    """100 runs, one result: the look-back's association order must not depend on timing. Sizes span
    many 32-tile windows and (2^24) more than one 1024-tile super-window, and a ragged last tile."""
    rng = np.random.default_rng(7)
    x = cupy.asarray(rng.standard_normal(n).astype(dtype))
    first = mr.cumsum(x)
    ref = np.cumsum(cupy.asnumpy(x).astype(np.float64))
    assert np.allclose(cupy.asnumpy(first), ref, rtol=1e-3, atol=1e-3 * np.sqrt(n))
    first_bits = bits(cupy.asnumpy(first))
    for _ in range(99):
        assert np.array_equal(bits(cupy.asnumpy(mr.cumsum(x))), first_bits)


def test_lookback_rows_are_repeatable():
    rng = np.random.default_rng(9)
    x = cupy.asarray(rng.standard_normal((3, (1 << 20) + 5)).astype(np.float32))
    first = bits(cupy.asnumpy(mr.cumsum(x, axis=1)))
    for _ in range(20):
        assert np.array_equal(bits(cupy.asnumpy(mr.cumsum(x, axis=1))), first)


def test_wide_accumulation_is_repeatable_and_float32():
    x = cupy.asarray(np.random.default_rng(5).random((1 << 24) + 3, dtype=np.float32))
    first = mr.cumsum(x, accumulate="wide")
    assert first.dtype == np.float32
    first_bits = bits(cupy.asnumpy(first))
    for _ in range(19):
        assert np.array_equal(bits(cupy.asnumpy(mr.cumsum(x, accumulate="wide"))), first_bits)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("deterministic", [True, False], ids=["fixed", "free"])
def test_both_lookbacks_match_a_float64_reference_at_level_boundaries(dtype, deterministic):
    """Both variants, inclusive and exclusive, with and without a carry, against a long double reference,
    within the usual bound eps * (tiles + 64 + 2 sqrt(tile)) * mass."""
    from multireduce.backends import cupy_backend as cb
    from multireduce.operators import get_operator

    op = get_operator("sum")
    acc = np.dtype(dtype)
    tile = _tile(dtype)
    rng = np.random.default_rng(21)
    eps = np.finfo(dtype).eps
    for n in _level_sizes(tile):
        host = (rng.random(n) - 0.5).astype(dtype)
        carry_host = np.array([rng.random() * 100], dtype=dtype)
        for carry, inclusive in [(None, True), (carry_host, False)]:
            out = cupy.empty((1, n), dtype)
            cb.lookback_scan(cupy.asarray(host).reshape(1, n), out, op, acc, op.identity(acc),
                             None if carry is None else cupy.asarray(carry), inclusive, deterministic=deterministic)
            seeded = np.concatenate([carry if carry is not None else np.zeros(1, dtype), host]).astype(np.longdouble)
            ref = np.cumsum(seeded)
            mass = np.cumsum(np.abs(seeded))
            ref, mass = (ref[1:], mass[1:]) if inclusive else (ref[:-1], mass[:-1])
            got = cupy.asnumpy(out)[0].astype(np.longdouble)
            bound = eps * (n / tile + 64 + 2 * tile ** 0.5) * mass + np.finfo(dtype).tiny
            worst = np.max(np.abs(got - ref) / bound)
            assert worst <= 1, f"n={n} inclusive={inclusive}: error {worst:.2f} x the bound"


@pytest.mark.parametrize("deterministic", [True, False], ids=["fixed", "free"])
def test_integer_scans_are_exact_either_way(deterministic):
    from multireduce.backends import cupy_backend as cb
    from multireduce.operators import get_operator

    op = get_operator("sum")
    acc = np.dtype(np.int64)
    tile = _tile(np.int32, np.int64, np.int64)
    rng = np.random.default_rng(4)
    rows, K = 2, 1024 * tile + 33 * tile + 1
    host = rng.integers(-(1 << 31), 1 << 31, (rows, K), dtype=np.int64).astype(np.int32)
    out = cupy.empty((rows, K), np.int64)
    carry = rng.integers(-(1 << 40), 1 << 40, rows, dtype=np.int64)
    cb.lookback_scan(cupy.asarray(host), out, op, acc, op.identity(acc), cupy.asarray(carry), True,
                     deterministic=deterministic)
    ref = np.cumsum(host.astype(np.int64), axis=1) + carry[:, None]
    assert np.array_equal(cupy.asnumpy(out), ref)


def test_fixed_lookback_keeps_a_noncommutative_operators_order():
    """2x2 matrix products (uint64: the free look-back by default) forced through the fixed look-back,
    rows with carries across several super-windows; checked through the recurrence out[i] = out[i-1] x[i]."""
    from multireduce.backends import cupy_backend as cb

    from ..helpers import matmul2x2, matmul_operator, random_matrices

    op = matmul_operator()
    acc = np.dtype(np.uint64)
    tile = _tile(np.uint64)
    rng = np.random.default_rng(17)
    rows, K = 2, 2 * 1024 * tile + 5 * 32 * tile + 77
    host = random_matrices(rng, rows * K).reshape(rows, K)
    carry = random_matrices(rng, rows)
    for inclusive in (True, False):
        out = cupy.empty((rows, K), acc)
        cb.lookback_scan(cupy.asarray(host), out, op, acc, op.identity(acc), cupy.asarray(carry), inclusive,
                         deterministic=True)
        got = cupy.asnumpy(out)
        if inclusive:
            assert np.array_equal(got[:, 0], matmul2x2(carry, host[:, 0]))
            assert np.array_equal(got[:, 1:], matmul2x2(got[:, :-1], host[:, 1:]))
        else:
            assert np.array_equal(got[:, 0], carry)
            assert np.array_equal(got[:, 1:], matmul2x2(got[:, :-1], host[:, :-1]))
        assert np.count_nonzero(got[:, -1]), "products collapsed to zero: the check would be vacuous"


def test_lookback_variant_override_and_occupancy(monkeypatch):
    from multireduce import kernels
    from multireduce.backends import cupy_backend as cb
    from multireduce.operators import get_operator

    op = get_operator("sum")
    assert kernels.fixed_lookback(op, np.float32) and not kernels.fixed_lookback(op, np.int64)
    assert not kernels.fixed_lookback(get_operator("max"), np.float32)
    x = cupy.asarray(np.random.default_rng(2).standard_normal(1 << 20).astype(np.float32))
    monkeypatch.setenv(cb.LOOKBACK_ENV, "free")
    free = cupy.asnumpy(mr.cumsum(x))
    monkeypatch.setenv(cb.LOOKBACK_ENV, "fixed")
    fixed = cupy.asnumpy(mr.cumsum(x))
    ref = np.cumsum(cupy.asnumpy(x).astype(np.float64))
    for got in (free, fixed):
        assert np.allclose(got, ref, rtol=1e-4, atol=1e-3)
    monkeypatch.setenv(cb.LOOKBACK_ENV, "sometimes")
    with pytest.raises(ValueError, match="MULTIREDUCE_SCAN_LOOKBACK is 'sometimes'; expected 'fixed', 'free'"):
        mr.cumsum(x)
    monkeypatch.delenv(cb.LOOKBACK_ENV)
    sms, p = cb._facts()
    for in_size, acc_size, out_size, dtypes in [(4, 4, 4, (np.float32,) * 3), (8, 8, 8, (np.float64,) * 3),
                                                (4, 8, 8, (np.int32, np.int64, np.int64)),
                                                (4, 8, 4, (np.float32, np.float64, np.float32))]:
        T, A, O = (np.dtype(d) for d in dtypes)
        for fixed_flag in (True, False):
            ks, _, _, shape = cb._scan_kernels(op, T, A, O, None, fixed_flag)
            blocks = cb.scan_occupancy(ks["lookback"], shape.block)
            assert 1 <= blocks <= 2048 // shape.block, (dtypes, shape, blocks)


def test_wide_float32_reduce_and_scan_kernels_round_once():
    """The float32-in-float64 kernels (dtypes.WIDE_FLOAT32_ON_GPU, accumulate="wide") against float64."""
    from multireduce.backends import cupy_backend as cb
    from multireduce.operators import get_operator

    op = get_operator("sum")
    x = np.random.default_rng(8).random(10**7, dtype=np.float32)
    ref = np.cumsum(x, dtype=np.float64)
    got = cupy.asnumpy(mr.cumsum(cupy.asarray(x), accumulate="wide"))
    assert got.dtype == np.float32
    assert np.max(np.abs(got - ref) / np.spacing(ref.astype(np.float32))) <= 0.5 + 1e-3
    total = cb.reduce(cupy.asarray(x), op, (0,), np.float64)
    assert abs(float(total[0]) - ref[-1]) <= 1e-9 * ref[-1]


def test_clustered_lookback_at_cluster_boundaries():
    """sm_90: the fixed look-back of float32 scans runs in thread-block clusters of 8 tiles, one descriptor
    per cluster (kernels/scan.cuh, scan_lookback_clustered). Rows of tile counts around the smallest
    clustered row (16), a cluster's window (8 x 32 tiles) and super-window (8 x 1024 tiles), with carries,
    inclusive and exclusive, against a long double reference within the bound above, and the same bits
    over repeated calls."""
    from multireduce import kernels
    from multireduce.backends import cupy_backend as cb
    from multireduce.operators import get_operator

    sms, p = cb._facts()
    cluster = kernels.scan_cluster(p, 4, 4, 4, True)
    if cluster == 0:
        pytest.skip("thread-block clusters serve sm_90 only (tuning.Policy.scan_cluster)")
    op = get_operator("sum")
    acc = np.dtype(np.float32)
    ks, _, _, shape = cb._scan_kernels(op, acc, acc, acc, None, True)
    assert "lookback_clustered" in ks and cb.scan_occupancy(ks["lookback_clustered"], shape.block) >= 1
    tile = _tile(np.float32)
    rng = np.random.default_rng(31)
    eps = np.finfo(np.float32).eps
    for tiles in (15, 16, 17, cluster * 32 - 1, cluster * 32 + 1, cluster * 1024 + 9):
        rows = 2 if tiles < 1000 else 1
        K = tiles * tile - 5
        host = (rng.random((rows, K)) - 0.5).astype(np.float32)
        carry_host = (rng.random(rows) * 100).astype(np.float32)
        x, carry = cupy.asarray(host), cupy.asarray(carry_host)
        for inclusive in (True, False):
            out = cupy.empty((rows, K), np.float32)
            cb.lookback_scan(x, out, op, acc, op.identity(acc), carry, inclusive, deterministic=True)
            got = cupy.asnumpy(out)
            seeded = np.concatenate([carry_host[:, None], host], axis=1).astype(np.longdouble)
            ref, mass = np.cumsum(seeded, axis=1), np.cumsum(np.abs(seeded), axis=1)
            ref, mass = (ref[:, 1:], mass[:, 1:]) if inclusive else (ref[:, :-1], mass[:, :-1])
            bound = eps * (K / tile + 64 + 2 * tile ** 0.5) * mass + np.finfo(np.float32).tiny
            worst = np.max(np.abs(got.astype(np.longdouble) - ref) / bound)
            assert worst <= 1, f"tiles={tiles} inclusive={inclusive}: error {worst:.2f} x the bound"
            if not inclusive:
                assert np.array_equal(bits(got[:, 0]), bits(carry_host)), "the carry itself begins each row"
            for _ in range(3):
                again = cupy.empty((rows, K), np.float32)
                cb.lookback_scan(x, again, op, acc, op.identity(acc), carry, inclusive, deterministic=True)
                assert np.array_equal(bits(cupy.asnumpy(again)), bits(got)), f"tiles={tiles}: bits changed"
