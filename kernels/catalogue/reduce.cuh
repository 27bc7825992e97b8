// multireduce: the catalogue of reduction kernels (compiled only when ``algorithm=`` names one).
//
// The seeds' ladder, each rung one idea. Kernels named ``*_partials`` write one partial per block; the
// host launches the same kernel again over the partials until one value is left; ``reduce_last_block``
// and ``reduce_ordered_single_block`` finish in one launch. BLOCK, the threads per block, comes from
// tuning.Policy.catalogue_block through the template arguments.
#pragma once
#include "../block.cuh"

namespace mr {

template <class T, class Acc>
__device__ __forceinline__ Acc load_or(const T* in, index_t i, index_t n, Acc identity) {
  return i < n ? convert<Acc>(in[i]) : identity;
}

// What a thread brings to its block's tree: one element (rungs 1-3), two (first add during load: each
// block covers 2*blockDim elements, halving the blocks), or a grid-stride fold of many.
template <class T, class Acc>
__device__ __forceinline__ Acc load_one(const T* in, index_t n, Acc identity) {
  return load_or(in, (index_t)blockIdx.x * blockDim.x + threadIdx.x, n, identity);
}

template <class T, class Acc, class Op>
__device__ __forceinline__ Acc load_two(const T* in, index_t n, Acc identity, Op op) {
  index_t i = (index_t)blockIdx.x * blockDim.x * 2 + threadIdx.x;
  return op(load_or(in, i, n, identity), load_or(in, i + blockDim.x, n, identity));
}

template <class T, class Acc, class Op>
__device__ __forceinline__ Acc load_grid_stride(const T* in, index_t n, Acc identity, Op op) {
  Acc v = identity;
  const index_t stride = (index_t)gridDim.x * blockDim.x;
  for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) v = op(v, convert<Acc>(in[i]));
  return v;
}

// The frame of the shared-memory rungs: every thread's value into shared memory, the rung's tree over
// the block (its result valid in thread 0), and thread 0 writes the block's partial. A rung is what it
// loads and which tree it walks.
template <int BLOCK, class Acc, class Op, class Tree>
__device__ __forceinline__ void shared_tree_partial(Acc v, Op op, Tree tree, Acc* partials) {
  __shared__ Acc s[BLOCK];
  s[threadIdx.x] = v;
  __syncthreads();
  v = tree(s, threadIdx.x, op);
  if (threadIdx.x == 0) partials[blockIdx.x] = v;
}

// Sequential addressing: the active half reads the other half; conflict-free, commutative only.
template <class Acc, class Op>
__device__ __forceinline__ void shared_interleaved(Acc* s, unsigned t, unsigned down_to, Op op) {
  for (unsigned half = blockDim.x / 2; half > down_to; half >>= 1) {
    if (t < half) s[t] = op(s[t], s[t + half]);
    __syncthreads();
  }
}

// The last 64 -> 1 steps inside warp 0: no block barrier, __syncwarp between steps (the seeds'
// "volatile" trick is not enough since Volta's independent thread scheduling).
template <class Acc, class Op>
__device__ __forceinline__ Acc last_warp(Acc* s, unsigned t, Op op) {
  Acc v = op(s[t], s[t + 32]);
#pragma unroll
  for (unsigned half = 16; half > 0; half >>= 1) {
    __syncwarp();
    s[t] = v;
    __syncwarp();
    v = op(v, s[t + half]);
  }
  return v;
}

// ---- the trees ------------------------------------------------------------------------------------
// Neighbored pairs: thread t works when t % (2*stride) == 0, so most of each warp idles (divergence).
// Pairs are neighbours, so order is kept.
struct NeighboredTree {
  template <class Acc, class Op>
  __device__ __forceinline__ Acc operator()(Acc* s, unsigned t, Op op) const {
    for (unsigned stride = 1; stride < blockDim.x; stride *= 2) {
      if (t % (2 * stride) == 0) s[t] = op(s[t], s[t + stride]);
      __syncthreads();
    }
    return s[0];
  }
};

// Neighbored pairs with compact thread indices: threads 0..k work on slots 2*stride*t, so whole warps
// retire, but the strided slots collide in shared-memory banks. Order is kept.
struct NeighboredCompactTree {
  template <class Acc, class Op>
  __device__ __forceinline__ Acc operator()(Acc* s, unsigned t, Op op) const {
    for (unsigned stride = 1; stride < blockDim.x; stride *= 2) {
      const unsigned slot = 2 * stride * t;
      if (slot < blockDim.x) s[slot] = op(s[slot], s[slot + stride]);
      __syncthreads();
    }
    return s[0];
  }
};

// Interleaved pairs down to one value (sequential addressing all the way).
struct InterleavedTree {
  template <class Acc, class Op>
  __device__ __forceinline__ Acc operator()(Acc* s, unsigned t, Op op) const {
    shared_interleaved(s, t, 0, op);
    return s[0];
  }
};

// Interleaved pairs down to 64 values, then warp 0 alone (``last_warp``).
struct InterleavedLastWarpTree {
  template <class Acc, class Op>
  __device__ __forceinline__ Acc operator()(Acc* s, unsigned t, Op op) const {
    shared_interleaved(s, t, 32, op);
    return t < 32 ? last_warp(s, t, op) : s[t];
  }
};

// Complete unrolling: BLOCK is a compile-time constant, so every level and its test unroll.
template <int BLOCK>
struct CompleteUnrollTree {
  static_assert(BLOCK >= 64 && BLOCK <= 1024 && (BLOCK & (BLOCK - 1)) == 0, "BLOCK is a power of two, 64..1024");
  template <class Acc, class Op>
  __device__ __forceinline__ Acc operator()(Acc* s, unsigned t, Op op) const {
    if (BLOCK >= 1024) { if (t < 512) s[t] = op(s[t], s[t + 512]); __syncthreads(); }
    if (BLOCK >= 512) { if (t < 256) s[t] = op(s[t], s[t + 256]); __syncthreads(); }
    if (BLOCK >= 256) { if (t < 128) s[t] = op(s[t], s[t + 128]); __syncthreads(); }
    if (BLOCK >= 128) { if (t < 64) s[t] = op(s[t], s[t + 64]); __syncthreads(); }
    return t < 32 ? last_warp(s, t, op) : s[t];
  }
};

// ---- the rungs ------------------------------------------------------------------------------------
// 1. Neighbored pairs.
template <class T, class Acc, class Op, int BLOCK>
__global__ void reduce_neighbored_partials(const T* in, index_t n, Acc identity, Acc* partials) {
  shared_tree_partial<BLOCK>(load_one(in, n, identity), Op(), NeighboredTree(), partials);
}

// 2. Neighbored pairs, compact thread indices.
template <class T, class Acc, class Op, int BLOCK>
__global__ void reduce_neighbored_compact_partials(const T* in, index_t n, Acc identity, Acc* partials) {
  shared_tree_partial<BLOCK>(load_one(in, n, identity), Op(), NeighboredCompactTree(), partials);
}

// 3. Interleaved pairs.
template <class T, class Acc, class Op, int BLOCK>
__global__ void reduce_interleaved_partials(const T* in, index_t n, Acc identity, Acc* partials) {
  shared_tree_partial<BLOCK>(load_one(in, n, identity), Op(), InterleavedTree(), partials);
}

// 4. First add during load.
template <class T, class Acc, class Op, int BLOCK>
__global__ void reduce_first_add_partials(const T* in, index_t n, Acc identity, Acc* partials) {
  shared_tree_partial<BLOCK>(load_two(in, n, identity, Op()), Op(), InterleavedTree(), partials);
}

// 5. Unrolled last warp.
template <class T, class Acc, class Op, int BLOCK>
__global__ void reduce_unroll_last_warp_partials(const T* in, index_t n, Acc identity, Acc* partials) {
  shared_tree_partial<BLOCK>(load_two(in, n, identity, Op()), Op(), InterleavedLastWarpTree(), partials);
}

// 6. Complete unrolling.
template <class T, class Acc, class Op, int BLOCK>
__global__ void __launch_bounds__(BLOCK) reduce_complete_unroll_partials(const T* in, index_t n, Acc identity,
                                                                         Acc* partials) {
  shared_tree_partial<BLOCK>(load_two(in, n, identity, Op()), Op(), CompleteUnrollTree<BLOCK>(), partials);
}

// 7. Many elements per thread: a fixed grid strides over the input, then the shared-memory tree.
template <class T, class Acc, class Op, int BLOCK>
__global__ void reduce_grid_stride_partials(const T* in, index_t n, Acc identity, Acc* partials) {
  shared_tree_partial<BLOCK>(load_grid_stride(in, n, identity, Op()), Op(), InterleavedLastWarpTree(), partials);
}

// 8. Warp shuffles: registers instead of shared memory for all but one value per warp.
template <class T, class Acc, class Op, int BLOCK>
__global__ void reduce_warp_shuffle_partials(const T* in, index_t n, Acc identity, Acc* partials) {
  __shared__ Acc scratch[kWarp];
  Op op;
  Acc v = block_reduce<BLOCK>(load_grid_stride(in, n, identity, op), op, identity, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = v;
}

// 9. One launch for all blocks: the last block to finish reduces the partials (fence + counter).
template <class T, class Acc, class Op, int BLOCK>
__global__ void reduce_last_block(const T* in, index_t n, Acc identity, Acc* partials, Acc* out,
                                  unsigned int* counter) {
  __shared__ Acc scratch[kWarp];
  __shared__ unsigned int is_last;
  Op op;
  Acc v = block_reduce<BLOCK>(load_grid_stride(in, n, identity, op), op, identity, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = v;
  if (!arrive_last(counter, &is_last)) return;
  v = identity;
  for (unsigned j = threadIdx.x; j < gridDim.x; j += blockDim.x) v = op(v, load_volatile(partials + j));
  v = block_reduce<BLOCK>(v, op, identity, scratch);
  if (threadIdx.x == 0) *out = v;
}

// 11. Order-preserving, one block: the whole input folded tile by tile, in order.
template <class T, class Acc, class Op, int BLOCK, int ITEMS>
__global__ void __launch_bounds__(BLOCK) reduce_ordered_single_block(const T* in, index_t n, Acc identity, Acc* out) {
  __shared__ Acc tile[BLOCK * ITEMS];
  __shared__ Acc scratch[kWarp];
  Acc v = block_fold_ordered<BLOCK, ITEMS>(in, 0, n, identity, Op(), tile, scratch);
  if (threadIdx.x == 0) *out = v;
}

}  // namespace mr
