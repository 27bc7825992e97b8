// multireduce: the last step of a reduction, on the device and prebuilt (kernels.STANDALONE).
//
// reduce_finish: a float16 result is accumulated in float32, and a mean divides the sum by the element count. CuPy's
// astype and true_divide would do the same, but each compiles an elementwise kernel with NVRTC at its
// first use (about 50 ms on a fresh node); this kernel ships precompiled with the rest.
// finite_probe: what nanmin/nanmax/nanmean/nanvar need to know to return without a warning, early. Both
// are small, so loading this module costs little on a first call.
#pragma once
#include "common.cuh"

namespace mr {

// out[i] = Out(Div(in[i]) / divisor), or Out(in[i]) where divide is 0. Div is the type NumPy's mean
// divides in (the accumulator's when it is a float, else double: kernels.division_dtype), so the bits
// are those of ``(value / divisor).astype(Out)``.
template <class Acc, class Div, class Out>
__global__ void reduce_finish(const Acc* in, index_t n, Div divisor, int divide, Out* out) {
  for (index_t i = blockIdx.x * (index_t)blockDim.x + threadIdx.x; i < n; i += (index_t)gridDim.x * blockDim.x) {
    out[i] = divide ? convert<Out>(convert<Div>(in[i]) / divisor) : convert<Out>(in[i]);
  }
}

// Samples of x for the host to rule out a data-dependent NumPy warning without waiting for the reduction
// launched after this: the first Block elements and Block - 1 more spread ``stride`` apart (stride >=
// Block, so no element is sampled twice). counts[0] = how many samples are finite (nanmin/nanmax: one
// proves no slice is all-NaN), counts[1] = how many are not NaN (nanmean, nanvar: more than ddof prove
// the count is). U is the element's bits (unsigned short, unsigned int, unsigned long long for
// float16/32/64) and kExponent its exponent field's mask; ``counts`` is pinned host memory the host reads
// once this launch has finished.
template <class U, unsigned long long kExponent, int Block>
__global__ void __launch_bounds__(Block) finite_probe(const U* __restrict__ x, index_t len, index_t stride,
                                                      volatile int* counts) {
  const U e = static_cast<U>(kExponent);
  const U fraction = static_cast<U>(~(e | (U(1) << (8 * sizeof(U) - 1))));
  const index_t i = threadIdx.x, j = (i + 1) * stride;
  const bool a = i < len, b = threadIdx.x < Block - 1 && j < len;
  const U va = a ? x[i] : U(0), vb = b ? x[j] : U(0);
  const int finite = __syncthreads_count(a && (va & e) != e) + __syncthreads_count(b && (vb & e) != e);
  const int numbers = __syncthreads_count(a && !((va & e) == e && (va & fraction) != 0)) +
                      __syncthreads_count(b && !((vb & e) == e && (vb & fraction) != 0));
  if (threadIdx.x == 0) {
    counts[0] = finite;
    counts[1] = numbers;
  }
}

}  // namespace mr
