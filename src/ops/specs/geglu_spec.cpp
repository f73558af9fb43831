// geglu: Gemma's and T5 v1.1's gated GELU, gelu(gate, tanh) · up, 4 × 256 tokens of hidden width
// 2048 by default (--numel picks the size of gate, and of up).
#include "opfuse/ops.h"
#include "ops/specs/inputs.h"

namespace opfuse::specs {
namespace {

OpCase geglu_case(const OpArgs& a) {
  expect_shapes(a.shapes, 1, 1, 8, "geglu");
  const at::Tensor g = leaf(randn(a.shapes[0], a.dtype)), u = leaf(randn(a.shapes[0], a.dtype));
  OpCase c;
  c.leaves = {g, u};
  c.grad_output = randn(a.shapes[0], a.dtype);
  c.variants = {{"reference", "0.5 * g * (1 + tanh(sqrt(2/pi) * (g + 0.044715 * g^3))) * up (T5's NewGELU, autograd)",
                 [=] { return 0.5 * g * (1 + torch::tanh(0.7978845608028654 * (g + 0.044715 * torch::pow(g, 3)))) * u; }},
                {"aten", "torch::gelu(gate, \"tanh\") * up", [=] { return torch::gelu(g, "tanh") * u; }},
                {"opfuse", "opfuse::geglu", [=] { return opfuse::geglu(g, u); }}};
  // forward reads gate and up, writes y; backward reads dy, gate and up, writes dgate and dup
  c.bytes_per_step = 8.0 * g.numel() * g.element_size();
  return c;
}

}  // namespace

OpSpec geglu_spec() {
  return {"geglu", [](const BenchSize& s) { return InputShapes{{rows_for(s.numel, 2048, 4 * 256), 2048}}; },
          geglu_case, {{{3, 77}}, {{2, 5, 16}}}};
}

}  // namespace opfuse::specs
