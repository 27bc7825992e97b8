// multireduce: segmented reduction, one value per start offset (np.<ufunc>.reduceat with ascending
// offsets; an empty segment gives the identity), for any associative operator, order kept.
//
// Work is balanced by ELEMENTS, not by segments: block b takes the tile [b*TILE, (b+1)*TILE) whatever
// the segments, so 10^7 segments of ~27 elements cost what one segment of 2^28 does (a segment per
// block or warp, as CUB's DeviceSegmentedReduce and torch.segment_reduce do, starves the GPU on small
// segments and on one huge one). Three launches:
//   1. segment_tile_starts: tile_first[b] = first offset index with offsets[k] >= b*TILE (one binary
//      search per tile, so no thread of step 2 searches the whole offset array).
//   2. segment_reduce_tiles: thread t of block b folds ITEMS consecutive elements (16-byte vector loads
//      where the tile is whole and aligned), walking the segment heads that fall among them. A segment
//      closes at the next head (or at n): closures the thread saw wholly are written at once; the
//      thread's first closure (its segment began in an earlier thread) waits for a block-wide segmented
//      exclusive scan of the threads' (closed anything?, fold since the last head) pairs. The one first
//      closure whose chain reaches the tile start (the segment began in an earlier tile) is the tile's
//      "head": its partial is stored with the tile's own (flag, fold) pair.
//   3. segment_fixup: one block scans the tiles' pairs in tile order (segmented, exclusive) and
//      finishes every tile's head: out[seg] = op(carry, partial).
// Every combination is op(earlier, later), so non-commutative operators are exact.
#pragma once
#include "block.cuh"

namespace mr {

// ---- segmented fold of (flag, value) pairs --------------------------------------------------------
// (f1, v1) then (f2, v2) = (f1 | f2, f2 ? v2 : v1 op v2): a set flag means "nothing earlier reaches past
// me". Associative and order-keeping whenever op is.
template <class Acc>
struct Seg {
  int flag;
  Acc value;
};

template <class Acc, class Op>
__device__ __forceinline__ Seg<Acc> seg_combine(const Seg<Acc>& a, const Seg<Acc>& b, Op op) {
  return Seg<Acc>{a.flag | b.flag, b.flag ? b.value : op(a.value, b.value)};
}

// Exclusive segmented scan across the block, one pair per thread; *total gets the fold of all (every
// thread). ``scratch_f`` / ``scratch_v`` hold BLOCK / 32 entries each, free on entry.
template <int BLOCK, class Acc, class Op>
__device__ __forceinline__ Seg<Acc> block_segmented_exclusive_scan(Seg<Acc> x, Op op, Acc identity, int* scratch_f,
                                                                   Acc* scratch_v, Seg<Acc>* total) {
  constexpr int kWarps = BLOCK / kWarp;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  Seg<Acc> inc = x;
#pragma unroll
  for (int offset = 1; offset < kWarp; offset <<= 1) {
    Seg<Acc> left{shfl_up(inc.flag, offset), shfl_up(inc.value, offset)};
    if (lane >= offset) inc = seg_combine(left, inc, op);
  }
  Seg<Acc> exc{shfl_up(inc.flag, 1), shfl_up(inc.value, 1)};
  if (lane == 0) exc = Seg<Acc>{0, identity};
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == kWarp - 1) {
    scratch_f[warp] = inc.flag;
    scratch_v[warp] = inc.value;
  }
  __syncthreads();
  Seg<Acc> before{0, identity}, all{0, identity};
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const Seg<Acc> y{scratch_f[w], scratch_v[w]};
    if (w < warp) before = seg_combine(before, y, op);
    all = seg_combine(all, y, op);
  }
  *total = all;
  return seg_combine(before, exc, op);
}

// Read-only load of data a previous launch wrote (__ldg has no bool overload).
template <class T>
__device__ __forceinline__ T load_readonly(const T* p) {
  if constexpr (sizeof(T) == 1 && T(2) == T(1)) {  // bool
    return __ldg(reinterpret_cast<const unsigned char*>(p)) != 0;
  } else {
    return __ldg(p);
  }
}

// ---- 1. where each tile's offsets begin --------------------------------------------------------------
// tile_first[b] (b in [0, tiles]) = lower_bound(offsets, b * tile).
__global__ void segment_tile_starts(const index_t* offsets, index_t m, index_t tile, index_t tiles,
                                    index_t* tile_first) {
  for (index_t b = (index_t)blockIdx.x * blockDim.x + threadIdx.x; b <= tiles; b += (index_t)gridDim.x * blockDim.x) {
    const index_t at = b * tile;
    index_t lo = 0, hi = m;
    while (lo < hi) {
      const index_t mid = lo + (hi - lo) / 2;
      if (__ldg(offsets + mid) < at) lo = mid + 1;
      else hi = mid;
    }
    tile_first[b] = lo;
  }
}

// ---- 2. the tiles ------------------------------------------------------------------------------------
// ITEMS consecutive elements per thread (a multiple of 16 / sizeof(T), so a whole aligned tile is read
// with 16-byte loads only). Per tile: the tile's fold pair (tile_flag, tile_value) and its head
// (head_seg: the segment the tile's first closure finishes, -1 if none or if nothing is to be written;
// head_value: the fold of the tile's elements of that segment).
template <class T, class Acc, class Op, int BLOCK, int ITEMS>
__global__ void __launch_bounds__(BLOCK)
    segment_reduce_tiles(const T* in, index_t n, const index_t* offsets, index_t m, const index_t* tile_first,
                         Acc identity, Acc* out, int* tile_flag, Acc* tile_value, index_t* head_seg,
                         Acc* head_value) {
  static_assert((ITEMS * sizeof(T)) % 16 == 0, "a thread's items are whole 16-byte vectors");
  constexpr index_t kTile = (index_t)BLOCK * ITEMS;
  constexpr int kVectors = ITEMS * sizeof(T) / 16;
  __shared__ int scratch_f[BLOCK / kWarp];
  __shared__ Acc scratch_v[BLOCK / kWarp];
  __shared__ index_t shared_head_seg;
  __shared__ Acc shared_head_value;
  Op op;
  const index_t tile_start = (index_t)blockIdx.x * kTile;
  const index_t a = tile_start + (index_t)threadIdx.x * ITEMS;  // this thread's first element

  // issue the loads first: the offset search below runs while they are in flight
  union {
    uint4 raw[kVectors];
    T e[ITEMS];
  } u;
  const bool whole = tile_start + kTile <= n && reinterpret_cast<unsigned long long>(in) % 16 == 0;
  if (whole) {
    const uint4* v = reinterpret_cast<const uint4*>(in + a);
#pragma unroll
    for (int k = 0; k < kVectors; ++k) u.raw[k] = __ldg(v + k);
  } else {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      if (a + k < n) u.e[k] = in[a + k];
    }
  }

  // s = the segment of element a - 1 (-1: before offsets[0]); the first head at or after a is
  // offsets[s + 1]. Offsets in [k_lo, k_hi) lie inside this tile.
  index_t lo = tile_first[blockIdx.x], hi = tile_first[blockIdx.x + 1];
  while (lo < hi) {
    const index_t mid = lo + (hi - lo) / 2;
    if (__ldg(offsets + mid) < a) lo = mid + 1;
    else hi = mid;
  }
  index_t s = lo - 1;
  index_t next = s + 1 < m ? __ldg(offsets + s + 1) : n;  // n: no head ahead

  Acc acc = identity;
  bool closed = false;  // has this thread finished a segment?
  index_t first_seg = -1;
  Acc first_value = identity;
  // Finish segment ``seg`` with ``v``: the thread's first closure waits for the block scan.
  auto close = [&](index_t seg, const Acc& v) {
    if (!closed) {
      closed = true;
      first_seg = seg;
      first_value = v;
    } else if (seg >= 0) {
      out[seg] = v;
    }
  };
  if (next >= a + ITEMS && a + ITEMS <= n) {  // no head among my items: a plain fold
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) acc = op(acc, load_as<Acc, Op>(u.e[k]));
  } else {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const index_t i = a + k;
      if (i < n) {
        if (next <= i) {  // i is a head: the segment of i - 1 ended there; skip (and fill) empty ones
          close(s, acc);
          acc = identity;
          ++s;
          next = s + 1 < m ? __ldg(offsets + s + 1) : n;
          while (next <= i) {  // offsets[s] == offsets[s + 1] == i: segment s is empty
            out[s] = identity;
            ++s;
            next = s + 1 < m ? __ldg(offsets + s + 1) : n;
          }
        }
        acc = op(acc, load_as<Acc, Op>(u.e[k]));
      }
    }
  }
  if (a < n && n <= a + ITEMS) {  // the last element is here: its segment ends; later ones are empty
    close(s, acc);
    acc = identity;
    for (index_t k = s + 1; k < m; ++k) out[k] = identity;
  }

  if (threadIdx.x == 0) shared_head_seg = -1;
  Seg<Acc> total;
  const Seg<Acc> before = block_segmented_exclusive_scan<BLOCK>(Seg<Acc>{closed ? 1 : 0, acc}, op, identity,
                                                                scratch_f, scratch_v, &total);
  if (closed) {
    const Acc v = op(before.value, first_value);
    if (before.flag || gridDim.x == 1) {  // the segment began in this tile (or there is no earlier tile)
      if (first_seg >= 0) out[first_seg] = v;
    } else {  // at most one thread: the first in the tile to close anything
      shared_head_seg = first_seg;
      shared_head_value = v;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    tile_flag[blockIdx.x] = total.flag;
    tile_value[blockIdx.x] = total.value;
    head_seg[blockIdx.x] = shared_head_seg;
    head_value[blockIdx.x] = shared_head_seg >= 0 ? shared_head_value : identity;
  }
}

// ---- 3. the cut segments ---------------------------------------------------------------------------
// One block walks the tiles in order, ITEMS per thread per round: the carry into tile j is the
// segmented fold of tiles [0, j); tile j's head segment gets op(carry, head_value[j]). The pairs are
// read twice (fold, then walk) rather than held: at 1024 threads registers are short, and the second
// read hits L2. Read-only loads (written by the previous launch) and unrolled walks, so the compiler
// issues a thread's loads together instead of one L2 round trip per tile behind each store to out.
template <class Acc, class Op, int BLOCK, int ITEMS>
__global__ void __launch_bounds__(BLOCK)
    segment_fixup(index_t tiles, const int* tile_flag, const Acc* tile_value, const index_t* head_seg,
                  const Acc* head_value, Acc identity, Acc* out) {
  __shared__ int scratch_f[BLOCK / kWarp];
  __shared__ Acc scratch_v[BLOCK / kWarp];
  Op op;
  Seg<Acc> running{0, identity};  // the fold of the tiles of earlier rounds (same in every thread)
  for (index_t base = 0; base < tiles; base += (index_t)BLOCK * ITEMS) {
    const index_t j0 = base + (index_t)threadIdx.x * ITEMS;
    Seg<Acc> mine{0, identity};
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      if (j0 + k < tiles) {
        mine = seg_combine(mine, Seg<Acc>{__ldg(tile_flag + j0 + k), load_readonly(tile_value + j0 + k)}, op);
      }
    }
    Seg<Acc> total;
    const Seg<Acc> before = block_segmented_exclusive_scan<BLOCK>(mine, op, identity, scratch_f, scratch_v, &total);
    Seg<Acc> carry = seg_combine(running, before, op);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      if (j0 + k < tiles) {
        const index_t seg = __ldg(head_seg + j0 + k);
        if (seg >= 0) out[seg] = op(carry.value, load_readonly(head_value + j0 + k));
        carry = seg_combine(carry, Seg<Acc>{__ldg(tile_flag + j0 + k), load_readonly(tile_value + j0 + k)}, op);
      }
    }
    running = seg_combine(running, total, op);
  }
}

// ---- the offsets, checked on the GPU before any work ------------------------------------------------
// bit 0 of *bad: a start outside [0, n]; bit 1: a start below the one before it. *bad is zero on entry.
__global__ void segment_check_offsets(const index_t* offsets, index_t m, index_t n, int* bad) {
  int found = 0;
  for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < m; i += (index_t)gridDim.x * blockDim.x) {
    const index_t o = __ldg(offsets + i);
    if (o < 0 || o > n) found |= 1;
    if (i > 0 && o < __ldg(offsets + i - 1)) found |= 2;
  }
  found = __reduce_or_sync(kFullMask, found);
  if (found && threadIdx.x % kWarp == 0) atomicOr(bad, found);
}

}  // namespace mr
