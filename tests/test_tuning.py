"""The launch policy's look-back tiles: which shape each dtype gets, and that every shape the sweep may
pick satisfies what kernels/scan.cuh assumes (whole 16-byte vectors, conflict-free odd items, static
shared memory under 48 KB). The GPU tests run every candidate; these need no GPU."""

from __future__ import annotations

import numpy as np
import pytest

from multireduce import dtypes
from multireduce.tuning import SCAN_SHAPE_CANDIDATES, ScanShape, policy, scan_size_class

STATIC_SHARED_LIMIT = 48 * 1024


def _scan_sizes(dtype):
    out = dtypes.result_dtype("sum", np.dtype(dtype))
    return np.dtype(dtype).itemsize, dtypes.accumulator_dtype(out).itemsize, out.itemsize


@pytest.mark.parametrize(("dtype", "size_class"), [
    (np.float32, "4byte"), (np.float16, "4byte"), (np.float64, "8byte"), (np.int64, "8byte"),
    (np.int32, "widening"), (np.uint32, "widening"), (np.int8, "mixed"), (np.uint16, "mixed"), (np.bool_, "mixed"),
])
def test_each_dtype_gets_its_size_class(dtype, size_class):
    sizes = _scan_sizes(dtype)
    assert scan_size_class(*sizes) == size_class
    assert policy(9).scan_shape(*sizes) == getattr(policy(9), "scan_" + size_class)


def test_tile_counts_shared_items_and_held_vectors():
    shape = ScanShape(128, 61, 6)
    assert shape.tile(4) == 128 * 61 + 6 * 128 * 4
    assert shape.tile(8) == 128 * 61 + 6 * 128 * 2
    assert shape.tile(2) == 128 * 61 + 6 * 128 * 8
    assert ScanShape(256, 9).tile(1) == 256 * 9
    assert str(shape) == "128x61+6v"


def _element_sizes():
    """(input, accumulator, output) sizes of every scan the library launches: each operator and dtype of
    the table, the catalogue scans' accumulator passes, and a narrowing ``dtype=``."""
    from multireduce.operators import get_operator

    sizes = {(8, 4, 4), (4, 8, 4)}  # cumsum(float64 array, dtype=float32); float32 accumulated in float64
    for opname in ("sum", "prod", "min", "max"):
        op = get_operator(opname)
        for dtype in dtypes.GPU_DTYPES:
            if dtype.kind not in op.kinds:
                continue
            out = dtypes.result_dtype(op.family, dtype)
            acc = dtypes.accumulator_dtype(out).itemsize
            sizes |= {(dtype.itemsize, acc, out.itemsize), (dtype.itemsize, acc, acc), (acc, acc, acc),
                      (acc, acc, out.itemsize)}
    return sorted(sizes)


@pytest.mark.parametrize("sizes", _element_sizes(), ids=lambda s: "in{}-acc{}-out{}".format(*s))
def test_every_candidate_fits_the_kernel(sizes):
    in_size, acc_size, out_size = sizes
    size_class = scan_size_class(in_size, acc_size, out_size)
    shapes = SCAN_SHAPE_CANDIDATES[size_class]
    assert getattr(policy(9), "scan_" + size_class) in shapes, "the default must be one the GPU tests check"
    for shape in shapes:
        assert shape.block % 32 == 0 and 32 <= shape.block <= 1024, shape
        assert shape.items % 2 == 1, f"{shape}: even items per thread put a warp's reads on few banks"
        shared = shape.block * shape.items
        assert shared * in_size % 16 == 0 and shared * out_size % 16 == 0, f"{shape}: tiles are whole vectors"
        staged = shared * in_size + (0 if in_size == out_size else shared * out_size)
        scratch = (1 + shape.held) * (shape.block // 32) * acc_size + 33 * acc_size + 64
        assert staged + scratch <= STATIC_SHARED_LIMIT, f"{shape}: {staged} bytes of static shared memory"
        if shape.held:
            assert out_size >= in_size and (16 // in_size) * out_size % 16 == 0, shape


def test_policy_constants_reach_the_template_arguments():
    """Launch constants come from one place: a Policy with other numbers yields other instantiations."""
    import dataclasses

    from multireduce import kernels

    base = policy(9)
    other = dataclasses.replace(base, reduce_block=128, reduce_vectors_per_thread=2, catalogue_block=512,
                                ordered_items=5, reduce_row_block=64, scan_block=128)
    f, a = "float", "float"
    names = kernels.reduce_names(f, a, "mr::Sum", other).names
    assert names["vectorized"] == "mr::reduce_vectorized<float, float, mr::Sum, 128, 2>"
    assert names["ordered_multi_block"].endswith(f", {other.ordered_block}, 5>")
    assert names["rows"] == "mr::reduce_rows<float, float, mr::Sum, 64, 5, false>"
    catalogue = kernels.reduce_catalogue_names(f, a, "mr::Sum", other).names
    assert all(e.endswith(", 512>") for r, e in catalogue.items() if r != "ordered_single_block")
    scans = kernels.scan_catalogue_names(f, a, a, "mr::Sum", other).names
    assert scans["blelloch"].endswith(", 128>") and scans["hillis_steele"].endswith(", 128>")
    shape = ScanShape(96, 17, 4)
    assert kernels.scan_names(f, a, a, "mr::Sum", other, shape).names["lookback"].endswith(", 96, 17, 4, false>")
    assert kernels.scan_names(f, a, a, "mr::Sum", other, shape, True).names["lookback"].endswith(", 96, 17, 4, true>")
    # the kernels declare those template parameters (no constant of their own in the source)
    source = kernels.kernel_source() + kernels.kernel_source(kernels.CATALOGUE_ENTRY)
    assert "kCatalogueBlock" not in source
    assert "int BLOCK, int VECTORS>\n__global__ void __launch_bounds__(BLOCK) reduce_vectorized" in source


def test_statistics_template_arguments_come_from_the_policy():
    """kernels/stats.cuh's template arguments are the policy's numbers (one source of launch constants)."""
    from multireduce.backends import cupy_stats

    p = policy(9)
    names = cupy_stats.stat_names("var", np.float32)
    assert names["rows"].endswith(f", {p.stats_block}, {p.stats_row_unroll}>")
    assert names["columns"].endswith(f", {p.stats_block}, {p.stats_column_unroll}>")
    assert names["fold"].endswith(f", {p.stats_block}>")
    assert (cupy_stats.BLOCKS_PER_SM, cupy_stats.THREADS_PER_SM, cupy_stats.SHORT_ROW, cupy_stats.MIN_PIECE) == (
        p.stats_rows_blocks_per_sm, p.stats_columns_threads_per_sm, p.stats_short_row, p.stats_min_piece)
