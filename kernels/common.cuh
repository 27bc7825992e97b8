// multireduce: types, conversions and the built-in operators shared by every kernel.
//
// No standard headers: the same text is compiled by NVRTC (through CuPy) and by nvcc (CI), and
// NVRTC ships none. Our own 16-bit float is a bit container converted with PTX, so float16 needs no
// cuda_fp16.h either.
#pragma once

namespace mr {

typedef long long index_t;  // every element offset: inputs past 2^31 elements are supported

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;

// ---- float16 as bits ----------------------------------------------------------------------------
struct half {
  unsigned short bits;
};

__device__ __forceinline__ float half_to_float(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}

__device__ __forceinline__ unsigned short float_to_half(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

// ---- conversions between element, accumulator and output types ----------------------------------
template <class To, class From>
struct Convert {
  __device__ __forceinline__ static To apply(const From& v) { return static_cast<To>(v); }
};
template <class From>
struct Convert<half, From> {
  __device__ __forceinline__ static half apply(const From& v) { return half{float_to_half(static_cast<float>(v))}; }
};
template <class To>
struct Convert<To, half> {
  __device__ __forceinline__ static To apply(const half& v) { return static_cast<To>(half_to_float(v.bits)); }
};
template <>
struct Convert<half, half> {
  __device__ __forceinline__ static half apply(const half& v) { return v; }
};

template <class To, class From>
__device__ __forceinline__ To convert(const From& v) {
  return Convert<To, From>::apply(v);
}

// ---- integer arithmetic that wraps (signed overflow is undefined in C++, defined in NumPy) ------
template <bool C, class A, class B> struct Select { typedef A type; };
template <class A, class B> struct Select<false, A, B> { typedef B type; };

template <class A> struct Unsigned { typedef A type; };
template <> struct Unsigned<signed char> { typedef unsigned char type; };
template <> struct Unsigned<short> { typedef unsigned short type; };
template <> struct Unsigned<int> { typedef unsigned int type; };
template <> struct Unsigned<long> { typedef unsigned long type; };
template <> struct Unsigned<long long> { typedef unsigned long long type; };

template <class A> struct IsSignedInt { static constexpr bool value = false; };
template <> struct IsSignedInt<signed char> { static constexpr bool value = true; };
template <> struct IsSignedInt<short> { static constexpr bool value = true; };
template <> struct IsSignedInt<int> { static constexpr bool value = true; };
template <> struct IsSignedInt<long> { static constexpr bool value = true; };
template <> struct IsSignedInt<long long> { static constexpr bool value = true; };

template <class A>
__device__ __forceinline__ bool is_nan(const A& v) {
  return v != v;  // false for integers, true only for floating-point NaN
}

// ---- built-in operators: left holds the earlier elements -----------------------------------------
struct Sum {
  template <class A>
  __device__ __forceinline__ A operator()(const A& a, const A& b) const {
    if constexpr (IsSignedInt<A>::value) {
      typedef typename Unsigned<A>::type U;
      return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return static_cast<A>(a + b);
    }
  }
};

struct Prod {
  template <class A>
  __device__ __forceinline__ A operator()(const A& a, const A& b) const {
    if constexpr (IsSignedInt<A>::value) {
      typedef typename Unsigned<A>::type U;
      return static_cast<A>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
    } else if constexpr (sizeof(A) < sizeof(int)) {
      return static_cast<A>(static_cast<unsigned>(a) * static_cast<unsigned>(b));
    } else {
      return static_cast<A>(a * b);
    }
  }
};

// NaN wins, as in numpy.minimum / numpy.maximum
struct Min {
  template <class A>
  __device__ __forceinline__ A operator()(const A& a, const A& b) const {
    return (b < a || is_nan(b)) ? b : a;
  }
};

struct Max {
  template <class A>
  __device__ __forceinline__ A operator()(const A& a, const A& b) const {
    return (a < b || is_nan(b)) ? b : a;
  }
};

// Reinterpret the bytes of ``v`` as a ``To`` (at least as large; spare bytes are zero). NVRTC has no
// memcpy, and a union is what CUDA compilers define for this.
template <class To, class From>
__device__ __forceinline__ To bits_as(const From& v) {
  static_assert(sizeof(From) <= sizeof(To), "the target holds every byte");
  union {
    To to;
    From from;
  } u;
  u.to = To();
  u.from = v;
  return u.to;
}

// ---- the load transform: what an operator makes of an input element as it is read -----------------
// An operator may define ``template <class A> static A load(const A& v)``, applied to every input element
// (after conversion to the accumulator) and never to partial results: the nan-family masks NaN there, in
// the same pass as the reduction. Every kernel reads input through load_as; without Op::load it is the
// plain conversion, so other operators' code is unchanged.
template <class Op, class A>
__device__ __forceinline__ auto load_transform(const A& v, int) -> decltype(Op::load(v)) {
  return Op::load(v);
}
template <class Op, class A>
__device__ __forceinline__ A load_transform(const A& v, long) {
  return v;
}
template <class Acc, class Op, class T>
__device__ __forceinline__ Acc load_as(const T& e) {
  return load_transform<Op>(convert<Acc>(e), 0);  // 0 is an int: the Op::load overload wins where it exists
}

template <class A>
__device__ __forceinline__ A positive_infinity();
template <>
__device__ __forceinline__ float positive_infinity<float>() {
  return bits_as<float>(0x7f800000u);
}
template <>
__device__ __forceinline__ double positive_infinity<double>() {
  return bits_as<double>(0x7ff0000000000000ull);
}

// NaN as the identity (numpy.nansum, nanprod); floating accumulators only. NaN made by the arithmetic
// itself (inf - inf) is a partial result, never reloaded, so it stays NaN as in NumPy.
struct NanSum : Sum {
  template <class A>
  __device__ __forceinline__ static A load(const A& v) {
    return is_nan(v) ? A(0) : v;
  }
};
struct NanProd : Prod {
  template <class A>
  __device__ __forceinline__ static A load(const A& v) {
    return is_nan(v) ? A(1) : v;
  }
};
// NaN skipped (numpy.nanmin, nanmax): read as the identity, +inf / -inf. An all-NaN slice then gives the
// identity; the caller tells it from a slice of infinities and finishes it as NumPy (warning, NaN).
struct NanMin : Min {
  template <class A>
  __device__ __forceinline__ static A load(const A& v) {
    return is_nan(v) ? positive_infinity<A>() : v;
  }
};
struct NanMax : Max {
  template <class A>
  __device__ __forceinline__ static A load(const A& v) {
    return is_nan(v) ? -positive_infinity<A>() : v;
  }
};

// ---- shuffles of any 1- to 8-byte value ---------------------------------------------------------
// The hardware shuffles 4- or 8-byte words; smaller types ride in an int.
template <class T, class Shuffle>
__device__ __forceinline__ T shuffle_bits(const T& v, Shuffle shuffle) {
  static_assert(sizeof(T) <= 8, "shuffled values are at most 8 bytes");
  typedef typename Select<(sizeof(T) <= 4), int, long long>::type Word;
  union {
    Word w;
    T t;
  } u;
  u.w = shuffle(bits_as<Word>(v));
  return u.t;
}

template <class T>
__device__ __forceinline__ T shfl_down(const T& v, int delta) {
  return shuffle_bits(v, [delta](auto w) { return __shfl_down_sync(kFullMask, w, delta); });
}
template <class T>
__device__ __forceinline__ T shfl_up(const T& v, int delta) {
  return shuffle_bits(v, [delta](auto w) { return __shfl_up_sync(kFullMask, w, delta); });
}
template <class T>
__device__ __forceinline__ T shfl_xor(const T& v, int mask) {
  return shuffle_bits(v, [mask](auto w) { return __shfl_xor_sync(kFullMask, w, mask); });
}
template <class T>
__device__ __forceinline__ T shfl_idx(const T& v, int lane) {
  return shuffle_bits(v, [lane](auto w) { return __shfl_sync(kFullMask, w, lane); });
}

// Loads that other blocks of the same launch may have just written (last-block guard, look-back).
template <class T>
__device__ __forceinline__ T load_volatile(const T* p) {
  return *reinterpret_cast<const volatile T*>(p);
}
template <class T>
__device__ __forceinline__ void store_volatile(T* p, const T& v) {
  *reinterpret_cast<volatile T*>(p) = v;
}

}  // namespace mr
