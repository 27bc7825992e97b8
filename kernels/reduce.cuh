// multireduce: the production reduction kernels, the ones algorithm="auto" launches (the seeds' ladder is
// in catalogue/reduce.cuh). All are templated on the element type T, the accumulator type Acc (elements
// are converted on load, and pass through Op::load where the operator has one: kernels/common.cuh) and
// the operator Op; every index is 64-bit: ``reduce_vectorized`` (commutative),
// ``reduce_ordered_multi_block`` (any associative operator), ``reduce_rows`` and ``reduce_columns`` (one
// axis of an N-d array).
#pragma once
#include "block.cuh"

namespace mr {

// Commutative: 16-byte vector loads (the OpenCL seed's uint4), VECTORS in flight per thread, grid-stride,
// warp shuffles, last-block guard. With one block it needs no partials.
template <class T, class Acc, class Op>
__device__ __forceinline__ Acc fold_vector(Acc v, const uint4& raw, Op op) {
  constexpr int kPer = 16 / sizeof(T);
  union {
    uint4 raw;
    T e[kPer];
  } u;
  u.raw = raw;
#pragma unroll
  for (int k = 0; k < kPer; ++k) v = op(v, load_as<Acc, Op>(u.e[k]));
  return v;
}

// VECTORS (tuning.Policy.reduce_vectors_per_thread): 16-byte loads each thread has in flight per pass.
template <class T, class Acc, class Op, int BLOCK, int VECTORS>
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
  if (tid < head) a0 = load_as<Acc, Op>(in[tid]);
  index_t i = tid;
  static_assert(VECTORS >= 1, "at least one vector per pass");
  for (; i + (VECTORS - 1) * stride < vectors; i += VECTORS * stride) {
    uint4 r[VECTORS];  // every load issued before the first fold waits on one
#pragma unroll
    for (int k = 0; k < VECTORS; ++k) r[k] = __ldg(vin + i + k * stride);
#pragma unroll
    for (int k = 0; k < VECTORS; ++k) {
      if (k % 2 == 0) a0 = fold_vector<T>(a0, r[k], op);
      else a1 = fold_vector<T>(a1, r[k], op);
    }
  }
  for (; i < vectors; i += stride) a0 = fold_vector<T>(a0, __ldg(vin + i), op);
  for (index_t j = head + vectors * kPer + tid; j < n; j += stride) a1 = op(a1, load_as<Acc, Op>(in[j]));
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

// Order-preserving, many blocks: block b folds the b-th contiguous segment; the last block folds
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
  v = block_fold_ordered<BLOCK, ITEMS, false>(static_cast<const volatile Acc*>(partials), 0, (index_t)gridDim.x,
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
      for (index_t k = threadIdx.x; k < K; k += BLOCK) v = op(v, load_as<Acc, Op>(r[k]));
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
    for (index_t k = k0; k < k1; ++k) v = op(v, load_as<Acc, Op>(p[k * inner]));
    out[id] = v;
  }
}

}  // namespace mr
