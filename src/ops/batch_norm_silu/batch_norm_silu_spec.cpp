// batch_norm_silu: EfficientNet's BatchNorm (momentum 0.01, eps 1e-3, training) then Swish.
#include "opfuse/ops.h"
#include "opfuse/reference_ops.h"
#include "ops/specs/inputs.h"

namespace opfuse::specs {
namespace {

OpCase batch_norm_silu_case(const OpArgs& a) {
  expect_shapes(a.shapes, 1, 2, 4, "batch_norm_silu");
  const auto& shape = a.shapes[0];
  if (shape.size() == 3) throw std::invalid_argument("batch_norm_silu: x must be [N, C] or [N, C, H, W]");
  const int64_t channels = shape[1];
  const at::Tensor x = leaf(randn(shape, a));
  const at::Tensor w = leaf((torch::rand({channels}) + 0.5).to(a.dtype)), b = leaf(randn({channels}, a.dtype));
  OpCase c;
  c.leaves = {x, w, b};
  c.grad_output = randn(shape, a);
  // Each variant updates its own running statistics.
  auto stats = [&] { return std::make_pair(torch::zeros({channels}, a.dtype), torch::ones({channels}, a.dtype)); };
  auto [rm0, rv0] = stats();
  auto [rm1, rv1] = stats();
  auto [rm2, rv2] = stats();
  c.variants = {
      {"reference", "torch::batch_norm, memory-efficient Swish",
       [=] { return reference::memory_efficient_swish(torch::batch_norm(x, w, b, rm0, rv0, true, 0.01, 1e-3, false)); }},
      {"aten", "torch::batch_norm, torch::silu",
       [=] { return torch::silu(torch::batch_norm(x, w, b, rm1, rv1, true, 0.01, 1e-3, false)); }},
      {"opfuse", "opfuse::batch_norm_silu", [=] { return opfuse::batch_norm_silu(x, w, b, rm2, rv2, true, 0.01, 1e-3); }}};
  // forward reads x twice (statistics, output) and writes y; backward reads dy and x, writes
  // dz, then reads dz and x and writes dx
  c.bytes_per_step = 9.0 * x.numel() * x.element_size();
  return c;
}

}  // namespace

OpSpec batch_norm_silu_spec() {
  return {"batch_norm_silu", [](const BenchSize& s) { return InputShapes{mbconv_activation(s.numel)}; },
          batch_norm_silu_case, {{{4, 3, 5, 5}}, {{6, 4}}}};
}

const OpSpecRegistration batch_norm_silu_registered{batch_norm_silu_spec};

}  // namespace opfuse::specs
