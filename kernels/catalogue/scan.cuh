// multireduce: the catalogue of scan kernels (compiled only when ``algorithm=`` names one): Hillis-Steele
// and Blelloch block scans, made to scan any length by the host's multi-level driver (block scans + scan
// of the block totals + add back, recursively), with ``scan_finish`` applying carry-ins and exclusive shifts.
#pragma once
#include "../block.cuh"

namespace mr {

// ---- catalogue: block scans writing inclusive results and one total per tile -------------------
// Hillis-Steele: log2(BLOCK) steps, each thread adds the value `offset` to its left; double-buffered.
template <class T, class Acc, class Op, int BLOCK>
__global__ void __launch_bounds__(BLOCK) scan_hillis_steele_tiles(const T* in, Acc* out, index_t K,
                                                                  index_t tiles_per_row, Acc identity, Acc* tile_totals) {
  __shared__ Acc buf[2][BLOCK];
  Op op;
  const index_t row = blockIdx.x / tiles_per_row, tile = blockIdx.x % tiles_per_row;
  const index_t k = tile * BLOCK + threadIdx.x;
  const index_t at = row * K + k;
  int cur = 0;
  buf[cur][threadIdx.x] = k < K ? convert<Acc>(in[at]) : identity;
  __syncthreads();
  for (int offset = 1; offset < BLOCK; offset <<= 1) {
    Acc v = buf[cur][threadIdx.x];
    if ((int)threadIdx.x >= offset) v = op(buf[cur][threadIdx.x - offset], v);
    buf[cur ^ 1][threadIdx.x] = v;
    cur ^= 1;
    __syncthreads();
  }
  if (k < K) out[at] = buf[cur][threadIdx.x];
  if (threadIdx.x == BLOCK - 1) tile_totals[blockIdx.x] = buf[cur][BLOCK - 1];
}

// Blelloch: up-sweep builds a tree of partial folds in place, down-sweep hands each left child its
// parent's prefix and each right child prefix op left. 2*BLOCK elements per tile; one padding slot
// every 32 keeps the power-of-two strides off a single shared-memory bank.
__device__ __forceinline__ int padded(int i) { return i + (i >> 5); }

template <class T, class Acc, class Op, int BLOCK>
__global__ void __launch_bounds__(BLOCK) scan_blelloch_tiles(const T* in, Acc* out, index_t K, index_t tiles_per_row,
                                                             Acc identity, Acc* tile_totals) {
  constexpr int kN = 2 * BLOCK;
  __shared__ Acc s[kN + (kN >> 5)];
  Op op;
  const index_t row = blockIdx.x / tiles_per_row, tile = blockIdx.x % tiles_per_row;
  const int a = threadIdx.x, b = threadIdx.x + BLOCK;
  const index_t ka = tile * kN + a, kb = tile * kN + b;
  const Acc xa = ka < K ? convert<Acc>(in[row * K + ka]) : identity;
  const Acc xb = kb < K ? convert<Acc>(in[row * K + kb]) : identity;
  s[padded(a)] = xa;
  s[padded(b)] = xb;
  int offset = 1;
  for (int d = kN >> 1; d > 0; d >>= 1) {  // up-sweep
    __syncthreads();
    if ((int)threadIdx.x < d) {
      int left = offset * (2 * threadIdx.x + 1) - 1, right = offset * (2 * threadIdx.x + 2) - 1;
      s[padded(right)] = op(s[padded(left)], s[padded(right)]);
    }
    offset <<= 1;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    tile_totals[blockIdx.x] = s[padded(kN - 1)];
    s[padded(kN - 1)] = identity;
  }
  for (int d = 1; d < kN; d <<= 1) {  // down-sweep
    offset >>= 1;
    __syncthreads();
    if ((int)threadIdx.x < d) {
      int left = offset * (2 * threadIdx.x + 1) - 1, right = offset * (2 * threadIdx.x + 2) - 1;
      Acc left_fold = s[padded(left)];
      s[padded(left)] = s[padded(right)];
      s[padded(right)] = op(s[padded(right)], left_fold);
    }
  }
  __syncthreads();
  // exclusive prefixes -> inclusive results
  if (ka < K) out[row * K + ka] = op(s[padded(a)], xa);
  if (kb < K) out[row * K + kb] = op(s[padded(b)], xb);
}

// Multi-level add-back: tile t >= 1 of each row gets the inclusive scan of the totals of tiles < t.
template <class Acc, class Op>
__global__ void scan_add_back(Acc* data, index_t K, index_t tile_size, index_t tiles_per_row,
                              const Acc* scanned_totals) {
  Op op;
  const index_t row = blockIdx.x / tiles_per_row, tile = blockIdx.x % tiles_per_row;
  if (tile == 0) return;
  const Acc prefix = scanned_totals[blockIdx.x - 1];
  for (index_t k = tile * tile_size + threadIdx.x; k < (tile + 1) * tile_size && k < K; k += blockDim.x)
    data[row * K + k] = op(prefix, data[row * K + k]);
}

// From inclusive results in Acc to the output: carry-in per row on the left, exclusive shift, cast.
template <class Acc, class Out, class Op>
__global__ void scan_finish(const Acc* inclusive_scan, Out* out, index_t rows, index_t K, const Acc* carry,
                            Acc identity, int inclusive) {
  Op op;
  const index_t n = rows * K;
  for (index_t i = (index_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (index_t)gridDim.x * blockDim.x) {
    const index_t row = i / K, k = i % K;
    Acc v = inclusive ? inclusive_scan[i] : (k > 0 ? inclusive_scan[i - 1] : identity);
    if (carry) v = op(carry[row], v);
    out[i] = convert<Out>(v);
  }
}

}  // namespace mr
