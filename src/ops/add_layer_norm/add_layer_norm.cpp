// opfuse::add_layer_norm: the residual add then LayerNorm over the last dimension, as GPT-2's and
// BERT's blocks compute it (h = x + residual; y = layer_norm(h) · w + b), one op returning (y, h):
// schemas, front ends, autograd, Meta kernels and its spec. The loops are in add_layer_norm_loops.h.
#include <ATen/OpMathType.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "ops/checks.h"
#include "ops/dispatch.h"
#include "ops/meta.h"
#include "ops/specs/inputs.h"

namespace opfuse {

// The kernel's entry points (add_layer_norm_kernel.cpp); the ops library is linked with
// --no-undefined, so a declaration here that drifts from its definition fails the build.
namespace cpu {
// LayerNorm over rows of d elements of h = x + residual (x, residual, weight, bias, h, y
// contiguous, one dtype; mean and rstd [rows] in the accumulation dtype):
//   h = x + residual,  y = (h − mean)·rstd·w + b,  rstd = 1 / sqrt(Σ(h − mean)²/d + eps)
void add_layer_norm_forward_kernel(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
                                   const at::Tensor& bias, double eps, at::Tensor& h, at::Tensor& y, at::Tensor& mean,
                                   at::Tensor& rstd);
// dx = rstd·(g − mean(g) − x̂·mean(g·x̂)) + dh with g = dy·w, x̂ = (h − mean)·rstd (dh may be
// undefined); dweight = Σ_rows dy·x̂, dbias = Σ_rows dy.
void add_layer_norm_backward_kernel(const at::Tensor& dy, const at::Tensor& dh, const at::Tensor& h,
                                    const at::Tensor& weight, const at::Tensor& mean, const at::Tensor& rstd,
                                    at::Tensor& dx, at::Tensor& dweight, at::Tensor& dbias);
}  // namespace cpu

namespace {

constexpr const char* kOp = "opfuse::add_layer_norm";

void check_parameter(const at::Tensor& p, const at::Tensor& x, const char* op, const char* name) {
  check_input(p, op, name);
  TORCH_CHECK(p.dim() == 1 && p.size(0) == x.size(-1), op, ": ", name, " must be [", x.size(-1),
              "] (x's last dimension), got ", p.sizes());
  TORCH_CHECK(p.scalar_type() == x.scalar_type(), op, ": x and ", name, " must have the same dtype, got ",
              x.scalar_type(), " and ", p.scalar_type());
}

void check_row_stats(const at::Tensor& s, const at::Tensor& h, const char* op, const char* name) {
  TORCH_CHECK(s.sizes() == h.sizes().slice(0, h.dim() - 1) && s.scalar_type() == at::toOpMathType(h.scalar_type()),
              op, ": ", name, " must hold one ", at::toOpMathType(h.scalar_type()), " per row of h (",
              h.sizes().slice(0, h.dim() - 1), "), got ", s.scalar_type(), " ", s.sizes());
}

// Returns (y, h, mean, rstd).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_layer_norm_forward_cpu(
    const at::Tensor& x_in, const at::Tensor& r_in, const at::Tensor& w_in, const at::Tensor& b_in, double eps) {
  constexpr const char* op = "opfuse::add_layer_norm_forward";
  check_input(x_in, op, "x");
  TORCH_CHECK(x_in.dim() >= 1, op, ": x must have at least one dimension");
  check_input(r_in, op, "residual");
  check_same(x_in, r_in, op, "x", "residual");
  check_parameter(w_in, x_in, op, "weight");
  check_parameter(b_in, x_in, op, "bias");
  TORCH_CHECK(eps >= 0, kOp, ": eps must not be negative, got ", eps);
  const at::Tensor x = x_in.contiguous(), r = r_in.contiguous(), w = w_in.contiguous(), b = b_in.contiguous();
  at::Tensor h = at::empty_like(x, at::MemoryFormat::Contiguous), y = at::empty_like(h);
  at::Tensor mean = meta::per_row(x), rstd = meta::per_row(x);
  cpu::add_layer_norm_forward_kernel(x, r, w, b, eps, h, y, mean, rstd);
  return {y, h, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor> add_layer_norm_cpu(const at::Tensor& x, const at::Tensor& residual,
                                                      const at::Tensor& weight, const at::Tensor& bias, double eps) {
  auto [y, h, mean, rstd] = add_layer_norm_forward_cpu(x, residual, weight, bias, eps);
  return {y, h};
}

// (dh, dweight, dbias): dh = LayerNorm's dx at h plus grad_h, the gradient of both x and residual.
std::tuple<at::Tensor, at::Tensor, at::Tensor> add_layer_norm_backward_cpu(
    const at::Tensor& grad, const c10::optional<at::Tensor>& grad_h, const at::Tensor& h_in, const at::Tensor& w_in,
    const at::Tensor& mean_in, const at::Tensor& rstd_in) {
  constexpr const char* op = "opfuse::add_layer_norm_backward";
  check_input(h_in, op, "h");
  check_input(grad, op, "grad");
  check_same(grad, h_in, op, "grad", "h");
  check_parameter(w_in, h_in, op, "weight");
  check_row_stats(mean_in, h_in, op, "mean");
  check_row_stats(rstd_in, h_in, op, "rstd");
  at::Tensor dh;
  if (grad_h.has_value() && grad_h->defined()) {
    check_same(*grad_h, h_in, op, "grad_h", "h");
    dh = grad_h->contiguous();
  }
  const at::Tensor h = h_in.contiguous(), w = w_in.contiguous(), dy = grad.contiguous();
  const at::Tensor mean = mean_in.contiguous(), rstd = rstd_in.contiguous();
  at::Tensor dx = at::empty_like(h, at::MemoryFormat::Contiguous), dw = at::empty_like(w), db = at::empty_like(w);
  cpu::add_layer_norm_backward_kernel(dy, dh, h, w, mean, rstd, dx, dw, db);
  return {dx, dw, db};
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Forward = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                           const at::Tensor&, const at::Tensor&, double);
using Backward = std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const c10::optional<at::Tensor>&,
                                                                const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                                const at::Tensor&);

auto add_layer_norm_op() {
  static auto op = find_op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                              const at::Tensor&, double)>("opfuse::add_layer_norm");
  return op;
}

// Saves h (an output), weight, mean and rstd. Either output may get a gradient: dy alone is
// LayerNorm's backward, dh alone passes straight to x and residual, both are one fused pass.
class AddLayerNormFunction : public torch::autograd::Function<AddLayerNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& residual,
                               const at::Tensor& weight, const at::Tensor& bias, double eps) {
    static auto forward_op = find_op<Forward>("opfuse::add_layer_norm_forward");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->set_materialize_grads(false);  // an output without a gradient costs no pass over zeros
    auto [y, h, mean, rstd] = forward_op.call(x, residual, weight, bias, eps);
    ctx->save_for_backward({h, weight, mean, rstd});
    return {y, h};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto backward_op = find_op<Backward>("opfuse::add_layer_norm_backward");
    const at::Tensor &dy = grads[0], &dh = grads[1];
    if (!dy.defined()) return {dh, dh, at::Tensor(), at::Tensor(), at::Tensor()};
    const auto s = ctx->get_saved_variables();
    auto [dx, dw, db] = backward_op.call(dy, dh.defined() ? c10::optional<at::Tensor>(dh) : c10::nullopt, s[0], s[1],
                                         s[2], s[3]);
    return {dx, dx, dw, db, at::Tensor()};
  }
};

// Outputs as the CPU front end allocates them, without data: row-major, mean and rstd one per row
// in the accumulation dtype.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> add_layer_norm_forward_meta(
    const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, const at::Tensor& bias, double eps) {
  return {meta::dense(x), meta::dense(x), meta::per_row(x), meta::per_row(x)};
}

}  // namespace

namespace specs {
namespace {

constexpr double kEps = 1e-5;

// GPT-2's block: 4 × 256 tokens of 768 by default (--numel picks the tokens). The variants return
// y alone: h's own gradient (the residual stream's) would cost every variant the same one add.
OpCase add_layer_norm_case(const OpArgs& a) {
  expect_shapes(a.shapes, 1, 1, 8, "add_layer_norm");
  const int64_t d = a.shapes[0].back();
  const at::Tensor x = leaf(randn(a.shapes[0], a.dtype)), r = leaf(randn(a.shapes[0], a.dtype));
  const at::Tensor w = leaf((torch::rand({d}) + 0.5).to(a.dtype)), b = leaf(randn({d}, a.dtype));
  OpCase c;
  c.leaves = {x, r, w, b};
  c.grad_output = randn(a.shapes[0], a.dtype);
  c.variants = {
      {"reference", "h = x + residual; ((h − mean) / sqrt(var + eps)) · w + b (autograd)",
       [=] {
         const at::Tensor h = x + r, centred = h - h.mean(-1, true);
         return centred * torch::rsqrt(centred.pow(2).mean(-1, true) + kEps) * w + b;
       }},
      {"aten", "F.layer_norm(x + residual)", [=] { return at::layer_norm(x + r, {d}, w, b, kEps); }},
      {"opfuse", "opfuse::add_layer_norm",
       [=] { return std::get<0>(add_layer_norm_op().call(x, r, w, b, kEps)); }}};
  // forward reads x and residual, writes h and y; backward reads dy and h, writes dx (also the
  // residual's gradient), as add_rms_norm's.
  c.bytes_per_step = 7.0 * x.numel() * x.element_size();
  return c;
}

OpSpec add_layer_norm_spec() {
  return {"add_layer_norm", [](const BenchSize& s) { return InputShapes{{rows_for(s.numel, 768, 4 * 256), 768}}; },
          add_layer_norm_case, {{{3, 7, 77}}, {{5, 1}}, {{33}}}};
}

const OpSpecRegistration add_layer_norm_registered{add_layer_norm_spec};

}  // namespace
}  // namespace specs
}  // namespace opfuse

TORCH_LIBRARY_FRAGMENT(opfuse, m) {
  // h = x + residual, then layer_norm(h, weight, bias) over the last dimension; returns (y, h).
  // _forward also returns each row's mean and rstd (float for bfloat16 x); _backward takes both
  // outputs' gradients (grad_h undefined when h got none) and returns (dh, dweight, dbias), dh
  // being both x's and residual's gradient.
  m.def("add_layer_norm(Tensor x, Tensor residual, Tensor weight, Tensor bias, float eps=1e-5) -> (Tensor, Tensor)");
  m.def("add_layer_norm_forward(Tensor x, Tensor residual, Tensor weight, Tensor bias, float eps) "
        "-> (Tensor, Tensor, Tensor, Tensor)");
  m.def("add_layer_norm_backward(Tensor grad, Tensor? grad_h, Tensor h, Tensor weight, Tensor mean, Tensor rstd) "
        "-> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(opfuse, CPU, m) {
  m.impl("add_layer_norm", &opfuse::add_layer_norm_cpu);
  m.impl("add_layer_norm_forward", &opfuse::add_layer_norm_forward_cpu);
  m.impl("add_layer_norm_backward", &opfuse::add_layer_norm_backward_cpu);
}

TORCH_LIBRARY_IMPL(opfuse, Meta, m) {
  using namespace opfuse::meta;
  m.impl("add_layer_norm", [](const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
                              const at::Tensor& bias, double eps) { return std::make_tuple(dense(x), dense(x)); });
  m.impl("add_layer_norm_forward", &opfuse::add_layer_norm_forward_meta);
  m.impl("add_layer_norm_backward", [](const at::Tensor& grad, const c10::optional<at::Tensor>& grad_h,
                                       const at::Tensor& h, const at::Tensor& weight, const at::Tensor& mean,
                                       const at::Tensor& rstd) {
    return std::make_tuple(dense(h), like(weight), like(weight));
  });
}

// The backward has no derivative of its own: double backward raises.
TORCH_LIBRARY_IMPL(opfuse, Autograd, m) {
  m.impl("add_layer_norm", [](const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
                              const at::Tensor& bias, double eps) {
    const auto out = opfuse::AddLayerNormFunction::apply(x, residual, weight, bias, eps);
    return std::make_tuple(out[0], out[1]);
  });
  m.impl("add_layer_norm_forward", torch::autograd::autogradNotImplementedFallback());
  m.impl("add_layer_norm_backward", torch::autograd::autogradNotImplementedFallback());
}
