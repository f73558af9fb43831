// One vector interface over the three CPU paths, so a kernel's loops are written once:
//   Lanes1<A>   one element in the accumulation type A (float, or double for float64)
//   Lanes8      eight float32 lanes (AVX2+FMA)
//   Lanes16     sixteen float32 lanes (AVX-512)
// Each has F (the value type, with + − * / as ordinary arithmetic), load/store for the storage
// types, set1, sigmoid, exp, sqrt (correctly rounded on every path, as / is), round_as<T> (each
// lane rounded to storage type T, as a store and load would round it), max, fmadd (a·b + c
// rounded once, the same bits on every path), load_pairs/store_pairs (2·kLanes interleaved
// elements as their even and odd elements), the horizontal hmax and hsumf of one F, and D: double
// accumulators for one F (sums of many elements are kept in double, so a per-channel sum over
// 10^5 elements loses nothing to float rounding): add (s += v), accumulate, hsum.
// A loop written against this interface must be compiled for its target: see
// batch_norm_silu_loops.h, which is included once per path under `#pragma GCC target`.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "ops/cpu/vec_math.h"

namespace opfuse::cpu {

template <typename Acc>
struct Lanes1 {
  static constexpr int kLanes = 1;
  using A = Acc;
  using F = Acc;
  using D = double;
  template <typename T>
  static F load(const T* p) { return F(*p); }
  template <typename T>
  static void store(T* p, F v) { *p = T(v); }
  static F set1(A v) { return v; }
  static F sigmoid(F z) { return cpu::sigmoid(z); }
  static F exp(F z) { return std::exp(z); }
  static F sqrt(F z) { return std::sqrt(z); }
  template <typename T>
  static F round_as(F v) { return F(T(v)); }
  static F max(F a, F b) { return a < b ? b : a; }
  static F fmadd(F a, F b, F c) { return std::fma(a, b, c); }
  template <typename T>
  static void load_pairs(const T* p, F& even, F& odd) { even = F(p[0]), odd = F(p[1]); }
  template <typename T>
  static void store_pairs(T* p, F even, F odd) { p[0] = T(even), p[1] = T(odd); }
  static A hmax(F v) { return v; }
  static A hsumf(F v) { return v; }
  static D dzero() { return 0; }
  static void add(D& s, F v) { s += double(v); }
  // s1 += a, s2 += a·b
  static void accumulate(D& s1, D& s2, F a, F b) {
    s1 += double(a);
    s2 += double(a) * double(b);
  }
  static void accumulate(double* s1, double* s2, F a, F b) { accumulate(*s1, *s2, a, b); }
  static double hsum(D d) { return d; }
};

struct Lanes8 {
  static constexpr int kLanes = 8;
  using A = float;
  using F = __m256;
  struct D { __m256d lo, hi; };
  OPFUSE_AVX2 static F load(const float* p) { return load8(p); }
  OPFUSE_AVX2 static F load(const c10::BFloat16* p) { return load8(p); }
  OPFUSE_AVX2 static void store(float* p, F v) { store8(p, v); }
  OPFUSE_AVX2 static void store(c10::BFloat16* p, F v) { store8(p, v); }
  OPFUSE_AVX2 static F set1(float v) { return _mm256_set1_ps(v); }
  OPFUSE_AVX2 static F sigmoid(F z) { return sigmoid8(z); }
  OPFUSE_AVX2 static F exp(F z) { return exp8(z); }
  OPFUSE_AVX2 static F sqrt(F z) { return _mm256_sqrt_ps(z); }
  template <typename T>
  OPFUSE_AVX2 static F round_as(F v) {
    if constexpr (std::is_same_v<T, c10::BFloat16>) return _mm256_castsi256_ps(bf16_bits8(v));
    else return v;
  }
  OPFUSE_AVX2 static F max(F a, F b) { return _mm256_max_ps(a, b); }
  OPFUSE_AVX2 static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  // shuffle_ps picks within 128-bit halves ([a0 a2 b0 b2 | a4 a6 b4 b6]); the 64-bit permute
  // puts the halves' pairs in order.
  template <typename T>
  OPFUSE_AVX2 static void load_pairs(const T* p, F& even, F& odd) {
    const F a = load(p), b = load(p + 8);
    constexpr int kOrder = _MM_SHUFFLE(3, 1, 2, 0);
    even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0))), kOrder));
    odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))), kOrder));
  }
  template <typename T>
  OPFUSE_AVX2 static void store_pairs(T* p, F even, F odd) {
    const F lo = _mm256_unpacklo_ps(even, odd), hi = _mm256_unpackhi_ps(even, odd);  // e0 o0 e1 o1 | e4 o4 e5 o5
    store(p, _mm256_permute2f128_ps(lo, hi, 0x20));
    store(p + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
  }
  OPFUSE_AVX2 static float hmax(F v) {
    alignas(32) float x[8];
    _mm256_store_ps(x, v);
    return std::max(std::max(std::max(x[0], x[1]), std::max(x[2], x[3])),
                    std::max(std::max(x[4], x[5]), std::max(x[6], x[7])));
  }
  // The same pairwise order as Lanes16's lower half.
  OPFUSE_AVX2 static float hsumf(F v) {
    alignas(32) float x[8];
    _mm256_store_ps(x, v);
    return ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]));
  }
  OPFUSE_AVX2 static D dzero() { return {_mm256_setzero_pd(), _mm256_setzero_pd()}; }
  OPFUSE_AVX2 static D widen(F v) {
    return {_mm256_cvtps_pd(_mm256_castps256_ps128(v)), _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1))};
  }
  OPFUSE_AVX2 static void add(D& s, F v) {
    const D w = widen(v);
    s = {s.lo + w.lo, s.hi + w.hi};
  }
  OPFUSE_AVX2 static void accumulate(D& s1, D& s2, F a, F b) {
    const D wa = widen(a), wb = widen(b);
    s1 = {s1.lo + wa.lo, s1.hi + wa.hi};
    s2 = {_mm256_fmadd_pd(wa.lo, wb.lo, s2.lo), _mm256_fmadd_pd(wa.hi, wb.hi, s2.hi)};
  }
  OPFUSE_AVX2 static void accumulate(double* s1, double* s2, F a, F b) {
    D m1{_mm256_loadu_pd(s1), _mm256_loadu_pd(s1 + 4)}, m2{_mm256_loadu_pd(s2), _mm256_loadu_pd(s2 + 4)};
    accumulate(m1, m2, a, b);
    _mm256_storeu_pd(s1, m1.lo), _mm256_storeu_pd(s1 + 4, m1.hi);
    _mm256_storeu_pd(s2, m2.lo), _mm256_storeu_pd(s2 + 4, m2.hi);
  }
  // A fixed pairwise order, so the sum of the lanes does not depend on anything but the data.
  OPFUSE_AVX2 static double hsum(D d) {
    alignas(32) double v[4];
    _mm256_store_pd(v, d.lo + d.hi);
    return (v[0] + v[1]) + (v[2] + v[3]);
  }
};

struct Lanes16 {
  static constexpr int kLanes = 16;
  using A = float;
  using F = __m512;
  struct D { __m512d lo, hi; };
  OPFUSE_AVX512 static F load(const float* p) { return load16(p); }
  OPFUSE_AVX512 static F load(const c10::BFloat16* p) { return load16(p); }
  OPFUSE_AVX512 static void store(float* p, F v) { store16(p, v); }
  OPFUSE_AVX512 static void store(c10::BFloat16* p, F v) { store16(p, v); }
  OPFUSE_AVX512 static F set1(float v) { return _mm512_set1_ps(v); }
  OPFUSE_AVX512 static F sigmoid(F z) { return sigmoid16(z); }
  OPFUSE_AVX512 static F exp(F z) { return exp16(z); }
  OPFUSE_AVX512 static F sqrt(F z) { return _mm512_sqrt_ps(z); }
  template <typename T>
  OPFUSE_AVX512 static F round_as(F v) {
    if constexpr (std::is_same_v<T, c10::BFloat16>) return _mm512_castsi512_ps(bf16_bits16(v));
    else return v;
  }
  OPFUSE_AVX512 static F max(F a, F b) { return _mm512_max_ps(a, b); }
  OPFUSE_AVX512 static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  template <typename T>
  OPFUSE_AVX512 static void load_pairs(const T* p, F& even, F& odd) {
    const F a = load(p), b = load(p + 16);
    const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    even = _mm512_permutex2var_ps(a, evens, b);
    odd = _mm512_permutex2var_ps(a, _mm512_add_epi32(evens, _mm512_set1_epi32(1)), b);
  }
  template <typename T>
  OPFUSE_AVX512 static void store_pairs(T* p, F even, F odd) {
    const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    store(p, _mm512_permutex2var_ps(even, first, odd));
    store(p + 16, _mm512_permutex2var_ps(even, _mm512_add_epi32(first, _mm512_set1_epi32(8)), odd));
  }
  OPFUSE_AVX512 static float hmax(F v) {
    alignas(64) float x[16];
    _mm512_store_ps(x, v);
    float top = x[0];
    for (int j = 1; j < 16; ++j) top = std::max(top, x[j]);
    return top;
  }
  OPFUSE_AVX512 static float hsumf(F v) {
    alignas(64) float x[16];
    _mm512_store_ps(x, v);
    float s[2];
    for (int h = 0; h < 2; ++h) {
      const float* y = x + 8 * h;
      s[h] = ((y[0] + y[1]) + (y[2] + y[3])) + ((y[4] + y[5]) + (y[6] + y[7]));
    }
    return s[0] + s[1];
  }
  OPFUSE_AVX512 static D dzero() { return {_mm512_setzero_pd(), _mm512_setzero_pd()}; }
  OPFUSE_AVX512 static D widen(F v) {
    return {_mm512_cvtps_pd(_mm512_castps512_ps256(v)),
            _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)))};
  }
  OPFUSE_AVX512 static void add(D& s, F v) {
    const D w = widen(v);
    s = {s.lo + w.lo, s.hi + w.hi};
  }
  OPFUSE_AVX512 static void accumulate(D& s1, D& s2, F a, F b) {
    const D wa = widen(a), wb = widen(b);
    s1 = {s1.lo + wa.lo, s1.hi + wa.hi};
    s2 = {_mm512_fmadd_pd(wa.lo, wb.lo, s2.lo), _mm512_fmadd_pd(wa.hi, wb.hi, s2.hi)};
  }
  OPFUSE_AVX512 static void accumulate(double* s1, double* s2, F a, F b) {
    D m1{_mm512_loadu_pd(s1), _mm512_loadu_pd(s1 + 8)}, m2{_mm512_loadu_pd(s2), _mm512_loadu_pd(s2 + 8)};
    accumulate(m1, m2, a, b);
    _mm512_storeu_pd(s1, m1.lo), _mm512_storeu_pd(s1 + 8, m1.hi);
    _mm512_storeu_pd(s2, m2.lo), _mm512_storeu_pd(s2 + 8, m2.hi);
  }
  OPFUSE_AVX512 static double hsum(D d) {
    alignas(64) double v[8];
    _mm512_store_pd(v, d.lo + d.hi);
    return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
  }
};

}  // namespace opfuse::cpu
