// drop_connect_add: efficientnet_pytorch's drop connect (p 0.2, B0's last blocks) then the
// residual add.
#include "opfuse/ops.h"
#include "ops/specs/inputs.h"

namespace opfuse::specs {
namespace {

OpCase drop_connect_add_case(const OpArgs& a) {
  expect_shapes(a.shapes, 1, 1, 8, "drop_connect_add");
  constexpr double p = 0.2, keep = 1 - p;
  const auto& shape = a.shapes[0];
  const at::Tensor x = leaf(randn(shape, a)), r = leaf(randn(shape, a));
  OpCase c;
  c.leaves = {x, r};
  c.grad_output = randn(shape, a);
  // one value per sample, [N, 1, …, 1], drawn as the reference (and opfuse) draws it
  std::vector<int64_t> per_sample(shape.size(), 1);
  per_sample[0] = shape[0];
  auto mask = [x, per_sample] { return torch::floor(keep + torch::rand(per_sample, x.options())); };
  c.variants = {
      {"reference", "x / keep * floor(keep + rand) + residual (efficientnet_pytorch)", [=] { return x / keep * mask() + r; }},
      {"aten", "torch::addcmul(residual, x, mask / keep)", [=] { return torch::addcmul(r, x, mask() / keep); }},
      {"opfuse", "opfuse::drop_connect_add", [=] { return opfuse::drop_connect_add(x, r, p, true); }}};
  // forward reads x and residual, writes out; backward reads dy, writes dx
  c.bytes_per_step = 5.0 * x.numel() * x.element_size();
  return c;
}

}  // namespace

OpSpec drop_connect_add_spec() {
  return {"drop_connect_add", [](const BenchSize& s) { return InputShapes{mbconv_activation(s.numel)}; },
          drop_connect_add_case, {{{5, 3, 4, 4}}}};
}

const OpSpecRegistration drop_connect_add_registered{drop_connect_add_spec};

}  // namespace opfuse::specs
