// Eight-lane float32 math for the AVX2+FMA kernels, and its scalar twin.
//
// Functions marked OPFUSE_AVX2 are compiled for AVX2+FMA whatever the file's flags, so one
// binary carries both paths; callers reach them only when cpu_capability() says avx2.
// __m256 is a GCC vector type, so `a * b + c` on it is ordinary vector arithmetic.
#pragma once

#include <immintrin.h>

#include <c10/util/BFloat16.h>

#include <cmath>
#include <cstdint>

#define OPFUSE_AVX2 __attribute__((target("avx2,fma"), always_inline)) inline
#define OPFUSE_AVX512 __attribute__((target("avx512f,avx2,fma"), always_inline)) inline

namespace opfuse::cpu {

template <typename A>
inline A sigmoid(A z) {
  return A(1) / (A(1) + std::exp(-z));
}

// exp(x) = 2^n · e^r with n = round(x / ln2) and r = x − n·ln2, ln2 split into a 9-bit head
// (n·ln2_hi is exact) and a tail, so |r| ≤ ln2/2. e^r is its Taylor series to r^7: the
// truncation is below 0.347^8 / 8! = 5e-9 < 2^-27, so with Horner's rounding the result is
// within 2 ulp of exp(x) (the ops tests measure the end-to-end bound). Outside
// [-87.34, 88] the result saturates to 0 / +inf — where a float32 exp is denormal or
// above 1.6e38, and sigmoid(±88) is 1 or below 1e-38 either way. NaN stays NaN: the clamp's
// min/max pass it through and the arithmetic carries it, so no blend is spent on it.
OPFUSE_AVX2 __m256 exp8(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3365402f);  // ln(FLT_MIN): 2^n stays normal
  const __m256 hi = _mm256_set1_ps(88.0f);          // n ≤ 127: 2^n does not overflow
  // a NaN x passes through: min/max return their second operand when one is NaN
  const __m256 xc = _mm256_min_ps(hi, _mm256_max_ps(lo, x));
  const __m256 n = _mm256_round_ps(xc * 1.44269504f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i biased = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
  __m256 y = p * _mm256_castsi256_ps(_mm256_slli_epi32(biased, 23));  // NaN for a NaN x
  y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
  return _mm256_and_ps(y, _mm256_cmp_ps(x, lo, _CMP_NLT_UQ));  // 0 below lo; NaN kept (unordered: true)
}

// sigmoid(z) = 1 / (1 + e^-z): e^-z → +inf gives exactly 0, e^-z → 0 gives exactly 1.
// A true division, not rcp + Newton, keeps the bound at the exp's plus two roundings.
OPFUSE_AVX2 __m256 sigmoid8(__m256 z) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, one + exp8(-z));
}

OPFUSE_AVX2 __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
OPFUSE_AVX2 void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }

// bfloat16 is the top half of a float32: widen by a shift.
OPFUSE_AVX2 __m256 load8(const c10::BFloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// v rounded to bfloat16 in the top half of each lane, the low half zero: to nearest even as
// c10::BFloat16 rounds (add 0x7fff plus the kept half's low bit), NaN a quiet NaN (0x7fc0)
// rather than carried by the rounding into infinity.
OPFUSE_AVX2 __m256i bf16_bits8(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_and_si256(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))),
                                           _mm256_set1_epi32(int(0xffff0000u)));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7fc00000), nan);
}

OPFUSE_AVX2 void store8(c10::BFloat16* p, __m256 v) {
  const __m256i half = _mm256_srli_epi32(bf16_bits8(v), 16);
  // packus works within 128-bit lanes; gather quadwords 0 and 2 to get the eight halves in order.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(half, half), 0b1000);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}

// The same exp and sigmoid, sixteen lanes wide: the same operations in the same order, so
// each lane's result equals the eight-lane version's bit for bit.
OPFUSE_AVX512 __m512 exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.3365402f);
  const __m512 hi = _mm512_set1_ps(88.0f);
  const __m512 xc = _mm512_min_ps(hi, _mm512_max_ps(lo, x));
  const __m512 n = _mm512_roundscale_ps(xc * 1.44269504f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  const __m512i biased = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
  const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ);  // 0 below lo; NaN kept
  __m512 y = _mm512_maskz_mul_ps(keep, p, _mm512_castsi512_ps(_mm512_slli_epi32(biased, 23)));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, hi, _CMP_GT_OQ), y, _mm512_set1_ps(INFINITY));
}

OPFUSE_AVX512 __m512 sigmoid16(__m512 z) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(one, one + exp16(-z));
}

OPFUSE_AVX512 __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
OPFUSE_AVX512 void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }

OPFUSE_AVX512 __m512 load16(const c10::BFloat16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Rounding as bf16_bits8's.
OPFUSE_AVX512 __m512i bf16_bits16(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_and_si512(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))),
                                           _mm512_set1_epi32(int(0xffff0000u)));
  return _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), rounded, _mm512_set1_epi32(0x7fc00000));
}

// vpmovdw narrows in order, so no lane shuffle is needed.
OPFUSE_AVX512 void store16(c10::BFloat16* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(bf16_bits16(v), 16)));
}

}  // namespace opfuse::cpu
