"""Launch policies, kept apart from the algorithms (as CUB does): one place per compute capability.

Each number is a template argument or a grid rule; the comments record what it measured and where.
The benchmark (``benchmarks/``) is how to revisit them; ``docs/performance.md`` holds the latest run.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ScanShape:
    """One look-back scan tile: ``block`` threads x ``items`` consecutive elements each in shared memory,
    then ``held`` layers of one 16-byte vector per thread kept in registers."""

    block: int
    items: int
    held: int = 0

    def tile(self, in_itemsize: int) -> int:
        """Elements per tile for inputs of ``in_itemsize`` bytes."""
        return self.block * (self.items + self.held * (16 // in_itemsize))

    def __str__(self) -> str:
        return f"{self.block}x{self.items}+{self.held}v"


def scan_size_class(in_size: int, acc_size: int, out_size: int) -> str:
    """The key of SCAN_SHAPE_CANDIDATES (and of the policy's ``scan_*`` shapes) for these element sizes:
    4-byte and 8-byte scans, 4-byte scans with an 8-byte accumulator, 4 -> 8-byte widening (int32 sums),
    and every other mix of sizes."""
    if in_size != out_size:
        return "widening" if (in_size, out_size) == (4, 8) else "mixed"
    if (in_size, acc_size) == (4, 8):  # float32 accumulated in float64: 4-byte traffic, 8-byte registers
        return "4byte_wide"
    return "8byte" if max(in_size, acc_size) > 4 else "4byte"


@dataclass(frozen=True)
class Policy:
    reduce_block: int = 256  # threads per block, production reduce
    reduce_blocks_per_sm: int = 8  # a full SM at 256 threads (2048 resident threads on sm_80/sm_90)
    reduce_vectors_per_thread: int = 4  # 16-byte loads in flight per thread per iteration (kernel constant)
    reduce_row_block: int = 256  # one block per row, axis reductions
    ordered_block: int = 256
    ordered_items: int = 7  # odd: thread t reads slots t*ITEMS+k without shared-memory bank conflicts
    scan_block: int = 256  # catalogue scans (Hillis-Steele, Blelloch)
    # look-back scan tiles (kernels/scan.cuh). Items odd, so thread t's blocked reads t*ITEMS+k hit distinct
    # shared-memory banks. H200, bytes read + written vs the copy roof at 2^28 (2^26) elements
    # (docs/performance.md, docs/sweep_scan_4.md); without held layers the best was 256x31 / 256x15 /
    # 256x9: 0.81 / 0.87 / 0.70 x copy.
    scan_4byte: ScanShape = ScanShape(128, 61, 6)  # float32 0.853-0.859 (0.826) x copy; +4v 0.848, +8v 0.851
    scan_8byte: ScanShape = ScanShape(128, 27, 4)  # float64 0.903-0.905 (0.898); 128x31+5v 0.907, +6v 0.894
    scan_widening: ScanShape = ScanShape(64, 17, 6)  # int32 -> int64 0.784 (0.774); 96x17+4v 0.779
    # float32 accumulated in float64 (dtypes.WIDE_FLOAT32_ON_GPU, accumulate="wide"): not measured yet; the
    # 4-byte tile with 2 held layers is the largest that ptxas (sm_90) fits without spilling double prefixes
    scan_4byte_wide: ScanShape = ScanShape(128, 61, 2)
    # the fixed look-back of float32 scans (4-byte input, accumulator and output) in thread-block clusters
    # of this many tiles (kernels/scan.cuh, scan_lookback_clustered; sm_90 only, so 0 here and 8 in sm_90's
    # entry below: kernels.scan_cluster). H200, float32 at 2^28 / 2^30, side by side: 0.852 / 0.843 -> 0.886
    # / 0.893 x copy with clusters of 8, 0.870 / 0.874 with 4; float64 lost 1 % and int32 -> int64 8 %
    # against their own fixed look-back, so they keep one look-back per tile (docs/profiles.md)
    scan_cluster: int = 0
    # other mixes (int8 -> int64, float16 -> float32 in the catalogue scans, float64 -> float32 with dtype=):
    # no held layers (a narrow input's vector widens into 16-32 registers of results; or the output is
    # narrower than the input), and in + out staged in shared memory
    scan_mixed: ScanShape = ScanShape(256, 9, 0)
    catalogue_block: int = 256  # the catalogue reductions' BLOCK template argument
    elementwise_block: int = 256  # one thread per output: columns, the catalogue's add-back and finish
    column_min_threads: int = 1 << 16  # below this many columns a strided scan transposes instead
    # statistics (kernels/stats.cuh, backends/cupy_stats.py): stats_rows, stats_columns and stats_fold,
    # measured on an H200 with these numbers (docs/performance.md, "Statistics": var/std float32 0.94 x copy
    # at 2^28)
    stats_block: int = 256  # threads per block of all three kernels (a template argument)
    stats_row_unroll: int = 4  # 16-byte packs in flight per thread in stats_rows (a template argument)
    stats_column_unroll: int = 8  # elements in flight per thread in stats_columns (a template argument)
    stats_rows_blocks_per_sm: int = 4  # stats_rows blocks per SM for one long row: one wave at up to 64 registers
    stats_columns_threads_per_sm: int = 2048  # stats_columns threads per SM the pieces aim to fill
    stats_short_row: int = 2048  # rows shorter than this go to stats_columns (a thread per row and piece)
    stats_min_piece: int = 32  # stats_columns: elements per thread at least
    # segmented reduce and scan (kernels/segment.cuh, backends/cupy_segment.py), measured on an H100 with
    # these numbers (docs/performance.md, "Segments": 0.90 / 0.88 / 0.66 x copy at 10^3 / 10^5 / 10^7
    # segments over 2^28 float32)
    segment_block: int = 256  # threads per tile (a template argument)
    segment_tile_bytes: int = 128  # bytes per thread: eight 16-byte loads in flight for 4- and 8-byte types
    segment_max_items: int = 32  # elements per thread at most: a thread's heads are one 32-bit mask
    segment_carry_block: int = 256  # the carry pass between tiles: threads per block
    segment_carry_items: int = 4  # consecutive tiles per carry thread: 1024 tiles per block
    segment_search_block: int = 256  # tile starts and the offsets check
    # exact sums and scans (kernels/exact.cuh, exact_scan.cuh, backends/cupy_exact.py; why these values:
    # the comments there and docs/performance.md, "Exact sums and scans")
    exact_block: int = 256  # threads per block of the exact sum (a template argument)
    exact_terms: int = 8  # expansion length per thread (a template argument)
    exact_unroll: tuple = (("float16", 2), ("float32", 4), ("float64", 4))  # 16-byte packs in flight
    exact_blocks_per_sm: int = 4  # one resident wave of the exact sum
    # exact scan pass 2's tile (a template argument each): benchmarks/sweep_exact_scan.py on an H200
    # (2026-11-26): 512 x 16 for float32 took 0.91 / 3.40 ms at 2^26 / 2^28 where 256 x 16 took 1.14 /
    # 4.12; float64 cannot stage 512 x 16 in 48 KB of static shared memory and 512 x 8 is its best (even)
    exact_scan_block: int = 512  # exact scan: threads per tile of pass 2
    exact_scan_items: tuple = (("float16", 16), ("float32", 16), ("float64", 8))  # elements per thread
    exact_scan_warps: int = 8  # exact scan pass 1: warps per block, one tile each
    exact_carry_block: int = 1024  # exact scan's carries (the words' cumsum): threads per block, a word a block
    exact_carry_items: int = 8  # and slots per thread: 8192 slots a chunk, one chunk up to 2^26 float32

    def scan_shape(self, in_size: int, acc_size: int, out_size: int) -> ScanShape:
        """The look-back tile for these element sizes."""
        return getattr(self, "scan_" + scan_size_class(in_size, acc_size, out_size))


# Look-back tiles worth measuring, by element size class; the sweep (benchmarks/sweep_scan.py) times
# them and the GPU tests check every one, so any may become a default.
SCAN_SHAPE_CANDIDATES = {
    "4byte": (ScanShape(128, 61, 6), ScanShape(128, 53, 4), ScanShape(128, 73, 8), ScanShape(256, 31)),
    "8byte": (ScanShape(128, 27, 4), ScanShape(128, 31, 5), ScanShape(128, 43, 8), ScanShape(256, 15)),
    "4byte_wide": (ScanShape(128, 61, 2), ScanShape(128, 61, 4), ScanShape(256, 31)),
    "widening": (ScanShape(64, 17, 6), ScanShape(96, 17, 4), ScanShape(128, 17, 4), ScanShape(256, 9)),
    "mixed": (ScanShape(256, 9),),
}

# One policy for every architecture: its numbers were measured on an H200 (sm_90) and no other GPU was
# available to measure; an architecture that needs other numbers gets its own entry here, keyed by the
# compute capability's major version. sm_90 adds the look-back's clusters (Hopper's thread-block clusters;
# not measured on later GPUs, which keep the plain look-back).
_POLICIES: dict[int, Policy] = {9: Policy(scan_cluster=8)}


def policy(compute_capability_major: int) -> Policy:
    return _POLICIES.get(compute_capability_major, Policy())
