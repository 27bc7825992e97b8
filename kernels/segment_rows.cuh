// multireduce: segments of rows. A C-contiguous (pre, n, post) array cut along its middle axis into
// segments of consecutive rows [starts[s], starts[s + 1]); out[p, s, c] = the fold over the segment's
// rows of x[p, i, c], in row order (op(earlier, later)). An empty segment gives the identity.
//
// What a group-by along an axis that is not the last needs (a time x space field by month or by day):
// every thread owns one column of one segment and walks its rows, so a warp reads 32 consecutive
// columns of a row at a time (coalesced, the data read once, in place: no transposed copy), UNROLL rows
// in flight per thread. Long segments are cut by the caller into pieces, whose partials it folds again
// with this kernel: threads then outnumber the rows a segment has.
#pragma once
#include "common.cuh"

namespace mr {

template <class T, class Acc, class Op, int BLOCK, int UNROLL>
__global__ void __launch_bounds__(BLOCK)
    segment_reduce_rows(const T* __restrict__ in, const index_t* __restrict__ starts, index_t pre, index_t n,
                        index_t post, index_t segments, Acc identity, Acc* __restrict__ out) {
  Op op;
  const index_t c = static_cast<index_t>(blockIdx.x) * BLOCK + threadIdx.x;
  if (c >= post) return;
  for (index_t ps = blockIdx.y; ps < pre * segments; ps += gridDim.y) {
    const index_t p = ps / segments, s = ps % segments;
    const index_t lo = starts[s], hi = starts[s + 1];
    const T* column = in + p * n * post + c;
    Acc acc = identity;
    index_t i = lo;
    for (; i + UNROLL <= hi; i += UNROLL) {
      T v[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) v[u] = column[(i + u) * post];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) acc = op(acc, load_as<Acc, Op>(v[u]));
    }
    for (; i < hi; ++i) acc = op(acc, load_as<Acc, Op>(column[i * post]));
    out[ps * post + c] = acc;
  }
}

}  // namespace mr
