// swiglu: Llama's silu(gate) · up, 4 × 256 tokens of hidden width 2048 by default (--numel
// picks the size of gate, and of up).
#include "opfuse/ops.h"
#include "ops/specs/inputs.h"

namespace opfuse::specs {
namespace {

OpCase swiglu_case(const OpArgs& a) {
  expect_shapes(a.shapes, 1, 1, 8, "swiglu");
  const at::Tensor g = leaf(randn(a.shapes[0], a.dtype)), u = leaf(randn(a.shapes[0], a.dtype));
  OpCase c;
  c.leaves = {g, u};
  c.grad_output = randn(a.shapes[0], a.dtype);
  c.variants = {{"reference", "gate * sigmoid(gate) * up (autograd)", [=] { return g * torch::sigmoid(g) * u; }},
                {"aten", "torch::silu(gate) * up", [=] { return torch::silu(g) * u; }},
                {"opfuse", "opfuse::swiglu", [=] { return opfuse::swiglu(g, u); }}};
  // forward reads gate and up, writes y; backward reads dy, gate and up, writes dgate and dup
  c.bytes_per_step = 8.0 * g.numel() * g.element_size();
  return c;
}

}  // namespace

OpSpec swiglu_spec() {
  return {"swiglu", [](const BenchSize& s) { return InputShapes{{rows_for(s.numel, 2048, 4 * 256), 2048}}; },
          swiglu_case, {{{3, 77}}, {{2, 5, 16}}}};
}

}  // namespace opfuse::specs
