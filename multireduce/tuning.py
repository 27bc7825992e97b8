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
    # look-back scan: items per thread of 256-thread tiles. Odd, so thread t's blocked reads t*ITEMS+k hit
    # distinct shared-memory banks. H200, 2^28 elements, bytes read + written vs the copy roof
    # (docs/performance.md; sweep tables docs/sweep_scan_*.md):
    scan_items_4byte: int = 31  # float32 256 x 31: 0.783 x copy (x 23: 0.744, x 39: 0.764, x 47: 0.765)
    scan_items_8byte: int = 15  # float64 256 x 15: 0.848 x copy (x 11: 0.818, x 19: 0.835, x 23: 0.836)
    scan_items_widening: int = 9  # int32 -> int64 256 x 9: 0.672 x copy (x 13: 0.653, x 15: 0.638)
    catalogue_block: int = 256  # fixed by kernels/reduce.cuh (kCatalogueBlock)
    column_min_threads: int = 1 << 16  # below this many columns a strided scan transposes instead

    def scan_items(self, in_size: int, acc_size: int, out_size: int) -> int:
        """Items per thread of the look-back scan for these element sizes."""
        if in_size != out_size and max(in_size, out_size) > 4:
            return self.scan_items_widening
        return self.scan_items_8byte if max(in_size, acc_size, out_size) > 4 else self.scan_items_4byte


# Look-back items per thread worth measuring, by element size class; the sweep (benchmarks/sweep_scan.py)
# times them and the GPU tests check every one, so any may become a default.
SCAN_ITEMS_CANDIDATES = {
    "4byte": (23, 31, 39, 47),
    "8byte": (11, 15, 19, 23),
    "widening": (9, 13, 15),
}

_POLICIES = {
    8: Policy(),  # Ampere / Ada
    9: Policy(),  # Hopper: H100, H200
}


def policy(compute_capability_major: int) -> Policy:
    return _POLICIES.get(compute_capability_major, Policy())
