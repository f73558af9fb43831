// silu and swish (β = 1): EfficientNet's memory-efficient Swish, a custom autograd Function.
#include "opfuse/ops.h"
#include "opfuse/reference_ops.h"
#include "ops/specs/inputs.h"

namespace opfuse::specs {
namespace {

OpCase swish_case(const OpArgs& a, bool silu) {
  expect_shapes(a.shapes, 1, 1, 8, silu ? "silu" : "swish");
  const at::Tensor x = leaf(randn(a.shapes[0], a));
  OpCase c;
  c.leaves = {x};
  c.grad_output = randn(a.shapes[0], a);
  auto fused = silu ? std::function<at::Tensor()>([x] { return opfuse::silu(x); })
                    : std::function<at::Tensor()>([x] { return opfuse::swish(x, 1.0); });
  c.variants = {
      {"reference", "memory-efficient Swish (autograd Function)", [x] { return reference::memory_efficient_swish(x); }},
      {"aten", "torch::silu", [x] { return torch::silu(x); }},
      {"opfuse", silu ? "opfuse::silu" : "opfuse::swish", fused}};
  // forward reads x, writes y; backward reads dy and x, writes dx
  c.bytes_per_step = 5.0 * x.numel() * x.element_size();
  return c;
}

InputShapes flat(const BenchSize& s) { return {{s.numel == 0 ? kDefaultNumel : s.numel}}; }

}  // namespace

OpSpec silu_spec() { return {"silu", flat, [](const OpArgs& a) { return swish_case(a, true); }, {{{1000}}, {{3, 17}}}}; }

OpSpec swish_spec() { return {"swish", flat, [](const OpArgs& a) { return swish_case(a, false); }, {{{77}}}}; }

const OpSpecRegistration silu_registered{silu_spec};
const OpSpecRegistration swish_registered{swish_spec};

}  // namespace opfuse::specs
