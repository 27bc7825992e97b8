// multireduce: warp- and block-level reductions and scans.
//
// Two families: "commutative" ones may combine any lanes in any order (butterflies); "ordered" ones
// only ever combine a contiguous earlier range on the left with the next range on the right, so they
// are exact for non-commutative operators. Every block function must be called by all threads.
#pragma once
#include "common.cuh"

namespace mr {

// ---- warp level ---------------------------------------------------------------------------------
template <class Acc, class Op>
__device__ __forceinline__ Acc warp_reduce(Acc v, Op op) {  // every lane gets the result
#pragma unroll
  for (int mask = kWarp / 2; mask > 0; mask >>= 1) v = op(v, shfl_xor(v, mask));
  return v;
}

// Lane 0 gets v[0] op v[1] op ... op v[31]: at each step lane l folds [l, l+2o) from two halves in order.
template <class Acc, class Op>
__device__ __forceinline__ Acc warp_reduce_ordered(Acc v, Op op) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int offset = 1; offset < kWarp; offset <<= 1) {
    Acc right = shfl_down(v, offset);
    if (lane + offset < kWarp) v = op(v, right);
  }
  return v;
}

// Inclusive scan across the warp (Hillis-Steele with shuffles); order is kept.
template <class Acc, class Op>
__device__ __forceinline__ Acc warp_inclusive_scan(Acc v, Op op) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int offset = 1; offset < kWarp; offset <<= 1) {
    Acc left = shfl_up(v, offset);
    if (lane >= offset) v = op(left, v);
  }
  return v;
}

// ---- block level --------------------------------------------------------------------------------
// Result valid in thread 0. ``scratch`` holds kWarp values in shared memory. ORDERED folds warps and
// lanes in order (any associative operator); otherwise butterflies (commutative operators).
template <int BLOCK, bool ORDERED, class Acc, class Op>
__device__ __forceinline__ Acc block_fold(Acc v, Op op, Acc identity, Acc* scratch) {
  constexpr int kWarps = BLOCK / kWarp;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  auto warp_fold = [op](Acc x) { return ORDERED ? warp_reduce_ordered(x, op) : warp_reduce(x, op); };
  v = warp_fold(v);
  if (kWarps == 1) return v;
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) v = warp_fold(lane < kWarps ? scratch[lane] : identity);
  return v;
}

template <int BLOCK, class Acc, class Op>
__device__ __forceinline__ Acc block_reduce(Acc v, Op op, Acc identity, Acc* scratch) {
  return block_fold<BLOCK, false>(v, op, identity, scratch);
}

template <int BLOCK, class Acc, class Op>
__device__ __forceinline__ Acc block_reduce_ordered(Acc v, Op op, Acc identity, Acc* scratch) {
  return block_fold<BLOCK, true>(v, op, identity, scratch);
}

// Exclusive scan across the block of N values per thread, in the order part 0 of every thread, then
// part 1 of every thread, ... (N = 1: one value per thread; more: a tile spread over threads in N
// layers). ``v[p]`` becomes the fold of every element before thread t's part p; ``*total`` the fold of
// all (every thread). ``scratch`` holds N * BLOCK / 32 values, free on entry.
template <int BLOCK, int N, class Acc, class Op>
__device__ __forceinline__ void block_exclusive_scan_parts(Acc (&v)[N], Op op, Acc identity, Acc* scratch,
                                                           Acc* total) {
  constexpr int kWarps = BLOCK / kWarp;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
#pragma unroll
  for (int p = 0; p < N; ++p) {
    const Acc inclusive = warp_inclusive_scan(v[p], op);
    if (lane == kWarp - 1) scratch[p * kWarps + warp] = inclusive;
    v[p] = shfl_up(inclusive, 1);
  }
  __syncthreads();
  Acc before_part = identity;  // the fold of the parts before p
#pragma unroll
  for (int p = 0; p < N; ++p) {
    Acc before_warp = identity, part = identity;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const Acc x = scratch[p * kWarps + w];
      if (w < warp) before_warp = op(before_warp, x);
      part = op(part, x);
    }
    const Acc before_thread = op(before_part, before_warp);
    v[p] = lane == 0 ? before_thread : op(before_thread, v[p]);
    before_part = op(before_part, part);
  }
  *total = before_part;
}

// ---- the last-block guard (one launch for all blocks) ---------------------------------------------
// Every block calls this after writing its partial; true in exactly one block, the last to arrive,
// which then sees every partial. The counter is left at zero for the next launch on the stream.
__device__ __forceinline__ bool arrive_last(unsigned int* counter, unsigned int* flag_shared) {
  __threadfence();  // publish this block's partial before counting it
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned int ticket = atomicAdd(counter, 1u);
    *flag_shared = (ticket == gridDim.x - 1);
    if (*flag_shared) *counter = 0u;
  }
  __syncthreads();
  if (*flag_shared) __threadfence();  // order the partial loads after the ticket
  return *flag_shared != 0u;
}

// ---- ordered fold of a range with coalesced loads ---------------------------------------------------
// Tiles of BLOCK*ITEMS elements are loaded coalesced into shared memory, each thread folds ITEMS
// consecutive elements, the block folds the threads in order. Result valid in thread 0. LOAD: ``in`` is
// input (read through load_as); false for partial results, which are folded as they are.
template <int BLOCK, int ITEMS, bool LOAD = true, class T, class Acc, class Op>
__device__ Acc block_fold_ordered(const T* in, index_t begin, index_t end, Acc identity, Op op, Acc* tile,
                                  Acc* scratch) {
  constexpr int kTile = BLOCK * ITEMS;
  Acc running = identity;
  for (index_t base = begin; base < end; base += kTile) {
    __syncthreads();  // the previous tile has been read
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      index_t i = base + k * BLOCK + threadIdx.x;
      Acc v = identity;
      if (i < end) {
        if constexpr (LOAD) {
          v = load_as<Acc, Op>(in[i]);
        } else {
          v = convert<Acc>(in[i]);
        }
      }
      tile[k * BLOCK + threadIdx.x] = v;
    }
    __syncthreads();
    Acc v = tile[threadIdx.x * ITEMS];
#pragma unroll
    for (int k = 1; k < ITEMS; ++k) v = op(v, tile[threadIdx.x * ITEMS + k]);
    v = block_reduce_ordered<BLOCK>(v, op, identity, scratch);
    if (threadIdx.x == 0) running = op(running, v);
  }
  return running;
}

}  // namespace mr
