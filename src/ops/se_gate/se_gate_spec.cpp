// se_gate: the squeeze-and-excitation tail of an EfficientNet block, x [N, C, H, W] · sigmoid(gate
// [N, C, 1, 1]).
#include "opfuse/ops.h"
#include "opfuse/reference_ops.h"
#include "ops/specs/inputs.h"

namespace opfuse::specs {
namespace {

OpCase se_gate_case(const OpArgs& a) {
  expect_shapes(a.shapes, 1, 4, 4, "se_gate");
  const auto& shape = a.shapes[0];
  const at::Tensor x = leaf(randn(shape, a)), g = leaf(randn({shape[0], shape[1], 1, 1}, a.dtype));
  OpCase c;
  c.leaves = {x, g};
  c.grad_output = randn(shape, a);
  c.variants = {{"reference", "sigmoid(g) * x (autograd)", [x, g] { return reference::composite_se_gate(x, g); }},
                {"aten", "x * torch::sigmoid(g) (autograd)", [x, g] { return x * torch::sigmoid(g); }},
                {"opfuse", "opfuse::se_gate", [x, g] { return opfuse::se_gate(x, g); }}};
  // forward reads x, writes y; backward reads dy and x, writes dx (the gate is small)
  c.bytes_per_step = 5.0 * x.numel() * x.element_size();
  return c;
}

}  // namespace

OpSpec se_gate_spec() {
  return {"se_gate", [](const BenchSize& s) { return InputShapes{efficientnet_activation(s.numel == 0 ? kDefaultNumel : s.numel)}; },
          se_gate_case, {{{2, 3, 5, 7}}}};
}

const OpSpecRegistration se_gate_registered{se_gate_spec};

}  // namespace opfuse::specs
