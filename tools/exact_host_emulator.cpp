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
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <vector>

#define __device__
#define __global__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

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
struct Convert<half, From> {
  static half apply(const From&) { return half{0x7e00}; }
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

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "round") == 0) return round_rows(argc, argv);
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
