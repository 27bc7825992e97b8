// multireduce: reduction kernels.
//
// The catalogue follows the seeds' ladder, each rung one idea. Kernels named ``*_partials`` write one
// partial per block; the host launches the same kernel again over the partials until one value is
// left. The rest finish in one launch with the last-block guard. All are templated on the element
// type T, the accumulator type Acc (elements are converted on load) and the operator Op; every index
// is 64-bit. The production kernels are ``reduce_vectorized`` (commutative), ``reduce_ordered_multi_block``
// (any associative operator), ``reduce_rows`` and ``reduce_columns`` (one axis of an N-d array).
#pragma once
#include "block.cuh"

namespace mr {

constexpr int kCatalogueBlock = 256;

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
template <class T, class Acc, class Op>
__global__ void reduce_neighbored_partials(const T* in, index_t n, Acc identity, Acc* partials) {
  __shared__ Acc s[kCatalogueBlock];
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
template <class T, class Acc, class Op>
__global__ void reduce_neighbored_compact_partials(const T* in, index_t n, Acc identity, Acc* partials) {
  __shared__ Acc s[kCatalogueBlock];
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
template <class T, class Acc, class Op>
__global__ void reduce_interleaved_partials(const T* in, index_t n, Acc identity, Acc* partials) {
  __shared__ Acc s[kCatalogueBlock];
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

template <class T, class Acc, class Op>
__global__ void reduce_first_add_partials(const T* in, index_t n, Acc identity, Acc* partials) {
  __shared__ Acc s[kCatalogueBlock];
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
template <class T, class Acc, class Op>
__global__ void reduce_unroll_last_warp_partials(const T* in, index_t n, Acc identity, Acc* partials) {
  __shared__ Acc s[kCatalogueBlock];
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
template <class T, class Acc, class Op>
__global__ void reduce_grid_stride_partials(const T* in, index_t n, Acc identity, Acc* partials) {
  __shared__ Acc s[kCatalogueBlock];
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
template <class T, class Acc, class Op>
__global__ void reduce_warp_shuffle_partials(const T* in, index_t n, Acc identity, Acc* partials) {
  __shared__ Acc scratch[kWarp];
  Op op;
  Acc v = identity;
  const index_t stride = (index_t)gridDim.x * blockDim.x;
  for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) v = op(v, convert<Acc>(in[i]));
  v = block_reduce<kCatalogueBlock>(v, op, identity, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = v;
}

// 9. One launch for all blocks: the last block to finish reduces the partials (fence + counter).
template <class T, class Acc, class Op>
__global__ void reduce_last_block(const T* in, index_t n, Acc identity, Acc* partials, Acc* out,
                                  unsigned int* counter) {
  __shared__ Acc scratch[kWarp];
  __shared__ unsigned int is_last;
  Op op;
  Acc v = identity;
  const index_t stride = (index_t)gridDim.x * blockDim.x;
  for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) v = op(v, convert<Acc>(in[i]));
  v = block_reduce<kCatalogueBlock>(v, op, identity, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = v;
  if (!arrive_last(counter, &is_last)) return;
  v = identity;
  for (unsigned j = threadIdx.x; j < gridDim.x; j += blockDim.x) v = op(v, load_volatile(partials + j));
  v = block_reduce<kCatalogueBlock>(v, op, identity, scratch);
  if (threadIdx.x == 0) *out = v;
}

// 10. Production, commutative: 16-byte vector loads (the OpenCL seed's uint4), four in flight per
//     thread, grid-stride, warp shuffles, last-block guard. With one block it needs no partials.
template <class T, class Acc, class Op>
__device__ __forceinline__ Acc fold_vector(Acc v, const uint4& raw, Op op) {
  constexpr int kPer = 16 / sizeof(T);
  union {
    uint4 raw;
    T e[kPer];
  } u;
  u.raw = raw;
#pragma unroll
  for (int k = 0; k < kPer; ++k) v = op(v, convert<Acc>(u.e[k]));
  return v;
}

template <class T, class Acc, class Op, int BLOCK>
__global__ void __launch_bounds__(BLOCK) reduce_vectorized(const T* in, index_t n, Acc identity, Acc* partials,
                                                           Acc* out, unsigned int* counter) {
  static_assert(16 % sizeof(T) == 0, "element size divides 16");
  constexpr int kPer = 16 / sizeof(T);
  __shared__ Acc scratch[kWarp];
  __shared__ unsigned int is_last;
  Op op;
  const index_t tid = (index_t)blockIdx.x * BLOCK + threadIdx.x;
  const index_t stride = (index_t)gridDim.x * BLOCK;
  // elements before the first 16-byte boundary, then whole vectors, then the tail
  const unsigned long long misalign = reinterpret_cast<unsigned long long>(in) % 16;
  index_t head = misalign ? (index_t)((16 - misalign) / sizeof(T)) : 0;
  if (head > n) head = n;
  const index_t vectors = (n - head) / kPer;
  const uint4* vin = reinterpret_cast<const uint4*>(in + head);

  Acc a0 = identity, a1 = identity;  // two chains: more independent work per thread
  if (tid < head) a0 = convert<Acc>(in[tid]);
  index_t i = tid;
  for (; i + 3 * stride < vectors; i += 4 * stride) {
    uint4 r0 = __ldg(vin + i), r1 = __ldg(vin + i + stride);
    uint4 r2 = __ldg(vin + i + 2 * stride), r3 = __ldg(vin + i + 3 * stride);
    a0 = fold_vector<T>(a0, r0, op);
    a1 = fold_vector<T>(a1, r1, op);
    a0 = fold_vector<T>(a0, r2, op);
    a1 = fold_vector<T>(a1, r3, op);
  }
  for (; i < vectors; i += stride) a0 = fold_vector<T>(a0, __ldg(vin + i), op);
  for (index_t j = head + vectors * kPer + tid; j < n; j += stride) a1 = op(a1, convert<Acc>(in[j]));
  Acc v = block_reduce<BLOCK>(op(a0, a1), op, identity, scratch);
  if (gridDim.x == 1) {
    if (threadIdx.x == 0) *out = v;
    return;
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = v;
  if (!arrive_last(counter, &is_last)) return;
  v = identity;
  for (unsigned j = threadIdx.x; j < gridDim.x; j += BLOCK) v = op(v, load_volatile(partials + j));
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

// 12. Order-preserving, many blocks: block b folds the b-th contiguous segment; the last block folds
//     the partials in block order. Production kernel for non-commutative operators.
template <class T, class Acc, class Op, int BLOCK, int ITEMS>
__global__ void __launch_bounds__(BLOCK) reduce_ordered_multi_block(const T* in, index_t n, index_t segment,
                                                                    Acc identity, Acc* partials, Acc* out,
                                                                    unsigned int* counter) {
  __shared__ Acc tile[BLOCK * ITEMS];
  __shared__ Acc scratch[kWarp];
  __shared__ unsigned int is_last;
  Op op;
  index_t begin = (index_t)blockIdx.x * segment;
  index_t end = begin + segment < n ? begin + segment : n;
  Acc v = block_fold_ordered<BLOCK, ITEMS>(in, begin, end, identity, op, tile, scratch);
  if (gridDim.x == 1) {
    if (threadIdx.x == 0) *out = v;
    return;
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = v;
  if (!arrive_last(counter, &is_last)) return;
  // partials are read through L2 only: plain cached loads could see stale lines
  v = block_fold_ordered<BLOCK, ITEMS>(static_cast<const volatile Acc*>(partials), 0, (index_t)gridDim.x,
                                       identity, op, tile, scratch);
  if (threadIdx.x == 0) *out = v;
}

// ---- one axis of an N-d array, viewed as (outer, K, inner) in C order ----------------------------
// inner == 1: one block per row (grid-stride over rows). ORDERED folds each row in order.
template <class T, class Acc, class Op, int BLOCK, int ITEMS, bool ORDERED>
__global__ void __launch_bounds__(BLOCK) reduce_rows(const T* in, index_t rows, index_t K, Acc identity, Acc* out) {
  __shared__ Acc tile[ORDERED ? BLOCK * ITEMS : 1];
  __shared__ Acc scratch[kWarp];
  Op op;
  for (index_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* r = in + row * K;
    Acc v;
    if constexpr (ORDERED) {
      v = block_fold_ordered<BLOCK, ITEMS>(r, 0, K, identity, op, tile, scratch);
    } else {
      v = identity;
      for (index_t k = threadIdx.x; k < K; k += BLOCK) v = op(v, convert<Acc>(r[k]));
      v = block_reduce<BLOCK>(v, op, identity, scratch);
    }
    if (threadIdx.x == 0) out[row] = v;
    __syncthreads();
  }
}

// inner > 1: one thread per (outer, segment, inner) folds its K-segment in order; consecutive threads
// read consecutive addresses. With segments > 1 the host folds the (outer, segments, inner) partials
// again, which keeps order and gives enough threads when outer * inner is small.
template <class T, class Acc, class Op>
__global__ void reduce_columns(const T* in, index_t outer, index_t K, index_t inner, index_t segments,
                               index_t segment, Acc identity, Acc* out) {
  Op op;
  const index_t total = outer * segments * inner;
  for (index_t id = (index_t)blockIdx.x * blockDim.x + threadIdx.x; id < total;
       id += (index_t)gridDim.x * blockDim.x) {
    index_t i = id % inner;
    index_t s = (id / inner) % segments;
    index_t o = id / (inner * segments);
    index_t k0 = s * segment, k1 = k0 + segment < K ? k0 + segment : K;
    const T* p = in + (o * K) * inner + i;
    Acc v = identity;
    for (index_t k = k0; k < k1; ++k) v = op(v, convert<Acc>(p[k * inner]));
    out[id] = v;
  }
}

}  // namespace mr
