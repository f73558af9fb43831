// SGD (momentum, dampening, Nesterov, weight decay), one step for a whole parameter group in one
// pass: each element's p, g and momentum buffer are read once and p and the buffer written once
// (5 accesses where torch's per-tensor loop makes 11 with momentum and weight decay). The group
// is cut into pieces (pieces.h) that threads share out.
//
// Compiled with -ffp-contract=off (src/ops/CMakeLists.txt), as adamw_kernel.cpp is: no path fuses
// a multiply into an add, so scalar, AVX2 and AVX-512 give identical bits.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>

#include <algorithm>
#include <vector>

#include "ops/cpu/capability.h"
#include "ops/cpu/lanes.h"
#include "ops/cpu/paths.h"
#include "ops/cpu/pieces.h"
#include "ops/sgd/sgd_kernel.h"

namespace opfuse::cpu {
namespace {

template <typename T>
struct SgdTensor {
  T* p;
  const T* g;
  T* b;  // null without momentum
};

#define OPFUSE_LOOPS "ops/sgd/sgd_loops.h"
#include "ops/cpu/per_path.h"

}  // namespace

void sgd_kernel(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers,
                const SgdCoefficients& coefficients) {
  if (params.empty()) return;
  const std::vector<Piece> pieces = pieces_of(params);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, params[0].scalar_type(), "opfuse::sgd_", [&] {
    std::vector<SgdTensor<scalar_t>> tensors;
    for (size_t i = 0; i < params.size(); ++i)
      tensors.push_back({params[i].data_ptr<scalar_t>(), grads[i].data_ptr<scalar_t>(),
                         momentum_buffers.empty() ? nullptr : momentum_buffers[i].data_ptr<scalar_t>()});
    OPFUSE_ON_PATH(scalar_t, sgd_all, (tensors, coefficients, pieces));
  });
}

}  // namespace opfuse::cpu
