"""Launch policies, kept apart from the algorithms (as CUB does): one place per compute capability.

Each number is a template argument or a grid rule; the comments record what it measured and where.
The benchmark (``benchmarks/``) is how to revisit them; ``docs/performance.md`` holds the latest run.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Policy:
    reduce_block: int = 256  # threads per block, production reduce
    reduce_blocks_per_sm: int = 8  # a full SM at 256 threads (2048 resident threads on sm_80/sm_90)
    reduce_vectors_per_thread: int = 4  # 16-byte loads in flight per thread per iteration (kernel constant)
    reduce_row_block: int = 256  # one block per row, axis reductions
    ordered_block: int = 256
    ordered_items: int = 7  # odd: thread t reads slots t*ITEMS+k without shared-memory bank conflicts
    scan_block: int = 256
    # look-back scan tiles: (items per thread, stages). Items odd: thread t's blocked reads t*ITEMS+k hit
    # distinct shared-memory banks. Stages 2 = persistent blocks that copy the next tile in while they
    # scan the current one. Measured GB/s beside each choice (docs/performance.md, sweep_scan_*.md).
    scan_tile_4byte: tuple[int, int] = (23, 1)  # 256 x 23 float32: 0.71 x copy (before cp.async loads)
    scan_tile_8byte: tuple[int, int] = (11, 1)  # 256 x 11 float64: 0.77 x copy (before cp.async loads)
    scan_tile_widening: tuple[int, int] = (9, 1)  # input and output tiles side by side (int32 -> int64)
    catalogue_block: int = 256  # fixed by kernels/reduce.cuh (kCatalogueBlock)
    column_min_threads: int = 1 << 16  # below this many columns a strided scan transposes instead

    def scan_tile(self, in_size: int, acc_size: int, out_size: int) -> tuple[int, int]:
        """(items per thread, stages) of the look-back scan for these element sizes."""
        if in_size != out_size and max(in_size, out_size) > 4:
            return self.scan_tile_widening
        return self.scan_tile_8byte if max(in_size, acc_size, out_size) > 4 else self.scan_tile_4byte


# Look-back tile shapes worth measuring, (items per thread, stages) by element size class; the sweep
# (benchmarks/sweep_scan.py) times them and the GPU tests check every one, so any may become a default.
SCAN_TILE_CANDIDATES = {
    "4byte": ((23, 1), (31, 1), (39, 1), (15, 2), (19, 2), (23, 2)),
    "8byte": ((11, 1), (15, 1), (19, 1), (7, 2), (9, 2), (11, 2)),
    "widening": ((9, 1), (13, 1), (5, 2), (9, 2)),
}

_POLICIES = {
    8: Policy(),  # Ampere / Ada
    9: Policy(),  # Hopper: H100, H200
}


def policy(compute_capability_major: int) -> Policy:
    return _POLICIES.get(compute_capability_major, Policy())
