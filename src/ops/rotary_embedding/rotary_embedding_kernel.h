// rotary_embedding's CPU kernel (rotary_embedding_kernel.cpp). Shapes, dtypes and layouts are checked by the front end
// (rotary_embedding.cpp); the kernel only computes.
#pragma once

#include <ATen/core/Tensor.h>

namespace opfuse::cpu {

// Rotary embedding over rows of x's last dimension d = 2P (x and y contiguous, one dtype): pair i
// of a row is (x[i], x[P + i]) (rotate-half) or (x[2i], x[2i + 1]) (interleaved), mapped by
//   y_a = cos_a·x_a − sin_a·x_b,   y_b = sin_b·x_a + cos_b·x_b   (transposed: the matrix's transpose)
// with the angles of the row's table row: cos and sin [n, width] contiguous in the accumulation
// dtype (float, double for float64), width P (one angle per pair) or d (one per element, laid out
// like x). table_row_strides, one per leading dimension of x, is how many table rows a step along
// it moves (0 where the table broadcasts).
void rotary_embedding_kernel(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                             at::IntArrayRef table_row_strides, bool interleaved, bool transposed, at::Tensor& y);

}  // namespace opfuse::cpu
