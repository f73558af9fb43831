// attention: minGPT's causal self-attention on [B, H, T, D] heads, the mask a registered tril
// buffer sliced to T, attention dropout on the probabilities.
#include <algorithm>
#include <cmath>

#include "opfuse/ops.h"
#include "ops/specs/inputs.h"

namespace opfuse::specs {
namespace {

// q's [B, H, T, D] among a chain's recorded shapes, which hold the scores [B, H, T, T] too (and
// list them first, being larger), and the 3-d views of both a 4-d matmul makes: the first 4-d
// shape beside whose scores they are, else the first 4-d shape.
const std::vector<int64_t>& heads_shape(const InputShapes& shapes) {
  const std::vector<int64_t>* first = nullptr;
  for (const auto& s : shapes) {
    if (s.size() != 4) continue;
    if (first == nullptr) first = &s;
    if (s[3] != s[2] && std::find(shapes.begin(), shapes.end(), std::vector<int64_t>{s[0], s[1], s[2], s[2]}) != shapes.end())
      return s;
  }
  if (first == nullptr) throw std::invalid_argument("attention: no 4-d q [B, H, T, D] among the shapes");
  return *first;
}

OpCase attention_case(const OpArgs& a) {
  const double p = a.dropout_p;
  if (p < 0 || p >= 1) throw std::invalid_argument("--dropout must be in [0, 1)");
  const auto& shape = heads_shape(a.shapes);
  const int64_t T = shape[2];
  const double scale = 1 / std::sqrt(double(shape[3]));
  // As the trace recorded them (OpArgs::dim_order): a model's q, k and v are often views of
  // [B, T, H, D], and its gradient arrives so.
  const at::Tensor q = leaf(randn(shape, a)), k = leaf(randn(shape, a)), v = leaf(randn(shape, a));
  const at::Tensor bias = torch::ones({T, T}, a.dtype).tril().view({1, 1, T, T});
  OpCase c;
  c.leaves = {q, k, v};
  c.grad_output = randn(shape, a);
  c.variants = {
      {"reference", "softmax((q @ kᵀ * scale).masked_fill(bias[:T, :T] == 0, -inf)) → dropout → @ v (minGPT)",
       [=] {
         const at::Tensor att = torch::matmul(q, k.transpose(-2, -1)) * scale;
         const at::Tensor probs = torch::softmax(att.masked_fill(bias.slice(2, 0, T).slice(3, 0, T) == 0, -INFINITY), -1);
         return torch::matmul(torch::dropout(probs, p, true), v);
       }},
      {"aten", "F.scaled_dot_product_attention (causal; torch's flash kernel on CPU)",
       [=] { return at::scaled_dot_product_attention(q, k, v, {}, p, true); }},
      {"opfuse", "opfuse::attention (tiled, causal)",
       [=] { return opfuse::attention(q, k, v, true, c10::nullopt, c10::nullopt, p); }}};
  // forward reads q, k, v and writes o; backward reads them, o and do, writes dq, dk, dv
  c.bytes_per_step = 12.0 * q.numel() * q.element_size();
  return c;
}

// q, k, v [4, 6, seq_len, head_dim]
InputShapes bench_shapes(const BenchSize& s) {
  if (s.seq_len < 1 || s.head_dim < 1) throw std::invalid_argument("--seq-len and --head-dim must be positive");
  if (s.numel != 0) throw std::invalid_argument("attention is sized by --seq-len and --head-dim, not --numel");
  return {{4, 6, s.seq_len, s.head_dim}};
}

}  // namespace

OpSpec attention_spec() { return {"attention", bench_shapes, attention_case, {{{2, 3, 17, 8}}, {{1, 2, 1, 5}}}}; }

const OpSpecRegistration attention_registered{attention_spec};

}  // namespace opfuse::specs
