// The composites opfuse's ops replace, written as the models they come from write them: the
// baselines the ops' specs, tests and benchmarks judge the fused ops by.
#pragma once

#include <ATen/core/Tensor.h>

namespace opfuse::reference {

// The reference's "memory efficient" Swish (efficientnet_pytorch SwishImplementation), op for
// op: forward i·sigmoid(i) saving only i; backward recomputes s = sigmoid(i) and applies
// g · (s · (1 + i · (1 − s))) as six separate tensor ops. The baseline every fusion is judged by.
at::Tensor memory_efficient_swish(const at::Tensor& x);

// x · sigmoid(x) through autograd (PyTorch records sigmoid and mul, saves both).
at::Tensor composite_swish(const at::Tensor& x);

// The reference's squeeze-and-excitation tail, sigmoid(gate) · x, through autograd.
at::Tensor composite_se_gate(const at::Tensor& x, const at::Tensor& gate);

}  // namespace opfuse::reference
