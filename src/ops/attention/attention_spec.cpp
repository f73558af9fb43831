// attention: minGPT's causal self-attention on [B, H, T, D] heads, the mask a registered tril
// buffer sliced to T, attention dropout on the probabilities.
#include <cmath>

#include "opfuse/ops.h"
#include "ops/specs/inputs.h"

namespace opfuse::specs {
namespace {

OpCase attention_case(const OpArgs& a) {
  expect_shapes(a.shapes, 1, 4, 4, "attention");
  const double p = a.dropout_p;
  if (p < 0 || p >= 1) throw std::invalid_argument("--dropout must be in [0, 1)");
  const auto& shape = a.shapes[0];
  const int64_t T = shape[2];
  const double scale = 1 / std::sqrt(double(shape[3]));
  const at::Tensor q = leaf(randn(shape, a.dtype)), k = leaf(randn(shape, a.dtype)), v = leaf(randn(shape, a.dtype));
  const at::Tensor bias = torch::ones({T, T}, a.dtype).tril().view({1, 1, T, T});
  OpCase c;
  c.leaves = {q, k, v};
  c.grad_output = randn(shape, a.dtype);
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
