// AdamW, one step for a whole parameter group in one pass: each element's p, g, m, v are read
// once and p, m, v written once (7 accesses where the per-tensor ATen loop makes ~20). The
// group is cut into pieces of kAdamWPiece elements, whatever tensor they belong to, so threads
// share out large and small tensors alike.
//
// This file is compiled with -ffp-contract=off (src/ops/CMakeLists.txt): no path fuses a
// multiply into an add, so scalar, AVX2 and AVX-512 give identical bits, and each operation
// rounds as the ATen op it replaces does (adamw_loops.h names the one exception).
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "ops/cpu/capability.h"
#include "ops/cpu/grain.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/lanes.h"
#include "ops/cpu/paths.h"

namespace opfuse::cpu {
namespace {

// 16384 elements (64 KiB of float p, ~450 KiB across p, g, m, v): a piece's arrays stay in L2
// while it is updated, and a 15M-parameter group gives ~1000 pieces to share out.
constexpr int64_t kAdamWPiece = 16384;

template <typename T>
struct AdamWTensor {
  T* p;
  const T* g;
  T* m;
  T* v;
  AdamWCoefficients coefficients;
};

struct AdamWPiece {
  int64_t tensor, begin, n;
};

#define OPFUSE_LOOPS "ops/cpu/adamw_loops.h"
#include "ops/cpu/per_path.h"

std::vector<AdamWPiece> pieces_of(at::TensorList params) {
  std::vector<AdamWPiece> pieces;
  for (int64_t i = 0; i < int64_t(params.size()); ++i)
    for (int64_t begin = 0; begin < params[i].numel(); begin += kAdamWPiece)
      pieces.push_back({i, begin, std::min(kAdamWPiece, params[i].numel() - begin)});
  return pieces;
}

}  // namespace

void adamw_kernel(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                  const std::vector<AdamWCoefficients>& coefficients) {
  if (params.empty()) return;
  const std::vector<AdamWPiece> pieces = pieces_of(params);
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, params[0].scalar_type(), "opfuse::adamw_", [&] {
    std::vector<AdamWTensor<scalar_t>> tensors;
    for (size_t i = 0; i < params.size(); ++i)
      tensors.push_back({params[i].data_ptr<scalar_t>(), grads[i].data_ptr<scalar_t>(),
                         exp_avgs[i].data_ptr<scalar_t>(), exp_avg_sqs[i].data_ptr<scalar_t>(), coefficients[i]});
    OPFUSE_ON_PATH(scalar_t, adamw_all, (tensors, pieces));
  });
}

}  // namespace opfuse::cpu
