// multireduce: one-pass statistics kernels (argmin/argmax with their NaN-skipping forms, and the
// moments (count, mean, M2) behind var/std/nanvar/nanstd/nanmean).
//
// Each kernel reads its input once, with 16-byte vector loads, and writes one partial per block; the
// host merges the few block partials with the same rules as the partials of Dask chunks
// (backends/numpy_stats.py), so one merge rule serves every level above the block.
#pragma once
#include "common.cuh"

namespace mr {

// ---- element visiting: each thread sees its elements in increasing index order -------------------
// (head elements before the first 16-byte boundary, then whole 16-byte packs grid-stride, then the
// tail), which is what lets the argmin/argmax tie break (lowest index) stay a per-thread "strictly
// better" test.
template <class T>
struct alignas(16) Pack {
  static constexpr int kCount = 16 / sizeof(T);
  T v[kCount];
};

template <class T, class Visit>
__device__ __forceinline__ void visit_elements(const T* __restrict__ x, index_t n, Visit visit) {
  const index_t thread = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const index_t threads = static_cast<index_t>(gridDim.x) * blockDim.x;
  constexpr int P = Pack<T>::kCount;
  const unsigned long long address = reinterpret_cast<unsigned long long>(x);
  index_t head = static_cast<index_t>(((16 - (address & 15)) & 15) / sizeof(T));
  if ((address % sizeof(T)) != 0 || head > n) head = n;  // unaligned element type: scalar loads only
  for (index_t i = thread; i < head; i += threads) visit(x[i], i);
  const index_t packs = (n - head) / P;
  const Pack<T>* body = reinterpret_cast<const Pack<T>*>(x + head);
  for (index_t p = thread; p < packs; p += threads) {
    const Pack<T> pack = body[p];
#pragma unroll
    for (int k = 0; k < P; ++k) visit(pack.v[k], head + p * P + k);
  }
  for (index_t i = head + packs * P + thread; i < n; i += threads) visit(x[i], i);
}

// ---- argmin / argmax ------------------------------------------------------------------------------
// Values are compared as their key type (float16 as float, exactly).
template <class T> struct StatKey { typedef T type; };
template <> struct StatKey<half> { typedef float type; };

// Whether candidate b replaces a: a candidate beats none (index -1); a NaN beats a number (NumPy:
// the first NaN wins); otherwise the larger (smaller) value, and on equal values the lower index.
template <bool Largest, class K>
__device__ __forceinline__ bool arg_takes(K ak, index_t ai, K bk, index_t bi) {
  if (bi < 0) return false;
  if (ai < 0) return true;
  const bool an = is_nan(ak), bn = is_nan(bk);
  if (an || bn) return bn && (!an || bi < ai);
  const bool beats = Largest ? (bk > ak) : (bk < ak);
  return beats || (bk == ak && bi < ai);
}

// One partial per block: out_key[b], out_index[b] (-1: the block saw no candidate).
template <class T, bool Largest, bool SkipNan, int Block>
__global__ void __launch_bounds__(Block) stats_arg_partials(const T* __restrict__ x, index_t n,
                                                            typename StatKey<T>::type* __restrict__ out_key,
                                                            index_t* __restrict__ out_index) {
  typedef typename StatKey<T>::type K;
  K best = K();
  index_t where = -1;
  visit_elements(x, n, [&](const T& v, index_t i) {
    const K k = convert<K>(v);
    if (SkipNan && is_nan(k)) return;  // NaN masked at load time
    if (arg_takes<Largest>(best, where, k, i)) {
      best = k;
      where = i;
    }
  });
#pragma unroll
  for (int d = kWarp / 2; d > 0; d /= 2) {
    const K k = shfl_down(best, d);
    const index_t i = shfl_down(where, d);
    if (arg_takes<Largest>(best, where, k, i)) {
      best = k;
      where = i;
    }
  }
  __shared__ K keys[Block / kWarp];
  __shared__ index_t indices[Block / kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) {
    keys[warp] = best;
    indices[warp] = where;
  }
  __syncthreads();
  if (warp == 0) {
    best = lane < Block / kWarp ? keys[lane] : K();
    where = lane < Block / kWarp ? indices[lane] : index_t(-1);
#pragma unroll
    for (int d = kWarp / 2; d > 0; d /= 2) {
      const K k = shfl_down(best, d);
      const index_t i = shfl_down(where, d);
      if (arg_takes<Largest>(best, where, k, i)) {
        best = k;
        where = i;
      }
    }
    if (lane == 0) {
      out_key[blockIdx.x] = best;
      out_index[blockIdx.x] = where;
    }
  }
}

// ---- moments ---------------------------------------------------------------------------------------
// Each thread runs Welford's update on x - anchor (the anchor is x[0], an exact double; for data whose
// mean is far above its spread the differences are exact), and partials merge with Chan's formula
// across the warp and the block. Block b writes out[4b..4b+3] = (count, anchor, mean - anchor, M2).
struct Moments {
  double n, mean, m2;
};

__device__ __forceinline__ Moments merge_moments(const Moments& a, const Moments& b) {
  const double n = a.n + b.n;
  if (b.n == 0) return a;
  if (a.n == 0) return b;
  const double share = b.n / n, delta = b.mean - a.mean;
  return Moments{n, a.mean + delta * share, a.m2 + b.m2 + delta * delta * a.n * share};
}

__device__ __forceinline__ Moments shfl_down_moments(const Moments& m, int d) {
  return Moments{shfl_down(m.n, d), shfl_down(m.mean, d), shfl_down(m.m2, d)};
}

template <class T, bool SkipNan, int Block>
__global__ void __launch_bounds__(Block) stats_moments_partials(const T* __restrict__ x, index_t n,
                                                                double* __restrict__ out) {
  double anchor = n > 0 ? convert<double>(x[0]) : 0.0;
  if (!(anchor - anchor == 0.0)) anchor = 0.0;  // NaN or inf: no anchor (the data decide the result)
  Moments m{0.0, 0.0, 0.0};
  visit_elements(x, n, [&](const T& v, index_t) {
    const double d = convert<double>(v) - anchor;
    if (SkipNan && is_nan(d)) return;  // NaN masked at load time
    m.n += 1.0;
    const double delta = d - m.mean;
    m.mean += delta / m.n;
    m.m2 += delta * (d - m.mean);
  });
#pragma unroll
  for (int d = kWarp / 2; d > 0; d /= 2) m = merge_moments(m, shfl_down_moments(m, d));
  __shared__ Moments warps[Block / kWarp];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) warps[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = lane < Block / kWarp ? warps[lane] : Moments{0.0, 0.0, 0.0};
#pragma unroll
    for (int d = kWarp / 2; d > 0; d /= 2) m = merge_moments(m, shfl_down_moments(m, d));
    if (lane == 0) {
      out[4 * blockIdx.x + 0] = m.n;
      out[4 * blockIdx.x + 1] = anchor;
      out[4 * blockIdx.x + 2] = m.mean;
      out[4 * blockIdx.x + 3] = m.m2;
    }
  }
}

}  // namespace mr
