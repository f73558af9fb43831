// CPU kernels of the opfuse operators. Shapes, dtypes and layouts are checked by the callers
// in src/ops/*.cpp; a kernel only computes.
#pragma once

#include <ATen/core/Tensor.h>

namespace at {
struct TensorIteratorBase;
}

namespace opfuse::cpu {

// out = x · sigmoid(βx)
void swish_forward_kernel(at::TensorIteratorBase& iter, double beta);
// dx = dy · s · (1 + βx(1 − s)),  s = sigmoid(βx)
void swish_backward_kernel(at::TensorIteratorBase& iter, double beta);

// out = x · sigmoid(gate) with gate [N·C] broadcast over each plane; x contiguous or
// channels_last, out alike.
void se_gate_forward_kernel(const at::Tensor& x, const at::Tensor& gate, at::Tensor& out);
// dx = dy · sigmoid(gate);  dgate = s(1 − s) · Σ_hw dy·x
void se_gate_backward_kernel(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& gate,
                             at::Tensor& dx, at::Tensor& dgate);

}  // namespace opfuse::cpu
