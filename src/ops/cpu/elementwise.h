// Runs an elementwise op over a TensorIterator: out = op(in...) with one or two inputs.
//
// An op is a struct with spellings of one formula, side by side:
//   A scalar(A x...)          in the accumulation type A (float for float32/bfloat16, double for float64)
//   __m256 vec(__m256 x...)   eight float32 lanes, OPFUSE_AVX2
//   __m512 vec(__m512 x...)   sixteen lanes, OPFUSE_AVX512, the same operations as the eight-lane one
// On AVX2/AVX-512 machines every float32/bfloat16 element goes through vec(): strided runs and
// the ragged tail are gathered into a full-width buffer rather than sent to scalar(), so an
// element's result never depends on where a thread's chunk happens to start.
#pragma once

#include <ATen/native/TensorIterator.h>
#include <ATen/OpMathType.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "ops/cpu/capability.h"
#include "ops/cpu/grain.h"
#include "ops/cpu/vec_math.h"

namespace opfuse::cpu {

template <typename T, int kInputs, typename Op>
OPFUSE_AVX2 void apply8(const Op& op, const T* a, const T* b, T* out) {
  if constexpr (kInputs == 1) store8(out, op.vec(load8(a)));
  else store8(out, op.vec(load8(a), load8(b)));
}

template <typename T, int kInputs, typename Op>
OPFUSE_AVX512 void apply16(const Op& op, const T* a, const T* b, T* out) {
  if constexpr (kInputs == 1) store16(out, op.vec(load16(a)));
  else store16(out, op.vec(load16(a), load16(b)));
}

// One body for both widths: kLanes elements at a time, direct when every operand is
// contiguous, through a gather buffer otherwise and for the tail.
template <int kLanes, typename T, int kInputs, typename Apply>
inline __attribute__((always_inline)) void map_lanes(char** data, const int64_t* strides, int64_t n,
                                                     const Apply& apply) {
  bool contiguous = true;
  for (int k = 0; k <= kInputs; ++k) contiguous &= strides[k] == sizeof(T);
  auto at = [&](int k, int64_t i) { return reinterpret_cast<T*>(data[k] + i * strides[k]); };
  int64_t i = 0;
  if (contiguous) {
    for (; i + kLanes <= n; i += kLanes) apply(at(1, i), at(kInputs, i), at(0, i));
  }
  for (; i < n; i += kLanes) {
    const int64_t m = std::min<int64_t>(kLanes, n - i);
    T in[2][kLanes] = {}, out[kLanes];
    for (int64_t j = 0; j < m; ++j)
      for (int k = 1; k <= kInputs; ++k) in[k - 1][j] = *at(k, i + j);
    apply(in[0], in[kInputs - 1], out);
    for (int64_t j = 0; j < m; ++j) *at(0, i + j) = out[j];
  }
}

template <typename T, int kInputs, typename Op>
__attribute__((target("avx2,fma"))) void map_avx2(char** data, const int64_t* strides, int64_t n, const Op& op) {
  map_lanes<8, T, kInputs>(data, strides, n, [&](const T* a, const T* b, T* out)
                                                 __attribute__((target("avx2,fma"))) { apply8<T, kInputs>(op, a, b, out); });
}

template <typename T, int kInputs, typename Op>
__attribute__((target("avx512f,avx2,fma"))) void map_avx512(char** data, const int64_t* strides, int64_t n,
                                                            const Op& op) {
  map_lanes<16, T, kInputs>(data, strides, n, [&](const T* a, const T* b, T* out)
                                                  __attribute__((target("avx512f,avx2,fma"))) { apply16<T, kInputs>(op, a, b, out); });
}

template <typename T, int kInputs, typename Op>
void map_scalar(char** data, const int64_t* strides, int64_t n, const Op& op) {
  using A = at::opmath_type<T>;
  for (int64_t i = 0; i < n; ++i) {
    auto in = [&](int k) { return static_cast<A>(*reinterpret_cast<const T*>(data[k] + i * strides[k])); };
    T* out = reinterpret_cast<T*>(data[0] + i * strides[0]);
    if constexpr (kInputs == 1) *out = static_cast<T>(op.scalar(in(1)));
    else *out = static_cast<T>(op.scalar(in(1), in(2)));
  }
}

template <typename T, int kInputs, typename Op>
void run_elementwise(at::TensorIteratorBase& iter, const Op& op) {
  constexpr bool has_vector_path = !std::is_same_v<T, double>;
  const Capability capability = cpu_capability();
  auto loop = [&](char** data, const int64_t* strides, int64_t size0, int64_t size1) {
    char* row[kInputs + 1];
    for (int64_t j = 0; j < size1; ++j) {
      for (int k = 0; k <= kInputs; ++k) row[k] = data[k] + j * strides[kInputs + 1 + k];
      if constexpr (has_vector_path) {
        if (capability == Capability::avx512) {
          map_avx512<T, kInputs>(row, strides, size0, op);
          continue;
        }
        if (capability == Capability::avx2) {
          map_avx2<T, kInputs>(row, strides, size0, op);
          continue;
        }
      }
      map_scalar<T, kInputs>(row, strides, size0, op);
    }
  };
  iter.for_each(loop, kGrain);
}

}  // namespace opfuse::cpu
