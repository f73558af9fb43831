// Rotary embedding: each pair (x_a, x_b) of a row's last dimension mapped by its 2×2 matrix,
//   y_a = cos_a·x_a − sin_a·x_b,   y_b = sin_b·x_a + cos_b·x_b
// one pass reading x and writing y, the angles read from the cos and sin rows as they are; the
// backward applies the transposed matrix (for per-pair tables the rotation by −θ). bfloat16 rows
// are computed in float and rounded once, on the store.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/capability.h"
#include "ops/cpu/grain.h"
#include "ops/cpu/lanes.h"
#include "ops/cpu/paths.h"
#include "ops/rotary_embedding/rotary_embedding_kernel.h"

namespace opfuse::cpu {
namespace {

// The table row of each row of x, walked as an odometer over x's leading dimensions: set once at a
// chunk's first row, then stepped row by row (no division per row, nothing stored per row).
class TableRows {
 public:
  TableRows(at::IntArrayRef sizes, at::IntArrayRef strides, int64_t first_row)
      : sizes_(sizes), strides_(strides), index_(sizes.size()) {
    for (int64_t j = int64_t(sizes.size()) - 1; j >= 0; --j) {
      index_[j] = first_row % sizes[j];
      first_row /= sizes[j];
      row_ += index_[j] * strides[j];
    }
  }
  int64_t row() const { return row_; }
  void next() {
    for (int64_t j = int64_t(sizes_.size()) - 1; j >= 0; --j) {
      row_ += strides_[j];
      if (++index_[j] < sizes_[j]) return;
      row_ -= sizes_[j] * strides_[j];
      index_[j] = 0;
    }
  }

 private:
  at::IntArrayRef sizes_, strides_;
  std::vector<int64_t> index_;
  int64_t row_ = 0;
};

// cos and sin [n, width] in the accumulation type, and for each of x's leading dimensions how many
// of their rows one step along it moves.
template <typename A>
struct RotaryTables {
  const A *cos, *sin;
  int64_t width;
  at::IntArrayRef row_strides;
};

#define OPFUSE_LOOPS "ops/rotary_embedding/rotary_embedding_loops.h"
#include "ops/cpu/per_path.h"

template <typename T>
void rotate_impl(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::IntArrayRef table_row_strides,
                 bool interleaved, bool transposed, at::Tensor& y) {
  using A = at::opmath_type<T>;
  const int64_t P = x.size(-1) / 2, rows = P == 0 ? 0 : x.numel() / (2 * P);
  const at::IntArrayRef row_sizes = x.sizes().slice(0, x.dim() - 1);
  const RotaryTables<A> tables{cos.data_ptr<A>(), sin.data_ptr<A>(), cos.size(-1), table_row_strides};
  const T* xp = x.data_ptr<T>();
  T* yp = y.data_ptr<T>();
  OPFUSE_ON_PATH(T, rotate_all, (xp, tables, row_sizes, rows, P, interleaved, transposed, yp));
}

}  // namespace

void rotary_embedding_kernel(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                             at::IntArrayRef table_row_strides, bool interleaved, bool transposed, at::Tensor& y) {
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "opfuse::rotary_embedding", [&] {
    rotate_impl<scalar_t>(x, cos, sin, table_row_strides, interleaved, transposed, y);
  });
}

}  // namespace opfuse::cpu
