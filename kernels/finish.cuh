// multireduce: the last step of a reduction, on the device and prebuilt (kernels.STANDALONE).
//
// reduce_finish: a float16 result is accumulated in float32, and a mean divides the sum by the element count. CuPy's
// astype and true_divide would do the same, but each compiles an elementwise kernel with NVRTC at its
// first use (about 50 ms on a fresh node); this kernel ships precompiled with the rest.
// finite_probe: what nanmin/nanmax need to know before they can return without a warning, early. Both are
// small, so loading this module costs little on a first call.
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

// found[0] = 1 when one of the first Block elements of x, or of Block elements spread over it ``stride``
// apart, is finite (its exponent field not all ones). U is the element's bits (unsigned short, unsigned int,
// unsigned long long for float16/32/64) and kExponent that field's mask. ``found`` is pinned host memory
// the host reads once the launch has finished (nanmin/nanmax: a finite element proves there is no
// all-NaN slice to warn about, without waiting for the reduction launched after this).
template <class U, unsigned long long kExponent, int Block>
__global__ void __launch_bounds__(Block) finite_probe(const U* __restrict__ x, index_t len, index_t stride,
                                                      volatile int* found) {
  const U e = static_cast<U>(kExponent);
  const index_t i = threadIdx.x;
  bool finite = i < len && (x[i] & e) != e;
  const index_t j = i * stride;
  if (j < len) finite = finite || (x[j] & e) != e;
  if (__syncthreads_or(finite) && threadIdx.x == 0) *found = 1;
}

}  // namespace mr
