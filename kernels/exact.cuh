// multireduce: exact (correctly rounded) sums of float16/float32/float64 rows, ExBLAS-style.
//
// Every element is converted to double (exact for float16/32). Each thread keeps a floating-point
// expansion of kTerms doubles updated by a TwoSum cascade: the sum of the expansion plus the elements
// not yet seen is invariant, because TwoSum is exact unless an addition overflows. What falls out of
// the last term (and any element of magnitude >= 2^kBig, where an addition could overflow) is added
// to a block superaccumulator in shared memory (Banks: unsigned 32-bit digits for the positive and the
// negative deposits), digit j counting units of 2^(32 j - 1074), so bit 0 is the smallest subnormal and
// every double lands in three adjacent digits. At the end each thread flushes its expansion, one thread
// turns pos - neg into signed words with carries (every word but the last a digit in [0, 2^32)), and
// the block adds its digits into the row's global words with integer atomics, which is associative:
// the row's words do not depend on the schedule, and their total not on the grid.
// The host folds the words into exact.py's integer state (backends/cupy_exact.py), so GPU, CPU and
// any chunking give the same bits. NaN/+inf/-inf are flags ORed into word kWords.
//
// Pack sums (float32, float16): a 16-byte pack is first summed in double when that sum is provably
// exact, and only that one double enters the expansion (4x / 8x fewer TwoSum cascades). Bound: let the
// pack's nonzero values have exponent fields in [lo, hi] (a subnormal counts as field 1, since its ulp is
// that of field 1). Every value is an integer multiple of u = ulp(field lo) = 2^(lo - bias - m), m = 23
// (float32) / 10 (float16), and |value| < 2^(hi - bias + 1). Any partial sum of j <= k values is then an
// integer multiple of u below k 2^(hi - bias + 1), i.e. fewer than 2^(hi - lo + m + 1 + ceil(log2 k)) units
// of u: a double holds it exactly when hi - lo + (m + 1) + ceil(log2 k) <= 53, and u >= 2^-149 is far
// above the double subnormal range, so no addition of the pack rounds. float32, k = 4: hi - lo <= 27,
// tested from the max and min nonzero |bits| of the pack; a wider pack, or one with inf/NaN or a
// subnormal (whose conversion needs to_double's bit path under -ftz), takes the per-element path. float16, k = 8: hi - lo <= 29 < 53 - 11 - 3 always holds, only inf/NaN fall back.
// The pack sum is < 2^131 in magnitude, far below kBig, and it is the same real number as its elements'
// sum, so the words (the exact sum) do not change: only how many cascades produce them.
//
// Invariants the words rest on, whatever the shape: (1) pack p of a row goes to grid thread p mod
// (gridDim.x * Block) for every Unroll, so a block's element set depends only on the grid; (2) after
// propagate_carries a block's words are the unique base-2^32 digits of its exact sum (top word signed),
// so they do not depend on the order of the shared atomics nor on Terms/Unroll/pack sums; (3) the row's
// words are integer sums of those digits: any launch order, any number of launches. The total (what is
// rounded) is the same for every grid; tools/exact_host_emulator.cpp reproduces the words bit for bit.
#pragma once
#include "common.cuh"

namespace mr {
namespace exact {

constexpr int kWords = 72;       // bits 0..2303: a double reaches bit 2098, sums of 2^40 of them 2138
constexpr int kOut = kWords + 1;  // + the flags word
constexpr int kBig = 960;         // |x| < 2^960 enters the expansion: 2^40 of them stay below 2^1000
constexpr unsigned long long kNan = 1, kPinf = 2, kNinf = 4;

template <class T> struct Pack {
  static constexpr int kCount = 16 / sizeof(T);
  T v[kCount];
};
template <class T> struct alignas(16) Aligned : Pack<T> {};

// The bits of ``v`` as a ``To`` of the same size: one function for both directions (float <-> unsigned).
// Through a union, which nvcc, NVRTC and g++ (the emulator) all define and compile to a register move;
// NVRTC refuses __builtin_memcpy in device code.
template <class To, class From>
__device__ __forceinline__ To bit_cast(const From& v) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast between types of one size");
  union {
    From from;
    To to;
  } u;
  u.from = v;
  return u.to;
}

__device__ __forceinline__ double to_double(double v) { return v; }
// float -> double. CuPy's NVRTC appends -ftz=true to every compile, and then even the conversion
// cvt.f64.f32 flushes a float32 subnormal to zero (the NVRTC-built kernel summed a lone subnormal to 0 on
// an H200). Normal values, zeros, inf and NaN convert exactly under any flags, so only a subnormal is
// built from its bits (integer operations and double arithmetic never flush): exact whether the kernel
// is prebuilt (nvcc, no -ftz) or NVRTC-built. Building every value from its bits cost float32 sums 40 %
// (0.86 -> 0.53 x the plain sum at 2^28, H200): the branch is the cheap form.
__device__ __forceinline__ double to_double(float v) {
  const unsigned u = bit_cast<unsigned>(v);
  if ((u & 0x7f800000u) != 0u || (u & 0x7fffffffu) == 0u) return static_cast<double>(v);
  const double magnitude = static_cast<double>(u & 0x7fffffu) * 0x1p-149;  // subnormal: mant * 2^-149
  return (u >> 31) ? -magnitude : magnitude;
}
__device__ __forceinline__ double to_double(half v) { return static_cast<double>(half_to_float(v.bits)); }

// The exact sum of a pack in double, or false when the bound of the header does not prove it (the
// caller then adds the elements one by one). float64 packs never take this path.
__device__ __forceinline__ bool pack_sum(const Pack<double>&, double&) { return false; }

constexpr int kF32PackSpread = 53 - 24 - 2;  // hi - lo limit for 4 float32 values (header's bound)

__device__ __forceinline__ bool pack_sum(const Pack<float>& p, double& sum) {
  unsigned hi = 0, lo = 0x7f800000u;  // lo: the smallest nonzero |bits|; an all-zero pack keeps lo > hi
#pragma unroll
  for (int k = 0; k < Pack<float>::kCount; ++k) {
    const unsigned a = bit_cast<unsigned>(p.v[k]) & 0x7fffffffu;
    hi = a > hi ? a : hi;
    const unsigned nz = a ? a : 0x7f800000u;
    lo = nz < lo ? nz : lo;
  }
  const int fhi = static_cast<int>(hi >> 23), flo = static_cast<int>(lo >> 23);
  // a subnormal goes the per-element way too: to_double's bit path, so that this one needs no branch
  if (fhi == 0xff || flo == 0 || fhi - flo > kF32PackSpread) return false;
  double s = 0.0;
#pragma unroll
  for (int k = 0; k < Pack<float>::kCount; ++k) s = __dadd_rn(s, static_cast<double>(p.v[k]));  // normal or 0
  sum = s;
  return true;
}

__device__ __forceinline__ bool pack_sum(const Pack<half>& p, double& sum) {
  double s = 0.0;
#pragma unroll
  for (int k = 0; k < Pack<half>::kCount; ++k) {
    if ((p.v[k].bits & 0x7c00u) == 0x7c00u) return false;  // inf/NaN: the per-element path sets the flags
    s = __dadd_rn(s, to_double(p.v[k]));
  }
  sum = s;
  return true;
}

// The block superaccumulator: the magnitudes of positive and of negative deposits in two banks of
// unsigned 32-bit digits, digit j counting units of 2^(32 j - 1074). 32-bit shared atomicAdd is native
// where a 64-bit add on signed words compiles to a compare-and-swap loop. A digit that wraps is seen by
// the thread whose add wrapped it (old + v >= 2^32), and that thread carries one into the next digit, so
// once all adds are done each bank holds the exact sum of what was added to it. The top digit never
// wraps: a block sees at most 2^28 elements per launch (cupy_exact._PER_BLOCK_LIMIT) and makes fewer than
// 2^28 + Terms * Block deposits, each below 2^(960 + 28 + 1) (expansion terms and TwoSum errors of sums
// of < 2^28 values below 2^kBig) or below 2^1024 (a big element), so a bank stays below 2^1054, far inside
// kWords * 32 = 2304 bits.
struct Banks {
  unsigned pos[kWords];
  unsigned neg[kWords];
};

__device__ __forceinline__ unsigned atomic_add_u32(unsigned* p, unsigned v) {
#ifdef __CUDA_ARCH__
  return atomicAdd(p, v);
#else  // host builds (tools/exact_host_emulator.cpp, tests/test_exact.py) run one thread at a time
  const unsigned old = *p;
  *p = old + v;
  return old;
#endif
}

__device__ __forceinline__ void add_digit(unsigned* bank, int j, unsigned v) {
  unsigned old = atomic_add_u32(bank + j, v);
  while (old > 0xffffffffu - v) {  // this add wrapped digit j: carry one into digit j + 1
    v = 1u;
    ++j;
    old = atomic_add_u32(bank + j, v);
  }
}

// Adds the finite double d exactly into the block's banks.
__device__ __forceinline__ void deposit(Banks& acc, double d) {
  const unsigned long long bits = static_cast<unsigned long long>(__double_as_longlong(d));
  const int field = static_cast<int>((bits >> 52) & 0x7ff);
  unsigned long long mant = bits & ((1ull << 52) - 1);
  if (field) mant |= 1ull << 52;
  if (mant == 0) return;
  const int pos = field ? field - 1 : 0;  // d = mant * 2^(pos - 1074)
  const int word = pos >> 5, shift = pos & 31;
  const unsigned long long low = mant << shift;
  const unsigned high = shift ? static_cast<unsigned>(mant >> (64 - shift)) : 0u;  // < 2^20
  unsigned* bank = (bits >> 63) ? acc.neg : acc.pos;
  const unsigned piece[3] = {static_cast<unsigned>(low), static_cast<unsigned>(low >> 32), high};
#pragma unroll
  for (int k = 0; k < 3; ++k) {
    if (piece[k]) add_digit(bank, word + k, piece[k]);
  }
}

template <int Terms>
struct Expansion {
  double a[Terms];
  unsigned long long flags;

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int i = 0; i < Terms; ++i) a[i] = 0.0;
    flags = 0;
  }

  __device__ __forceinline__ void add(double x, Banks& acc) {
    const unsigned long long bits = static_cast<unsigned long long>(__double_as_longlong(x));
    const int field = static_cast<int>((bits >> 52) & 0x7ff);
    if (field == 0x7ff) {  // inf or NaN: flags only, as exact.py
      flags |= (bits & ((1ull << 52) - 1)) ? kNan : ((bits >> 63) ? kNinf : kPinf);
      return;
    }
    if (field >= 1023 + kBig) {  // |x| >= 2^960: the cascade's additions could overflow
      deposit(acc, x);
      return;
    }
#pragma unroll
    for (int i = 0; i < Terms; ++i) {  // TwoSum (Knuth): s + e == a[i] + x exactly
      const double s = __dadd_rn(a[i], x);
      const double bv = __dsub_rn(s, a[i]);
      const double e = __dadd_rn(__dsub_rn(a[i], __dsub_rn(s, bv)), __dsub_rn(x, bv));
      a[i] = s;
      x = e;
      if (x == 0.0) return;
    }
    deposit(acc, x);
  }

  __device__ __forceinline__ void flush(Banks& acc) {
#pragma unroll
    for (int i = 0; i < Terms; ++i) deposit(acc, a[i]);
  }
};

template <class T, int Terms>
__device__ __forceinline__ void add_pack(const Pack<T>& pack, Expansion<Terms>& ex, Banks& acc) {
  double sum;
  if (pack_sum(pack, sum)) {
    ex.add(sum, acc);
    return;
  }
#pragma unroll
  for (int k = 0; k < Pack<T>::kCount; ++k) ex.add(to_double(pack.v[k]), acc);
}

// One row: the elements head-first (scalars up to the 16-byte boundary), then 16-byte packs
// grid-stride over blockIdx.x, then the scalar tail. Pack p always goes to thread p mod (grid threads);
// Unroll only loads that thread's next packs before adding any, since the kernel is latency-bound (one
// 16-byte load in flight per thread does not cover DRAM latency at a few blocks per SM).
// visit_range: the same with ``thread`` of ``threads`` given (the exact scan's pass 1: a warp per tile).
template <class T, int Terms, int Unroll>
__device__ __forceinline__ void visit_range(const T* __restrict__ x, index_t n, index_t thread, index_t threads,
                                            Expansion<Terms>& ex, Banks& acc) {
  constexpr int P = Pack<T>::kCount;
  const unsigned long long address = reinterpret_cast<unsigned long long>(x);
  index_t head = static_cast<index_t>(((16 - (address & 15)) & 15) / sizeof(T));
  if ((address % sizeof(T)) != 0 || head > n) head = n;
  for (index_t i = thread; i < head; i += threads) ex.add(to_double(x[i]), acc);
  const index_t packs = (n - head) / P;
  const Aligned<T>* body = reinterpret_cast<const Aligned<T>*>(x + head);
  index_t p = thread;
  for (; p + (Unroll - 1) * threads < packs; p += Unroll * threads) {
    Aligned<T> pk[Unroll];
#pragma unroll
    for (int u = 0; u < Unroll; ++u) pk[u] = body[p + u * threads];
#pragma unroll
    for (int u = 0; u < Unroll; ++u) add_pack<T, Terms>(pk[u], ex, acc);
  }
  for (; p < packs; p += threads) add_pack<T, Terms>(body[p], ex, acc);
  for (index_t i = head + packs * P + thread; i < n; i += threads) ex.add(to_double(x[i]), acc);
}

template <class T, int Terms, int Unroll>
__device__ __forceinline__ void visit_row(const T* __restrict__ x, index_t n, Expansion<Terms>& ex,
                                          Banks& acc) {
  const index_t thread = static_cast<index_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const index_t threads = static_cast<index_t>(gridDim.x) * blockDim.x;
  visit_range<T, Terms, Unroll>(x, n, thread, threads, ex, acc);
}

// The block's exact sum as digits in [0, 2^32) for every word but the last (signed), so the grid's
// sum of digits cannot overflow; |pos - neg + carry| < 2^33 at every step.
__device__ __forceinline__ void propagate_carries(const Banks& acc, long long* digits) {
  long long carry = 0;
  for (int j = 0; j < kWords - 1; ++j) {
    const long long v = static_cast<long long>(acc.pos[j]) - static_cast<long long>(acc.neg[j]) + carry;
    digits[j] = v & 0xffffffffll;
    carry = v >> 32;  // arithmetic shift: floor division, negative values borrow
  }
  digits[kWords - 1] = static_cast<long long>(acc.pos[kWords - 1]) - static_cast<long long>(acc.neg[kWords - 1]) + carry;
}

// x: rows x n, row r at x + r * row_stride (elements). out: rows x kOut words, zeroed by the caller;
// words 0..kWords-1 receive the block digits (sum of words[j] * 2^(32 j - 1074) = the exact row sum),
// word kWords the ORed flags.
template <class T, int Terms, int Block, int Unroll = 1>  // the default: tests/test_exact.py names <T, 4, 1>
__global__ void __launch_bounds__(Block) exact_sum_rows(const T* __restrict__ x, index_t rows, index_t n,
                                                        index_t row_stride, long long* __restrict__ out) {
  __shared__ Banks acc;
  __shared__ long long digits[kWords];
  __shared__ unsigned long long block_flags;
  for (index_t row = blockIdx.y; row < rows; row += gridDim.y) {
    for (int j = threadIdx.x; j < kWords; j += Block) acc.pos[j] = acc.neg[j] = 0u;
    if (threadIdx.x == 0) block_flags = 0;
    __syncthreads();
    Expansion<Terms> ex;
    ex.init();
    visit_row<T, Terms, Unroll>(x + row * row_stride, n, ex, acc);
    ex.flush(acc);
    if (ex.flags) atomicOr(&block_flags, ex.flags);
    __syncthreads();
    if (threadIdx.x == 0) propagate_carries(acc, digits);
    __syncthreads();
    long long* dst = out + row * kOut;
    for (int j = threadIdx.x; j < kWords; j += Block) {
      if (digits[j]) atomicAdd(reinterpret_cast<unsigned long long*>(dst + j), static_cast<unsigned long long>(digits[j]));
    }
    if (threadIdx.x == 0 && block_flags) atomicOr(reinterpret_cast<unsigned long long*>(dst + kWords), block_flags);
    __syncthreads();  // acc is reset for the next row only after every thread has read it
  }
}

// ---- rounding on the device ----------------------------------------------------------------------
// A row's words rounded once to a float format, as exact.py's finish and round_exact do on the host, so
// that a whole-array exact sum needs no copy of its words to the host (backends/cupy_exact.py).

__device__ __forceinline__ int highest_bit(unsigned v) {  // v != 0
#ifdef __CUDA_ARCH__
  return 31 - __clz(v);
#else
  return 31 - __builtin_clz(v);
#endif
}

// Bits [lo, lo + count) of the little-endian digits (count <= 64; digits past kWords read as 0).
__device__ __forceinline__ unsigned long long digit_bits(const unsigned* d, int lo, int count) {
  if (count <= 0) return 0ull;
  const int word = lo >> 5, shift = lo & 31;
  const unsigned long long w0 = word < kWords ? d[word] : 0u, w1 = word + 1 < kWords ? d[word + 1] : 0u;
  const unsigned long long w2 = word + 2 < kWords ? d[word + 2] : 0u;
  const unsigned long long low = w0 | (w1 << 32);
  unsigned long long v = shift ? (low >> shift) | (w2 << (64 - shift)) : low;
  return count >= 64 ? v : v & ((1ull << count) - 1);
}

// Whether any bit below bit ``lo`` is set.
__device__ __forceinline__ bool any_below(const unsigned* d, int lo) {
  if (lo <= 0) return false;
  const int word = lo >> 5, shift = lo & 31;
  for (int j = 0; j < word && j < kWords; ++j) {
    if (d[j]) return true;
  }
  return word < kWords && shift && (d[word] & ((1u << shift) - 1u)) != 0u;
}

// floor(N / (divisor * 2^shift)) for the digits' value N (divisor >= 1, the quotient below 2^64), by
// long division over N's bits from ``msb`` down to bit ``shift``; ``rem`` gets the remainder of
// floor(N / 2^shift) by the divisor. Bit at a time: the remainder stays below the divisor (< 2^63), so
// every step fits in 64 bits, and a row is rounded once.
__device__ __forceinline__ unsigned long long divide_bits(const unsigned* d, int msb, int shift,
                                                          unsigned long long divisor, unsigned long long& rem) {
  unsigned long long q = 0, r = 0;
  for (int bit = msb; bit >= shift; --bit) {
    r = (r << 1) | ((d[bit >> 5] >> (bit & 31)) & 1u);
    q <<= 1;
    if (r >= divisor) {
      r -= divisor;
      q |= 1ull;
    }
  }
  rem = r;
  return q;
}

// int64 words (any values, as sums of digits) -> digits in [0, 2^32) of the magnitude; returns what is
// left above the top digit (0 unless the value is past every format), ``negative`` its sign.
__device__ __forceinline__ long long words_to_digits(const long long* w, unsigned* d, bool& negative) {
  long long carry = 0;
  for (int j = 0; j < kWords; ++j) {
    const long long t = (w[j] & 0xffffffffll) + carry;
    d[j] = static_cast<unsigned>(t & 0xffffffffll);
    carry = (t >> 32) + (w[j] >> 32);  // arithmetic shifts: floor division, negative words borrow
  }
  negative = carry < 0;
  if (negative) {  // magnitude: two's complement of (digits, top)
    unsigned long long c = 1;
    for (int j = 0; j < kWords; ++j) {
      const unsigned long long t = static_cast<unsigned long long>(~d[j]) + c;
      d[j] = static_cast<unsigned>(t);
      c = t >> 32;
    }
    carry = ~carry + static_cast<long long>(c);
  }
  return carry;
}

// The value of one row's kOut words divided by ``divisor`` (1 for a sum, the count for a mean; 0 gives
// NaN, as exact.py's empty mean), rounded to nearest, half to even, to a float of ``precision`` bits whose
// smallest normal exponent is ``emin`` (float16 11/-14, float32 24/-126, float64 53/-1022), as a double
// that format holds exactly, or +-inf past its range (the caller's conversion to a narrower type turns a
// value past that type's largest finite into inf, as exact.py does). Flags as exact.py's finish: NaN, or
// +inf with -inf, give NaN (``skipnan``: the NaN flag is ignored, nansum); an exact zero is +0.0. The same
// integer arithmetic as exact.py's round_exact, so the same bits.
__device__ __forceinline__ double round_words(const long long* w, int precision, int emin, bool skipnan,
                                              unsigned long long divisor = 1) {
  const unsigned long long flags = static_cast<unsigned long long>(w[kWords]);
  const bool pinf = (flags & kPinf) != 0, ninf = (flags & kNinf) != 0;
  const double nan = __longlong_as_double(0x7ff8000000000000ll), inf = __longlong_as_double(0x7ff0000000000000ll);
  if ((!skipnan && (flags & kNan)) || (pinf && ninf) || divisor == 0) return nan;
  if (pinf) return inf;
  if (ninf) return -inf;
  // the words are any int64 (sums of block digits): carry them into digits in [0, 2^32) and a signed top
  unsigned d[kWords];
  bool negative;
  const long long carry = words_to_digits(w, d, negative);
  if (carry != 0) return negative ? -inf : inf;  // >= 2^(32 kWords - 1074): past every format
  int top = kWords - 1;
  while (top >= 0 && d[top] == 0u) --top;
  if (top < 0) return 0.0;
  const int msb = 32 * top + highest_bit(d[top]);  // N in [2^msb, 2^(msb + 1)), value N 2^-1074 / divisor
  int divisor_bits = 0;
  while (divisor_bits < 64 && (divisor >> divisor_bits) != 0ull) ++divisor_bits;
  // k = floor(log2(N / divisor)) is msb + 1 - divisor_bits or one less: try the larger, and step down when
  // the quotient comes out a bit short of the format's precision (and was not clamped to subnormal ulps)
  for (int k = msb + 1 - divisor_bits;; --k) {
    const int e = k - 1074;
    const int q = (e > emin ? e : emin) - (precision - 1);  // the ulp's exponent (subnormals keep emin's)
    const int shift = q + 1074;  // >= 0 for every format: float64's smallest ulp is bit 0
    unsigned long long rem = 0, m = 0;
    if (divisor == 1ull) {
      m = digit_bits(d, shift, msb - shift + 1);
    } else {
      m = divide_bits(d, msb, shift, divisor, rem);
    }
    if (e > emin && m < (1ull << (precision - 1))) continue;  // k one too large
    // rounding: the true remainder R = rem 2^shift + (N mod 2^shift) against half the step divisor 2^shift
    const bool low_half = shift >= 1 && digit_bits(d, shift - 1, 1) != 0ull;  // bit shift - 1 of N
    const bool low_rest = any_below(d, shift - 1);                            // bits below it
    bool up;
    if (2 * rem > divisor) {
      up = true;
    } else if (2 * rem == divisor) {  // R >= half; a tie when N mod 2^shift == 0
      up = low_half || low_rest || (m & 1ull);
    } else if (2 * rem + 1 == divisor) {  // R against half comes down to N mod 2^shift against 2^(shift - 1)
      up = low_half && (low_rest || (m & 1ull));
    } else {
      up = false;
    }
    if (up) ++m;
    const double value = ldexp(static_cast<double>(m), q);  // m <= 2^precision: exact, or inf past float64
    return negative ? -value : value;
  }
}

// A rounded value (a double the output format holds exactly, +-inf or NaN) as the output type, with no
// FP32 instruction for float: CuPy's NVRTC compiles with -ftz=true, under which cvt.rn.f32.f64 flushed
// a float32 subnormal result to zero. NaN is NumPy's (float16 0x7e00; a GPU conversion gives 0x7fff).
template <class Out>
struct FromRounded {
  __device__ __forceinline__ static Out apply(double v) { return Convert<Out, double>::apply(v); }
};
template <>
struct FromRounded<float> {
  __device__ __forceinline__ static float apply(double v) {
    const unsigned long long b = static_cast<unsigned long long>(__double_as_longlong(v));
    const unsigned sign = static_cast<unsigned>(b >> 63) << 31;
    const int field = static_cast<int>((b >> 52) & 0x7ff);
    if (field == 0x7ff) return bit_cast<float>((b & ((1ull << 52) - 1)) ? 0x7fc00000u : (sign | 0x7f800000u));
    if (field == 0) return bit_cast<float>(sign);  // zero (a double subnormal is never a float32 value)
    const int e = field - 1023;
    if (e > 127) return bit_cast<float>(sign | 0x7f800000u);
    if (e >= -126) return bit_cast<float>(sign | (static_cast<unsigned>(e + 127) << 23) |
                                        static_cast<unsigned>((b >> 29) & 0x7fffffu));
    const double magnitude = (b >> 63) ? -v : v;  // a float32 subnormal: an integer multiple of 2^-149
    return bit_cast<float>(sign | static_cast<unsigned>(magnitude * 0x1p149));
  }
};
template <>
struct FromRounded<half> {  // float16 values are normal float32s: the float conversion does not flush
  __device__ __forceinline__ static half apply(double v) {
    return v != v ? half{0x7e00} : Convert<half, double>::apply(v);
  }
};

// out[r] = the words of row r (rows x kOut) over ``divisor`` rounded to Out (round_words), kRoundRows rows
// per block. The block first copies its rows' words to shared memory in one coalesced sweep: a thread
// reading its row's 73 words itself waited on them one after another (~8 us a call for one row). With
// ``clear`` the sweep writes zeros back, so words kept for the next sum need no clearing launch.
constexpr int kRoundRows = 32;
template <class Out>
__global__ void __launch_bounds__(kRoundRows) exact_round_rows(long long* __restrict__ words, index_t rows,
                                                               int precision, int emin, int skipnan,
                                                               index_t divisor, int clear, Out* __restrict__ out) {
  __shared__ long long staged[kRoundRows * kOut];
  const index_t step = static_cast<index_t>(gridDim.x) * kRoundRows;
  for (index_t first = static_cast<index_t>(blockIdx.x) * kRoundRows; first < rows; first += step) {
    const int count = static_cast<int>(rows - first < kRoundRows ? rows - first : kRoundRows);
    long long* row_words = words + first * kOut;
    for (int i = threadIdx.x; i < count * kOut; i += blockDim.x) {
      staged[i] = row_words[i];
      if (clear) row_words[i] = 0;
    }
    __syncthreads();
    if (static_cast<int>(threadIdx.x) < count) {
      const double v = round_words(staged + threadIdx.x * kOut, precision, emin, skipnan != 0,
                                   static_cast<unsigned long long>(divisor));
      out[first + threadIdx.x] = FromRounded<Out>::apply(v);
    }
    __syncthreads();
  }
}

}  // namespace exact
}  // namespace mr

#include "exact_scan.cuh"
