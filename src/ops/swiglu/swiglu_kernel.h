// swiglu's CPU kernel (swiglu_kernel.cpp). Shapes, dtypes and layouts are checked by the front end
// (swiglu.cpp); the kernel only computes.
#pragma once

#include <ATen/core/Tensor.h>

namespace opfuse::cpu {

// The activation of a gated unit's gate: silu (SwiGLU) or gelu's tanh form (GeGLU).
enum class Gate { silu, gelu_tanh };

// A gated unit over rows of y's last dimension d: y = a(gate) · up, dgate = dy · u · a'(g),
// dup = dy · a(g). y and dy are contiguous; a row's gate and up (and dgate, dup) start
// in_stride elements after the previous row's: d for two contiguous tensors, 2d for the halves
// of one packed tensor.
void gated_forward_kernel(Gate gate, const at::Tensor& g, const at::Tensor& up, int64_t in_stride, at::Tensor& y);
void gated_backward_kernel(Gate gate, const at::Tensor& dy, const at::Tensor& g, const at::Tensor& up,
                           int64_t in_stride, at::Tensor& dgate, at::Tensor& dup);

}  // namespace opfuse::cpu
