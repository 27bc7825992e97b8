"""The catalogue of GPU algorithms: names, what each one teaches, and whether it keeps element order.

This is metadata only (no CuPy import), so ``multireduce.algorithms()`` and argument checks work on any
machine. The kernels themselves are in ``kernels/*.cuh``; ``backends.cupy_backend`` launches them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Algorithm:
    name: str
    family: str  # "reduce" or "scan"
    keeps_order: bool  # safe for non-commutative operators
    summary: str


_ENTRIES = [
    # reductions, in the order of the seeds' ladder
    Algorithm("neighbored", "reduce", True,
              "neighbored pairs in shared memory, divergent test t % (2*stride) == 0"),
    Algorithm("neighbored_compact", "reduce", True,
              "neighbored pairs, compact thread indices (index = 2*stride*t): no divergence, bank conflicts"),
    Algorithm("interleaved", "reduce", False,
              "interleaved pairs (sequential addressing): stride halves from blockDim/2"),
    Algorithm("first_add", "reduce", False,
              "interleaved pairs, each thread adds two elements while loading"),
    Algorithm("unroll_last_warp", "reduce", False,
              "first add during load, the last 32 partials reduced by one warp without block barriers"),
    Algorithm("complete_unroll", "reduce", False,
              "block size as a template parameter, every level unrolled"),
    Algorithm("grid_stride", "reduce", False,
              "many elements per thread with a grid-stride loop, one block per SM pair, then a second launch"),
    Algorithm("warp_shuffle", "reduce", False,
              "grid-stride loads, block reduction with warp shuffles (__shfl_down_sync)"),
    Algorithm("last_block", "reduce", False,
              "one launch for all blocks: partials, __threadfence, atomic counter, the last block finishes"),
    Algorithm("vectorized", "reduce", False,
              "16-byte vector loads (the OpenCL seed's uint4), grid-stride, warp shuffles, last-block guard"),
    Algorithm("ordered_single_block", "reduce", True,
              "one block, contiguous tiles folded in order: for non-commutative operators"),
    Algorithm("ordered_multi_block", "reduce", True,
              "each block folds a contiguous segment in order; the last block folds the partials in order"),
    # scans
    Algorithm("hillis_steele", "scan", True,
              "Hillis-Steele block scan (log n steps, n log n work), any length through the multi-level driver"),
    Algorithm("blelloch", "scan", True,
              "Blelloch work-efficient up/down sweep with bank-conflict padding, multi-level for any length"),
    Algorithm("decoupled_lookback", "scan", True,
              "one pass: 16-byte coalesced tile loads, block scan, decoupled look-back across tiles"),
]

CATALOGUE: dict[str, Algorithm] = {a.name: a for a in _ENTRIES}
REDUCE_ALGORITHMS = tuple(a.name for a in _ENTRIES if a.family == "reduce")
SCAN_ALGORITHMS = tuple(a.name for a in _ENTRIES if a.family == "scan")


def algorithms(family: str | None = None) -> list[str]:
    """Names accepted by ``algorithm=`` ("auto" picks per size).

    Parameters
    ----------
    family : {"reduce", "scan"} or None, optional
        The reductions' names, the scans', or (None, the default) both.

    Returns
    -------
    names : list of str
        "auto" first, then the catalogue's kernels in ladder order.

    Examples
    --------
    >>> import numpy as np, multireduce as mr
    >>> mr.algorithms("scan")
    ['auto', 'hillis_steele', 'blelloch', 'decoupled_lookback']
    >>> mr.algorithms("reduce")[:4]
    ['auto', 'neighbored', 'neighbored_compact', 'interleaved']
    >>> mr.sum(np.arange(5), algorithm="warp_shuffle")
    Traceback (most recent call last):
    ...
    ValueError: multireduce.sum: argument 'algorithm' is 'warp_shuffle', a GPU kernel, but 'x' holds NumPy data; ...
    """
    if family not in (None, "reduce", "scan"):
        raise ValueError(f"algorithms: argument 'family' must be 'reduce', 'scan' or None; got {family!r}")
    return ["auto"] + [a.name for a in _ENTRIES if family in (None, a.family)]
