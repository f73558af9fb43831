// Argument checks shared by the operator front ends; each failure is a c10::Error
// (RuntimeError in Python) whose message names the operator and what it expected.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

namespace opfuse {

inline bool is_supported_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kBFloat16;
}

inline void check_input(const at::Tensor& t, const char* op, const char* name) {
  TORCH_CHECK(t.defined(), op, ": ", name, " is an undefined tensor");
  TORCH_CHECK(t.device().is_cpu(), op, ": ", name, " must be a CPU tensor, got ", t.device());
  TORCH_CHECK(is_supported_dtype(t.scalar_type()), op, ": ", name,
              " must be float32, float64 or bfloat16, got ", t.scalar_type());
}

inline void check_same(const at::Tensor& a, const at::Tensor& b, const char* op,
                       const char* name_a, const char* name_b) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), op, ": ", name_a, " and ", name_b,
              " must have the same dtype, got ", a.scalar_type(), " and ", b.scalar_type());
  TORCH_CHECK(a.sizes() == b.sizes(), op, ": ", name_a, " and ", name_b,
              " must have the same shape, got ", a.sizes(), " and ", b.sizes());
}

}  // namespace opfuse
