// multireduce: one-pass statistics kernels: argmin/argmax (and their NaN-skipping forms), the moments
// (count, mean, M2) behind var/std/nanvar/nanstd/nanmean, nanmin/nanmax, any/all and count_nonzero.
//
// Every statistic is a small policy ("Stat": a State, how an element enters it, how two States merge,
// and the final value), and these kernels serve them all:
//   stats_rows     rows of contiguous elements (every axis, or trailing axes; rows may be strided):
//                  16-byte vector loads, UNROLL packs in flight per thread, warp shuffles, one State per
//                  (row, split) block;
//   stats_columns  one reduced run of axes in the middle or in front (outer, len, inner): a thread per
//                  (column, piece of the run), loads coalesced across columns;
//   stats_fold     one warp per output merges its States and writes the State and/or the final value;
//   stats_whole    a whole contiguous array to its final value in one launch: stats_rows' shares, and the
//                  last block to finish merges them as stats_fold would (the same bits, one launch less);
//                  prebuilt as a module of its own (stats_whole.cuh).
// The host launches them (backends/cupy_stats.py); the States it copies back merge with the rules of
// backends/numpy_stats.py, so one merge rule serves blocks, chunks and GPUs.
#pragma once
#include "common.cuh"

namespace mr {

template <class T> struct StatKey { typedef T type; };  // values compare as this type (float16 as float)
template <> struct StatKey<half> { typedef float type; };
template <class T> struct IsFloat { static constexpr bool value = false; };
template <> struct IsFloat<half> { static constexpr bool value = true; };
template <> struct IsFloat<float> { static constexpr bool value = true; };
template <> struct IsFloat<double> { static constexpr bool value = true; };

template <class K>
__device__ __forceinline__ K quiet_nan() {
  return static_cast<K>(__longlong_as_double(0x7ff8000000000000LL));
}

// NumPy's truth of an element: NaN is true, -0.0 is false
template <class T>
__device__ __forceinline__ bool nonzero(const T& v) { return v != T(0); }
template <>
__device__ __forceinline__ bool nonzero<half>(const half& v) { return (v.bits & 0x7fff) != 0; }

// Elements that need nothing but one-by-one visits get visit_run from here.
template <class Stat>
struct OneByOne {
  template <int G, class T, class State>
  __device__ __forceinline__ static void visit_run(State& s, const T (&v)[G], const index_t (&at)[G]) {
#pragma unroll
    for (int k = 0; k < G; ++k) Stat::visit(s, v[k], at[k]);
  }
};

// ---- argmin / argmax --------------------------------------------------------------------------------
// NumPy's nanargmax (nanargmin) reads NaN as -inf (+inf) and then takes the first best, so a NaN still
// wins a tie with an infinity after it: np.nanargmax([nan, -inf]) == 0.
template <bool Largest, class K>
__device__ __forceinline__ K nan_as_worst(const K& k) {
  if constexpr (IsFloat<K>::value) {
    return is_nan(k) ? (Largest ? -positive_infinity<K>() : positive_infinity<K>()) : k;
  } else {
    return k;
  }
}

// State (key, index): index -1 is "no candidate yet". Without SkipNan a NaN key beats every number (NumPy:
// the first NaN wins); with it a NaN ranks as the worst number and the key stays NaN only while every
// candidate was NaN (result -1: the host raises "All-NaN slice"), otherwise it holds the winner's rank.
// The merge orders by (rank, then the lower index): order-free, so States merge in any grouping.
template <class T, bool Largest, bool SkipNan>
struct ArgStat : OneByOne<ArgStat<T, Largest, SkipNan>> {
  typedef T Elem;
  typedef typename StatKey<T>::type K;
  typedef long long Out;
  struct State {
    K key;
    index_t index;
  };
  __device__ __forceinline__ static State start() { return State{K(), -1}; }
  __device__ __forceinline__ static bool beats(const K& b, const K& a) { return Largest ? b > a : b < a; }
  // A thread visits its elements in increasing index order, so a later element replaces the best only
  // if strictly better.
  __device__ __forceinline__ static void visit(State& s, const T& v, index_t i) {
    const K k = convert<K>(v);
    if (s.index < 0) {
      s = State{k, i};
      return;
    }
    if constexpr (SkipNan) {
      const K r = nan_as_worst<Largest>(k), rs = nan_as_worst<Largest>(s.key);
      if (beats(r, rs)) {
        s = State{r, i};
      } else if (!is_nan(k)) {
        s.key = rs;  // a number came: no longer an all-NaN slice (a no-op when the key was a number)
      }
    } else {
      // a NaN k is "better" than any number, and nothing replaces a NaN
      if (!is_nan(s.key) && (is_nan(k) || beats(k, s.key))) s = State{k, i};
    }
  }
  __device__ __forceinline__ static State merge(const State& a, const State& b) {
    if (b.index < 0) return a;
    if (a.index < 0) return b;
    const bool lower = b.index < a.index;
    if constexpr (SkipNan) {
      const K ra = nan_as_worst<Largest>(a.key), rb = nan_as_worst<Largest>(b.key);
      const bool take = beats(rb, ra) || (rb == ra && lower);
      const bool hollow = is_nan(a.key) && is_nan(b.key);
      return State{hollow ? a.key : (take ? rb : ra), take ? b.index : a.index};
    } else {
      const bool an = is_nan(a.key), bn = is_nan(b.key);
      const bool take = (an || bn) ? (bn && (!an || lower)) : (beats(b.key, a.key) || (b.key == a.key && lower));
      return take ? b : a;
    }
  }
  __device__ __forceinline__ static Out result(const State& s, double, int) {
    return (SkipNan && is_nan(s.key)) ? -1 : s.index;
  }
};

// ---- moments ------------------------------------------------------------------------------------------
// (count, anchor, offset, M2): the mean is anchor + offset, the anchor the first finite element the
// State saw (an exact double; for data whose mean is far above its spread, the differences from it are
// exact, and so are the differences of two States' anchors). Runs of G elements are reduced two-pass
// in registers and enter the State with Chan's update: one division per run of up to 8 instead of one
// per element (Welford). Merges are numpy_stats.moments_merge.
//
// NumPy's results where the arithmetic is not finite: inf or NaN in the data makes the mean their sum
// (mean of [inf, 1] is inf, of [inf, -inf] NaN) and M2 NaN (np.var computes x - mean = inf - inf); such
// a State has anchor 0, the mean as its offset and M2 NaN, as numpy_stats does. Chan's delta would be
// inf - inf there, so every update checks that its delta is finite and otherwise goes to merge_wide,
// which also catches finite data whose differences overflow (values near +-1.8e308: the variance is
// then inf, not NaN). The checks cost one compare per element or run.
template <class A> struct IsHalf { static constexpr bool value = false; };
template <> struct IsHalf<half> { static constexpr bool value = true; };

template <class T, bool SkipNan>
struct MomentsStat {
  typedef T Elem;
  typedef typename Select<IsFloat<T>::value, T, double>::type Out;
  struct State {
    double n, anchor, mean, m2;
  };
  __device__ __forceinline__ static State start() { return State{0.0, 0.0, 0.0, 0.0}; }
  __device__ __forceinline__ static bool finite(double w) { return w - w == 0.0; }
  // One element: a finite one is its own anchor; inf or NaN is the offset, with M2 NaN (w - w).
  __device__ __forceinline__ static State single(double w) {
    const double a = finite(w) ? w : 0.0;
    return State{1.0, a, w - a, w - w};
  }
  __device__ __forceinline__ static void visit(State& s, const T& v, index_t) {
    const double w = convert<double>(v);
    if (SkipNan && is_nan(w)) return;  // NaN masked at load time
    const double d = w - s.anchor, delta = d - s.mean;
    if (s.n == 0.0 || !finite(delta)) {  // the first element, or inf, NaN or an overflowing difference
      s = merge(s, single(w));
      return;
    }
    s.n += 1.0;
    s.mean += delta / s.n;
    s.m2 += delta * (d - s.mean);
  }
  // runs of at most 8 elements keep the values and differences in registers. 16 (one float32 load batch)
  // took the float32 rows kernel to 90 registers, 2 blocks per SM, and var to 0.69 x copy at 2^26 on an
  // H200 (0.82 before the NumPy-rules change added the anchor search); 8 needs 62 (nvcc 13, sm_90)
  // float16 (kNarrowRuns): a run's differences, mean and squares in float32, runs of up to 16 (see
  // visit_narrow).
  static constexpr bool kNarrowRuns = IsHalf<T>::value;
  template <int G>
  __device__ __forceinline__ static void visit_run(State& s, const T (&v)[G], const index_t (&)[G]) {
    constexpr int L = kNarrowRuns ? 16 : 8;
    constexpr int R = G < L ? G : L;
    static_assert(G % R == 0, "runs split evenly");
#pragma unroll
    for (int c = 0; c < G; c += R) {
      if constexpr (kNarrowRuns) {
        visit_narrow<R>(s, v + c);
      } else {
        visit_some<R>(s, v + c);
      }
    }
  }
  // A float16 run as visit_some, in float32: float16 values and their differences from the anchor (itself
  // a float16 value, or 0) are far inside float32's range, so nothing overflows and only inf/NaN take the
  // double wide_run; a difference is exact within 13 binades of the anchor and otherwise rounded once, as
  // the run's mean and squares are (relative errors near 2^-24, far below float16's 2^-11). Converting
  // each element to double and the FP64 arithmetic bounded float16 var at 0.52 x copy (2^26, H200): twice
  // float32's elements per byte for the same double work. Explicit roundings (no contraction but the one
  // fused square), so nvcc and NVRTC builds give the same bits.
  template <int R>
  __device__ __forceinline__ static void visit_narrow(State& s, const T* v) {
    float w[R];
#pragma unroll
    for (int k = 0; k < R; ++k) w[k] = convert<float>(v[k]);
    if (s.n == 0.0) {
#pragma unroll
      for (int k = R - 1; k >= 0; --k) s.anchor = w[k] - w[k] == 0.0f ? static_cast<double>(w[k]) : s.anchor;
    }
    const float anchor = static_cast<float>(s.anchor);
    float d[R], sum = 0.0f;
    unsigned nans = 0u;
#pragma unroll
    for (int k = 0; k < R; ++k) {
      d[k] = __fsub_rn(w[k], anchor);
      const bool nan = SkipNan && is_nan(w[k]);
      nans |= (nan ? 1u : 0u) << k;
      sum = nan ? sum : __fadd_rn(sum, d[k]);
    }
    if (!(sum - sum == 0.0f)) {  // inf or NaN in the run
      s = merge(s, wide_run<R>(v));
      return;
    }
    const int count = R - __popc(nans);
    if (SkipNan && count == 0) return;
    const float mean = SkipNan ? __fdiv_rn(sum, static_cast<float>(count)) : __fmul_rn(sum, 1.0f / R);
    float q = 0.0f;
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const float e = __fsub_rn(d[k], mean);
      q = ((nans >> k) & 1u) ? q : __fmaf_rn(e, e, q);
    }
    s = merge(s, State{static_cast<double>(count), s.anchor, static_cast<double>(mean), static_cast<double>(q)});
  }
  template <int R>
  __device__ __forceinline__ static void visit_some(State& s, const T* v) {
    double w[R];
#pragma unroll
    for (int k = 0; k < R; ++k) w[k] = convert<double>(v[k]);
    if (s.n == 0.0) {  // no anchor yet (once per thread, or while only NaN came): the run's first finite value
#pragma unroll
      for (int k = R - 1; k >= 0; --k) s.anchor = finite(w[k]) ? w[k] : s.anchor;
    }
    // SkipNan: a NaN element (d NaN exactly when the element is: the anchor is finite) is left out of
    // sum and q, and the run's count is R less the NaNs. The NaN test is the element's own (FP32 for
    // float32), the count a popcount, and sum and q skip an addition rather than add a selected 0.0,
    // whose result is the same (neither is ever -0.0): the FP64 pipe, which bounds nanvar of float32,
    // does what var's does, with the same bits.
    double d[R], sum = 0.0;
    unsigned nans = 0u;
#pragma unroll
    for (int k = 0; k < R; ++k) {
      d[k] = w[k] - s.anchor;
      if (SkipNan) {
        bool nan;
        if constexpr (sizeof(T) == 4) nan = is_nan(v[k]);
        else nan = is_nan(w[k]);
        nans |= (nan ? 1u : 0u) << k;
        sum = nan ? sum : __dadd_rn(sum, d[k]);
      } else {
        sum += d[k];
      }
    }
    if (!finite(sum)) {  // inf or NaN in the run, or differences past DBL_MAX (rare)
      s = merge(s, wide_run<R>(v));  // converted again: w need not stay live past the differences
      return;
    }
    const double count = double(R - __popc(nans));
    if (SkipNan && count == 0.0) return;
    const double n = SkipNan ? count : double(R);
    const double mean = SkipNan ? sum / n : sum * (1.0 / R);  // 1/R is exact: R is a power of two
    double q = 0.0;
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const double e = d[k] - mean;
      if (SkipNan) {
        q = ((nans >> k) & 1u) ? q : __dadd_rn(q, __dmul_rn(e, e));  // rounded apart, as e * e then + 0.0 were
      } else {
        q += e * e;
      }
    }
    s = merge(s, State{n, s.anchor, mean, q});
  }
  // A run holding inf or NaN, or finite values whose differences from the anchor pass DBL_MAX. NumPy's
  // mean of it is the values' sum over the count (inf, -inf or NaN once inf or NaN came: the State keeps
  // it as its offset over anchor 0) and its M2 NaN once inf or NaN came (x - mean = inf - inf), else inf:
  // the anchor is one of this thread's values, and a difference past DBL_MAX / R from it makes M2 >=
  // (DBL_MAX / R)^2 / 2. Straight-line code without calls, so the unrolled fast path stays lean.
  template <int R>
  __device__ __forceinline__ static State wide_run(const T* v) {
    double w[R];
#pragma unroll
    for (int k = 0; k < R; ++k) w[k] = convert<double>(v[k]);
    double count = 0.0;
    bool finite_data = true;
#pragma unroll
    for (int k = 0; k < R; ++k) {
      const bool ok = !(SkipNan && is_nan(w[k]));
      count += ok ? 1.0 : 0.0;
      finite_data = finite_data && (!ok || finite(w[k]));
    }
    const double n = SkipNan ? count : double(R);
    double mean = 0.0;
#pragma unroll
    for (int k = 0; k < R; ++k) mean += (SkipNan && is_nan(w[k])) ? 0.0 : w[k] / n;
    return State{n, 0.0, mean, finite_data ? positive_infinity<double>() : quiet_nan<double>()};
  }
  __device__ __forceinline__ static State merge(const State& a, const State& b) {
    if (b.n == 0.0) return a;
    if (a.n == 0.0) return b;
    const double n = a.n + b.n, share = b.n / n;
    const double delta = (b.anchor - a.anchor) + (b.mean - a.mean);
    if (!finite(delta)) return merge_wide(a, b, n, share);
    return State{n, a.anchor, a.mean + delta * share, a.m2 + b.m2 + delta * delta * a.n * share};
  }
  // The two means' difference is not finite. An inf or NaN mean: the means add as NumPy's sum does
  // (inf + 1 = inf, inf - inf = NaN), M2 NaN. Two finite means: the exact pieces of delta overflowed,
  // the plain difference may not; if it does too, the means are more than DBL_MAX apart, so M2 >=
  // delta^2 * a.n * b.n / n is inf, and their weighted mean cannot overflow (they have opposite signs)
  // and becomes the anchor.
  __device__ __forceinline__ static State merge_wide(const State& a, const State& b, double n, double share) {
    const double ma = a.anchor + a.mean, mb = b.anchor + b.mean;
    if (!finite(ma) || !finite(mb)) return State{n, 0.0, ma + mb, quiet_nan<double>()};
    const double delta = mb - ma;
    if (finite(delta)) return State{n, ma, delta * share, a.m2 + b.m2 + delta * delta * a.n * share};
    return State{n, ma * (a.n / n) + mb * share, 0.0, positive_infinity<double>()};
  }
  // mode 0: variance, 1: standard deviation, 2: mean, with NumPy's rules (the host warns): np.var
  // divides M2 by max(count - ddof, 0), so inf or (M2 = 0) NaN at dof <= 0; np.nanvar gives NaN
  // wherever count - ddof <= 0; the mean of nothing (an all-NaN slice) is NaN.
  __device__ __forceinline__ static Out result(const State& s, double ddof, int mode) {
    double r;
    if (mode == 2) {
      r = s.n == 0.0 ? quiet_nan<double>() : s.anchor + s.mean;
    } else {
      const double dof = s.n - ddof;
      r = (SkipNan && !(dof > 0.0)) ? quiet_nan<double>() : s.m2 / (dof > 0.0 ? dof : 0.0);
      if (mode == 1) r = __dsqrt_rn(r);  // an intrinsic: NVRTC has no math headers
    }
    return convert<Out>(r);
  }
};

// ---- nanmin / nanmax (NaN skipped; an all-NaN slice gives NaN) -----------------------------------------
template <class T, bool Largest>
struct ExtremeStat : OneByOne<ExtremeStat<T, Largest>> {
  typedef T Elem;
  typedef typename StatKey<T>::type K;
  typedef T Out;
  struct State {
    K value;
    int seen;
  };
  __device__ __forceinline__ static State start() { return State{K(), 0}; }
  __device__ __forceinline__ static void visit(State& s, const T& v, index_t) {
    const K k = convert<K>(v);
    if (is_nan(k)) return;
    if (!s.seen || (Largest ? k > s.value : k < s.value)) s = State{k, 1};
  }
  __device__ __forceinline__ static State merge(const State& a, const State& b) {
    if (!b.seen) return a;
    if (!a.seen) return b;
    return (Largest ? b.value > a.value : b.value < a.value) ? b : a;
  }
  __device__ __forceinline__ static Out result(const State& s, double, int) {
    if constexpr (IsFloat<T>::value) {
      return convert<T>(s.seen ? s.value : quiet_nan<K>());
    } else {
      return convert<T>(s.value);
    }
  }
};

// ---- any / all ------------------------------------------------------------------------------------------
template <class T, bool Every>
struct TruthStat : OneByOne<TruthStat<T, Every>> {
  typedef T Elem;
  typedef bool Out;
  struct State {
    int value;
  };
  __device__ __forceinline__ static State start() { return State{Every ? 1 : 0}; }
  __device__ __forceinline__ static void visit(State& s, const T& v, index_t) {
    s.value = Every ? (s.value & int(nonzero(v))) : (s.value | int(nonzero(v)));
  }
  __device__ __forceinline__ static State merge(const State& a, const State& b) {
    return State{Every ? (a.value & b.value) : (a.value | b.value)};
  }
  __device__ __forceinline__ static Out result(const State& s, double, int) { return s.value != 0; }
};

// ---- count_nonzero --------------------------------------------------------------------------------------
template <class T>
struct CountStat : OneByOne<CountStat<T>> {
  typedef T Elem;
  typedef long long Out;
  struct State {
    long long value;
  };
  __device__ __forceinline__ static State start() { return State{0}; }
  __device__ __forceinline__ static void visit(State& s, const T& v, index_t) { s.value += nonzero(v) ? 1 : 0; }
  __device__ __forceinline__ static State merge(const State& a, const State& b) { return State{a.value + b.value}; }
  __device__ __forceinline__ static Out result(const State& s, double, int) { return s.value; }
};

// ---- the kernels ------------------------------------------------------------------------------------------
template <class S>
__device__ __forceinline__ S shfl_down_state(const S& s, int d) {
  constexpr int kWords = (sizeof(S) + 3) / 4;
  union {
    S state;
    int words[kWords];
  } u;
  u.state = s;
#pragma unroll
  for (int w = 0; w < kWords; ++w) u.words[w] = __shfl_down_sync(kFullMask, u.words[w], d);
  return u.state;
}

// Merges the States of lanes [0, valid) into lane 0 (lanes at or past ``valid`` are never read).
template <class Stat>
__device__ __forceinline__ typename Stat::State warp_merge(typename Stat::State s, int valid) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int d = kWarp / 2; d > 0; d /= 2) {
    const typename Stat::State other = shfl_down_state(s, d);
    if (lane + d < valid) s = Stat::merge(s, other);
  }
  return s;
}

// Every thread's State merged over the block, in a fixed order; the result is thread 0's. One barrier:
// call it once per block, with every thread.
template <class Stat, int Block>
__device__ __forceinline__ typename Stat::State block_merge(typename Stat::State s) {
  __shared__ typename Stat::State warps[Block / kWarp];
  s = warp_merge<Stat>(s, kWarp);
  if (threadIdx.x % kWarp == 0) warps[threadIdx.x / kWarp] = s;
  __syncthreads();
  if (threadIdx.x < kWarp) {
    s = warps[threadIdx.x < Block / kWarp ? threadIdx.x : 0];
    s = warp_merge<Stat>(s, Block / kWarp);
  }
  return s;
}

template <class T>
struct alignas(16) Pack {
  static constexpr int kCount = 16 / sizeof(T);
  T v[kCount];
};

// The State of one block's share of a row (``len`` contiguous elements at xr, element j with index base +
// j), the row cut among ``splits`` blocks of which this is ``split``: elements before the first 16-byte
// boundary, then 16-byte packs (UNROLL in flight per thread, grid-stride over the row's blocks), then the
// tail, each thread in increasing index order; merged over the block (thread 0's). Every thread calls it.
template <class Stat, int Block, int Unroll>
__device__ __forceinline__ typename Stat::State row_share(const typename Stat::Elem* __restrict__ xr, index_t len,
                                                          index_t base, int split, int splits) {
  typedef typename Stat::Elem T;
  typedef typename Stat::State State;
  constexpr int P = Pack<T>::kCount;
  State s = Stat::start();
  const index_t thread = static_cast<index_t>(split) * Block + threadIdx.x;
  const index_t threads = static_cast<index_t>(splits) * Block;
  const unsigned long long address = reinterpret_cast<unsigned long long>(xr);
  index_t head = static_cast<index_t>(((16 - (address & 15)) & 15) / sizeof(T));
  if ((address % sizeof(T)) != 0 || head > len) head = len;  // unaligned element type: scalar loads only
  for (index_t i = thread; i < head; i += threads) Stat::visit(s, xr[i], base + i);
  const index_t packs = (len - head) / P;
  const Pack<T>* __restrict__ body = reinterpret_cast<const Pack<T>*>(xr + head);
  index_t p = thread;
  for (; p + (Unroll - 1) * threads < packs; p += Unroll * threads) {
    Pack<T> r[Unroll];  // every load issued before the first visit waits on one
#pragma unroll
    for (int u = 0; u < Unroll; ++u) r[u] = body[p + u * threads];
    T v[Unroll * P];
    index_t at[Unroll * P];
#pragma unroll
    for (int u = 0; u < Unroll; ++u) {
#pragma unroll
      for (int k = 0; k < P; ++k) {
        v[u * P + k] = r[u].v[k];
        at[u * P + k] = base + head + (p + u * threads) * P + k;
      }
    }
    Stat::template visit_run<Unroll * P>(s, v, at);
  }
  for (; p < packs; p += threads) {
    const Pack<T> r = body[p];
    T v[P];
    index_t at[P];
#pragma unroll
    for (int k = 0; k < P; ++k) {
      v[k] = r.v[k];
      at[k] = base + head + p * P + k;
    }
    Stat::template visit_run<P>(s, v, at);
  }
  for (index_t i = head + packs * P + thread; i < len; i += threads) Stat::visit(s, xr[i], base + i);
  return block_merge<Stat, Block>(s);
}

// The resident blocks per SM stats_rows asks of ptxas (__launch_bounds__): the host's grid is sized for
// four (row_splits), and a kernel that fits only three runs its last quarter as a second wave. The
// NaN-skipping moments of float32/float16 took 74 / 72 registers unbounded; bounded to 64 they spill a
// few bytes and still run 0.62 -> 0.80 x copy (nanvar, float32, 2^28, H200). Bounding every statistic
// made the others slower (their spills cost more than the wave they did not have). 0 asks for nothing:
// ptxas then allocates as without the second argument (1 would let it take more registers than that).
template <class Stat>
struct RowsMinBlocks {
  static constexpr int value = 0;
};
template <class T>
struct RowsMinBlocks<MomentsStat<T, true>> {
  static constexpr int value = sizeof(T) <= 4 ? 4 : 0;
};

// Block b = row * splits + split reduces its share of row ``row`` (``len`` contiguous elements starting
// at x + row * row_stride; element j of the row has index row * row_index_step + j). out[b] = the
// block's State.
template <class Stat, int Block, int Unroll>
__global__ void __launch_bounds__(Block, RowsMinBlocks<Stat>::value)
    stats_rows(const typename Stat::Elem* __restrict__ x, index_t len, index_t row_stride, index_t row_index_step,
               int splits, typename Stat::State* __restrict__ out) {
  const index_t row = blockIdx.x / splits;
  const typename Stat::State s =
      row_share<Stat, Block, Unroll>(x + row * row_stride, len, row * row_index_step, blockIdx.x % splits, splits);
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}

// Columns: the array is (outer, len, inner) with (len, inner) contiguous and outer blocks ``outer_stride``
// elements apart; column c = o * inner + i reduces x[o * outer_stride + j * inner + i] over j. Thread t
// (grid-stride) takes column t % columns and piece t / columns of ``piece`` consecutive j (index j), UNROLL
// loads in flight; out[t] = its State (so out is (splits, columns)).
template <class Stat, int Block, int Unroll>
__global__ void __launch_bounds__(Block) stats_columns(const typename Stat::Elem* __restrict__ x, index_t outer,
                                                       index_t outer_stride, index_t len, index_t inner,
                                                       index_t piece, index_t splits,
                                                       typename Stat::State* __restrict__ out) {
  typedef typename Stat::Elem T;
  typedef typename Stat::State State;
  const index_t columns = outer * inner;
  const index_t total = columns * splits;
  for (index_t t = static_cast<index_t>(blockIdx.x) * Block + threadIdx.x; t < total;
       t += static_cast<index_t>(gridDim.x) * Block) {
    const index_t column = t % columns, split = t / columns;
    const T* __restrict__ xc = x + (column / inner) * outer_stride + column % inner;
    State s = Stat::start();
    index_t j = split * piece;
    const index_t end = j + piece < len ? j + piece : len;
    for (; j + Unroll <= end; j += Unroll) {
      T v[Unroll];
      index_t at[Unroll];
#pragma unroll
      for (int u = 0; u < Unroll; ++u) {
        v[u] = xc[(j + u) * inner];
        at[u] = j + u;
      }
      Stat::template visit_run<Unroll>(s, v, at);
    }
    for (; j < end; ++j) Stat::visit(s, xc[j * inner], j);
    out[t] = s;
  }
}

// A State written by another block of the running grid, loaded from L2 (ld.global.cg): L1 is not kept
// coherent between SMs within a launch.
template <class S>
__device__ __forceinline__ S load_from_l2(const S* p) {
  static_assert(sizeof(S) % 4 == 0, "States are whole 32-bit words");
  union {
    S state;
    unsigned words[sizeof(S) / 4];
  } u;
  const unsigned* w = reinterpret_cast<const unsigned*>(p);
#pragma unroll
  for (int k = 0; k < static_cast<int>(sizeof(S) / 4); ++k) u.words[k] = __ldcg(w + k);
  return u.state;
}

template <bool FromThisGrid, class S>
__device__ __forceinline__ S load_state(const S* p) {
  if constexpr (FromThisGrid) {
    return load_from_l2(p);
  } else {
    return *p;
  }
}

// p[k * stride] for k < splits merged by one block in a fixed order: thread t merges k = t, t + Block, ...
// in turn, then the threads merge as block_merge does (thread 0's result); every thread calls it. A
// thread's States are loaded up to four at a time, all in flight before its first merge: stats_whole's
// last block merges a few States per thread (528 at 2^26 elements on 132 SMs: two or three each), and
// one L2 load after another is part of the tail that the one launch adds after its streaming part
// (argmax / any of float32 at 2^26: 0.910-0.911 / 0.991-0.992 -> 0.919-0.920 / 0.995-0.998 x copy, H200). Except
// stats_whole's moments (32-byte States): four of them in flight spilled in its last block (ptxas,
// sm_90, 64 registers) and var of float32 at 2^26 fell 0.894 -> 0.882 x copy, so they load one at a time.
// ``FromThisGrid`` (stats_whole's last block): the States were written by other blocks of the running
// grid, so they are loaded from L2. The order is the same either way.
template <class Stat, int Block, bool FromThisGrid>
__device__ __forceinline__ typename Stat::State merge_in_block(const typename Stat::State* p, index_t splits,
                                                               index_t stride) {
  typedef typename Stat::State State;
  State s = Stat::start();
  if constexpr (FromThisGrid && sizeof(State) > 16) {
    for (index_t k = threadIdx.x; k < splits; k += Block) s = Stat::merge(s, load_from_l2(p + k * stride));
    return block_merge<Stat, Block>(s);
  }
  for (index_t k = threadIdx.x; k < splits; k += 4 * Block) {
    const bool has_b = k + Block < splits, has_c = k + 2 * Block < splits, has_d = k + 3 * Block < splits;
    const State a = load_state<FromThisGrid>(p + k * stride);
    const State b = has_b ? load_state<FromThisGrid>(p + (k + Block) * stride) : a;
    const State c = has_c ? load_state<FromThisGrid>(p + (k + 2 * Block) * stride) : a;
    const State d = has_d ? load_state<FromThisGrid>(p + (k + 3 * Block) * stride) : a;
    s = Stat::merge(s, a);
    if (has_b) s = Stat::merge(s, b);
    if (has_c) s = Stat::merge(s, c);
    if (has_d) s = Stat::merge(s, d);
  }
  return block_merge<Stat, Block>(s);
}

// Output o merges parts[o * output_stride + k * split_stride] for k < splits (splits >= 1) and writes
// states[o] and/or result[o] (either may be null). A grid of at least ``outputs`` blocks gives each
// output a block: a whole row's hundreds of States then load a few per thread, all in flight, where one
// warp's lanes would wait on one L2 load after another (12 us of a 80 us argmax at 2^26 on an H200).
// A smaller grid gives each output a warp.
template <class Stat, int Block>
__global__ void __launch_bounds__(Block) stats_fold(const typename Stat::State* __restrict__ parts, index_t outputs,
                                                    index_t splits, index_t split_stride, index_t output_stride,
                                                    typename Stat::State* __restrict__ states,
                                                    typename Stat::Out* __restrict__ result, double ddof, int mode) {
  typedef typename Stat::State State;
  if (gridDim.x >= outputs) {
    const index_t o = blockIdx.x;  // the grid's spare blocks return together: the barrier is per block
    if (o >= outputs) return;
    const State s = merge_in_block<Stat, Block, false>(parts + o * output_stride, splits, split_stride);
    if (threadIdx.x == 0) {
      if (states) states[o] = s;
      if (result) result[o] = Stat::result(s, ddof, mode);
    }
    return;
  }
  const int lane = threadIdx.x % kWarp;
  const index_t warps = static_cast<index_t>(gridDim.x) * (Block / kWarp);
  for (index_t o = static_cast<index_t>(blockIdx.x) * (Block / kWarp) + threadIdx.x / kWarp; o < outputs;
       o += warps) {
    const State* p = parts + o * output_stride;
    State s = p[(lane < splits ? lane : 0) * split_stride];
    for (index_t k = lane + kWarp; k < splits; k += kWarp) s = Stat::merge(s, p[k * split_stride]);
    s = warp_merge<Stat>(s, splits < kWarp ? static_cast<int>(splits) : kWarp);
    if (lane == 0) {
      if (states) states[o] = s;
      if (result) result[o] = Stat::result(s, ddof, mode);
    }
  }
}

// stats_whole's last block: every block's State merged as stats_fold's block per output merges them,
// the final value written, the arrivals counter put back to 0. Not inlined: the merge (a division per
// moments merge) would otherwise take registers from the streaming loop of every block (a float32
// variance at 2^26 elements fell from 0.87 to 0.77 x copy so, with its spills in that loop).
template <class Stat, int Block>
__device__ __noinline__ void whole_last_block(const typename Stat::State* parts, int count, unsigned* arrivals,
                                              typename Stat::Out* result, double ddof, int mode) {
  const typename Stat::State all = merge_in_block<Stat, Block, true>(parts, count, 1);
  if (threadIdx.x == 0) {
    result[0] = Stat::result(all, ddof, mode);
    *arrivals = 0u;
  }
}

// A whole contiguous array of ``len`` elements to its final value in one launch (the last-block guard of
// the reduction ladder): block b writes its share's State to parts[b] and takes a ticket; the block that
// takes the last one merges parts[0 .. gridDim.x) as stats_fold would (the same bits as stats_rows then
// stats_fold) and puts ``arrivals`` back to 0 for the next launch on the stream (launches on one stream
// run in order, so one counter serves them all). MinBlocks: the blocks per SM the host's grid assumes
// resident.
template <class Stat, int Block, int Unroll, int MinBlocks>
__global__ void __launch_bounds__(Block, MinBlocks) stats_whole(const typename Stat::Elem* __restrict__ x, index_t len,
                                                                typename Stat::State* parts, unsigned* arrivals,
                                                                typename Stat::Out* __restrict__ result, double ddof,
                                                                int mode) {
  __shared__ bool last;
  const typename Stat::State s = row_share<Stat, Block, Unroll>(x, len, 0, blockIdx.x, gridDim.x);
  if (threadIdx.x == 0) {
    parts[blockIdx.x] = s;
    __threadfence();  // this block's State is visible to every block before its ticket is taken
    last = atomicAdd(arrivals, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  whole_last_block<Stat, Block>(parts, gridDim.x, arrivals, result, ddof, mode);
}

}  // namespace mr
