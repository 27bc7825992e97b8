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

// The first rungs' prologue: one element per thread into shared memory (identity past the end).
template <class T, class Acc>
__device__ __forceinline__ void load_one_per_thread(Acc* s, const T* in, index_t n, Acc identity) {
  s[threadIdx.x] = load_or(in, (index_t)blockIdx.x * blockDim.x + threadIdx.x, n, identity);
  __syncthreads();
}

// 1. Neighbored pairs: thread t works when t % (2*stride) == 0, so most of each warp idles (divergence).
//    Pairs are neighbours, so order is kept.
template <class T, class Acc, class Op, int BLOCK>
__global__ void reduce_neighbored_partials(const T* in, index_t n, Acc identity, Acc* partials) {
  __shared__ Acc s[BLOCK];
  Op op;
  const unsigned t = threadIdx.x;
  load_one_per_thread(s, in, n, identity);
  for (unsigned stride = 1; stride < blockDim.x; stride *= 2) {
    if (t % (2 * stride) == 0) s[t] = op(s[t], s[t + stride]);
    __syncthreads();
  }
  if (t == 0) partials[blockIdx.x] = s[0];
}

// 2. Neighbored pairs with compact thread indices: threads 0..k work on slots 2*stride*t, so whole
//    warps retire, but the strided slots collide in shared-memory banks. Order is kept.
template <class T, class Acc, class Op, int BLOCK>
__global__ void reduce_neighbored_compact_partials(const T* in, index_t n, Acc identity, Acc* partials) {
  __shared__ Acc s[BLOCK];
  Op op;
  const unsigned t = threadIdx.x;
  load_one_per_thread(s, in, n, identity);
  for (unsigned stride = 1; stride < blockDim.x; stride *= 2) {
    unsigned slot = 2 * stride * t;
    if (slot < blockDim.x) s[slot] = op(s[slot], s[slot + stride]);
    __syncthreads();
  }
  if (t == 0) partials[blockIdx.x] = s[0];
}

// Sequential addressing: the active half reads the other half; conflict-free, commutative only.
template <class Acc, class Op>
__device__ __forceinline__ void shared_interleaved(Acc* s, unsigned t, unsigned down_to, Op op) {
  for (unsigned half = blockDim.x / 2; half > down_to; half >>= 1) {
    if (t < half) s[t] = op(s[t], s[t + half]);
    __syncthreads();
  }
}

// 3. Interleaved pairs.
template <class T, class Acc, class Op, int BLOCK>
__global__ void reduce_interleaved_partials(const T* in, index_t n, Acc identity, Acc* partials) {
  __shared__ Acc s[BLOCK];
  Op op;
  const unsigned t = threadIdx.x;
  load_one_per_thread(s, in, n, identity);
  shared_interleaved(s, t, 0, op);
  if (t == 0) partials[blockIdx.x] = s[0];
}

// 4. First add during load: each block covers 2*blockDim elements, halving the blocks.
template <class T, class Acc, class Op>
__device__ __forceinline__ Acc load_two(const T* in, index_t n, Acc identity, Op op) {
  index_t i = (index_t)blockIdx.x * blockDim.x * 2 + threadIdx.x;
  return op(load_or(in, i, n, identity), load_or(in, i + blockDim.x, n, identity));
}

template <class T, class Acc, class Op, int BLOCK>
__global__ void reduce_first_add_partials(const T* in, index_t n, Acc identity, Acc* partials) {
  __shared__ Acc s[BLOCK];
  Op op;
  const unsigned t = threadIdx.x;
  s[t] = load_two(in, n, identity, op);
  __syncthreads();
  shared_interleaved(s, t, 0, op);
  if (t == 0) partials[blockIdx.x] = s[0];
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

// 5. Unrolled last warp.
template <class T, class Acc, class Op, int BLOCK>
__global__ void reduce_unroll_last_warp_partials(const T* in, index_t n, Acc identity, Acc* partials) {
  __shared__ Acc s[BLOCK];
  Op op;
  const unsigned t = threadIdx.x;
  s[t] = load_two(in, n, identity, op);
  __syncthreads();
  shared_interleaved(s, t, 32, op);
  if (t < 32) {
    Acc v = last_warp(s, t, op);
    if (t == 0) partials[blockIdx.x] = v;
  }
}

// 6. Complete unrolling: BLOCK is a compile-time constant, so every level and its test unroll.
template <class T, class Acc, class Op, int BLOCK>
__global__ void __launch_bounds__(BLOCK) reduce_complete_unroll_partials(const T* in, index_t n, Acc identity,
                                                                         Acc* partials) {
  static_assert(BLOCK >= 64 && BLOCK <= 1024 && (BLOCK & (BLOCK - 1)) == 0, "BLOCK is a power of two, 64..1024");
  __shared__ Acc s[BLOCK];
  Op op;
  const unsigned t = threadIdx.x;
  index_t i = (index_t)blockIdx.x * BLOCK * 2 + t;
  s[t] = op(load_or(in, i, n, identity), load_or(in, i + BLOCK, n, identity));
  __syncthreads();
  if (BLOCK >= 1024) { if (t < 512) s[t] = op(s[t], s[t + 512]); __syncthreads(); }
  if (BLOCK >= 512) { if (t < 256) s[t] = op(s[t], s[t + 256]); __syncthreads(); }
  if (BLOCK >= 256) { if (t < 128) s[t] = op(s[t], s[t + 128]); __syncthreads(); }
  if (BLOCK >= 128) { if (t < 64) s[t] = op(s[t], s[t + 64]); __syncthreads(); }
  if (t < 32) {
    Acc v = last_warp(s, t, op);
    if (t == 0) partials[blockIdx.x] = v;
  }
}

// 7. Many elements per thread: a fixed grid strides over the input, then the shared-memory tree.
template <class T, class Acc, class Op, int BLOCK>
__global__ void reduce_grid_stride_partials(const T* in, index_t n, Acc identity, Acc* partials) {
  __shared__ Acc s[BLOCK];
  Op op;
  const unsigned t = threadIdx.x;
  Acc v = identity;
  const index_t stride = (index_t)gridDim.x * blockDim.x;
  for (index_t i = (index_t)blockIdx.x * blockDim.x + t; i < n; i += stride) v = op(v, convert<Acc>(in[i]));
  s[t] = v;
  __syncthreads();
  shared_interleaved(s, t, 32, op);
  if (t < 32) {
    v = last_warp(s, t, op);
    if (t == 0) partials[blockIdx.x] = v;
  }
}

// 8. Warp shuffles: registers instead of shared memory for all but one value per warp.
template <class T, class Acc, class Op, int BLOCK>
__global__ void reduce_warp_shuffle_partials(const T* in, index_t n, Acc identity, Acc* partials) {
  __shared__ Acc scratch[kWarp];
  Op op;
  Acc v = identity;
  const index_t stride = (index_t)gridDim.x * blockDim.x;
  for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) v = op(v, convert<Acc>(in[i]));
  v = block_reduce<BLOCK>(v, op, identity, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = v;
}

// 9. One launch for all blocks: the last block to finish reduces the partials (fence + counter).
template <class T, class Acc, class Op, int BLOCK>
__global__ void reduce_last_block(const T* in, index_t n, Acc identity, Acc* partials, Acc* out,
                                  unsigned int* counter) {
  __shared__ Acc scratch[kWarp];
  __shared__ unsigned int is_last;
  Op op;
  Acc v = identity;
  const index_t stride = (index_t)gridDim.x * blockDim.x;
  for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) v = op(v, convert<Acc>(in[i]));
  v = block_reduce<BLOCK>(v, op, identity, scratch);
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
