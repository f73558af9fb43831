// rms_norm: Llama's RMSNorm, 4 × 256 tokens of 768 by default (--numel picks the tokens).
// ATen 1.13 has no rms_norm; its nearest single op, layer_norm, is the "aten" variant.
#include "opfuse/ops.h"
#include "ops/specs/inputs.h"

namespace opfuse::specs {
namespace {

constexpr double kEps = 1e-5;

OpCase rms_norm_case(const OpArgs& a) {
  expect_shapes(a.shapes, 1, 1, 8, "rms_norm");
  const int64_t d = a.shapes[0].back();
  const at::Tensor x = leaf(randn(a.shapes[0], a.dtype)), w = leaf((torch::rand({d}) + 0.5).to(a.dtype));
  OpCase c;
  c.leaves = {x, w};
  c.grad_output = randn(a.shapes[0], a.dtype);
  c.variants = {
      {"reference", "(x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).type_as(x) * w (Llama)",
       [=] {
         const at::Tensor xf = x.to(accumulation_type(x));
         return (xf * torch::rsqrt(xf.pow(2).mean(-1, true) + kEps)).type_as(x) * w;
       }},
      {"aten", "F.rms_norm (at::rms_norm, torch 2.4+)", [=] { return at::rms_norm(x, {d}, w, kEps); }},
      {"opfuse", "opfuse::rms_norm", [=] { return opfuse::rms_norm(x, w, kEps); }}};
  // forward reads x and writes y; backward reads dy and x, writes dx (w and rstd are small)
  c.bytes_per_step = 5.0 * x.numel() * x.element_size();
  return c;
}

}  // namespace

OpSpec rms_norm_spec() {
  return {"rms_norm", [](const BenchSize& s) { return InputShapes{{rows_for(s.numel, 768, 4 * 256), 768}}; },
          rms_norm_case, {{{3, 7, 77}}, {{5, 1}}, {{33}}}};
}

const OpSpecRegistration rms_norm_registered{rms_norm_spec};

}  // namespace opfuse::specs
