// The gated units, a(gate) · up, 4 × 256 tokens of hidden width 2048 by default (--numel picks
// the size of gate, and of up): swiglu, Llama's silu(gate) · up, and geglu, Gemma's and T5
// v1.1's gelu(gate, tanh) · up.
#include <functional>

#include "opfuse/ops.h"
#include "ops/specs/inputs.h"

namespace opfuse::specs {
namespace {

using Variants = std::function<std::vector<OpVariant>(const at::Tensor& gate, const at::Tensor& up)>;

OpCase gated_case(const OpArgs& a, const char* name, const Variants& variants) {
  expect_shapes(a.shapes, 1, 1, 8, name);
  const at::Tensor g = leaf(randn(a.shapes[0], a.dtype)), u = leaf(randn(a.shapes[0], a.dtype));
  OpCase c;
  c.leaves = {g, u};
  c.grad_output = randn(a.shapes[0], a.dtype);
  c.variants = variants(g, u);
  // forward reads gate and up, writes y; backward reads dy, gate and up, writes dgate and dup
  c.bytes_per_step = 8.0 * g.numel() * g.element_size();
  return c;
}

InputShapes gated_shapes(const BenchSize& s) { return {{rows_for(s.numel, 2048, 4 * 256), 2048}}; }

OpCase swiglu_case(const OpArgs& a) {
  return gated_case(a, "swiglu", [](const at::Tensor& g, const at::Tensor& u) -> std::vector<OpVariant> {
    return {{"reference", "gate * sigmoid(gate) * up (autograd)", [=] { return g * torch::sigmoid(g) * u; }},
            {"aten", "torch::silu(gate) * up", [=] { return torch::silu(g) * u; }},
            {"opfuse", "opfuse::swiglu", [=] { return opfuse::swiglu(g, u); }}};
  });
}

OpCase geglu_case(const OpArgs& a) {
  return gated_case(a, "geglu", [](const at::Tensor& g, const at::Tensor& u) -> std::vector<OpVariant> {
    return {{"reference", "0.5 * g * (1 + tanh(sqrt(2/pi) * (g + 0.044715 * g^3))) * up (T5's NewGELU, autograd)",
             [=] { return 0.5 * g * (1 + torch::tanh(0.7978845608028654 * (g + 0.044715 * torch::pow(g, 3)))) * u; }},
            {"aten", "torch::gelu(gate, \"tanh\") * up", [=] { return torch::gelu(g, "tanh") * u; }},
            {"opfuse", "opfuse::geglu", [=] { return opfuse::geglu(g, u); }}};
  });
}

}  // namespace

OpSpec swiglu_spec() { return {"swiglu", gated_shapes, swiglu_case, {{{3, 77}}, {{2, 5, 16}}}}; }
OpSpec geglu_spec() { return {"geglu", gated_shapes, geglu_case, {{{3, 77}}, {{2, 5, 16}}}}; }

const OpSpecRegistration swiglu_registered{swiglu_spec};
const OpSpecRegistration geglu_registered{geglu_spec};

}  // namespace opfuse::specs
