// rms_norm: Llama's RMSNorm; add_rms_norm: a Llama block's residual add then RMSNorm,
// h = x + residual, y = rms_norm(h) · w. Both 4 × 256 tokens of 768 by default (--numel picks the
// tokens), against F.rms_norm. add_rms_norm's variants return y alone: h's own gradient (the
// residual stream's) would cost every variant the same one add.
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

OpCase add_rms_norm_case(const OpArgs& a) {
  expect_shapes(a.shapes, 1, 1, 8, "add_rms_norm");
  const int64_t d = a.shapes[0].back();
  const at::Tensor x = leaf(randn(a.shapes[0], a.dtype)), r = leaf(randn(a.shapes[0], a.dtype));
  const at::Tensor w = leaf((torch::rand({d}) + 0.5).to(a.dtype));
  OpCase c;
  c.leaves = {x, r, w};
  c.grad_output = randn(a.shapes[0], a.dtype);
  c.variants = {
      {"reference", "h = x + residual; (h.float() * rsqrt(h.float().pow(2).mean(-1) + eps)).type_as(h) * w (Llama)",
       [=] {
         const at::Tensor h = x + r, hf = h.to(accumulation_type(h));
         return (hf * torch::rsqrt(hf.pow(2).mean(-1, true) + kEps)).type_as(h) * w;
       }},
      {"aten", "F.rms_norm(x + residual) (at::rms_norm, torch 2.4+)",
       [=] { return at::rms_norm(x + r, {d}, w, kEps); }},
      {"opfuse", "opfuse::add_rms_norm", [=] { return std::get<0>(opfuse::add_rms_norm(x, r, w, kEps)); }}};
  // forward reads x and residual, writes h and y; backward reads dy and h, writes dx (which is
  // also residual's gradient). Not counted: x and residual are both leaves here, so torch's
  // AccumulateGrad clones the dx they share (3 MB read and written at [1024, 768], in every
  // variant: ATen's AddBackward0 shares its gradient too); in a model they are other ops' outputs.
  c.bytes_per_step = 7.0 * x.numel() * x.element_size();
  return c;
}

}  // namespace

OpSpec rms_norm_spec() {
  return {"rms_norm", [](const BenchSize& s) { return InputShapes{{rows_for(s.numel, 768, 4 * 256), 768}}; },
          rms_norm_case, {{{3, 7, 77}}, {{5, 1}}, {{33}}}};
}

const OpSpecRegistration rms_norm_registered{rms_norm_spec};

OpSpec add_rms_norm_spec() {
  return {"add_rms_norm", [](const BenchSize& s) { return InputShapes{{rows_for(s.numel, 768, 4 * 256), 768}}; },
          add_rms_norm_case, {{{3, 7, 77}}, {{5, 1}}, {{33}}}};
}

const OpSpecRegistration add_rms_norm_registered{add_rms_norm_spec};

}  // namespace opfuse::specs
