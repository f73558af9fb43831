// Rotary embedding: each pair (x_a, x_b) of a row's last dimension mapped by its 2×2 matrix,
//   y_a = a·x_a + b·x_b,   y_b = c·x_a + d·x_b
// one pass reading x and writing y. The front end builds the matrices from cos and sin: the
// rotation (cos θ, −sin θ, sin θ, cos θ) forward, its transpose, the rotation by −θ, backward.
// bfloat16 rows are computed in float and rounded once, on the store.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "ops/cpu/capability.h"
#include "ops/cpu/grain.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/lanes.h"
#include "ops/cpu/paths.h"

namespace opfuse::cpu {
namespace {

#define OPFUSE_LOOPS "ops/cpu/rotary_embedding_loops.h"
#include "ops/cpu/per_path.h"

template <typename T>
void rotate_impl(const at::Tensor& x, const at::Tensor& table, const at::Tensor& row_table, bool interleaved,
                 at::Tensor& y) {
  using A = at::opmath_type<T>;
  const int64_t P = x.size(-1) / 2, rows = P == 0 ? 0 : x.numel() / (2 * P);
  const T* xp = x.data_ptr<T>();
  const A* k = table.data_ptr<A>();
  const int64_t* rt = row_table.data_ptr<int64_t>();
  T* yp = y.data_ptr<T>();
  OPFUSE_ON_PATH(T, rotate_all, (xp, k, rt, rows, P, interleaved, yp));
}

}  // namespace

void rotary_embedding_kernel(const at::Tensor& x, const at::Tensor& table, const at::Tensor& row_table,
                             bool interleaved, at::Tensor& y) {
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "opfuse::rotary_embedding",
                                 [&] { rotate_impl<scalar_t>(x, table, row_table, interleaved, y); });
}

}  // namespace opfuse::cpu
