// multireduce: segmented reduction, one value per start offset (np.<ufunc>.reduceat with ascending
// offsets; an empty segment gives the identity), for any associative operator, order kept.
//
// Work is balanced by ELEMENTS, not by segments: block b takes the tile [b*TILE, (b+1)*TILE) whatever
// the segments, so 10^7 segments of ~27 elements cost what one segment of 2^28 does (a segment per
// block or warp, as CUB's DeviceSegmentedReduce and torch.segment_reduce do, starves the GPU on small
// segments and on one huge one). Four launches (three while the tiles fit one carry group):
//   1. segment_tile_starts: tile_first[b] = first offset index with offsets[k] >= b*TILE (one binary
//      search per tile, so no thread of step 2 searches the whole offset array).
//   2. segment_reduce_tiles: thread t of block b folds ITEMS consecutive elements (coalesced loads
//      through shared memory, WarpTransposeLoad), walking the segment heads that fall among them. A
//      segment closes at the next head (or at n): closures the thread saw wholly are written at once; the
//      thread's first closure (its segment began in an earlier thread) waits for a block-wide segmented
//      exclusive scan of the threads' (closed anything?, fold since the last head) pairs. The one first
//      closure whose chain reaches the tile start (the segment began in an earlier tile) is the tile's
//      "head": its partial is stored with the tile's own (flag, fold) pair.
//   3. segment_carry_totals / segment_carry_apply: the tiles' pairs scanned in tile order (segmented,
//      exclusive) by many blocks in a fixed tree, finishing every tile's head: out[seg] = op(carry,
//      partial).
// Every combination is op(earlier, later), so non-commutative operators are exact.
//
// The segmented inclusive scan (segment_scan_tiles, below) is one pass with decoupled look-back.
#pragma once
#include "block.cuh"
#include "scan.cuh"

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

// ---- coalesced tile loads --------------------------------------------------------------------------
// A thread folds ITEMS consecutive elements, but reading them straight from global memory makes a warp's
// load touch 32 lines at a stride of ITEMS elements (L1 saturated, DRAM half idle). So each warp loads its
// kWarp * ITEMS elements with consecutive lanes on consecutive 16-byte vectors (scalars where the warp's
// part is not whole and aligned), stages them in a per-warp shared buffer and each thread reads its run
// back (CUB's BLOCK_LOAD_WARP_TRANSPOSE). The buffer is counted in 32-bit words with one pad word per 32:
// a thread's run is kWords words, so without the pad lanes reading word k of their runs would all hit one
// bank. fetch() only issues the global loads, so callers can search offsets while they are in flight.
template <class T, int ITEMS>
struct WarpTransposeLoad {
  static_assert((ITEMS * sizeof(T)) % 16 == 0, "a thread's items are whole 16-byte vectors");
  static constexpr int kWords = ITEMS * sizeof(T) / 4;            // one thread's run
  static constexpr int kVectors = kWords / 4;
  static constexpr int kSharedWords = kWarp * kWords + kWords;     // one warp's buffer, pads included
  static_assert(kWarp % kWords == 0, "a thread's run (and each 16-byte vector) lies within one padded row,"
                " so its words sit at constant offsets from one address");
  union {
    uint4 raw[kVectors];
    T e[ITEMS];
    unsigned w[kWords];
  } u;
  bool vectors;

  __device__ __forceinline__ static int padded(int word) { return word + word / kWarp; }

  // The warp's elements [warp_start, warp_start + kWarp * ITEMS) of ``in`` (those below n).
  __device__ __forceinline__ void fetch(const T* in, index_t warp_start, index_t n) {
    const int lane = threadIdx.x % kWarp;
    vectors = warp_start + kWarp * ITEMS <= n && reinterpret_cast<unsigned long long>(in + warp_start) % 16 == 0;
    if (vectors) {
      const uint4* v = reinterpret_cast<const uint4*>(in + warp_start);
#pragma unroll
      for (int q = 0; q < kVectors; ++q) u.raw[q] = __ldg(v + q * kWarp + lane);
    } else {  // int bounds: the part is at most kWarp * ITEMS long
      const int rest = (int)(n - warp_start < kWarp * ITEMS ? n - warp_start : kWarp * ITEMS) - lane;
      const T* from = in + warp_start + lane;
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        if (k * kWarp < rest) u.e[k] = from[k * kWarp];
      }
    }
  }

  // Afterwards u.e holds this thread's ITEMS consecutive elements (those past n undefined). ``buffer``:
  // the warp's kSharedWords words, free on entry and on return.
  __device__ __forceinline__ void transpose(unsigned* buffer) {
    const int lane = threadIdx.x % kWarp;
    if (vectors) {
#pragma unroll
      for (int q = 0; q < kVectors; ++q) {
        unsigned* to = buffer + padded(4 * (q * kWarp + lane));
        to[0] = u.raw[q].x;
        to[1] = u.raw[q].y;
        to[2] = u.raw[q].z;
        to[3] = u.raw[q].w;
      }
    } else {
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) put(buffer, k * kWarp + lane, u.e[k]);
    }
    __syncwarp();
    const unsigned* run = buffer + padded(lane * kWords);
#pragma unroll
    for (int k = 0; k < kWords; ++k) u.w[k] = run[k];
    __syncwarp();
  }

  // Element e of the warp's part at its padded place: sizes divide 4 or are multiples of it, so an
  // element never straddles a pad; wide ones go word by word (a pad breaks their alignment).
  __device__ __forceinline__ static void put(unsigned* buffer, int e, const T& v) {
    if constexpr (sizeof(T) >= 4) {
      const unsigned* words = reinterpret_cast<const unsigned*>(&v);
#pragma unroll
      for (int j = 0; j < (int)(sizeof(T) / 4); ++j) buffer[padded(e * (int)(sizeof(T) / 4) + j)] = words[j];
    } else {
      const int byte = e * (int)sizeof(T);
      *reinterpret_cast<T*>(reinterpret_cast<unsigned char*>(buffer + padded(byte / 4)) + byte % 4) = v;
    }
  }
};

// ---- a thread's heads ----------------------------------------------------------------------------------
// The heads among a thread's elements [a, a + valid) as a bit mask (bit k: an offset equals a + k; a run
// of equal offsets sets its bit once), with the index of the first offset at or after a and how many
// offsets (repeats counted) fall in the run. A tile's offsets, [tile_first[b], tile_first[b+1]), are
// staged in shared memory, relative to the tile start, when at most CAP of them fall in it: then every
// search and walk below is a shared-memory read, and a tile pays two dependent global loads (its bounds,
// then its offsets, both while its data is in flight) instead of one per search step. 10^7 segments over
// 2^28 float32 elements put about 300 offsets in a tile of 8192. A tile with more (segments shorter than
// 4 elements on average, or runs of repeats) searches the global array, skipping a run of repeats by one
// binary search. Every thread of the block must call this (it may hold a __syncthreads).
template <int BLOCK, int CAP>
struct ThreadHeads {
  unsigned mask;    // bit k: a head at a + k
  index_t first;    // the first offset index with offsets[first] >= a
  index_t count;    // offsets in [a, a + valid), repeats counted

  __device__ __forceinline__ void find(const index_t* offsets, const index_t* tile_first, index_t tile_start,
                                       index_t a, int valid, int* staged) {
    const index_t lo = tile_first[blockIdx.x], hi = tile_first[blockIdx.x + 1];
    mask = 0;
    if (hi == lo) {  // no offset in the tile (uniform across the block): nothing to stage or search
      first = lo;
      count = 0;
      return;
    }
    if (hi - lo <= CAP) {  // uniform across the block
      const int m = (int)(hi - lo);
      for (int j = threadIdx.x; j < m; j += BLOCK) staged[j] = (int)(__ldg(offsets + lo + j) - tile_start);
      __syncthreads();
      const int from = (int)(a - tile_start);
      int l = 0, h = m;  // the first staged offset at or after ``from``
      while (l < h) {
        const int mid = (l + h) / 2;
        if (staged[mid] < from) l = mid + 1;
        else h = mid;
      }
      int j = l;
      for (; j < m; ++j) {
        const int at = staged[j] - from;
        if (at >= valid) break;
        mask |= 1u << at;
      }
      first = lo + l;
      count = j - l;
      return;
    }
    index_t l = lo, h = hi;
    while (l < h) {
      const index_t mid = l + (h - l) / 2;
      if (__ldg(offsets + mid) < a) l = mid + 1;
      else h = mid;
    }
    first = l;
    index_t j = l;
    while (j < hi) {
      const index_t o = __ldg(offsets + j);
      if (o >= a + valid) break;  // past my items (or an offset n in the last tile)
      mask |= 1u << (int)(o - a);
      index_t rl = j + 1, rh = hi;  // past the run of offsets equal to o
      if (rl < rh && __ldg(offsets + rl) == o) {
        while (rl < rh) {
          const index_t mid = rl + (rh - rl) / 2;
          if (__ldg(offsets + mid) <= o) rl = mid + 1;
          else rh = mid;
        }
      }
      j = rl;
    }
    count = j - first;
  }
};

// Offsets staged per tile: a quarter of the tile's elements (segments of 4 or more on average).
template <int BLOCK, int ITEMS>
struct StagedOffsets {
  static constexpr int kCount = BLOCK * ITEMS / 4;
};

// ---- 1. where each tile's offsets begin --------------------------------------------------------------
// tile_first[b] (b in [0, tiles]) = lower_bound(offsets, b * tile).
// ``bad`` (or nullptr): the offsets check's flag (segment_check_offsets, queued before on the same
// stream). Where it is set, every tile starts at offset m (past the last): no tile has offsets and
// every element lies in segment m - 1, so the kernels after this one, already queued while the host
// waits for the flag, walk no offset and write only their own outputs, which the host then drops to
// raise the error. (Starting every tile at 0 instead would make the thread holding the last element
// walk all m offsets one by one.)
__global__ void segment_tile_starts(const index_t* offsets, index_t m, index_t tile, index_t tiles,
                                    index_t* tile_first, const int* bad) {
  const bool refused = bad != nullptr && __ldg(bad) != 0;
  for (index_t b = (index_t)blockIdx.x * blockDim.x + threadIdx.x; b <= tiles; b += (index_t)gridDim.x * blockDim.x) {
    const index_t at = b * tile;
    index_t lo = refused ? m : 0, hi = m;
    while (lo < hi) {
      const index_t mid = lo + (hi - lo) / 2;
      if (__ldg(offsets + mid) < at) lo = mid + 1;
      else hi = mid;
    }
    tile_first[b] = lo;
  }
}

// ---- a lane's fold through at most HEADS heads -------------------------------------------------------
// acc folds the ITEMS elements e[], restarting at each head of ``mask`` (at most HEADS of them; from its
// value on entry before the first): closes[h] (h < HEADS) gets the fold that head h ends (acc's value just
// before the head), acc's value on entry where the lane has fewer heads. The heads' positions are
// compared against each unrolled element position, so the loop has no branch and no per-element store.
template <int ITEMS, int HEADS, class Op, class Acc, class E, int SLOTS>
__device__ __forceinline__ void fold_at_heads(const E (&e)[ITEMS], unsigned mask, Op op, Acc& acc,
                                              Acc (&closes)[SLOTS]) {
  static_assert(HEADS <= SLOTS, "a slot per head");
  int at[HEADS];
#pragma unroll
  for (int h = 0; h < HEADS; ++h) {
    at[h] = mask ? __ffs(mask) - 1 : ITEMS;  // ITEMS: no such head
    mask &= mask - 1;
    closes[h] = acc;  // overwritten wherever the head exists
  }
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const Acc x = load_as<Acc, Op>(e[k]);
    bool head = false;
#pragma unroll
    for (int h = 0; h < HEADS; ++h) {
      closes[h] = k == at[h] ? acc : closes[h];
      head |= k == at[h];
    }
    acc = head ? x : op(acc, x);
  }
}

// ---- 2. the tiles ------------------------------------------------------------------------------------
// ITEMS consecutive elements per thread (a multiple of 16 / sizeof(T), so a whole aligned tile is read
// with 16-byte loads only). Per tile: the tile's fold pair (tile_flag, tile_value) and its head
// (head_seg: the segment the tile's first closure finishes, -1 if none or if nothing is to be written;
// head_value: the fold of the tile's elements of that segment).
template <class T, class Acc, class Op, int BLOCK, int ITEMS>
__global__ void __launch_bounds__(BLOCK, 1024 / BLOCK)
    segment_reduce_tiles(const T* in, index_t n, const index_t* offsets, index_t m, const index_t* tile_first,
                         Acc identity, Acc* out, int* tile_flag, Acc* tile_value, index_t* head_seg,
                         Acc* head_value) {
  static_assert(ITEMS <= 32, "a thread's heads fit one 32-bit mask");
  using Load = WarpTransposeLoad<T, ITEMS>;
  constexpr index_t kTile = (index_t)BLOCK * ITEMS;
  constexpr int kStaged = StagedOffsets<BLOCK, ITEMS>::kCount;
  __shared__ int scratch_f[BLOCK / kWarp];
  __shared__ Acc scratch_v[BLOCK / kWarp];
  __shared__ index_t shared_head_seg;
  __shared__ Acc shared_head_value;
  __shared__ unsigned staging[BLOCK / kWarp][Load::kSharedWords];
  __shared__ int staged[kStaged];
  Op op;
  const index_t tile_start = (index_t)blockIdx.x * kTile;
  const index_t a = tile_start + (index_t)threadIdx.x * ITEMS;  // this thread's first element
  const int valid = (int)(n - a <= 0 ? 0 : (n - a < ITEMS ? n - a : ITEMS));

  // issue the loads first: the offset search below runs while they are in flight
  Load load;
  load.fetch(in, tile_start + (index_t)(threadIdx.x / kWarp) * kWarp * ITEMS, n);
  ThreadHeads<BLOCK, kStaged> heads;
  heads.find(offsets, tile_first, tile_start, a, valid, staged);
  index_t s = heads.first - 1;  // the segment of element a - 1 (-1: before offsets[0])
  load.transpose(staging[threadIdx.x / kWarp]);
  const auto& u = load.u;

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
  // No repeated offsets and not the array's last element: the heads mask alone says where segments end.
  // A warp with no head folds plainly. Any other folds without branching on the heads (a branch per head
  // would run the closing code at almost every element wherever most lanes hold a head): where no lane of
  // the warp holds more than two heads, each unrolled element position is compared against the lane's
  // one or two head positions and the closures stay in registers (2^20 random segments over 2^28
  // elements put ~4 heads in a warp's elements, and two in one lane in a fifth of the warps); otherwise a
  // predicated store per element, the first closure kept. Every path folds op(earlier, later) from the
  // same starts: the same bits.
  const bool by_mask = a + ITEMS < n && heads.count == __popc(heads.mask);
  const int lane_heads = __popc(heads.mask);
  const int warp_heads = __reduce_max_sync(kFullMask, (unsigned)lane_heads);  // the most any lane holds
  const index_t seg_before = heads.first - 1;  // the segment of element a - 1: closure j ends seg_before + j
  if (by_mask && warp_heads == 0) {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) acc = op(acc, load_as<Acc, Op>(u.e[k]));
  } else if (by_mask && warp_heads <= 2) {
    Acc closes[2];
    if (warp_heads == 1) fold_at_heads<ITEMS, 1, Op>(u.e, heads.mask, op, acc, closes);
    else fold_at_heads<ITEMS, 2, Op>(u.e, heads.mask, op, acc, closes);
    if (lane_heads > 0) {
      closed = true;
      first_seg = seg_before;
      first_value = closes[0];
    }
    if (lane_heads == 2) out[seg_before + 1] = closes[1];
  } else if (by_mask) {
    int j = 0;
    Acc first_close = identity;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const bool head = (heads.mask >> k) & 1u;
      const Acc x = load_as<Acc, Op>(u.e[k]);
      if (head && j > 0) out[seg_before + j] = acc;
      first_close = head && j == 0 ? acc : first_close;
      j += head;
      acc = head ? x : op(acc, x);
    }
    if (j > 0) {
      closed = true;
      first_seg = seg_before;
      first_value = first_close;
    }
  } else if (valid > 0) {  // repeated offsets (empty segments to fill) or the array's end: walk the offsets
    index_t next = s + 1 < m ? __ldg(offsets + s + 1) : n;  // n: no head ahead
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const index_t i = a + k;
      if (k < valid) {
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
    if (n <= a + ITEMS) {  // the last element is here: its segment ends; later ones are empty
      close(s, acc);
      acc = identity;
      for (index_t k = s + 1; k < m; ++k) out[k] = identity;
    }
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

// ---- 3. the carries between tiles ----------------------------------------------------------------------
// The running (flag, value) pair entering each tile is the segmented fold of the pairs of the tiles
// before it, in tile order. Two launches, each a fixed combination tree, so the same bits on every run:
//   segment_carry_totals: block g folds the pairs of its group, tiles [g*GROUP, (g+1)*GROUP) (GROUP =
//     BLOCK x ITEMS, ITEMS consecutive tiles per thread), into group_flag[g] / group_value[g];
//   segment_carry_apply: block g folds the totals of groups [0, g) (BLOCK at a time), scans its group's
//     pairs and hands each tile j the pair entering it. HEADS (the reduction): tile j's head segment gets
//     op(entering, head_value[j]). Else (the deterministic scan): tile_value[j] becomes the entering
//     value, in place (a thread reads each of its pairs before it overwrites it, and no other reads them).
// With one group the first launch is skipped. seed: the value entering tile 0 (a Dask chunk's carry).
template <class Acc, class Op, int ITEMS>
__device__ __forceinline__ Seg<Acc> fold_tile_pairs(index_t j0, index_t tiles, const int* tile_flag,
                                                    const Acc* tile_value, Acc identity, Op op) {
  Seg<Acc> mine{0, identity};
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    if (j0 + k < tiles) mine = seg_combine(mine, Seg<Acc>{tile_flag[j0 + k], tile_value[j0 + k]}, op);
  }
  return mine;
}

template <class Acc, class Op, int BLOCK, int ITEMS>
__global__ void __launch_bounds__(BLOCK)
    segment_carry_totals(index_t tiles, const int* tile_flag, const Acc* tile_value, Acc identity, int* group_flag,
                         Acc* group_value) {
  __shared__ int scratch_f[BLOCK / kWarp];
  __shared__ Acc scratch_v[BLOCK / kWarp];
  Op op;
  const index_t j0 = ((index_t)blockIdx.x * BLOCK + threadIdx.x) * ITEMS;
  const Seg<Acc> mine = fold_tile_pairs<Acc, Op, ITEMS>(j0, tiles, tile_flag, tile_value, identity, op);
  Seg<Acc> total;
  block_segmented_exclusive_scan<BLOCK>(mine, op, identity, scratch_f, scratch_v, &total);
  if (threadIdx.x == 0) {
    group_flag[blockIdx.x] = total.flag;
    group_value[blockIdx.x] = total.value;
  }
}

template <class Acc, class Op, int BLOCK, int ITEMS, bool HEADS>
__global__ void __launch_bounds__(BLOCK)
    segment_carry_apply(index_t tiles, const int* tile_flag, Acc* tile_value, const index_t* head_seg,
                        const Acc* head_value, const int* group_flag, const Acc* group_value, Acc identity,
                        Acc seed, Acc* out) {
  __shared__ int scratch_f[BLOCK / kWarp];
  __shared__ Acc scratch_v[BLOCK / kWarp];
  Op op;
  Seg<Acc> entering{0, seed};  // the fold of the earlier groups (same in every thread)
  for (index_t base = 0; base < (index_t)blockIdx.x; base += BLOCK) {
    const index_t g = base + threadIdx.x;
    const Seg<Acc> pair = g < (index_t)blockIdx.x ? Seg<Acc>{group_flag[g], group_value[g]} : Seg<Acc>{0, identity};
    Seg<Acc> total;
    block_segmented_exclusive_scan<BLOCK>(pair, op, identity, scratch_f, scratch_v, &total);
    entering = seg_combine(entering, total, op);
  }
  const index_t j0 = ((index_t)blockIdx.x * BLOCK + threadIdx.x) * ITEMS;
  const Seg<Acc> mine = fold_tile_pairs<Acc, Op, ITEMS>(j0, tiles, tile_flag, tile_value, identity, op);
  Seg<Acc> total;
  const Seg<Acc> before = block_segmented_exclusive_scan<BLOCK>(mine, op, identity, scratch_f, scratch_v, &total);
  Seg<Acc> carry = seg_combine(entering, before, op);
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    if (j0 + k < tiles) {
      const Seg<Acc> pair{tile_flag[j0 + k], tile_value[j0 + k]};
      if constexpr (HEADS) {
        const index_t seg = head_seg[j0 + k];
        if (seg >= 0) out[seg] = op(carry.value, head_value[j0 + k]);
      } else {
        tile_value[j0 + k] = carry.value;
      }
      carry = seg_combine(carry, pair, op);
    }
  }
}

// ---- segmented inclusive scan: one pass, decoupled look-back -----------------------------------------
// out[i] = the fold of x[h..i], h the last head at or before i (a head: a start offset below n; repeats
// count once); elements before the first head continue the running value ``carry`` handed on by
// earlier Dask chunks (has_carry), else element 0 is a head. Balanced by elements as the reduction:
// block b scans the tile [b*TILE, (b+1)*TILE), thread t ITEMS consecutive elements (coalesced loads
// through WarpTransposeLoad; 16-byte stores where the tile is whole and aligned, STAGED: through shared
// memory, see pass 2), its heads a bit mask (ITEMS <= 32) built from the offsets tile_first
// (segment_tile_starts) gives the tile.
// The look-back is scan.cuh's over plain values, because a tile holding a head knows its inclusive
// prefix without looking back (the fold since its last head): it publishes PREFIX at once, so a chain
// of AGGREGATEs never crosses a head, and folding plain values from the nearest PREFIX is the
// segmented fold. A tile whose first element is a head does not look back at all; with 10^7 segments
// over 2^28 elements nearly every tile holds a head, so no tile waits on more than its neighbour. As
// in scan.cuh, which predecessors have published depends on timing, so float sums may differ in the
// last bits run to run (exact combines do not). Words must be zero before the launch.
// MODE 0 is that one pass. The same code also runs the deterministic three-pass form (reduce, then
// scan): MODE 1 only writes each tile's (any head?, fold since its last head) pair to tile_flag /
// tile_value; the carry pass (segment_carry_totals / _apply) turns those into the running value entering
// each tile, in place;
// MODE 2 rescans each tile from it. Every fold there has a fixed shape: the same bits on every run,
// for the price of reading the data twice.
// Four blocks of 256 per SM (64 registers): 128 KB of loads in flight per SM; ptxas left alone takes 70
// for float32 and fits three.
enum : int { kScanLookback = 0, kScanTotals = 1, kScanRescan = 2 };

template <class T, class Acc, class Out, class Op, int BLOCK, int ITEMS, bool STAGED, int MODE>
__global__ void __launch_bounds__(BLOCK, 1024 / BLOCK)
    segment_scan_tiles(const T* in, Out* out, index_t n, const index_t* offsets, const index_t* tile_first,
                       Acc identity, Acc carry, int has_carry, unsigned long long* words, int* tile_flag,
                       Acc* tile_value) {
  static_assert((ITEMS * sizeof(T)) % 16 == 0 && (ITEMS * sizeof(Out)) % 16 == 0,
                "a thread's items are whole 16-byte vectors in and out");
  static_assert(ITEMS <= 32, "a thread's heads fit one 32-bit mask");
  using Load = WarpTransposeLoad<T, ITEMS>;
  constexpr index_t kTile = (index_t)BLOCK * ITEMS;
  constexpr int kPerOut = 16 / sizeof(Out);
  // Staged stores (pass 2) need BLOCK x (ITEMS x sizeof(Out) + 16) bytes of static shared memory (at most
  // 48 KB): wider outputs go straight. They reuse the warp's load buffer, free again by then.
  constexpr bool kStage = STAGED && BLOCK * (ITEMS * sizeof(Out) + 16) <= 48 * 1024;
  constexpr int kRow = ITEMS + kPerOut;  // elements per lane's row in the store buffer
  constexpr int kStageBytes = kStage ? kWarp * kRow * (int)sizeof(Out) : 0;
  constexpr int kLoadBytes = Load::kSharedWords * 4;
  constexpr int kWarpBytes = (kStageBytes > kLoadBytes ? kStageBytes : kLoadBytes) + 15 & ~15;
  __shared__ int scratch_f[BLOCK / kWarp];
  __shared__ Acc scratch_v[BLOCK / kWarp];
  __shared__ Acc tile_exclusive;
  __shared__ __align__(16) unsigned char warp_space[BLOCK / kWarp][kWarpBytes];
  constexpr int kStaged = StagedOffsets<BLOCK, ITEMS>::kCount;
  __shared__ int staged[kStaged];
  Op op;
  const LookbackState<Acc> st{words};
  const index_t tile = blockIdx.x;
  const index_t tile_start = tile * kTile;
  const index_t a = tile_start + (index_t)threadIdx.x * ITEMS;  // this thread's first element
  const int valid = (int)(n - a <= 0 ? 0 : (n - a < ITEMS ? n - a : ITEMS));

  const bool whole = tile_start + kTile <= n;
  Load load;
  load.fetch(in, tile_start + (index_t)(threadIdx.x / kWarp) * kWarp * ITEMS, n);

  // my heads, while the loads are in flight
  ThreadHeads<BLOCK, kStaged> found;
  found.find(offsets, tile_first, tile_start, a, valid, staged);
  unsigned heads = found.mask;
  if (a == 0 && !has_carry && valid > 0) heads |= 1u;  // nothing runs into element 0
  load.transpose(reinterpret_cast<unsigned*>(warp_space[threadIdx.x / kWarp]));
  const auto& u = load.u;

  // pass 1: my (any head?, fold since my last head)
  Acc acc = identity;
  if (heads == 0 && valid == ITEMS) {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) acc = op(acc, load_as<Acc, Op>(u.e[k]));
  } else {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      if (k < valid) {
        const Acc x = load_as<Acc, Op>(u.e[k]);
        acc = (heads >> k) & 1u ? x : op(acc, x);
      }
    }
  }
  Seg<Acc> total;
  const Seg<Acc> before = block_segmented_exclusive_scan<BLOCK>(Seg<Acc>{heads != 0, acc}, op, identity,
                                                                scratch_f, scratch_v, &total);

  if constexpr (MODE == kScanTotals) {
    if (threadIdx.x == 0) {
      tile_flag[blockIdx.x] = total.flag;
      tile_value[blockIdx.x] = total.value;
    }
    return;
  }
  // the running value entering the tile
  if constexpr (MODE == kScanRescan) {
    if (threadIdx.x == 0) tile_exclusive = tile == 0 ? (has_carry ? carry : identity) : tile_value[tile];
  } else if (threadIdx.x < kWarp) {
    const bool open = (shfl_idx(heads, 0) & 1u) == 0;  // the tile's first element continues a segment
    const Acc seed = has_carry ? carry : identity;
    const bool later = tile + 1 < (index_t)gridDim.x;  // someone reads this tile's descriptor
    Acc before_tile = seed;
    if (tile > 0) {
      if (threadIdx.x == 0 && later) st.publish(tile, total.value, total.flag ? kStatusPrefix : kStatusAggregate);
      before_tile = open ? look_back(st, tile, 0, seed, identity, op) : identity;
    }
    if (threadIdx.x == 0) {
      if (!total.flag && later) st.publish(tile, op(before_tile, total.value), kStatusPrefix);
      if (tile == 0 && total.flag && later) st.publish(tile, total.value, kStatusPrefix);
      tile_exclusive = before_tile;
    }
  }
  __syncthreads();

  // pass 2: rescan my items from the value entering them (the carry itself for thread 0: no identity
  // folded in)
  Acc running = before.flag ? before.value : (threadIdx.x == 0 ? tile_exclusive : op(tile_exclusive, before.value));
  if (whole && reinterpret_cast<unsigned long long>(out) % 16 == 0) {
    // results leave in 16-byte vectors: straight from each thread (its ITEMS consecutive outputs, so a
    // warp's store touches 32 lines, each only in part) or, STAGED, through a per-warp shared buffer
    // read back so that a warp's store is 512 contiguous bytes; rows padded by one vector so the lanes
    // of a quarter-warp write distinct banks.
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    constexpr int kRowVectors = ITEMS / kPerOut;
    Out* stage = reinterpret_cast<Out*>(warp_space[warp]);
    uint4* dst = kStage ? reinterpret_cast<uint4*>(stage + lane * kRow) : reinterpret_cast<uint4*>(out + a);
#pragma unroll
    for (int q = 0; q < kRowVectors; ++q) {
      union {
        uint4 raw;
        Out e[kPerOut];
      } r;
#pragma unroll
      for (int e = 0; e < kPerOut; ++e) {
        const int k = q * kPerOut + e;
        const Acc x = load_as<Acc, Op>(u.e[k]);
        running = (heads >> k) & 1u ? x : op(running, x);
        r.e[e] = convert<Out>(running);
      }
      dst[q] = r.raw;
    }
    if constexpr (kStage) {
      __syncwarp();
      uint4* warp_out = reinterpret_cast<uint4*>(out + tile_start + (index_t)warp * kWarp * ITEMS);
#pragma unroll
      for (int q = 0; q < kRowVectors; ++q) {
        const int v = q * kWarp + lane;  // the warp's v-th output vector: row v / kRowVectors of the buffer
        warp_out[v] = reinterpret_cast<const uint4*>(stage + (v / kRowVectors) * kRow)[v % kRowVectors];
      }
    }
  } else {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      if (k < valid) {
        const Acc x = load_as<Acc, Op>(u.e[k]);
        running = (heads >> k) & 1u ? x : op(running, x);
        out[a + k] = convert<Out>(running);
      }
    }
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
