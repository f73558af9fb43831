// sgd's CPU kernel (sgd_kernel.cpp). Shapes, dtypes and layouts are checked by the front end
// (sgd.cpp); the kernel only computes.
#pragma once

#include <ATen/core/Tensor.h>

namespace opfuse::cpu {

// One SGD step over tensors i, each of p, g and (with momentum) b contiguous, of one size and of
// one dtype (all tensors alike), updated in place (see sgd_loops.h for the order of operations):
//   d ← g + wd·p;  b ← momentum·b + (1 − dampening)·d (b ← d when fresh);  d ← nesterov ? d + momentum·b : b
//   p ← p − lr·d                                                            g negated if maximize
// momentum_buffers empty: no momentum (d is g + wd·p).
struct SgdCoefficients {
  double lr, momentum, dampening, weight_decay;
  bool nesterov, maximize;
  bool fresh_buffers;  // the buffers' first step: they take d, whatever they hold
};
void sgd_kernel(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers,
                const SgdCoefficients& coefficients);

}  // namespace opfuse::cpu
