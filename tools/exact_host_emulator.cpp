// Host emulator of kernels/exact.cuh: the kernel's own device functions (pack_sum, Expansion, deposit,
// visit_row, propagate_carries) compiled by g++ with shims, one block at a time and its threads one after
// another. The kernel's result is independent of the order of the integer atomics, and each thread's
// expansion is private, so this sequential order gives the words any GPU schedule gives.
// tools/exact_emulate.py builds it (exact.cuh next to an empty common.cuh: the shims below replace it).
//
//   exact_host_emulator DTYPE N GRID BLOCK TERMS UNROLL BYTE_OFFSET < raw element bytes   (DTYPE: e, f, d)
//   prints the kOut words of the row, one per line (int64).
//   exact_host_emulator round PRECISION EMIN SKIPNAN DIVISOR ROWS < ROWS x kOut int64 words (native order)
//   prints round_words of each row as the int64 bits of the double, and the bits FromRounded<float> makes of
//   it (exact_round_rows<float>'s store), one row per line.
//   exact_host_emulator scan DTYPE OUT N BLOCK ITEMS SKIPNAN < raw element bytes, then the row's carry
//   (kTileOut int64: the words and NaN/+inf/-inf counts cupy_exact.carry_words gives)
//   prints the count of outputs pass 2 left unproved, the count of its threads that ran the exact path
//   (exact_outputs: their fast path, approximate_outputs, gave up, or the elements or outputs are float64),
//   the count of threads with elements and the count of tiles the tile-wide fast path finished
//   (fast_bound), then each output's bits: kernels/exact_scan.cuh, its seeds and fallback kernels run as
//   they are, pass 1 and pass 2 replayed thread by thread (ITEMS: 1, 2, 3, 4, 8, 16 or 32).
//   exact_host_emulator seed ROWS SKIPNAN < ROWS x kTileOut int64   prints seed_of_words of each row.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <algorithm>
#include <vector>
#include <type_traits>

#define __device__
#define __global__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct uint4 {  // the kernels' 16-byte vector loads (stage_tile, store_tile) compile here; pass 2 is replayed
  unsigned x, y, z, w;
};
struct Dim3 {
  unsigned x = 0, y = 0, z = 0;
};
static Dim3 threadIdx, blockIdx, blockDim, gridDim;

inline void __syncthreads() {}
inline long long __double_as_longlong(double d) {
  long long r;
  std::memcpy(&r, &d, sizeof r);
  return r;
}
inline double __longlong_as_double(long long v) {
  double d;
  std::memcpy(&d, &v, sizeof d);
  return d;
}
inline double __dadd_rn(double a, double b) { return a + b; }  // SSE2, round to nearest, no contraction
inline double __dsub_rn(double a, double b) { return a - b; }
// Directed roundings: the nearest sum, moved one ulp when its exact error (TwoSum) points that way.
inline double add_directed(double a, double b, int direction) {
  const double s = a + b;
  if (!std::isfinite(s)) return s;
  const double bv = s - a;
  const double e = (a - (s - bv)) + (b - bv);
  if (direction > 0 && e > 0.0) return std::nextafter(s, INFINITY);
  if (direction < 0 && e < 0.0) return std::nextafter(s, -INFINITY);
  return s;
}
inline double __dadd_ru(double a, double b) { return add_directed(a, b, 1); }
inline double __dadd_rd(double a, double b) { return add_directed(a, b, -1); }
inline double __dsub_ru(double a, double b) { return add_directed(a, -b, 1); }
inline double __dsub_rd(double a, double b) { return add_directed(a, -b, -1); }
// a * b rounded up: the nearest product, moved one ulp up when its exact error (an FMA) is positive
inline double __dmul_ru(double a, double b) {
  const double p = a * b;
  if (!std::isfinite(p)) return p;
  return std::fma(a, b, -p) > 0.0 ? std::nextafter(p, INFINITY) : p;
}
inline float __double2float_rn(double d) { return static_cast<float>(d); }  // SSE2: to nearest, even
// warp intrinsics: the kernels that use them compile here, the drivers below replay their effect
template <class V> inline V __shfl_up_sync(unsigned, V v, int) { return v; }
template <class V> inline V __shfl_xor_sync(unsigned, V v, int) { return v; }
inline unsigned __reduce_max_sync(unsigned, unsigned v) { return v; }
inline unsigned __reduce_min_sync(unsigned, unsigned v) { return v; }
inline void __syncwarp() {}
inline int __syncthreads_count(int p) { return p != 0; }
inline int __syncthreads_and(int p) { return p != 0; }
inline int atomicAdd(int* p, int v) {
  const int old = *p;
  *p = old + v;
  return old;
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
  const unsigned long long old = *p;
  *p = old + v;
  return old;
}
inline unsigned long long atomicOr(unsigned long long* p, unsigned long long v) {
  const unsigned long long old = *p;
  *p = old | v;
  return old;
}

namespace mr {
typedef long long index_t;
struct half {
  unsigned short bits;
};
inline float half_to_float(unsigned short h) {  // exact: every float16 is a float32
  const int e = (h >> 10) & 31, m = h & 1023;
  const float sign = (h & 0x8000) ? -1.0f : 1.0f;
  if (e == 31) return m ? NAN : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -24);
  return sign * std::ldexp(static_cast<float>(1024 + m), e - 25);
}
template <class To, class From>
struct Convert {  // exact_round_rows' output conversions compile here but never run
  static To apply(const From& v) { return static_cast<To>(v); }
};
template <class From>
struct Convert<half, From> {  // exact for float16 values, +-inf past the range (FromRounded<half>'s use)
  static half apply(const From& from) {
    const double v = static_cast<double>(from);
    if (v != v) return half{0x7e00};
    const unsigned short sign = std::signbit(v) ? 0x8000 : 0;
    const double a = std::fabs(v);
    if (a > 65504.0) return half{static_cast<unsigned short>(sign | 0x7c00)};
    if (a < 0x1p-14) return half{static_cast<unsigned short>(sign | static_cast<unsigned short>(a * 0x1p24))};
    int e;
    const double m = std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
    const unsigned mant = static_cast<unsigned>(m * 2048.0) - 1024u;
    return half{static_cast<unsigned short>(sign | ((e - 1 + 15) << 10) | mant)};
  }
};
}  // namespace mr

#include "exact.cuh"

using namespace mr::exact;

template <class T, int Terms, int Unroll>
static void run_row(const T* x, long long n, unsigned grid, unsigned block, unsigned long long* out) {
  gridDim.x = grid;
  gridDim.y = 1;
  blockDim.x = block;
  blockIdx.y = 0;
  for (unsigned b = 0; b < grid; ++b) {
    blockIdx.x = b;
    Banks acc = {};
    long long digits[kWords];
    unsigned long long flags = 0;
    for (unsigned t = 0; t < block; ++t) {
      threadIdx.x = t;
      Expansion<Terms> ex;
      ex.init();
      visit_row<T, Terms, Unroll>(x, n, ex, acc);
      ex.flush(acc);
      flags |= ex.flags;
    }
    propagate_carries(acc, digits);
    for (int j = 0; j < kWords; ++j) out[j] += static_cast<unsigned long long>(digits[j]);
    out[kWords] |= flags;
  }
}

template <class T, int Unroll>
static bool dispatch_terms(int terms, const T* x, long long n, unsigned grid, unsigned block,
                           unsigned long long* out) {
  switch (terms) {
    case 2: run_row<T, 2, Unroll>(x, n, grid, block, out); return true;
    case 3: run_row<T, 3, Unroll>(x, n, grid, block, out); return true;
    case 4: run_row<T, 4, Unroll>(x, n, grid, block, out); return true;
    case 6: run_row<T, 6, Unroll>(x, n, grid, block, out); return true;
    case 8: run_row<T, 8, Unroll>(x, n, grid, block, out); return true;
  }
  return false;
}

template <class T>
static bool dispatch(int terms, int unroll, const T* x, long long n, unsigned grid, unsigned block,
                     unsigned long long* out) {
  switch (unroll) {
    case 1: return dispatch_terms<T, 1>(terms, x, n, grid, block, out);
    case 2: return dispatch_terms<T, 2>(terms, x, n, grid, block, out);
    case 4: return dispatch_terms<T, 4>(terms, x, n, grid, block, out);
    case 8: return dispatch_terms<T, 8>(terms, x, n, grid, block, out);
  }
  return false;
}

static int round_rows(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s round PRECISION EMIN SKIPNAN DIVISOR ROWS < words\n", argv[0]);
    return 2;
  }
  const int precision = std::atoi(argv[2]), emin = std::atoi(argv[3]), skipnan = std::atoi(argv[4]);
  const unsigned long long divisor = std::strtoull(argv[5], nullptr, 10);
  const long long rows = std::atoll(argv[6]);
  std::vector<long long> words(static_cast<size_t>(rows) * kOut);
  if (!words.empty() && std::fread(words.data(), sizeof(long long), words.size(), stdin) != words.size()) {
    std::fprintf(stderr, "short input\n");
    return 2;
  }
  for (long long r = 0; r < rows; ++r) {
    const double v = round_words(words.data() + r * kOut, precision, emin, skipnan != 0, divisor);
    // what exact_round_rows<float> stores (FromRounded<float>), meaningful at precision 24
    const unsigned as_float = bit_cast<unsigned>(FromRounded<float>::apply(v));
    std::printf("%lld %u\n", __double_as_longlong(v), as_float);
  }
  return 0;
}

// ---- the exact scan (kernels/exact_scan.cuh) -------------------------------------------------------------
// Kogge-Stone within each warp, then over the warp totals: the exclusive prefixes of ``p`` in
// exact_scan.cuh's block_exclusive tree (``combine(earlier, later)``; ``zero`` before each warp's first)
template <class V, class Combine>
static std::vector<V> block_exclusive_replay(const std::vector<V>& p, int block, const V& zero, Combine combine) {
  const int warps = block / 32;
  std::vector<V> inc = p, ws(warps), out(block);
  for (int w = 0; w < warps; ++w) {
    for (int o = 1; o < 32; o <<= 1) {
      std::vector<V> next(inc.begin() + 32 * w, inc.begin() + 32 * w + 32);
      for (int lane = o; lane < 32; ++lane) next[lane] = combine(inc[32 * w + lane - o], inc[32 * w + lane]);
      std::copy(next.begin(), next.end(), inc.begin() + 32 * w);
    }
    ws[w] = inc[32 * w + 31];
  }
  for (int o = 1; o < warps; o <<= 1) {
    std::vector<V> next = ws;
    for (int lane = o; lane < warps; ++lane) next[lane] = combine(ws[lane - o], ws[lane]);
    ws = next;
  }
  for (int t = 0; t < block; ++t) {
    const V ex = (t & 31) == 0 ? zero : inc[t - 1];
    out[t] = t < 32 ? ex : combine(ws[t / 32 - 1], ex);
  }
  return out;
}

// pass 2's tile-wide path over one tile (exact_scan_tiles' tile_wide: plain double for float16/float32
// elements and outputs, double-double otherwise): true, and res written, when every output was proved
template <class T, class Out, int Items>
static bool fast_tile(const T* x, int len, int block, bool skipnan, const Partial& seed, std::vector<Out>& res) {
  const int tile = block * Items;
  std::vector<T> in(static_cast<size_t>(padded(tile)), T{});  // stage_tile: zeros past the row
  for (int i = 0; i < len; ++i) in[padded(i)] = staged_element(x[i], skipnan);
  constexpr bool kPlain = sizeof(T) <= 4 && sizeof(Out) <= 4;  // else pairs
  using Acc = std::conditional_t<kPlain, double, DD>;
  std::vector<Acc> sums(block);
  std::vector<unsigned> own(block);
  unsigned top = 0u, low = ~0u;
  for (int th = 0; th < block; ++th) {
    unsigned thread_low;
    sums[th] = thread_sum<Acc, T, Items>(in.data(), th * Items, own[th], thread_low);
    top = std::max(top, own[th]);
    low = std::min(low, thread_low);
  }
  // block_exclusive_sum: block_exclusive's tree over plain doubles or pairs
  const std::vector<Acc> prefix = block_exclusive_replay(sums, block, Acc{}, [](const Acc& a, const Acc& b) {
    return plus(a, b);
  });
  int g = unit_of_low<T>(low);
  if constexpr (kPlain) {
    if (!tile_sums_exact<T>(top, g, tile)) {
      unsigned least = ~0u;
      for (int th = 0; th < block; ++th) least = std::min(least, thread_lowest_bits<T, Items>(in.data(), th * Items));
      g = unit_of_key<T>(least);
    }
  }
  bool proved = true;
  for (int th = 0; th < block; ++th) {
    const int first = th * Items;
    auto run = [&] {
      if constexpr (kPlain) {
        const double a = __dadd_rn(seed.hi, prefix[th]);
        return PlainRun{a, fast_bound<T, Items>(seed, a, own[th], top, g, first)};
      } else {
        const DD a = dd_combine(DD{seed.hi, seed.lo}, prefix[th]);
        return PairRun{a, pair_bound<T, Items>(seed, a, own[th], top, g, first, tile)};
      }
    }();
    if (!(run.u < INFINITY)) return false;
    proved = tile_outputs<T, Out, Items>(run, in.data(), res.data(), first) && proved;
  }
  return proved;
}

template <class Out>
static unsigned long long out_bits(const Out& o) {
  unsigned long long b = 0;
  std::memcpy(&b, &o, sizeof(Out));
  return b;
}

// The kernels' grid-stride loops run whole when the grid is one block: the launches below replay a kernel
// whose threads are independent by running its threads in turn.
static void one_block(unsigned threads) {
  gridDim.x = 1;
  blockIdx.x = 0;
  blockDim.x = threads;
}

template <class T, class Out, int Terms, int Unroll, int Items>
static int run_scan(const T* x, long long n, int block, bool skipnan, const long long* carry) {
  const long long tile = static_cast<long long>(block) * Items;
  const long long tiles = n ? (n + tile - 1) / tile : 0;
  if (tiles == 0) {  // cupy_exact.cumsum launches nothing for an empty row
    std::printf("0 0 0 0\n");
    return 0;
  }
  std::vector<long long> cum(static_cast<size_t>(tiles + 1) * kTileOut, 0);
  std::copy(carry, carry + kTileOut, cum.begin());  // slot 0: the row's incoming carry
  for (long long t = 0; t < tiles; ++t) {  // pass 1: exact_tile_words, one warp, lanes in turn
    const long long start = t * tile, len = std::min(tile, n - start);
    Banks acc = {};
    unsigned long long flags = 0;
    for (int lane = 0; lane < 32; ++lane) {
      Expansion<Terms> ex;
      ex.init();
      visit_range<T, Terms, Unroll>(x + start, len, lane, 32, ex, acc);
      ex.flush(acc);
      flags |= ex.flags;
    }
    long long digits[kWords];
    propagate_carries(acc, digits);
    long long* dst = cum.data() + tile_slot(t, tiles) * kTileOut;
    for (int j = 0; j < kWords; ++j) dst[j] = digits[j];
    dst[kWords] = (flags & kNan) ? 1 : 0;
    dst[kWords + 1] = (flags & kPinf) ? 1 : 0;
    dst[kWords + 2] = (flags & kNinf) ? 1 : 0;
  }
  for (long long s = 1; s <= tiles; ++s) {  // the carries: an inclusive int64 cumsum of the slots (exact_words_cumsum)
    for (int j = 0; j < kTileOut; ++j) cum[s * kTileOut + j] += cum[(s - 1) * kTileOut + j];
  }
  std::vector<long long> seeds(static_cast<size_t>(tiles) * 4);
  one_block(32);
  for (unsigned th = 0; th < 32; ++th) {
    threadIdx.x = th;
    exact_scan_seeds<32>(cum.data(), tiles, tiles, skipnan ? 1 : 0, seeds.data());
  }
  std::vector<Out> out(static_cast<size_t>(n));
  std::vector<int> marked(static_cast<size_t>(tiles), 0);
  long long unproved = 0, exact_threads = 0, threads = 0, fast_tiles = 0;
  std::vector<double> v(static_cast<size_t>(tile));
  std::vector<Partial> mine(block);
  std::vector<Span> spans(block);
  std::vector<Out> res(static_cast<size_t>(padded(static_cast<int>(tile))));  // the kernel's shared staging
  for (long long t = 0; t < tiles; ++t) {  // pass 2: exact_scan_tiles, threads in turn
    const long long start = t * tile;
    const int len = static_cast<int>(std::min(tile, n - start));
    Partial seed;
    seed.hi = __longlong_as_double(seeds[4 * t]);
    seed.lo = __longlong_as_double(seeds[4 * t + 1]);
    seed.eb = __longlong_as_double(seeds[4 * t + 2]);
    seed.flags = static_cast<unsigned long long>(seeds[4 * t + 3]);
    if (fast_tile<T, Out, Items>(x + start, len, block, skipnan, seed, res)) {
      for (int i = 0; i < len; ++i) out[start + i] = res[padded(i)];
      threads += (len + Items - 1) / Items;
      ++fast_tiles;
      continue;  // marked[t] stays 0
    }
    for (int th = 0; th < block; ++th) {
      for (int j = 0; j < Items; ++j) {
        const int i = th * Items + j;
        v[i] = i < len ? to_double(x[start + i]) : 0.0;
      }
      spans[th] = exponent_span<Items>(v.data() + th * Items);
      mine[th] = thread_partial<T, Items>(v.data() + th * Items, spans[th], skipnan);
    }
    const std::vector<Partial> excl = block_exclusive_replay(mine, block, partial_zero(), partial_combine);
    long long unproved_here = 0;
    for (int th = 0; th < block; ++th) {
      const int first = th * Items;
      const Partial run = partial_combine(seed, excl[th]);
      const double* mine_v = v.data() + first;
      if (!approximate_outputs<T, Out, Items>(run, mine_v, spans[th], first, len, res.data())) {
        exact_threads += first < len;
        unproved_here += exact_outputs<Out, Items>(run, mine_v, first, len, skipnan, res.data());
      }
      threads += first < len;
    }
    for (int i = 0; i < len; ++i) out[start + i] = res[padded(i)];
    unproved += unproved_here;
    marked[t] = static_cast<int>(unproved_here);
  }
  one_block(32);
  threadIdx.x = 0;  // the walking thread (its 31 neighbours skip every tile)
  exact_scan_fallback<T, Out>(x, 1, n, tile, tiles, cum.data(), marked.data(), out.data());
  std::printf("%lld %lld %lld %lld\n", unproved, exact_threads, threads, fast_tiles);
  for (long long i = 0; i < n; ++i) std::printf("%llu\n", out_bits(out[i]));
  return 0;
}

template <class T, int Items>
static int scan_to(char out, const T* x, long long n, int block, bool skipnan, const long long* carry) {
  constexpr int unroll = sizeof(T) == 2 ? 2 : 4;  // cupy_exact.UNROLL
  if (out == 'e') return run_scan<T, mr::half, 8, unroll, Items>(x, n, block, skipnan, carry);
  if (out == 'f') return run_scan<T, float, 8, unroll, Items>(x, n, block, skipnan, carry);
  if (out == 'd') return run_scan<T, double, 8, unroll, Items>(x, n, block, skipnan, carry);
  std::fprintf(stderr, "unsupported output dtype %c\n", out);
  return 2;
}

// Items is a template argument of pass 2's per-thread functions (the kernel's): the tests' and the library's.
template <class T>
static int scan_items(char out, int items, const T* x, long long n, int block, bool skipnan, const long long* carry) {
  switch (items) {
    case 1: return scan_to<T, 1>(out, x, n, block, skipnan, carry);
    case 2: return scan_to<T, 2>(out, x, n, block, skipnan, carry);
    case 3: return scan_to<T, 3>(out, x, n, block, skipnan, carry);
    case 4: return scan_to<T, 4>(out, x, n, block, skipnan, carry);
    case 8: return scan_to<T, 8>(out, x, n, block, skipnan, carry);
    case 16: return scan_to<T, 16>(out, x, n, block, skipnan, carry);
    case 32: return scan_to<T, 32>(out, x, n, block, skipnan, carry);
  }
  std::fprintf(stderr, "unsupported ITEMS %d (1, 2, 3, 4, 8, 16, 32)\n", items);
  return 2;
}

static int scan_row(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: %s scan DTYPE OUT N BLOCK ITEMS SKIPNAN < bytes, then the carry's kTileOut int64\n", argv[0]);
    return 2;
  }
  const char dtype = argv[2][0], out = argv[3][0];
  const long long n = std::atoll(argv[4]);
  const int block = std::atoi(argv[5]), items = std::atoi(argv[6]);
  const bool skipnan = std::atoi(argv[7]) != 0;
  if (block < 32 || block % 32 || items < 1) {
    std::fprintf(stderr, "BLOCK must be a multiple of 32, ITEMS >= 1\n");
    return 2;
  }
  const size_t item = dtype == 'e' ? 2 : dtype == 'f' ? 4 : 8;
  const size_t bytes = static_cast<size_t>(n) * item;
  std::vector<unsigned char> storage(bytes + 16);
  unsigned char* data = storage.data() + ((16 - (reinterpret_cast<uintptr_t>(storage.data()) & 15)) & 15);
  long long carry[kTileOut];
  if ((bytes && std::fread(data, 1, bytes, stdin) != bytes) ||
      std::fread(carry, sizeof(long long), kTileOut, stdin) != static_cast<size_t>(kTileOut)) {
    std::fprintf(stderr, "short input\n");
    return 2;
  }
  if (dtype == 'e') return scan_items(out, items, reinterpret_cast<const mr::half*>(data), n, block, skipnan, carry);
  if (dtype == 'f') return scan_items(out, items, reinterpret_cast<const float*>(data), n, block, skipnan, carry);
  if (dtype == 'd') return scan_items(out, items, reinterpret_cast<const double*>(data), n, block, skipnan, carry);
  std::fprintf(stderr, "unsupported dtype %c\n", dtype);
  return 2;
}

static int seed_rows(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s seed ROWS SKIPNAN < words\n", argv[0]);
    return 2;
  }
  const long long rows = std::atoll(argv[2]);
  const bool skipnan = std::atoi(argv[3]) != 0;
  std::vector<long long> words(static_cast<size_t>(rows) * kTileOut);
  if (!words.empty() && std::fread(words.data(), sizeof(long long), words.size(), stdin) != words.size()) {
    std::fprintf(stderr, "short input\n");
    return 2;
  }
  for (long long r = 0; r < rows; ++r) {
    const Partial p = seed_of_words(words.data() + r * kTileOut, skipnan);
    std::printf("%lld %lld %lld %llu\n", __double_as_longlong(p.hi), __double_as_longlong(p.lo),
                __double_as_longlong(p.eb), p.flags);
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "round") == 0) return round_rows(argc, argv);
  if (argc > 1 && std::strcmp(argv[1], "scan") == 0) return scan_row(argc, argv);
  if (argc > 1 && std::strcmp(argv[1], "seed") == 0) return seed_rows(argc, argv);
  if (argc != 8) {
    std::fprintf(stderr, "usage: %s DTYPE N GRID BLOCK TERMS UNROLL BYTE_OFFSET < bytes\n", argv[0]);
    return 2;
  }
  const char dtype = argv[1][0];
  const long long n = std::atoll(argv[2]);
  const unsigned grid = static_cast<unsigned>(std::atoi(argv[3])), block = static_cast<unsigned>(std::atoi(argv[4]));
  const int terms = std::atoi(argv[5]), unroll = std::atoi(argv[6]), offset = std::atoi(argv[7]);
  const size_t item = dtype == 'e' ? 2 : dtype == 'f' ? 4 : 8;
  const size_t bytes = static_cast<size_t>(n) * item;
  std::vector<unsigned char> storage(bytes + 64);
  unsigned char* base = storage.data();
  base += (16 - (reinterpret_cast<uintptr_t>(base) & 15)) & 15;  // 16-aligned, then the requested offset
  unsigned char* data = base + offset;
  if (bytes && std::fread(data, 1, bytes, stdin) != bytes) {
    std::fprintf(stderr, "short input\n");
    return 2;
  }
  unsigned long long out[kOut] = {0};
  bool ok = false;
  if (dtype == 'e') ok = dispatch(terms, unroll, reinterpret_cast<const mr::half*>(data), n, grid, block, out);
  if (dtype == 'f') ok = dispatch(terms, unroll, reinterpret_cast<const float*>(data), n, grid, block, out);
  if (dtype == 'd') ok = dispatch(terms, unroll, reinterpret_cast<const double*>(data), n, grid, block, out);
  if (!ok) {
    std::fprintf(stderr, "unsupported dtype %c, terms %d or unroll %d\n", dtype, terms, unroll);
    return 2;
  }
  for (int j = 0; j < kOut; ++j) std::printf("%lld\n", static_cast<long long>(out[j]));
  return 0;
}
