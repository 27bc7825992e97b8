// multireduce: exact (correctly rounded) inclusive cumulative sums of float16/float32/float64 rows on the GPU.
// Included by exact.cuh (it uses its Banks, Expansion, visit_range, propagate_carries and round_words).
//
// Every output is the exact prefix sum rounded once, half to even, to the output format, with NaN/+-inf as
// exact.py's host scan (_exact_scan_1d) places them. Rows are cut into tiles of Block * Items elements.
//
//   pass 1   exact_tile_words: one warp per tile computes the tile's exact sum as kWords words (the exact
//            sum kernel's expansions and digit banks) plus its NaN/+inf/-inf counts (0 or 1): kTileOut
//            int64 per tile, written with plain stores.
//   carries  an int64 inclusive cumsum of those words along the slots of a row (exact_words_cumsum, in place:
//            integer adds, so exact and independent of the order; every word but the top is a digit in
//            [0, 2^32), so 2^31 tiles stay below 2^63). The counts scan alongside: count > 0 is the OR.
//            A row's slot 0 holds the row's incoming carry (the exact total and flag counts of whatever
//            came before the row: the earlier chunks of a Dask array; zero otherwise) in the same form,
//            and tile k slot k + 1, so the cumsum at slot k is everything before tile k, carry included,
//            and every later step treats the row's first tile like any other.
//   seeds    exact_scan_seeds: tile t's carry (the cumsum at its carry_slot) as a double-double (hi, lo)
//            with a bound eb on |carry - hi - lo| (0 when the carry fits the 106 bits), and the carried flags.
//   pass 2   exact_scan_tiles: one block per tile, scanned tile-wide under one rigorous bound per thread:
//            in plain double for float16/float32 elements and outputs (block_exclusive_sum, fast_bound), in
//            double-double where the elements or the outputs are float64 (block_exclusive_sum of pairs,
//            pair_bound); each output is proved from it, and a tile all of whose outputs are proved is done.
//   retry    exact_scan_retry: every other tile on the Partial path: each thread sums its Items
//            consecutive elements as a Partial (double-double + bound; float16/float32 elements within a provably exact exponent
//            spread as one plain double sum: thread_partial), the block scans the Partials (warp shuffles,
//            then the warp totals), and each thread's exact prefix is seed + its exclusive prefix. For
//            float16/float32 elements and outputs the thread first tries the fast path (approximate_outputs):
//            a plain double running sum from the prefix's hi with a rigorous bound on its distance to the
//            exact prefix, proving each output by rounding both ends of that interval. If any output of the
//            thread is not proved (or NaN/inf are involved), or for float64, it writes all its outputs on
//            the exact path (exact_outputs): a running Partial advanced by TwoSums, writing each output whose
//            rounding the bound proves; an output it cannot prove gets a sentinel NaN payload, and the tile
//            is marked.
//   fallback exact_scan_fallback: for each marked tile only, one thread walks the tile with the carry's
//            exact words, adding every element into them, and rounds the words (round_words, exact.py's
//            rounding bit for bit) wherever it finds the sentinel. Launched always with a fixed grid: no
//            host round trip, nothing to do when no tile is marked.
//
// The bound. A Partial (hi, lo, eb) stands for a real V with |V - hi - lo| <= eb, hi = RN(hi + lo). Adding
// an element x, or another Partial, uses only TwoSum steps (exact, absent overflow: magnitudes are kept
// below 2^kTrack, past which eb becomes +inf) and one addition of the two low parts whose rounding error
// is itself obtained exactly by a TwoSum and added to eb with upward rounding (__dadd_ru). So eb stays a
// rigorous bound, and it is exactly 0 while the prefix fits a double-double: then hi + lo IS the exact
// prefix and ties are decided exactly (float32 integer data around 2^24, float16 around 2^11, float64
// sums one bit too long). A rounding is proved when both rounding midpoints of the candidate are farther
// from hi + lo than eb, the distances computed with downward rounding (__dsub_rd, __dadd_rd), so the
// comparison errs only towards a fallback. The fast path's bound (approximate_outputs) starts at the exact
// prefix's |lo| + eb and adds each double addition's rounding error bound upward, so it is rigorous too.
// The output is then the correctly rounded value whatever the path, so the result is bitwise exact.py's
// and does not depend on the tile, the block, the path or the schedule.
//
// float32 inputs are converted through to_double (subnormals from their bits: CuPy's NVRTC compiles with
// -ftz=true) and outputs written through FromRounded (bit operations), as the exact sum kernel does.
#pragma once

namespace mr {
namespace exact {

constexpr int kTileOut = kWords + 3;  // a tile's words, then its NaN, +inf and -inf counts (0 or 1)
constexpr double kTrack = 0x1p1000;   // |prefix| or |element| past this: eb = inf (TwoSum could overflow)
constexpr int kScanMinBlocks = 3;     // pass 2: resident blocks per SM asked of ptxas (<= 85 registers at 256 threads);
                                      // exact_scan_tiles' default MinBlocks (benchmarks/sweep_exact_scan.py sweeps it)

// Words slots: each row of ``tiles`` tiles owns tiles + 1 slots of kTileOut, its carry first (see "carries").
// Tile t (of all rows, row-major) is written at tile_slot(t); the cumsum at carry_slot(t) is its carry.
__device__ __forceinline__ index_t carry_slot(index_t t, index_t tiles) { return t + t / tiles; }
__device__ __forceinline__ index_t tile_slot(index_t t, index_t tiles) { return carry_slot(t, tiles) + 1; }

struct Partial {
  double hi, lo, eb;
  unsigned long long flags;
};

__device__ __forceinline__ double positive_inf() { return __longlong_as_double(0x7ff0000000000000ll); }
__device__ __forceinline__ double quiet_nan() { return __longlong_as_double(0x7ff8000000000000ll); }

__device__ __forceinline__ Partial partial_zero() {
  Partial p;
  p.hi = 0.0;
  p.lo = 0.0;
  p.eb = 0.0;
  p.flags = 0ull;
  return p;
}

// s + e == a + b exactly (Knuth), unless an operation overflows.
__device__ __forceinline__ void two_sum(double a, double b, double& s, double& e) {
  s = __dadd_rn(a, b);
  const double bv = __dsub_rn(s, a);
  e = __dadd_rn(__dsub_rn(a, __dsub_rn(s, bv)), __dsub_rn(b, bv));
}

// p += x: a finite x into the double-double, inf/NaN into the flags (NaN ignored when ``skipnan``).
__device__ __forceinline__ void partial_add(Partial& p, double x, bool skipnan) {
  const unsigned long long bits = static_cast<unsigned long long>(__double_as_longlong(x));
  const int field = static_cast<int>((bits >> 52) & 0x7ff);
  if (field == 0x7ff) {
    if (bits & ((1ull << 52) - 1)) {
      if (!skipnan) p.flags |= kNan;
    } else {
      p.flags |= (bits >> 63) ? kNinf : kPinf;
    }
    return;
  }
  if (field >= 1023 + 1000) {  // |x| >= kTrack
    p.eb = positive_inf();
    return;
  }
  double s, e, t, et;
  two_sum(p.hi, x, s, e);
  two_sum(p.lo, e, t, et);  // the one inexact step: its error et, exactly
  two_sum(s, t, p.hi, p.lo);
  p.eb = __dadd_ru(p.eb, fabs(et));
  if (!(fabs(p.hi) < kTrack)) p.eb = positive_inf();
}

// a + b (a holds the earlier elements; the flags OR).
__device__ __forceinline__ Partial partial_combine(const Partial& a, const Partial& b) {
  Partial r;
  r.flags = a.flags | b.flags;
  double s, e, t1, e1, t2, e2;
  two_sum(a.hi, b.hi, s, e);
  two_sum(a.lo, b.lo, t1, e1);
  two_sum(t1, e, t2, e2);
  two_sum(s, t2, r.hi, r.lo);  // V = s + t2 + e1 + e2 exactly
  r.eb = __dadd_ru(__dadd_ru(__dadd_ru(a.eb, b.eb), fabs(e1)), fabs(e2));
  if (!(fabs(r.hi) < kTrack)) r.eb = positive_inf();
  return r;
}

// A carry (kTileOut words: kWords words of units 2^-1074, then the NaN/+inf/-inf counts) as a Partial: hi
// the top 53 bits, lo the next 53 bit positions (both truncated, then renormalized by a TwoSum: exact), eb
// one unit of lo's last position when any bit lies below it, else 0; eb = inf past kTrack.
__device__ __forceinline__ Partial seed_of_words(const long long* w, bool skipnan) {
  Partial p = partial_zero();
  p.flags = ((w[kWords] != 0 && !skipnan) ? kNan : 0ull) | (w[kWords + 1] != 0 ? kPinf : 0ull) |
            (w[kWords + 2] != 0 ? kNinf : 0ull);
  unsigned d[kWords];
  bool negative = false;
  if (words_to_digits(w, d, negative) != 0) {
    p.eb = positive_inf();
    return p;
  }
  int top = kWords - 1;
  while (top >= 0 && d[top] == 0u) --top;
  if (top < 0) return p;
  const int msb = 32 * top + highest_bit(d[top]);
  if (msb - 1074 >= 1000) {
    p.eb = positive_inf();
    return p;
  }
  const int hs = msb >= 52 ? msb - 52 : 0;
  double hi = ldexp(static_cast<double>(digit_bits(d, hs, msb - hs + 1)), hs - 1074);
  double lo = 0.0, eb = 0.0;
  if (hs > 0) {
    const int ls = hs >= 53 ? hs - 53 : 0;
    lo = ldexp(static_cast<double>(digit_bits(d, ls, hs - ls)), ls - 1074);
    if (any_below(d, ls)) eb = ldexp(1.0, ls - 1074);
  }
  if (negative) {
    hi = -hi;
    lo = -lo;
  }
  two_sum(hi, lo, p.hi, p.lo);
  p.eb = eb;
  return p;
}

// ---- proving a rounding ---------------------------------------------------------------------------------
template <class Out> struct Format;
template <> struct Format<half> {
  static constexpr int kPrecision = 11, kEmin = -14, kEmax = 15;
};
template <> struct Format<float> {
  static constexpr int kPrecision = 24, kEmin = -126, kEmax = 127;
};
template <> struct Format<double> {
  static constexpr int kPrecision = 53, kEmin = -1022, kEmax = 1023;
};

__device__ __forceinline__ int exponent_of(double a) {  // floor(log2 a) of a normal positive double
  return static_cast<int>((static_cast<unsigned long long>(__double_as_longlong(a)) >> 52) & 0x7ff) - 1023;
}

// a (finite, >= 0) rounded to nearest, half to even, to a P-bit format of smallest normal exponent Emin
// (float16/32 only), as a double: exact, possibly past the format's largest finite (the caller clamps).
template <int P, int Emin>
__device__ __forceinline__ double round_magnitude(double a) {
  const unsigned long long b = static_cast<unsigned long long>(__double_as_longlong(a));
  const int field = static_cast<int>(b >> 52);
  if (field == 0) return 0.0;  // below 2^-1022: far below half the smallest float32 subnormal
  const int e = field - 1023;
  const unsigned long long mant = (b & ((1ull << 52) - 1)) | (1ull << 52);  // a = mant 2^(e - 52)
  const int q = (e > Emin ? e : Emin) - (P - 1);                             // the ulp's exponent
  const int shift = q - (e - 52);                                            // >= 53 - P
  if (shift > 54) return 0.0;  // a < 2^(q - 2)
  unsigned long long m = mant >> shift;
  const unsigned long long rem = mant & ((1ull << shift) - 1), half_unit = 1ull << (shift - 1);
  if (rem > half_unit || (rem == half_unit && (m & 1ull))) ++m;
  return ldexp(static_cast<double>(m), q);
}

// Half the gap from a format value c >= 0 to its neighbour above / below (c = 0: the smallest subnormal's).
template <int P, int Emin>
__device__ __forceinline__ double half_gap_up(double c) {
  const int e = c == 0.0 ? Emin : exponent_of(c);
  return ldexp(1.0, (e > Emin ? e : Emin) - (P - 1) - 1);
}
template <int P, int Emin>
__device__ __forceinline__ double half_gap_down(double c) {
  if (c == 0.0) return half_gap_up<P, Emin>(c);
  const int e = exponent_of(c);
  const bool power = (static_cast<unsigned long long>(__double_as_longlong(c)) & ((1ull << 52) - 1)) == 0ull;
  return ldexp(1.0, (e > Emin ? e : Emin) - (P - 1) - ((power && e > Emin) ? 2 : 1));
}
// The rounding of the Partial's value to Out as a double Out holds exactly (or +-inf), when the bound
// proves it; false: fall back to the exact words.
template <class Out>
__device__ __forceinline__ bool proved_rounding(const Partial& r, double& out) {
  constexpr int P = Format<Out>::kPrecision, Emin = Format<Out>::kEmin, Emax = Format<Out>::kEmax;
  const double inf = positive_inf();
  if (!(r.eb < inf)) return false;
  const double a = fabs(r.hi);
  const double l = r.hi < 0.0 ? -r.lo : r.lo;  // V's magnitude is a + l (+- eb)
  if constexpr (P == 53) {
    if (r.eb == 0.0) {  // hi + lo is exact and hi = RN(hi + lo): the correctly rounded value itself
      out = r.hi == 0.0 ? 0.0 : r.hi;
      return true;
    }
    if (!(a >= 0x1p-968)) return false;  // near zero (or float64 subnormal): the words decide
    // half the gaps are the powers 2^(e - 53) and, below a power of two, 2^(e - 54): normal doubles
    // (e >= -968), built from their exponent field rather than by ldexp
    const int e = exponent_of(a);
    const bool power = (static_cast<unsigned long long>(__double_as_longlong(a)) & ((1ull << 52) - 1)) == 0ull;
    const double up = __longlong_as_double(static_cast<long long>(e - 53 + 1023) << 52);
    const double down = power ? 0.5 * up : up;
    if (__dsub_rd(up, l) > r.eb && __dadd_rd(down, l) > r.eb) {
      out = r.hi;
      return true;
    }
    return false;
  } else {
  if (a == 0.0) {  // then lo == 0
    if (r.eb != 0.0) return false;
    out = 0.0;  // an exact zero prefix is +0.0
    return true;
  }
  const double over = ldexp(1.0, Emax + 1);  // the first magnitude past the format: rounds to inf
  double c, gap_up, gap_down;  // the candidate and half the gaps to its neighbours
  if (P == 24 && a >= 0x1p-125 && a < 0x1p127) {
    // float32 away from its subnormals and its overflow: the hardware's rounding and the neighbours' bits
    // give what round_magnitude and the half gaps (three ldexp: most of pass 2's time) give. The
    // candidate and its neighbours are normal floats, which convert exactly under -ftz=true, and their
    // sums and halves are exact in double.
    const float cf = __double2float_rn(a);
    const unsigned bits = bit_cast<unsigned>(cf);
    c = static_cast<double>(cf);
    gap_up = 0.5 * (static_cast<double>(bit_cast<float>(bits + 1u)) - c);
    gap_down = 0.5 * (c - static_cast<double>(bit_cast<float>(bits - 1u)));
  } else {
    c = round_magnitude<P, Emin>(a);
    if (c > over) c = over;
    gap_up = c == over ? inf : half_gap_up<P, Emin>(c);
    gap_down = half_gap_down<P, Emin>(c);
  }
  const double mid_up = c + gap_up;
  const double mid_down = c - gap_down;
  if (a == mid_up || a == mid_down) {  // hi on a midpoint: c is its even side, lo says which side V is on
    const bool at_up = a == mid_up;
    const double toward = at_up ? l : -l;  // > 0: V lies past the midpoint, away from c
    if (__dsub_rd(toward, r.eb) > 0.0) {
      c = at_up ? c + 2.0 * gap_up : c - 2.0 * gap_down;
    } else if (!(__dsub_rd(-toward, r.eb) > 0.0 || (toward == 0.0 && r.eb == 0.0))) {
      return false;  // an exact tie (toward == 0, eb == 0) keeps the even c
    }
  } else {
    const double up = mid_up == inf ? inf : __dsub_rd(__dsub_rd(mid_up, a), l);
    const double down = __dadd_rd(__dsub_rd(a, mid_down), l);
    if (!(up > r.eb && down > r.eb)) return false;
  }
  if (c == 0.0 && !(__dadd_rd(a, l) > r.eb)) return false;  // the sign of a zero result must be known
  out = c >= over ? inf : c;
  if (r.hi < 0.0) out = -out;
  return true;
  }
}

// NaN/+-inf of the flags as exact.py's scan: true (and the value) when they decide the output.
__device__ __forceinline__ bool special_output(unsigned long long flags, double& out) {
  if (!flags) return false;
  const bool pinf = (flags & kPinf) != 0, ninf = (flags & kNinf) != 0;
  if ((flags & kNan) || (pinf && ninf)) {
    out = quiet_nan();
  } else {
    out = pinf ? positive_inf() : -positive_inf();
  }
  return true;
}

// The mark pass 2 leaves on an output it could not prove: a signalling-NaN payload no rounding produces.
template <class Out> struct Sentinel;
template <> struct Sentinel<half> {
  __device__ __forceinline__ static half value() { return half{0x7d0bu}; }
  __device__ __forceinline__ static bool is(half v) { return v.bits == 0x7d0bu; }
};
template <> struct Sentinel<float> {
  __device__ __forceinline__ static float value() { return bit_cast<float>(0x7fa00badu); }
  __device__ __forceinline__ static bool is(float v) { return bit_cast<unsigned>(v) == 0x7fa00badu; }
};
template <> struct Sentinel<double> {
  __device__ __forceinline__ static double value() { return bit_cast<double>(0x7ff4000000000badull); }
  __device__ __forceinline__ static bool is(double v) { return bit_cast<unsigned long long>(v) == 0x7ff4000000000badull; }
};

// The output of one element given the running Partial after it: false (and the sentinel) when unproved.
template <class Out>
__device__ __forceinline__ bool element_output(const Partial& run, Out& o) {
  double v;
  if (special_output(run.flags, v) || proved_rounding<Out>(run, v)) {
    o = FromRounded<Out>::apply(v);
    return true;
  }
  o = Sentinel<Out>::value();
  return false;
}

// ---- pass 2, one thread's Items elements ---------------------------------------------------------------
__device__ __forceinline__ int padded(int i) { return i + (i >> 5); }  // shared staging without bank conflicts

__host__ __device__ constexpr int ceil_log2(int n) { return n <= 1 ? 0 : 1 + ceil_log2((n + 1) / 2); }

__device__ __forceinline__ int lowest_bit(unsigned long long v) {  // v != 0
#ifdef __CUDA_ARCH__
  return __ffsll(static_cast<long long>(v)) - 1;
#else
  return __builtin_ctzll(v);
#endif
}

// The exponent of the lowest set bit of a nonzero double: it is a multiple of 2^lowest_unit(d).
__device__ __forceinline__ int lowest_unit(double d) {
  const unsigned long long bits = static_cast<unsigned long long>(__double_as_longlong(d)) << 1 >> 1;
  const int field = static_cast<int>(bits >> 52);
  const unsigned long long mantissa = (bits & ((1ull << 52) - 1)) | (field ? 1ull << 52 : 0ull);
  return (field ? field : 1) - 1075 + lowest_bit(mantissa);
}

// The biased double exponents of the largest and the smallest nonzero |value| of a thread's float16/float32
// elements (top 0x7ff: an inf/NaN among them; all zero: top 0, bottom 0x7ff). A nonzero float16/float32 is
// a normal double, so the high word of its double (exponent field, top mantissa bits) is nonzero and its
// exponent field is the value's exponent e = floor(log2 |value|).
struct Span {
  int top, bottom;
};
template <int Items>
__device__ __forceinline__ Span exponent_span(const double* v) {
  constexpr unsigned kSpecial = 0x7ff00000u;  // the high word of inf, the least of NaN's
  unsigned top = 0u, bottom = kSpecial;
#pragma unroll
  for (int j = 0; j < Items; ++j) {
    const unsigned h =
        static_cast<unsigned>(static_cast<unsigned long long>(__double_as_longlong(v[j])) >> 32) & 0x7fffffffu;
    top = h > top ? h : top;
    const unsigned nonzero = h ? h : kSpecial;
    bottom = nonzero < bottom ? nonzero : bottom;
  }
  Span s;
  s.top = static_cast<int>(top >> 20);
  s.bottom = static_cast<int>(bottom >> 20);
  return s;
}

// The exponent of a power of two that divides every element of the span (T = float16/float32): a value of
// T with exponent e is an integer multiple of 2^(max(e, Emin) - P + 1) (P, Emin: T's precision and smallest
// normal exponent; a subnormal is a multiple of 2^(Emin - P + 1)), so each is a multiple of the smallest
// exponent's unit. Past 1000 when every element is zero (no constraint).
template <class T>
__device__ __forceinline__ int unit_exponent(const Span& s) {
  const int e = s.bottom - 1023;
  return (e > Format<T>::kEmin ? e : Format<T>::kEmin) - Format<T>::kPrecision + 1;
}

// The Partial of the thread's elements v[0..Items) (zeros past the row), the block scan's input. float16
// and float32 values whose exponents lie close enough are summed in plain double, exactly: all are
// multiples of u = 2^unit_exponent, and every partial sum of at most Items of them is a multiple of u below
// Items 2^(top + 1), fewer than 2^(top - max(bottom, Emin) + P + ceil_log2(Items)) units of u (top, bottom:
// the span's unbiased exponents). A double holds that exactly when top - max(bottom, Emin) is at most 53 - P
// - ceil_log2(Items) (float32, 16 items: 25 binades; float16, 16 items: 38, more than float16's whole span
// of 29), and u >= 2^-149 is far above the double subnormals, so no addition rounds: the Partial (sum, 0, 0)
// is exact. Otherwise (a wider spread, inf/NaN, float64 input) partial_add's TwoSums.
template <class T, int Items>
__device__ __forceinline__ Partial thread_partial(const double* v, const Span& span, bool skipnan) {
  Partial p = partial_zero();
  if constexpr (sizeof(T) <= 4) {
    constexpr int kSpread = 53 - Format<T>::kPrecision - ceil_log2(Items);
    const int low = unit_exponent<T>(span) + Format<T>::kPrecision - 1;  // max(bottom, Emin), unbiased
    if (span.top != 0x7ff && span.top - 1023 - low <= kSpread) {
      double sum = 0.0;
#pragma unroll
      for (int j = 0; j < Items; ++j) sum = __dadd_rn(sum, v[j]);
      p.hi = sum;
      return p;
    }
  }
#pragma unroll
  for (int j = 0; j < Items; ++j) partial_add(p, v[j], skipnan);
  return p;
}

// A double rounded to nearest, half to even, to float16 bits by the hardware (cvt.rn.f16.f64, as inline PTX,
// which -ftz=true leaves alone: float16 subnormals come out exact). The emulator (no __CUDA_ARCH__) rounds
// with round_magnitude, the same rounding.
__device__ __forceinline__ unsigned short double_to_half_bits(double a) {
#ifdef __CUDA_ARCH__
  unsigned short h;
  asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(a));
  return h;
#else
  const double m = round_magnitude<11, -14>(fabs(a));
  return Convert<half, double>::apply(__double_as_longlong(a) < 0 ? -m : m).bits;
#endif
}

// One float16/float32 output from a double a known to lie within u of the exact prefix: true (and o) when
// every real within u of a rounds to the same Out, false (and the sentinel) when not, or a is inf/NaN.
// a - u rounded down and a + u rounded up both round to the same Out value, so by the monotonicity of
// rounding to nearest every real between them does (a tie included: u = 0 is the exact prefix, and the
// conversion rounds it half to even; ends of opposite signs or zeros differ). float32 only where |a| >=
// 2^-125, clear of the float32 subnormals the conversion flushes under -ftz=true (a flushed end differs
// from the other, normal one); float16 wherever a != 0. Elsewhere (an exact zero prefix is +0.0, float32
// near zero) proved_rounding of the Partial (a, 0, u) decides.
template <class Out>
__device__ __forceinline__ bool approximation_output(double a, double u, Out& o) {
  o = Sentinel<Out>::value();
  if (!(fabs(a) < kTrack)) return false;  // inf/NaN entered the sum: the exact path sets the flags
  const double below = __dsub_rd(a, u), above = __dadd_ru(a, u);
  if constexpr (sizeof(Out) == 4) {
    if (fabs(a) >= 0x1p-125) {
      const float b = __double2float_rn(below), t = __double2float_rn(above);
      if (bit_cast<unsigned>(b) != bit_cast<unsigned>(t)) return false;
      o = b;
      return true;
    }
  } else {
    if (a != 0.0) {
      const unsigned short b = double_to_half_bits(below);
      if (b != double_to_half_bits(above)) return false;
      o = half{b};
      return true;
    }
  }
  Partial p = partial_zero();
  p.hi = a;
  p.eb = u;
  double r;
  if (!proved_rounding<Out>(p, r)) return false;
  o = FromRounded<Out>::apply(r);
  return true;
}

// The fast path, for float16/float32 elements and outputs: the thread's outputs res[padded(first + j)]
// from a plain double running sum a, started at run.hi, and a bound u on |a - exact prefix|, started at
// |run.lo| + run.eb (rounded up). Each addition adds its rounding error's bound h to u (upward):
//   - h = 0 when |a| < 2^53 g, g a power of two dividing run.hi and every element: then every running sum
//     is a multiple of g (a rounded one is at least 2^53 g, whose ulp is a multiple of g), and a sum below
//     2^53 g, which rounding to nearest cannot take to 2^53 g or past it, is held exactly. So integers,
//     float16 data and whatever fits 53 bits keep u = 0, and their ties are decided exactly;
//   - else h = |a| 2^-53 rounded to nearest: at least half an ulp of a, a power of two (or 0 when |a| <
//     2^-1021, where every sum is exact) that no rounding of |a| 2^-53 goes below, and half an ulp bounds
//     the addition's error.
// A float32 output is proved unless a lies within u of a rounding midpoint, about 2^-24 |a| apart, where u
// stays below (|run.hi| + the Items running sums) 2^-53 + u's start. True when every output was proved;
// false when one was not, or the prefix carries NaN/inf flags (special_output, on the exact path), or T or
// Out is float64 (no double approximation can prove a 53-bit rounding; float64 elements would need their
// 53-bit units): the caller then overwrites all of them with exact_outputs.
template <class T, class Out, int Items>
__device__ __forceinline__ bool approximate_outputs(const Partial& run, const double* v, const Span& span,
                                                    int first, int len, Out* res) {
  if constexpr (sizeof(T) == 8 || sizeof(Out) == 8) {
    return false;
  } else {
    if (run.flags) return false;
    int unit = unit_exponent<T>(span);  // then the exponent of g, and 2^53 g as a double (inf past 2^1023)
    if (run.hi != 0.0) {
      const int hi_unit = lowest_unit(run.hi);
      unit = hi_unit < unit ? hi_unit : unit;
    }
    const double exact_below = unit + 53 > 1023 ? positive_inf()
                                                : __longlong_as_double(static_cast<long long>(unit + 53 + 1023) << 52);
    double a = run.hi, u = __dadd_ru(fabs(run.lo), run.eb);
    bool proved = true;
#pragma unroll
    for (int j = 0; j < Items; ++j) {
      if (first + j < len) {
        a = __dadd_rn(a, v[j]);
        if (!(fabs(a) < exact_below)) u = __dadd_ru(u, fabs(a) * 0x1p-53);
        Out o;
        proved = approximation_output<Out>(a, u, o) && proved;
        res[padded(first + j)] = o;
      }
    }
    return proved;
  }
}

// The exact path: the thread's outputs from run (the exact Partial of everything before its first element)
// advanced by partial_add's TwoSums; returns how many outputs it left as sentinels (unproved).
template <class Out, int Items>
__device__ __forceinline__ int exact_outputs(Partial run, const double* v, int first, int len, bool skipnan,
                                             Out* res) {
  int unproved = 0;
#pragma unroll
  for (int j = 0; j < Items; ++j) {
    if (first + j < len) {
      partial_add(run, v[j], skipnan);
      Out o;
      if (!element_output<Out>(run, o)) ++unproved;
      res[padded(first + j)] = o;
    }
  }
  return unproved;
}

// ---- pass 2's tile-wide path: the tile scanned in plain double under one bound per thread ---------------
// The Partial path (thread_partial, block_exclusive, approximate_outputs or exact_outputs) spends about a
// hundred instructions per element, most of them in the block scan: each combination of two Partials is
// four TwoSums and a bound. For float16/float32 elements and outputs pass 2 scans the tile in plain double
// (each thread's sum, the same Kogge-Stone tree as block_exclusive over those sums, the seed's hi added
// once) and covers every rounding of that scan with one bound U per thread; each output is then proved as
// approximate_outputs proves it (approximation_output). A tile all of whose outputs are proved is done.
// Otherwise (U infinite: the seed carries NaN/inf flags or lies past kTrack, or an element is inf/NaN; or
// one output unproved) the tile is marked and exact_scan_retry runs the Partial path on it. Both write only
// correctly rounded prefixes, so the bits do not depend on which path a tile took.
//
// The bound, per thread. Every element of the tile has magnitude below 2^E (E: one past the tile's largest
// exponent), so the elements before the thread's first (index ``first`` in the tile) sum in magnitude to at
// most S = first 2^E, and every sum of the tile scan that reaches the thread's prefix is a sum over some of
// them: at most S plus its own rounding errors. An addition's rounding error is at most |result| 2^-53 (a
// result among the double subnormals is exact). The additions that reach the prefix: the earlier threads'
// sums (together at most Items S 2^-53), the warp scan's 5 levels and the warp totals' at most 5 (each
// level adds sums over disjoint elements: at most S 2^-53 a level) and the warp prefix added to the lane's
// (S 2^-53): at most (Items + 11) S 2^-53 < c S 2^-53 with c = 2^ceil_log2(Items + 12) (32 for 16 items),
// which leaves room for the errors' own growth. The seed's hi added, a0 = RN(seed.hi + prefix), then the
// thread's running values a_j = a0 + its elements are at most m / 2, m = 2 (|a0| + Items 2^e + c S 2^-53)
// (e: one past the thread's largest exponent), and the seed's addition and the Items running ones err by at
// most (Items + 1) (m / 2) 2^-53 <= r m 2^-53 with r = 2^(ceil_log2(Items + 1) - 1) (16 for 16 items). With
// the seed's own |lo| + eb: U = |seed.lo| + seed.eb + c S 2^-53 + r m 2^-53, rounded up. Exactly: every element
// is a multiple of g = 2^unit (unit_exponent of the tile's smallest nonzero magnitude). When S <= 2^53 g no
// sum of the tile scan that reaches the prefix rounds (each is a multiple of g, at most S), and when also
// m <= 2^53 min(g, the lowest bit of seed.hi) neither does a0 nor any running value: then U = |seed.lo| +
// seed.eb, 0 for a carry that fits a double-double, so integer data's ties are decided exactly.

// float16/float32 magnitudes as bits (their order is the values' order) and their formats' fields.
template <class T> struct Magnitude;
template <> struct Magnitude<half> {
  static constexpr int kShift = 10, kBias = 15, kSpecial = 0x1f;
  __device__ __forceinline__ static unsigned of(half v) { return v.bits & 0x7fffu; }
};
template <> struct Magnitude<float> {
  static constexpr int kShift = 23, kBias = 127, kSpecial = 0xff;
  __device__ __forceinline__ static unsigned of(float v) { return bit_cast<unsigned>(v) & 0x7fffffffu; }
};
// float64: the high word of the magnitude (its exponent field and top 20 mantissa bits), which orders the
// magnitudes' exponents (the double-double path reads exponents only); 1 for a subnormal whose bits all lie
// in the low word, so that it still counts as nonzero, of exponent field 0.
template <> struct Magnitude<double> {
  static constexpr int kShift = 20, kBias = 1023, kSpecial = 0x7ff;
  __device__ __forceinline__ static unsigned of(double v) {
    const unsigned long long bits = static_cast<unsigned long long>(__double_as_longlong(v)) << 1 >> 1;
    const unsigned high = static_cast<unsigned>(bits >> 32);
    return high ? high : (bits ? 1u : 0u);
  }
};

// An element as the fast path stages it: a NaN as zero where NaNs are skipped (nancumsum), which gives the
// same prefixes, since a skipped NaN adds nothing to the exact sum and an exact zero prefix is +0.0 either way.
template <class T>
__device__ __forceinline__ T staged_element(T v, bool zero_nan) {
  if constexpr (sizeof(T) == 8) {
    return zero_nan && v != v ? 0.0 : v;
  } else {
    constexpr unsigned kInf = static_cast<unsigned>(Magnitude<T>::kSpecial) << Magnitude<T>::kShift;
    return zero_nan && Magnitude<T>::of(v) > kInf ? T{} : v;
  }
}

// The shared slot of element j of the thread whose run starts at tile element ``first`` (a multiple of Items):
// padded(first + j), which is padded(first) + j when Items divides 32 (no run crosses a pad).
template <int Items>
__device__ __forceinline__ int run_slot(int first, int j) {
  if constexpr (32 % Items == 0) {
    return padded(first) + j;
  } else {
    return padded(first + j);
  }
}

// s += v in plain double (the double-double path's add_to takes its pairs).
__device__ __forceinline__ void add_to(double& s, double v) { s = __dadd_rn(s, v); }

// A thread's sum of its staged elements in order (``in``: the tile's slots), in plain double or in pairs
// (Acc: double or DD, added by add_to), the largest magnitude's bits (top) and the smallest nonzero
// magnitude's bits minus one (low; ~0u when all are zero).
template <class Acc, class T, int Items>
__device__ __forceinline__ Acc thread_sum(const T* in, int first, unsigned& top, unsigned& low) {
  Acc s{};
  top = 0u;
  low = ~0u;
#pragma unroll
  for (int j = 0; j < Items; ++j) {
    const T e = in[run_slot<Items>(first, j)];
    const unsigned m = Magnitude<T>::of(e);
    top = m > top ? m : top;
    low = m - 1u < low ? m - 1u : low;
    add_to(s, to_double(e));
  }
  return s;
}

// The exponent g of a power of two that divides every element, from low (the smallest nonzero magnitude's
// bits minus one, ~0u: all zero, then 2000): unit_exponent of that magnitude.
template <class T>
__device__ __forceinline__ int unit_of_low(unsigned low) {
  if (low == ~0u) return 2000;
  const int field = static_cast<int>((low + 1u) >> Magnitude<T>::kShift);
  return (field ? field : 1) - Magnitude<T>::kBias - Format<T>::kPrecision + 1;
}

// Whether every sum over a tile of ``tile`` elements, all of magnitude at most ``top``'s and multiples of
// 2^g, is held exactly by a double: tile 2^(top's exponent + 1) <= 2^(53 + g).
template <class T>
__device__ __forceinline__ bool tile_sums_exact(unsigned top, int g, int tile) {
  const int field = static_cast<int>(top >> Magnitude<T>::kShift);
  return top == 0u || (field ? field : 1) - Magnitude<T>::kBias + 1 + ceil_log2(tile) <= 53 + g;
}

// The least exponent of the lowest set bit over a thread's nonzero elements (~0u when all are zero), biased as
// the format's exponent field: unit_of_low's power of two from the exponents alone is the least element's
// ulp, this one the least lowest bit, which for integer data is 2^0 or more. Computed only for a tile whose
// sums unit_of_low cannot show exact.
template <class T, int Items>
__device__ __forceinline__ unsigned thread_lowest_bits(const T* in, int first) {
  typedef Magnitude<T> M;
  unsigned key = ~0u;
#pragma unroll
  for (int j = 0; j < Items; ++j) {
    const unsigned m = M::of(in[run_slot<Items>(first, j)]);
    const unsigned field = m >> M::kShift;
    const unsigned significand = (m & ((1u << M::kShift) - 1u)) | (1u << M::kShift);  // subnormals: the same
    const unsigned k = (field ? field : 1u) + static_cast<unsigned>(lowest_bit(significand));
    key = m && k < key ? k : key;
  }
  return key;
}

// unit of thread_lowest_bits' least key over a tile (~0u: all zero, then 2000)
template <class T>
__device__ __forceinline__ int unit_of_key(unsigned key) {
  return key == ~0u ? 2000 : static_cast<int>(key) - Magnitude<T>::kBias - Format<T>::kPrecision + 1;
}

// Plain doubles as the block scans below take them (the double-double path overloads these for its pairs):
// the sum of an earlier and a later value, a shuffle up, and a value kept in shared memory (``his``; the
// pairs' low parts go to ``los``).
__device__ __forceinline__ double plus(double earlier, double later) { return __dadd_rn(earlier, later); }
__device__ __forceinline__ double shuffle_up_value(double v, int delta) { return __shfl_up_sync(0xffffffffu, v, delta); }
__device__ __forceinline__ void keep(double* his, double*, int i, double v) { his[i] = v; }
__device__ __forceinline__ void kept(const double* his, const double*, int i, double& v) { v = his[i]; }

// The exclusive prefix of the threads' sums (Acc: double or DD) in thread order, by block_exclusive's tree
// (tools/exact_host_emulator.cpp replays it); top and low become the tile's (the largest of the threads'
// tops, the least of their lows). ``his``, ``los``, ``tops``, ``lows``: Block / 32 entries each.
template <int Block, class Acc>
__device__ __forceinline__ Acc block_exclusive_sum(const Acc& s, unsigned& top, unsigned& low, double* his, double* los,
                                                   unsigned* tops, unsigned* lows) {
  constexpr int Warps = Block / 32;
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  Acc inc = s;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const Acc up = shuffle_up_value(inc, o);
    if (lane >= o) inc = plus(up, inc);
  }
  const unsigned warp_top = __reduce_max_sync(0xffffffffu, top), warp_low = __reduce_min_sync(0xffffffffu, low);
  if (lane == 31) {
    keep(his, los, warp, inc);
    tops[warp] = warp_top;
    lows[warp] = warp_low;
  }
  __syncthreads();
  if (warp == 0) {
    Acc w{};
    if (lane < Warps) kept(his, los, lane, w);
#pragma unroll
    for (int o = 1; o < Warps; o <<= 1) {
      const Acc up = shuffle_up_value(w, o);
      if (lane >= o) w = plus(up, w);
    }
    const unsigned t = __reduce_max_sync(0xffffffffu, lane < Warps ? tops[lane] : 0u);
    const unsigned l = __reduce_min_sync(0xffffffffu, lane < Warps ? lows[lane] : ~0u);
    if (lane < Warps) keep(his, los, lane, w);
    if (lane == 0) {
      tops[0] = t;
      lows[0] = l;
    }
  }
  __syncthreads();
  top = tops[0];
  low = lows[0];
  Acc ex = shuffle_up_value(inc, 1);
  if (lane == 0) ex = Acc{};
  if (warp == 0) return ex;
  Acc before;
  kept(his, los, warp - 1, before);
  return plus(before, ex);
}

// What both tile-wide bounds start from, for the thread whose first element is element ``first`` of its
// tile and whose largest magnitude's bits are ``own``, in a tile whose largest are ``top``: S (``before``:
// the earlier elements' magnitudes at most), Items 2^e (``mine``: the thread's own at most) and 2^E
// (``unit``: above every element's magnitude). False (nothing set) where the tile cannot be proved at all:
// the seed carries flags or an unbounded error, or an element is inf/NaN; the same in every thread.
template <class T, int Items>
__device__ __forceinline__ bool tile_reach(const Partial& seed, unsigned own, unsigned top, int first, double& before,
                                           double& mine, double& unit) {
  static_assert(Items <= 32, "the bounds count at most 32 items a thread (and 32 warps a block, CUDA's most)");
  typedef Magnitude<T> M;
  const int top_field = static_cast<int>(top >> M::kShift), own_field = static_cast<int>(own >> M::kShift);
  if (seed.flags || top_field == M::kSpecial || !(seed.eb < positive_inf())) return false;
  unit = ldexp(1.0, (top_field ? top_field : 1) - M::kBias + 1);
  before = static_cast<double>(first) * unit;
  mine = own ? static_cast<double>(Items) * ldexp(1.0, (own_field ? own_field : 1) - M::kBias + 1) : 0.0;
  return true;
}

// U of the comment above for the thread whose first element is element ``first`` of its tile, whose a0
// is ``a0`` and whose largest magnitude's bits are ``own``, in a tile whose magnitudes' bits are ``top`` at
// most and whose elements are multiples of 2^g (2000: all zero), after ``seed``; +inf, in every thread of
// the tile, where the fast path cannot prove anything (flags, an inf/NaN element, a seed past kTrack or
// with an unbounded error).
template <class T, int Items>
__device__ __forceinline__ double fast_bound(const Partial& seed, double a0, unsigned own, unsigned top, int g,
                                             int first) {
  double before, mine, unit;
  if (!tile_reach<T, Items>(seed, own, top, first, before, mine, unit) || !(fabs(seed.hi) < kTrack)) {
    return positive_inf();
  }
  const double base = __dadd_ru(fabs(seed.lo), seed.eb);
  const bool exact = g > 960 || before <= ldexp(1.0, 53 + g);
  constexpr double kScan = static_cast<double>(1 << ceil_log2(Items + 12)) * 0x1p-53;     // c 2^-53
  constexpr double kRun = static_cast<double>(1 << (ceil_log2(Items + 1) - 1)) * 0x1p-53;  // r 2^-53
  const double scan_error = exact ? 0.0 : __dmul_ru(before, kScan);
  const double m = 2.0 * __dadd_ru(__dadd_ru(fabs(a0), mine), scan_error);
  if (seed.hi != 0.0) {
    const int seed_unit = lowest_unit(seed.hi);
    g = seed_unit < g ? seed_unit : g;
  }
  if (exact && (g > 960 || m <= ldexp(1.0, 53 + g))) return base;
  return __dadd_ru(__dadd_ru(base, scan_error), __dmul_ru(m, kRun));
}

// A tile path's outputs res[run_slot(first, j)] from its staged elements in[run_slot(first, j)] (zeros past
// the row, whose outputs are never stored): run.next(element, output) advances the thread's running value by
// the element and proves the output; true when every output was proved. ``res`` may share ``in``'s memory:
// where T and Out have one size, slot j of each is the same bytes, read by its own thread just before it
// writes them; otherwise every thread reads its elements before a barrier and writes after it, so every
// thread of the block calls this.
template <class T, class Out, int Items, class Run>
__device__ __forceinline__ bool tile_outputs(Run& run, const T* in, Out* res, int first) {
  bool proved = true;
  if constexpr (sizeof(T) == sizeof(Out)) {
#pragma unroll
    for (int j = 0; j < Items; ++j) {
      const int slot = run_slot<Items>(first, j);
      Out o;
      proved = run.template next<Out>(to_double(in[slot]), o) && proved;
      res[slot] = o;
    }
  } else {
    T e[Items];
#pragma unroll
    for (int j = 0; j < Items; ++j) e[j] = in[run_slot<Items>(first, j)];
    __syncthreads();
#pragma unroll
    for (int j = 0; j < Items; ++j) {
      Out o;
      proved = run.template next<Out>(to_double(e[j]), o) && proved;
      res[run_slot<Items>(first, j)] = o;
    }
  }
  return proved;
}

// The fast path's running value: a plain double a (from seed.hi + the thread's exclusive prefix), each
// output proved within u of the exact prefix (approximation_output).
struct PlainRun {
  double a, u;
  template <class Out>
  __device__ __forceinline__ bool next(double v, Out& o) {
    a = __dadd_rn(a, v);
    return approximation_output<Out>(a, u, o);
  }
};

// ---- pass 2's tile-wide double-double path (float64 elements or outputs) --------------------------------
// A float64 prefix needs more than a double to be rounded to float64, so where the elements or the outputs
// are float64 the tile is scanned in double-double: each thread's sum of its elements, the same Kogge-Stone
// tree, the seed added, then the running values, each a normalized pair (hi, lo) (hi = RN(hi + lo)), and
// each output proved by proved_rounding of (hi, lo, U) as the Partial path proves it. The pairs are added
// with TwoSums and one or two plain additions of the low parts, whose errors are bounded, not tracked:
//   dd_add(a, v): TwoSum(a.hi, v) = (s, e) exactly; t = RN(a.lo + e) errs by at most |t| 2^-53 <= 2^-52
//     (|a.hi| + |v|) 2^-53 (|a.lo| <= |a.hi| 2^-53, |e| <= |s| 2^-53); TwoSum(s, t) is exact: at most
//     2 (|a.hi| + |v|) 2^-106 in all;
//   dd_combine(a, b): t1 = RN(a.lo + b.lo) and t = RN(t1 + e) err by at most (|t1| + |t|) 2^-53 <= 4 (|a.hi|
//     + |b.hi|) 2^-106.
// With S and m as the plain path's bound counts them (S: the earlier elements' magnitudes, m: twice the
// running values'), the thread sums err by at most 4 Items S 2^-106 together, the scan's at most 11 levels
// by 4 S 2^-106 each, the seed's combination by 4 m 2^-106 and the Items running additions by 2 m 2^-106
// each: U = seed.eb + c (S + m) 2^-106 with c = 2^ceil_log2(4 Items + 45) covers it (128 for 8 items).
// Exactly: when the elements, seed.hi and seed.lo are multiples of g = 2^unit, every double the path forms
// is one too (a rounded sum at least 2^52 g is a multiple of its ulp, itself one of g), the low parts added
// are at most 1.5 2^-52 of the magnitudes, and so every addition is exact while S + m <= 2^104 g: then U =
// seed.eb, and exact ties (float64 sums whose prefix falls halfway between two doubles, often) are decided
// exactly. Magnitudes stay below 2^1000 (kTrack), where no TwoSum overflows; past that the tile goes to
// the Partial path.
struct DD {
  double hi, lo;
};

__device__ __forceinline__ DD dd_add(const DD& a, double v) {
  double s, e;
  two_sum(a.hi, v, s, e);
  DD r;
  two_sum(s, __dadd_rn(a.lo, e), r.hi, r.lo);
  return r;
}

__device__ __forceinline__ DD dd_combine(const DD& a, const DD& b) {
  double s, e;
  two_sum(a.hi, b.hi, s, e);
  DD r;
  two_sum(s, __dadd_rn(__dadd_rn(a.lo, b.lo), e), r.hi, r.lo);
  return r;
}

// The double-double path's running value and bound: each output proved_rounding of (a.hi, a.lo, u).
struct PairRun {
  DD a;
  double u;
  template <class Out>
  __device__ __forceinline__ bool next(double v, Out& o) {
    a = dd_add(a, v);
    Partial p = partial_zero();
    p.hi = a.hi;
    p.lo = a.lo;
    p.eb = u;
    double r;
    if (!proved_rounding<Out>(p, r)) {
      o = Sentinel<Out>::value();
      return false;
    }
    o = FromRounded<Out>::apply(r);
    return true;
  }
};

__device__ __forceinline__ void add_to(DD& s, double v) { s = dd_add(s, v); }

// block_exclusive_sum's operations on double-double pairs
__device__ __forceinline__ DD plus(const DD& earlier, const DD& later) { return dd_combine(earlier, later); }
__device__ __forceinline__ DD shuffle_up_value(const DD& v, int delta) {
  return DD{__shfl_up_sync(0xffffffffu, v.hi, delta), __shfl_up_sync(0xffffffffu, v.lo, delta)};
}
__device__ __forceinline__ void keep(double* his, double* los, int i, const DD& v) {
  his[i] = v.hi;
  los[i] = v.lo;
}
__device__ __forceinline__ void kept(const double* his, const double* los, int i, DD& v) { v = DD{his[i], los[i]}; }

// U of the double-double path for the thread whose first element is element ``first`` of its tile, whose
// running value starts at a0 and whose largest magnitude's bits are ``own``, in a tile whose largest are
// ``top`` and whose elements are multiples of 2^g (2000: all zero), after ``seed``; +inf where the path
// cannot prove anything (flags, an inf/NaN element, magnitudes near kTrack, a seed with an unbounded error).
template <class T, int Items>
__device__ __forceinline__ double pair_bound(const Partial& seed, const DD& a0, unsigned own, unsigned top, int g,
                                            int first, int tile) {
  double before, mine, unit;
  // the same in every thread: every sum of the tile's elements and the seed stays far below kTrack
  if (!tile_reach<T, Items>(seed, own, top, first, before, mine, unit) ||
      !(__dadd_ru(fabs(seed.hi), 4.0 * static_cast<double>(tile) * unit) < 0x1p996)) {
    return positive_inf();
  }
  const double m = 2.0 * __dadd_ru(__dadd_ru(fabs(a0.hi), mine), before);
  const double reach = __dadd_ru(before, m);
  if (seed.hi != 0.0) g = lowest_unit(seed.hi) < g ? lowest_unit(seed.hi) : g;
  if (seed.lo != 0.0) g = lowest_unit(seed.lo) < g ? lowest_unit(seed.lo) : g;
  if (g > 900 || reach <= ldexp(1.0, 104 + g)) return seed.eb;  // every addition exact
  constexpr double kPair = static_cast<double>(1 << ceil_log2(4 * Items + 45)) * 0x1p-106;
  return __dadd_ru(seed.eb, __dmul_ru(reach, kPair));
}

// ---- the fallback: exact words walked along a tile -----------------------------------------------------
// w += the finite double d (as deposit, into int64 words: a tile's adds stay far below 2^63).
__device__ __forceinline__ void add_to_words(long long* w, double d) {
  const unsigned long long bits = static_cast<unsigned long long>(__double_as_longlong(d));
  const int field = static_cast<int>((bits >> 52) & 0x7ff);
  unsigned long long mant = bits & ((1ull << 52) - 1);
  if (field) mant |= 1ull << 52;
  if (mant == 0) return;
  const int pos = field ? field - 1 : 0;
  const int word = pos >> 5, shift = pos & 31;
  const unsigned long long low = mant << shift;
  const long long high = shift ? static_cast<long long>(mant >> (64 - shift)) : 0ll;
  const long long p0 = static_cast<long long>(low & 0xffffffffull), p1 = static_cast<long long>(low >> 32);
  if (bits >> 63) {
    w[word] -= p0;
    w[word + 1] -= p1;
    w[word + 2] -= high;
  } else {
    w[word] += p0;
    w[word + 1] += p1;
    w[word + 2] += high;
  }
}

// One tile by one thread: ``w`` (kOut int64, scratch) starts at the carry's words, takes every
// finite element in order, and each sentinel output becomes the words rounded (flags never decide a
// sentinel's output: pass 2 writes those directly). ``skipnan`` needs no care: a NaN never enters the words.
template <class T, class Out>
__device__ __forceinline__ void fallback_walk(const T* __restrict__ x, Out* __restrict__ out, index_t len,
                                              const long long* __restrict__ carry, long long* w) {
  for (int j = 0; j < kWords; ++j) w[j] = carry[j];
  w[kWords] = 0;
  for (index_t i = 0; i < len; ++i) {
    const double v = to_double(x[i]);
    if (((static_cast<unsigned long long>(__double_as_longlong(v)) >> 52) & 0x7ff) != 0x7ff) add_to_words(w, v);
    if (Sentinel<Out>::is(out[i])) {
      out[i] = FromRounded<Out>::apply(round_words(w, Format<Out>::kPrecision, Format<Out>::kEmin, false));
    }
  }
}

// ---- kernels ---------------------------------------------------------------------------------------------
// Pass 1. x: rows x n (C order); tiles of ``tile`` elements, ``tiles`` per row; out: rows * (tiles + 1) *
// kTileOut, tile t written at tile_slot(t) (the carry slots are the caller's).
template <class T, int Terms, int Warps, int Unroll>
__global__ void __launch_bounds__(Warps * 32) exact_tile_words(const T* __restrict__ x, index_t rows, index_t n,
                                                               index_t tile, index_t tiles,
                                                               long long* __restrict__ out) {
  __shared__ Banks acc[Warps];
  __shared__ long long digits[Warps][kWords];
  const int warp = static_cast<int>(threadIdx.x >> 5), lane = static_cast<int>(threadIdx.x & 31);
  Banks& mine = acc[warp];
  const index_t count = rows * tiles;
  for (index_t t = static_cast<index_t>(blockIdx.x) * Warps + warp; t < count;
       t += static_cast<index_t>(gridDim.x) * Warps) {
    const index_t row = t / tiles, start = (t - row * tiles) * tile;
    const index_t len = n - start < tile ? n - start : tile;
    for (int j = lane; j < kWords; j += 32) mine.pos[j] = mine.neg[j] = 0u;
    __syncwarp();
    Expansion<Terms> ex;
    ex.init();
    visit_range<T, Terms, Unroll>(x + row * n + start, len, lane, 32, ex, mine);
    ex.flush(mine);
    unsigned long long flags = ex.flags;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) flags |= __shfl_xor_sync(0xffffffffu, flags, o);
    __syncwarp();
    if (lane == 0) propagate_carries(mine, digits[warp]);
    __syncwarp();
    long long* dst = out + tile_slot(t, tiles) * kTileOut;
    for (int j = lane; j < kWords; j += 32) dst[j] = digits[warp][j];
    if (lane == 0) {
      dst[kWords] = (flags & kNan) ? 1 : 0;
      dst[kWords + 1] = (flags & kPinf) ? 1 : 0;
      dst[kWords + 2] = (flags & kNinf) ? 1 : 0;
    }
    __syncwarp();
  }
}

// Seeds: cum is the inclusive cumsum of the words slots along each row; seed t = the words at carry_slot(t)
// (the row's carry and the tiles before t), as 4 int64 (hi, lo, eb bits and the flags).
template <int Block>
__global__ void __launch_bounds__(Block) exact_scan_seeds(const long long* __restrict__ cum, index_t count,
                                                          index_t tiles, int skipnan, long long* __restrict__ seeds) {
  const index_t stride = static_cast<index_t>(gridDim.x) * Block;
  for (index_t t = static_cast<index_t>(blockIdx.x) * Block + threadIdx.x; t < count; t += stride) {
    const Partial p = seed_of_words(cum + carry_slot(t, tiles) * kTileOut, skipnan != 0);
    seeds[4 * t] = __double_as_longlong(p.hi);
    seeds[4 * t + 1] = __double_as_longlong(p.lo);
    seeds[4 * t + 2] = __double_as_longlong(p.eb);
    seeds[4 * t + 3] = static_cast<long long>(p.flags);
  }
}

__device__ __forceinline__ Partial shuffle_up(const Partial& p, int delta) {
  Partial r;
  r.hi = __shfl_up_sync(0xffffffffu, p.hi, delta);
  r.lo = __shfl_up_sync(0xffffffffu, p.lo, delta);
  r.eb = __shfl_up_sync(0xffffffffu, p.eb, delta);
  r.flags = __shfl_up_sync(0xffffffffu, p.flags, delta);
  return r;
}

// The exclusive prefix of the threads' Partials in thread order (inclusive Kogge-Stone in each warp, then
// over the warp totals in warp 0). tools/exact_host_emulator.cpp replays the same combination tree.
template <int Block>
__device__ __forceinline__ Partial block_exclusive(const Partial& p, Partial* warp_sums) {
  constexpr int Warps = Block / 32;
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  Partial inc = p;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const Partial up = shuffle_up(inc, o);
    if (lane >= o) inc = partial_combine(up, inc);
  }
  if (lane == 31) warp_sums[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    Partial w = lane < Warps ? warp_sums[lane] : partial_zero();
#pragma unroll
    for (int o = 1; o < Warps; o <<= 1) {
      const Partial up = shuffle_up(w, o);
      if (lane >= o) w = partial_combine(up, w);
    }
    if (lane < Warps) warp_sums[lane] = w;
  }
  __syncthreads();
  Partial ex = shuffle_up(inc, 1);
  if (lane == 0) ex = partial_zero();
  return warp == 0 ? ex : partial_combine(warp_sums[warp - 1], ex);
}

// A tile's elements into its shared slots (``buffer`` as T: element i at padded(i); zeros from len to the
// tile's end; NaN as zero where ``zero_nan``), returned as T. A whole tile starting on a 16-byte boundary is read in 16-byte vectors, vector q
// of the tile by thread q mod Block (coalesced); its elements enter shared memory one by one (the pads break
// the vectors' alignment), at padded(first of the vector) + c, since a vector never crosses a pad.
template <class T, int Block, int Items>
__device__ __forceinline__ const T* stage_tile(const T* __restrict__ src, int len, unsigned char* buffer, bool zero_nan) {
  T* in = reinterpret_cast<T*>(buffer);
  constexpr int Tile = Block * Items, kPer = 16 / static_cast<int>(sizeof(T));
  if constexpr (Items % kPer == 0 && 32 % kPer == 0) {
    if (len == Tile && (reinterpret_cast<unsigned long long>(src) & 15ull) == 0) {
      union Vector {
        uint4 raw;
        T e[kPer];
      };
      const uint4* from = reinterpret_cast<const uint4*>(src);
#pragma unroll
      for (int k = 0; k < Tile / kPer / Block; ++k) {
        const int q = static_cast<int>(threadIdx.x) + k * Block;
        Vector v;
        v.raw = from[q];
        const int base = padded(q * kPer);
#pragma unroll
        for (int c = 0; c < kPer; ++c) in[base + c] = staged_element(v.e[c], zero_nan);
      }
      return in;
    }
  }
  for (int i = threadIdx.x; i < Tile; i += Block) {
    in[padded(i)] = staged_element(i < len ? src[i] : T{}, zero_nan);
  }
  return in;
}

// The tile's outputs from their shared slots to the row: 16-byte vectors where the tile is whole and starts
// on a 16-byte boundary (as stage_tile reads), else one by one.
template <class Out, int Block, int Items>
__device__ __forceinline__ void store_tile(const Out* res, int len, Out* __restrict__ dst) {
  constexpr int Tile = Block * Items, kPer = 16 / static_cast<int>(sizeof(Out));
  if constexpr (Items % kPer == 0 && 32 % kPer == 0) {
    if (len == Tile && (reinterpret_cast<unsigned long long>(dst) & 15ull) == 0) {
      union Vector {
        uint4 raw;
        Out e[kPer];
      };
      uint4* to = reinterpret_cast<uint4*>(dst);
#pragma unroll
      for (int k = 0; k < Tile / kPer / Block; ++k) {
        const int q = static_cast<int>(threadIdx.x) + k * Block;
        const int base = padded(q * kPer);
        Vector v;
#pragma unroll
        for (int c = 0; c < kPer; ++c) v.e[c] = res[base + c];
        to[q] = v.raw;
      }
      return;
    }
  }
  for (int i = threadIdx.x; i < len; i += Block) dst[i] = res[padded(i)];
}

// Tile t's seed (exact_scan_seeds' four int64).
__device__ __forceinline__ Partial load_seed(const long long* seeds, index_t t) {
  Partial seed;
  seed.hi = __longlong_as_double(seeds[4 * t]);
  seed.lo = __longlong_as_double(seeds[4 * t + 1]);
  seed.eb = __longlong_as_double(seeds[4 * t + 2]);
  seed.flags = static_cast<unsigned long long>(seeds[4 * t + 3]);
  return seed;
}

// Where tile t of rows of n elements, ``tiles`` tiles each, lies: the offset of its first element from the
// first row's, and how many elements it has.
template <int Tile>
struct TilePlace {
  index_t offset;
  int len;
  __device__ __forceinline__ TilePlace(index_t t, index_t tiles, index_t n) {
    const index_t row = t / tiles, start = (t - row * tiles) * Tile;
    offset = row * n + start;
    len = static_cast<int>(n - start < Tile ? n - start : Tile);
  }
};

// The shared memory of one pass-2 block: the tile's inputs, then its outputs, in one buffer, and the block
// scans' warp totals.
template <class T, class Out, int Block, int Items>
struct TileShared {
  static constexpr int kSlots = Block * Items + Block * Items / 32;
  __align__(16) unsigned char buffer[(sizeof(T) > sizeof(Out) ? sizeof(T) : sizeof(Out)) * kSlots];
  Partial warp_sums[Block / 32];
  double sums[Block / 32], los[Block / 32];
  unsigned tops[Block / 32], lows[Block / 32], keys[Block / 32];
};

// The Partial path of tile t (of rows of n elements, ``tiles`` tiles each), outputs written and marked[t] set: each thread sums its Items consecutive elements as a Partial, the block scans the Partials,
// and each thread writes its outputs by approximate_outputs or, where that gives up, exact_outputs. Every
// thread of the block calls it.
template <class T, class Out, int Block, int Items>
__device__ __forceinline__ void partial_tile(const T* __restrict__ x, index_t n, index_t tiles, index_t t,
                                             const long long* __restrict__ seeds, bool skip, Out* __restrict__ out,
                                             int* __restrict__ marked, TileShared<T, Out, Block, Items>& shared) {
  const TilePlace<Block * Items> at(t, tiles, n);
  const int len = at.len, first = static_cast<int>(threadIdx.x) * Items;
  const T* in = stage_tile<T, Block, Items>(x + at.offset, len, shared.buffer, false);
  __syncthreads();
  Out* res = reinterpret_cast<Out*>(shared.buffer);  // the same memory: read into v before the block scan
  double v[Items];
#pragma unroll
  for (int j = 0; j < Items; ++j) v[j] = to_double(in[run_slot<Items>(first, j)]);  // zeros past the row
  const Span span = exponent_span<Items>(v);  // read by the float16/float32 paths only
  // the block scan's barriers also end the reads of ``in``
  Partial run = block_exclusive<Block>(thread_partial<T, Items>(v, span, skip), shared.warp_sums);
  run = partial_combine(load_seed(seeds, t), run);
  const int unproved = approximate_outputs<T, Out, Items>(run, v, span, first, len, res)
                           ? 0
                           : exact_outputs<Out, Items>(run, v, first, len, skip, res);
  const int any = __syncthreads_count(unproved);
  store_tile<Out, Block, Items>(res, len, out + at.offset);
  if (threadIdx.x == 0) marked[t] = any;
  __syncthreads();
}

// The plain path's running value and bound for this thread (float16/float32 elements and outputs): the
// tile scanned in double (block_exclusive_sum), u from fast_bound. Every thread calls it (it holds barriers).
template <class T, int Block, int Items, class Shared>
__device__ __forceinline__ PlainRun plain_run(const T* in, int first, const long long* __restrict__ seeds, index_t t,
                                              Shared& shared) {
  constexpr int Tile = Block * Items;
  unsigned own, low;
  const double sum = thread_sum<double, T, Items>(in, first, own, low);
  unsigned top = own;
  const double prefix = block_exclusive_sum<Block>(sum, top, low, shared.sums, shared.los, shared.tops, shared.lows);
  int g = unit_of_low<T>(low);
  if (!tile_sums_exact<T>(top, g, Tile)) {  // the same in every thread: the lowest bits may show them exact
    const unsigned key = __reduce_min_sync(0xffffffffu, thread_lowest_bits<T, Items>(in, first));
    if ((threadIdx.x & 31) == 0) shared.keys[threadIdx.x >> 5] = key;
    __syncthreads();
    unsigned least = ~0u;
#pragma unroll
    for (int w = 0; w < Block / 32; ++w) least = shared.keys[w] < least ? shared.keys[w] : least;
    g = unit_of_key<T>(least);
  }
  const Partial seed = load_seed(seeds, t);
  const double a = __dadd_rn(seed.hi, prefix);
  return PlainRun{a, fast_bound<T, Items>(seed, a, own, top, g, first)};
}

// The double-double path's running value and bound for this thread (float64 elements or outputs): the tile
// scanned in pairs (block_exclusive_sum of DD), u from pair_bound. Every thread calls it (it holds barriers).
template <class T, int Block, int Items, class Shared>
__device__ __forceinline__ PairRun pair_run(const T* in, int first, const long long* __restrict__ seeds, index_t t,
                                            Shared& shared) {
  unsigned own, low;
  const DD sum = thread_sum<DD, T, Items>(in, first, own, low);
  unsigned top = own;
  const DD prefix = block_exclusive_sum<Block>(sum, top, low, shared.sums, shared.los, shared.tops, shared.lows);
  const Partial seed = load_seed(seeds, t);
  const DD a = dd_combine(DD{seed.hi, seed.lo}, prefix);
  return PairRun{a, pair_bound<T, Items>(seed, a, own, top, unit_of_low<T>(low), first, Block * Items)};
}

// The tile-wide path on tile t: its outputs written and marked[t] = 0 where every one was proved, else
// marked[t] = kRetry and nothing written. Every thread calls it.
constexpr int kRetry = -1;
template <class T, class Out, int Block, int Items>
__device__ __forceinline__ void tile_wide(const T* __restrict__ x, index_t n, index_t tiles, index_t t,
                                          const long long* __restrict__ seeds, bool skip, Out* __restrict__ out,
                                          int* __restrict__ marked, TileShared<T, Out, Block, Items>& shared) {
  const TilePlace<Block * Items> at(t, tiles, n);
  const T* in = stage_tile<T, Block, Items>(x + at.offset, at.len, shared.buffer, skip);  // NaN as 0 if skip
  __syncthreads();
  const int first = static_cast<int>(threadIdx.x) * Items;
  // the scan's barriers also end the reads of ``in`` by other threads
  auto run = [&] {
    if constexpr (sizeof(T) <= 4 && sizeof(Out) <= 4) {
      return plain_run<T, Block, Items>(in, first, seeds, t, shared);
    } else {
      return pair_run<T, Block, Items>(in, first, seeds, t, shared);
    }
  }();
  // u is +inf in every thread of the tile or in none: the threads call tile_outputs together
  Out* res = reinterpret_cast<Out*>(shared.buffer);
  const bool proved = run.u < positive_inf() && tile_outputs<T, Out, Items>(run, in, res, first);
  if (__syncthreads_and(proved)) {
    store_tile<Out, Block, Items>(res, at.len, out + at.offset);
    if (threadIdx.x == 0) marked[t] = 0;
  } else if (threadIdx.x == 0) {
    marked[t] = kRetry;
  }
  __syncthreads();
}

// Pass 2: one block per tile (grid-stride). seeds: 4 int64 per tile (exact_scan_seeds); out: rows x n;
// marked[t]: how many threads of tile t left a sentinel (0: the tile is final), or kRetry where the tile-wide
// path gave the tile up: exact_scan_retry then runs its Partial path. The Partial path lives in a kernel of
// its own so that its registers do not crowd the tile-wide path's.
// MinBlocks: the resident blocks per SM asked of ptxas (__launch_bounds__' second argument: it caps the
// registers at about 65536 / (Block * MinBlocks)); it changes the schedule only, never an output.
template <class T, class Out, int Block, int Items, int MinBlocks = kScanMinBlocks>
__global__ void __launch_bounds__(Block, MinBlocks) exact_scan_tiles(const T* __restrict__ x, index_t rows, index_t n,
                                                          index_t tiles, const long long* __restrict__ seeds,
                                                          int skipnan, Out* __restrict__ out,
                                                          int* __restrict__ marked) {
  __shared__ TileShared<T, Out, Block, Items> shared;
  const index_t count = rows * tiles;
  for (index_t t = blockIdx.x; t < count; t += gridDim.x) {
    tile_wide<T, Out, Block, Items>(x, n, tiles, t, seeds, skipnan != 0, out, marked, shared);
  }
}

// The Partial path of every tile exact_scan_tiles marked kRetry. Thread i of block b looks at tile b + i *
// gridDim.x (then Block * gridDim.x further on): the block reads its marks at once, lists the tiles to retry
// and runs them one after another (tiles are independent: the order changes no output).
template <class T, class Out, int Block, int Items, int MinBlocks = kScanMinBlocks>
__global__ void __launch_bounds__(Block, MinBlocks) exact_scan_retry(const T* __restrict__ x, index_t rows, index_t n,
                                                          index_t tiles, const long long* __restrict__ seeds,
                                                          int skipnan, Out* __restrict__ out,
                                                          int* __restrict__ marked) {
  __shared__ TileShared<T, Out, Block, Items> shared;
  __shared__ index_t listed[Block];
  __shared__ int found;
  const index_t count = rows * tiles;
  for (index_t base = blockIdx.x; base < count; base += static_cast<index_t>(gridDim.x) * Block) {
    if (threadIdx.x == 0) found = 0;
    __syncthreads();
    const index_t mine = base + static_cast<index_t>(threadIdx.x) * gridDim.x;
    if (mine < count && marked[mine] == kRetry) listed[atomicAdd(&found, 1)] = mine;
    __syncthreads();
    const int retries = found;
    for (int k = 0; k < retries; ++k) {
      partial_tile<T, Out, Block, Items>(x, n, tiles, listed[k], seeds, skipnan != 0, out, marked, shared);
    }
    __syncthreads();  // every thread has read ``found`` and ``listed`` before the next round writes them
  }
}

// The carries: the words slots' inclusive cumsum along each row, in place (words: rows x slots x kTileOut
// int64). Block b scans column b % kTileOut of row b / kTileOut in chunks of Block * Items slots, each thread
// Items consecutive ones, carrying each chunk's total into the next. Integer adds: exact and free of order,
// so the result is any cumsum's.
template <int Block, int Items>
__global__ void __launch_bounds__(Block) exact_words_cumsum(long long* __restrict__ words, index_t rows,
                                                            index_t slots) {
  __shared__ long long warp_totals[Block / 32];
  const index_t row = blockIdx.x / kTileOut;
  if (row >= rows) return;
  long long* column = words + row * slots * kTileOut + blockIdx.x % kTileOut;
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  long long carry = 0;
  for (index_t chunk = 0; chunk < slots; chunk += static_cast<index_t>(Block) * Items) {
    const index_t first = chunk + static_cast<index_t>(threadIdx.x) * Items;
    long long v[Items];
    long long sum = 0;
#pragma unroll
    for (int j = 0; j < Items; ++j) {
      v[j] = first + j < slots ? column[(first + j) * kTileOut] : 0;
      sum += v[j];
    }
    long long inc = sum;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const long long up = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += up;
    }
    if (lane == 31) warp_totals[warp] = inc;
    __syncthreads();
    long long run = carry + inc - sum;  // everything before the thread's first slot
#pragma unroll
    for (int k = 0; k < Block / 32; ++k) {
      const long long total = warp_totals[k];
      if (k < warp) run += total;
      carry += total;
    }
#pragma unroll
    for (int j = 0; j < Items; ++j) {
      run += v[j];
      if (first + j < slots) column[(first + j) * kTileOut] = run;
    }
    __syncthreads();  // warp_totals is read before the next chunk writes it
  }
}

// Fallback: grid-stride over tiles, one warp per block, lane 0 walks each marked tile (fallback_walk).
// cum: the inclusive cumsum of the words slots (tile t's carry at carry_slot(t)).
template <class T, class Out>
__global__ void __launch_bounds__(32) exact_scan_fallback(const T* __restrict__ x, index_t rows, index_t n,
                                                          index_t tile, index_t tiles,
                                                          const long long* __restrict__ cum,
                                                          const int* __restrict__ marked, Out* __restrict__ out) {
  __shared__ long long w[kOut];
  const index_t count = rows * tiles;
  for (index_t t = blockIdx.x; t < count; t += gridDim.x) {
    if (marked[t] == 0 || threadIdx.x != 0) continue;
    const index_t row = t / tiles, start = (t - row * tiles) * tile;
    const index_t len = n - start < tile ? n - start : tile;
    fallback_walk<T, Out>(x + row * n + start, out + row * n + start, len, cum + carry_slot(t, tiles) * kTileOut, w);
  }
}

}  // namespace exact
}  // namespace mr
