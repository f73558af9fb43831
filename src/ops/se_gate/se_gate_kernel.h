// se_gate's CPU kernel (se_gate_kernel.cpp). Shapes, dtypes and layouts are checked by the front end
// (se_gate.cpp); the kernel only computes.
#pragma once

#include <ATen/core/Tensor.h>

namespace opfuse::cpu {

// out = x · sigmoid(gate) with gate [N·C] broadcast over each plane; x contiguous or
// channels_last, out alike.
void se_gate_forward_kernel(const at::Tensor& x, const at::Tensor& gate, at::Tensor& out);
// dx = dy · sigmoid(gate);  dgate = s(1 − s) · Σ_hw dy·x
void se_gate_backward_kernel(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& gate,
                             at::Tensor& dx, at::Tensor& dgate);

}  // namespace opfuse::cpu
