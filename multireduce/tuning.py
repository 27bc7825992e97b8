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
    # scan tiles (odd: thread t's blocked reads t*ITEMS+k hit distinct shared-memory banks). A sweep on an
    # H200 at 2^28 (docs/sweep_scan_1.md, _2.md) found 256 x 31 better for 4-byte types (0.745 vs 0.71 x
    # copy) and 256 x 15 for 8-byte ones (0.80 vs 0.77 x); not switched yet: the GPU test suite has not
    # run with those instantiations (no device time was left), and it must before they become the default.
    scan_items_4byte: int = 23  # 256 x 23 float32: 0.71 x copy
    scan_items_8byte: int = 11  # 256 x 11 float64: 0.77 x copy
    scan_items_widening: int = 9  # input and output tiles side by side (e.g. int32 -> int64): 27 KB, 8 blocks/SM
    catalogue_block: int = 256  # fixed by kernels/reduce.cuh (kCatalogueBlock)
    column_min_threads: int = 1 << 16  # below this many columns a strided scan transposes instead

    def scan_items(self, in_size: int, acc_size: int, out_size: int) -> int:
        if in_size != out_size and max(in_size, out_size) > 4:
            return self.scan_items_widening
        return self.scan_items_8byte if max(in_size, acc_size, out_size) > 4 else self.scan_items_4byte


_POLICIES = {
    8: Policy(),  # Ampere / Ada
    9: Policy(),  # Hopper: H100, H200
}


def policy(compute_capability_major: int) -> Policy:
    return _POLICIES.get(compute_capability_major, Policy())
