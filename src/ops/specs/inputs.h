// What the op specs share: random inputs of a dtype, leaves, and sizes from bench-op's --numel.
#pragma once

#include <c10/util/accumulate.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <stdexcept>

#include "opfuse/op_spec.h"

namespace opfuse::specs {

// Standard normal values drawn in float and converted (torch draws no bfloat16 of its own), so a
// float case draws what torch::randn draws.
inline at::Tensor randn(at::IntArrayRef shape, at::ScalarType dtype) { return torch::randn(shape).to(dtype); }

// An activation of the case: as above, laid out in the arguments' dimension order (a recorded
// model's) where it has the order's rank.
inline at::Tensor randn(at::IntArrayRef shape, const OpArgs& a) {
  if (a.dim_order.size() != shape.size()) return randn(shape, a.dtype);
  std::vector<int64_t> in_memory, back(shape.size());
  for (size_t k = 0; k < a.dim_order.size(); ++k) {
    in_memory.push_back(shape[a.dim_order[k]]);
    back[a.dim_order[k]] = static_cast<int64_t>(k);
  }
  return randn(in_memory, a.dtype).permute(back);
}

inline at::Tensor leaf(const at::Tensor& t) { return t.detach().requires_grad_(); }

// What `x.float()` in a composite means here: float for float32 and bfloat16, and float64 kept
// (the composite is the float64 reference of the op tests).
inline at::ScalarType accumulation_type(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// rows of d elements: the default, or as many as about numel elements make (at least one).
inline int64_t rows_for(int64_t numel, int64_t d, int64_t default_rows) {
  return numel == 0 ? default_rows : std::max<int64_t>(1, numel / d);
}

// The recorded shapes a spec needs: at least `count`, the first of rank in [min_dim, max_dim].
inline void expect_shapes(const InputShapes& shapes, size_t count, int64_t min_dim, int64_t max_dim, const char* op) {
  if (shapes.size() < count || int64_t(shapes[0].size()) < min_dim || int64_t(shapes[0].size()) > max_dim)
    throw std::invalid_argument(fmt::format("{}: no case for shapes of {} tensors, the first of rank {}", op,
                                            shapes.size(), shapes.empty() ? 0 : shapes[0].size()));
}

}  // namespace opfuse::specs

namespace opfuse::specs {

// The elementwise ops' default size for bench-op.
constexpr int64_t kDefaultNumel = 6'400'000;

// EfficientNet-like activations: 16 samples of 56×56 and as many channels as numel allows
// (at least one).
inline std::vector<int64_t> efficientnet_activation(int64_t numel) {
  const int64_t n = 16, hw = 56 * 56;
  return {n, std::max<int64_t>(1, numel / (n * hw)), 56, 56};
}

// An MBConv expansion's activation, [16, 96, 56, 56] by default, [16, C, 56, 56] of about numel
// elements otherwise.
inline std::vector<int64_t> mbconv_activation(int64_t numel) {
  return numel == 0 ? std::vector<int64_t>{16, 96, 56, 56} : efficientnet_activation(numel);
}

// stories15M's 56 parameter tensors (dim 288, 6 layers, hidden 768, vocab 32000, the output layer
// tied to the embedding): the parameter group the optimizers' specs step.
inline InputShapes llama_parameter_shapes() {
  constexpr int64_t dim = 288, layers = 6, hidden = 768, vocab = 32000;
  InputShapes shapes{{vocab, dim}};
  for (int64_t l = 0; l < layers; ++l) {
    shapes.push_back({dim});  // attention_norm
    for (int w = 0; w < 4; ++w) shapes.push_back({dim, dim});  // wq, wk, wv, wo
    shapes.push_back({dim});  // ffn_norm
    shapes.insert(shapes.end(), {{hidden, dim}, {dim, hidden}, {hidden, dim}});  // w1, w2, w3
  }
  shapes.push_back({dim});  // the final norm
  return shapes;
}

// bench-op's shapes for an optimizer's spec: stories15M's parameters, whatever the size asked.
inline InputShapes optimizer_bench_shapes(const BenchSize& s, const char* op) {
  if (s.numel != 0)
    throw std::invalid_argument(fmt::format("{} steps stories15M's parameter set, not --numel elements", op));
  return llama_parameter_shapes();
}

// "56 tensors, 15191712 parameters (stories15M)": an optimizer case's shape for reports.
inline std::string parameter_set_name(const InputShapes& shapes) {
  int64_t total = 0;
  for (const auto& shape : shapes) total += c10::multiply_integers(shape);
  return fmt::format("{} tensors, {} parameters{}", shapes.size(), total,
                     shapes == llama_parameter_shapes() ? " (stories15M)" : "");
}

}  // namespace opfuse::specs
