// AdamW, one step for a whole parameter group in one pass: each element's p, g, m, v are read
// once and p, m, v written once (7 accesses where the per-tensor ATen loop makes ~20). The
// group is cut into pieces (pieces.h) that threads share out.
//
// This file is compiled with -ffp-contract=off (src/ops/CMakeLists.txt): no path fuses a
// multiply into an add, so scalar, AVX2 and AVX-512 give identical bits, and each operation
// rounds as the ATen op it replaces does (adamw_loops.h names the one exception).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "ops/adamw/adamw_kernel.h"
#include "ops/cpu/capability.h"
#include "ops/cpu/lanes.h"
#include "ops/cpu/paths.h"
#include "ops/cpu/pieces.h"

namespace opfuse::cpu {
namespace {

template <typename T>
struct AdamWTensor {
  T* p;
  const T* g;
  T* m;
  T* v;
  AdamWCoefficients coefficients;
};

#define OPFUSE_LOOPS "ops/adamw/adamw_loops.h"
#include "ops/cpu/per_path.h"

}  // namespace

void adamw_kernel(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                  const std::vector<AdamWCoefficients>& coefficients) {
  if (params.empty()) return;
  const std::vector<Piece> pieces = pieces_of(params);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, params[0].scalar_type(), "opfuse::adamw_", [&] {
    std::vector<AdamWTensor<scalar_t>> tensors;
    for (size_t i = 0; i < params.size(); ++i)
      tensors.push_back({params[i].data_ptr<scalar_t>(), grads[i].data_ptr<scalar_t>(),
                         exp_avgs[i].data_ptr<scalar_t>(), exp_avg_sqs[i].data_ptr<scalar_t>(), coefficients[i]});
    OPFUSE_ON_PATH(scalar_t, adamw_all, (tensors, pieces));
  });
}

}  // namespace opfuse::cpu
