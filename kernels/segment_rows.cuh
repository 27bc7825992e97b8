// multireduce: segments of rows. A C-contiguous (pre, n, post) array cut along its middle axis into
// segments of consecutive rows [starts[s], starts[s + 1]); out[p, s, c] = the fold over the segment's
// rows of x[p, i, c], in row order (op(earlier, later)). An empty segment gives the identity.
//
// What a group-by along an axis that is not the last needs (a time x space field by month or by day):
// every thread owns VEC adjacent columns of one segment and walks its rows, so a warp reads 32 x VEC
// consecutive elements of a row at a time (coalesced, the data read once, in place: no transposed copy),
// UNROLL rows in flight per thread. Long segments are cut by the caller into pieces, whose partials it
// folds again with this kernel: threads then outnumber the rows a segment has.
#pragma once
#include "common.cuh"

namespace mr {

template <int BYTES>
struct RowWord;  // an unsigned type of BYTES bytes: VEC elements loaded in one instruction
template <>
struct RowWord<1> { typedef unsigned char type; };
template <>
struct RowWord<2> { typedef unsigned short type; };
template <>
struct RowWord<4> { typedef unsigned type; };
template <>
struct RowWord<8> { typedef uint2 type; };
template <>
struct RowWord<16> { typedef uint4 type; };

// VEC > 1 needs post % VEC == 0 and ``in`` aligned to VEC elements (the caller checks both).
template <class T, class Acc, class Op, int BLOCK, int UNROLL, int VEC>
__global__ void __launch_bounds__(BLOCK)
    segment_reduce_rows(const T* __restrict__ in, const index_t* __restrict__ starts, index_t pre, index_t n,
                        index_t post, index_t segments, Acc identity, Acc* __restrict__ out) {
  typedef typename RowWord<VEC * sizeof(T)>::type Word;
  union Pack {
    Word word;
    T e[VEC];
  };
  Op op;
  const index_t c = (static_cast<index_t>(blockIdx.x) * BLOCK + threadIdx.x) * VEC;
  if (c >= post) return;
  for (index_t ps = blockIdx.y; ps < pre * segments; ps += gridDim.y) {
    const index_t p = ps / segments, s = ps % segments;
    const index_t lo = starts[s], hi = starts[s + 1];
    const T* column = in + p * n * post + c;
    Acc acc[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc[v] = identity;
    index_t i = lo;
    for (; i + UNROLL <= hi; i += UNROLL) {
      Pack pack[UNROLL];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) pack[u].word = *reinterpret_cast<const Word*>(column + (i + u) * post);
#pragma unroll
      for (int u = 0; u < UNROLL; ++u)
#pragma unroll
        for (int v = 0; v < VEC; ++v) acc[v] = op(acc[v], load_as<Acc, Op>(pack[u].e[v]));
    }
    for (; i < hi; ++i) {
      Pack pack;
      pack.word = *reinterpret_cast<const Word*>(column + i * post);
#pragma unroll
      for (int v = 0; v < VEC; ++v) acc[v] = op(acc[v], load_as<Acc, Op>(pack.e[v]));
    }
#pragma unroll
    for (int v = 0; v < VEC; ++v) out[ps * post + c + v] = acc[v];
  }
}

}  // namespace mr
