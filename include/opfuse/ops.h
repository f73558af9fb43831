// opfuse's fused operators, as C++ functions.
//
// Each call goes through the dispatcher (`opfuse::<name>` registered with TORCH_LIBRARY), so
// C++ code, TorchScript graphs and Python's torch.ops.opfuse.* all reach the same kernels and
// the same fused backward.
#pragma once

#include <ATen/core/Tensor.h>

namespace opfuse {

// silu(x) = x * sigmoid(x); backward is one fused pass.
at::Tensor silu(const at::Tensor& x);

// swish(x, beta) = x * sigmoid(beta * x); silu is beta = 1.
at::Tensor swish(const at::Tensor& x, double beta = 1.0);

// se_gate(x, gate) = x * sigmoid(gate), gate [N, C, 1, 1] broadcast over x [N, C, H, W]:
// the squeeze-and-excitation tail of an EfficientNet block.
at::Tensor se_gate(const at::Tensor& x, const at::Tensor& gate);

// Path of the shared library holding the operators, for torch.ops.load_library.
const char* ops_library_path();

}  // namespace opfuse
