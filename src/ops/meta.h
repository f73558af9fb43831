// What the ops' Meta kernels share: each gives its op's outputs (sizes, dtypes, strides) without
// data, as its CPU front end allocates them, for FakeTensor, AOTAutograd and torch.compile. Sizes
// may be symbolic (torch.compile's dynamic shapes), so they are read as SymInts; an output made on
// x's device (per_row) serves the CPU front end as well.
#pragma once

#include <ATen/OpMathType.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include <optional>
#include <vector>

#include "ops/layout.h"

namespace opfuse::meta {

// x's layout (empty_like keeps a dense input's strides), row-major, or the one x's 4-D kernel walks.
inline at::Tensor like(const at::Tensor& x) { return at::empty_like(x); }
inline at::Tensor dense(const at::Tensor& x) { return at::empty_like(x, x.options(), at::MemoryFormat::Contiguous); }
inline at::Tensor in_kernel_layout(const at::Tensor& x) { return at::empty_like(x, x.options(), kernel_layout(x)); }

// x's sizes with the last one replaced (by `last`) or dropped (no `last`).
inline std::vector<c10::SymInt> sizes_with_last(const at::Tensor& x, std::optional<c10::SymInt> last = std::nullopt) {
  std::vector<c10::SymInt> sizes(x.sym_sizes().begin(), x.sym_sizes().end() - 1);
  if (last) sizes.push_back(*last);
  return sizes;
}

inline at::Tensor empty(c10::SymIntArrayRef sizes, const at::Tensor& like, at::ScalarType dtype) {
  return at::empty_symint(sizes, like.options().dtype(dtype));
}
inline at::Tensor empty(c10::SymIntArrayRef sizes, const at::Tensor& like) { return empty(sizes, like, like.scalar_type()); }

// One value per row of x's last dimension, in the dtype the kernels accumulate x in (a norm's
// mean or rstd, attention's row statistics).
inline at::Tensor per_row(const at::Tensor& x) {
  return empty(sizes_with_last(x), x, at::toOpMathType(x.scalar_type()));
}

}  // namespace opfuse::meta
