// multireduce: the last step of a reduction, on the device and prebuilt (kernels.STANDALONE).
//
// A float16 result is accumulated in float32, and a mean divides the sum by the element count. CuPy's
// astype and true_divide would do the same, but each compiles an elementwise kernel with NVRTC at its
// first use (about 50 ms on a fresh node); this kernel ships precompiled with the rest.
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

}  // namespace mr
