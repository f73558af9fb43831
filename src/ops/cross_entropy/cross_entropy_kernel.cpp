// Cross entropy over rows of logits, the loss and its gradient in one forward:
//   lse = max + log Σ_j exp(x_j − max)
//   loss = lse − (1 − ε)·x_t − ε/V · Σ_j x_j
//   dloss/dx_j = c·(softmax_j − (1 − ε)·[j = t] − ε/V)      c = 1/valid rows (mean) or 1
// Three passes over a row, which stays in cache between them: max (and Σx), exp and its sum,
// the gradient. Sums are double; bfloat16 rows are computed in float and rounded once.
//
// The linear form never holds all the logits: per chunk of rows, logits = h·Wᵀ into one buffer,
// the gradient computed there, then grad_h = g·W and grad_W += gᵀ·h (Liger-Kernel's fused linear
// cross entropy, on the CPU).
#include <ATen/Dispatch.h>
#include <ATen/Functions.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "ops/cpu/aligned_vector.h"
#include "ops/cpu/blas.h"
#include "ops/cpu/capability.h"
#include "ops/cpu/grain.h"
#include "ops/cpu/lanes.h"
#include "ops/cpu/paths.h"
#include "ops/cross_entropy/cross_entropy_kernel.h"

namespace opfuse::cpu {
namespace {

#define OPFUSE_LOOPS "ops/cross_entropy/cross_entropy_loops.h"
#include "ops/cpu/per_path.h"

// Logits of this many elements per chunk (48 MB of float32; 393 rows at V = 32000). Each chunk's
// grad_W += gᵀ·h streams all of grad_W once more: at h [1024, 288], W [32000, 288] on 2 threads
// (OpenBLAS), chunks of 131 rows made the three matmuls 37 % slower than unchunked, 229 rows
// 20 %, 393 rows 7 %. Still a fifth of what the composite's [N, V] tensors hold there.
constexpr int64_t kChunkElements = int64_t{12} << 20;

}  // namespace

void cross_entropy_forward_kernel(const at::Tensor& logits, int64_t row_stride, const at::Tensor& target,
                                  const CrossEntropyRule& rule, double grad_scale, at::Tensor& losses,
                                  at::Tensor& grad) {
  const int64_t n = logits.size(-1), rows = target.numel();
  const int64_t* tp = target.data_ptr<int64_t>();
  double* lp = losses.data_ptr<double>();
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, logits.scalar_type(), "opfuse::cross_entropy", [&] {
    const scalar_t* x = logits.data_ptr<scalar_t>();
    scalar_t* g = grad.defined() ? grad.data_ptr<scalar_t>() : nullptr;
    OPFUSE_ON_PATH(scalar_t, forward_all,
                   (x, rows, n, row_stride, tp, rule.ignore_index, rule.label_smoothing, grad_scale, lp, g));
  });
}

void linear_cross_entropy_kernel(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& target,
                                 const CrossEntropyRule& rule, double grad_scale, at::Tensor& losses,
                                 at::Tensor& grad_h, at::Tensor& grad_weight) {
  const int64_t rows = h.size(0), hidden = h.size(1), n = weight.size(0);
  const int64_t chunk = std::max<int64_t>(1, std::min(rows, kChunkElements / std::max<int64_t>(1, n)));
  const bool with_grad = grad_h.defined() || grad_weight.defined();
  if (grad_weight.defined() && rows == 0) grad_weight.zero_();
  const int64_t* tp = target.data_ptr<int64_t>();
  double* lp = losses.data_ptr<double>();
  AT_DISPATCH_FLOATING_TYPES(h.scalar_type(), "opfuse::linear_cross_entropy", [&] {
    const scalar_t *hp = h.data_ptr<scalar_t>(), *wp = weight.data_ptr<scalar_t>();
    scalar_t* dh = grad_h.defined() ? grad_h.data_ptr<scalar_t>() : nullptr;
    scalar_t* dw = grad_weight.defined() ? grad_weight.data_ptr<scalar_t>() : nullptr;
    // through torch's allocator, so its memory is counted where torch's is
    const at::Tensor buffer = at::empty({chunk, n}, h.options());
    scalar_t* z = buffer.data_ptr<scalar_t>();
    for (int64_t start = 0; start < rows; start += chunk) {
      const int64_t m = std::min(chunk, rows - start);
      const scalar_t* hc = hp + start * hidden;
      gemm<scalar_t>(false, true, m, n, hidden, 1, hc, hidden, wp, hidden, 0, z, n);  // z = h·Wᵀ
      // the gradient wrt the logits replaces them in the buffer
      OPFUSE_ON_PATH(scalar_t, forward_all, (z, m, n, n, tp + start, rule.ignore_index, rule.label_smoothing,
                                             grad_scale, lp + start, with_grad ? z : nullptr));
      if (dh != nullptr) gemm<scalar_t>(false, false, m, hidden, n, 1, z, n, wp, hidden, 0, dh + start * hidden, hidden);
      if (dw != nullptr) gemm<scalar_t>(true, false, n, hidden, m, 1, z, n, hc, hidden, start == 0 ? 0 : 1, dw, hidden);
    }
  });
}

}  // namespace opfuse::cpu
