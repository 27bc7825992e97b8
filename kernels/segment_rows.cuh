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

// Hands step(v, element) the elements of rows [lo, hi) of a thread's VEC adjacent columns (``column``
// points at them in row 0), in row order, UNROLL rows loaded before any is handed on. VEC > 1 needs
// post % VEC == 0 and the columns aligned to VEC elements (the caller checks both).
template <class T, int UNROLL, int VEC, class Step>
__device__ __forceinline__ void walk_rows(const T* column, index_t lo, index_t hi, index_t post, Step& step) {
  typedef typename RowWord<VEC * sizeof(T)>::type Word;
  union Pack {
    Word word;
    T e[VEC];
  };
  index_t i = lo;
  for (; i + UNROLL <= hi; i += UNROLL) {
    Pack pack[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) pack[u].word = *reinterpret_cast<const Word*>(column + (i + u) * post);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
#pragma unroll
      for (int v = 0; v < VEC; ++v) step(v, pack[u].e[v]);
  }
  for (; i < hi; ++i) {
    Pack pack;
    pack.word = *reinterpret_cast<const Word*>(column + i * post);
#pragma unroll
    for (int v = 0; v < VEC; ++v) step(v, pack.e[v]);
  }
}

template <class T, class Acc, class Op, int BLOCK, int UNROLL, int VEC>
__global__ void __launch_bounds__(BLOCK)
    segment_reduce_rows(const T* __restrict__ in, const index_t* __restrict__ starts, index_t pre, index_t n,
                        index_t post, index_t segments, Acc identity, Acc* __restrict__ out) {
  Op op;
  const index_t c = (static_cast<index_t>(blockIdx.x) * BLOCK + threadIdx.x) * VEC;
  if (c >= post) return;
  for (index_t ps = blockIdx.y; ps < pre * segments; ps += gridDim.y) {
    const index_t p = ps / segments, s = ps % segments;
    Acc acc[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc[v] = identity;
    auto fold = [&](int v, const T& e) { acc[v] = op(acc[v], load_as<Acc, Op>(e)); };
    walk_rows<T, UNROLL, VEC>(in + p * n * post + c, starts[s], starts[s + 1], post, fold);
#pragma unroll
    for (int v = 0; v < VEC; ++v) out[ps * post + c + v] = acc[v];
  }
}

// The variance's second pass over segments of rows: with d = x - shift, where shift is the anchor (a
// first mean) of the segment's group and column, total[p, s, c] = the sum of d and squares[p, s, c] the
// sum of d * d over the segment's rows, in float64 and row order; NaN counts as d = 0 where SKIPNAN.
// group_of[s] is segment s's group, shift a C-contiguous (pre, groups, post) array. Each product is
// rounded before it is added (no fused multiply-add), as the square of a rounded deviation is.
template <class T, int BLOCK, int UNROLL, int VEC, bool SKIPNAN>
__global__ void __launch_bounds__(BLOCK)
    segment_shifted_squares_rows(const T* __restrict__ in, const index_t* __restrict__ starts,
                                 const index_t* __restrict__ group_of, const double* __restrict__ shift,
                                 index_t pre, index_t n, index_t post, index_t segments, index_t groups,
                                 double* __restrict__ total, double* __restrict__ squares) {
  const index_t c = (static_cast<index_t>(blockIdx.x) * BLOCK + threadIdx.x) * VEC;
  if (c >= post) return;
  for (index_t ps = blockIdx.y; ps < pre * segments; ps += gridDim.y) {
    const index_t p = ps / segments, s = ps % segments;
    const double* anchor = shift + (p * groups + group_of[s]) * post + c;
    double a[VEC], sum[VEC], sq[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      a[v] = anchor[v];
      sum[v] = 0.0;
      sq[v] = 0.0;
    }
    auto fold = [&](int v, const T& e) {
      double d = __dsub_rn(convert<double>(e), a[v]);
      if (SKIPNAN && d != d) d = 0.0;
      sum[v] = __dadd_rn(sum[v], d);
      sq[v] = __dadd_rn(sq[v], __dmul_rn(d, d));
    };
    walk_rows<T, UNROLL, VEC>(in + p * n * post + c, starts[s], starts[s + 1], post, fold);
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      total[ps * post + c + v] = sum[v];
      squares[ps * post + c + v] = sq[v];
    }
  }
}

}  // namespace mr
