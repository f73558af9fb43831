// opfuse::rms_norm and opfuse::add_rms_norm (the residual add before it, as every Llama block
// does it): front ends, autograd and the C++ API. The loops live in cpu/rms_norm_loops.h.
#include <ATen/OpMathType.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "opfuse/ops.h"
#include "ops/checks.h"
#include "ops/dispatch.h"
#include "ops/meta.h"
#include "ops/rms_norm/rms_norm_kernel.h"

namespace opfuse {
namespace {

constexpr const char* kOp = "opfuse::rms_norm";

void check_arguments(const at::Tensor& x, const at::Tensor& weight, const char* op) {
  check_input(x, op, "x");
  check_input(weight, op, "weight");
  TORCH_CHECK(x.dim() >= 1, op, ": x must have at least one dimension");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), op, ": weight must be [", x.size(-1),
              "] (x's last dimension), got ", weight.sizes());
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), op, ": x and weight must have the same dtype, got ",
              x.scalar_type(), " and ", weight.scalar_type());
}

void check_rstd(const at::Tensor& rstd, const at::Tensor& x, const char* op) {
  TORCH_CHECK(rstd.sizes() == x.sizes().slice(0, x.dim() - 1), op, ": rstd must hold one value per row of x (",
              x.sizes().slice(0, x.dim() - 1), "), got ", rstd.sizes());
  TORCH_CHECK(rstd.scalar_type() == at::toOpMathType(x.scalar_type()), op, ": rstd must be ",
              at::toOpMathType(x.scalar_type()), ", got ", rstd.scalar_type());
}

std::tuple<at::Tensor, at::Tensor> rms_norm_forward_cpu(const at::Tensor& x_in, const at::Tensor& w_in, double eps) {
  check_arguments(x_in, w_in, "opfuse::rms_norm_forward");
  TORCH_CHECK(eps >= 0, kOp, ": eps must not be negative, got ", eps);
  const at::Tensor x = x_in.contiguous(), w = w_in.contiguous();
  at::Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous), rstd = meta::per_row(x);
  cpu::rms_norm_forward_kernel(x, w, eps, y, rstd);
  return {y, rstd};
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cpu(const at::Tensor& grad, const at::Tensor& x_in,
                                                         const at::Tensor& w_in, const at::Tensor& rstd) {
  constexpr const char* op = "opfuse::rms_norm_backward";
  check_arguments(x_in, w_in, op);
  check_input(grad, op, "grad");
  check_same(grad, x_in, op, "grad", "x");
  check_rstd(rstd, x_in, op);
  const at::Tensor x = x_in.contiguous(), w = w_in.contiguous(), dy = grad.contiguous(), r = rstd.contiguous();
  at::Tensor dx = at::empty_like(x, at::MemoryFormat::Contiguous), dw = at::empty_like(w);
  cpu::rms_norm_backward_kernel(dy, x, w, r, dx, dw);
  return {dx, dw};
}

at::Tensor rms_norm_cpu(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return std::get<0>(rms_norm_forward_cpu(x, weight, eps));
}

// h = x + residual, y = rms_norm(h); returns (y, h, rstd).
std::tuple<at::Tensor, at::Tensor, at::Tensor> add_rms_norm_forward_cpu(const at::Tensor& x_in, const at::Tensor& r_in,
                                                                        const at::Tensor& w_in, double eps) {
  constexpr const char* op = "opfuse::add_rms_norm_forward";
  check_arguments(x_in, w_in, op);
  check_input(r_in, op, "residual");
  check_same(x_in, r_in, op, "x", "residual");
  TORCH_CHECK(eps >= 0, "opfuse::add_rms_norm: eps must not be negative, got ", eps);
  const at::Tensor x = x_in.contiguous(), r = r_in.contiguous(), w = w_in.contiguous();
  at::Tensor h = at::empty_like(x, at::MemoryFormat::Contiguous), y = at::empty_like(h), rstd = meta::per_row(x);
  cpu::add_rms_norm_forward_kernel(x, r, w, eps, h, y, rstd);
  return {y, h, rstd};
}

// (dh, dweight): dh = rms_norm's dx at h plus grad_h, the gradient of both x and residual.
std::tuple<at::Tensor, at::Tensor> add_rms_norm_backward_cpu(const at::Tensor& grad, const c10::optional<at::Tensor>& grad_h,
                                                             const at::Tensor& h_in, const at::Tensor& w_in,
                                                             const at::Tensor& rstd) {
  constexpr const char* op = "opfuse::add_rms_norm_backward";
  check_arguments(h_in, w_in, op);
  check_input(grad, op, "grad");
  check_same(grad, h_in, op, "grad", "h");
  check_rstd(rstd, h_in, op);
  at::Tensor dh;
  if (grad_h.has_value() && grad_h->defined()) {
    check_same(*grad_h, h_in, op, "grad_h", "h");
    dh = grad_h->contiguous();
  }
  const at::Tensor h = h_in.contiguous(), w = w_in.contiguous(), dy = grad.contiguous(), r = rstd.contiguous();
  at::Tensor dx = at::empty_like(h, at::MemoryFormat::Contiguous), dw = at::empty_like(w);
  cpu::add_rms_norm_backward_kernel(dy, dh, h, w, r, dx, dw);
  return {dx, dw};
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm_cpu(const at::Tensor& x, const at::Tensor& residual,
                                                    const at::Tensor& weight, double eps) {
  auto [y, h, rstd] = add_rms_norm_forward_cpu(x, residual, weight, eps);
  return {y, h};
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

auto forward_op() {
  static auto op = find_op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, double)>(
      "opfuse::rms_norm_forward");
  return op;
}

auto backward_op() {
  static auto op = find_op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                              const at::Tensor&, const at::Tensor&)>(
      "opfuse::rms_norm_backward");
  return op;
}

auto rms_norm_op() {
  static auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&, double)>("opfuse::rms_norm");
  return op;
}

// Saves x, weight and the per-row rstd; x̂ is recomputed in the backward's one pass.
class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [y, rstd] = forward_op().call(x, weight, eps);
    ctx->save_for_backward({x, weight, rstd});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    const auto saved = ctx->get_saved_variables();
    auto [dx, dw] = backward_op().call(grads[0], saved[0], saved[1], saved[2]);
    return {dx, dw, at::Tensor()};
  }
};

auto add_forward_op() {
  static auto op = find_op<std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                          const at::Tensor&, double)>(
      "opfuse::add_rms_norm_forward");
  return op;
}

auto add_backward_op() {
  static auto op = find_op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const c10::optional<at::Tensor>&,
                                                              const at::Tensor&, const at::Tensor&, const at::Tensor&)>(
      "opfuse::add_rms_norm_backward");
  return op;
}

auto add_rms_norm_op() {
  static auto op = find_op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                              double)>("opfuse::add_rms_norm");
  return op;
}

// Saves h (an output), weight and rstd. Either output may get a gradient: dy alone is rms_norm's
// backward, dh alone passes straight to x and residual, both are one fused pass.
class AddRmsNormFunction : public torch::autograd::Function<AddRmsNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& residual,
                               const at::Tensor& weight, double eps) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    ctx->set_materialize_grads(false);  // an output without a gradient costs no pass over zeros
    auto [y, h, rstd] = add_forward_op().call(x, residual, weight, eps);
    ctx->save_for_backward({h, weight, rstd});
    return {y, h};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor &dy = grads[0], &dh = grads[1];
    if (!dy.defined()) return {dh, dh, at::Tensor(), at::Tensor()};
    const auto saved = ctx->get_saved_variables();
    auto [dx, dw] = add_backward_op().call(dy, dh.defined() ? c10::optional<at::Tensor>(dh) : c10::nullopt, saved[0],
                                           saved[1], saved[2]);
    return {dx, dx, dw, at::Tensor()};
  }
};

}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return rms_norm_op().call(x, weight, eps);
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual,
                                                const at::Tensor& weight, double eps) {
  return add_rms_norm_op().call(x, residual, weight, eps);
}

}  // namespace opfuse

TORCH_LIBRARY_FRAGMENT(opfuse, m) {
  // x · rsqrt(mean(x², -1) + eps) · weight over the last dimension; _forward also returns the
  // per-row rstd (float for bfloat16 x) that _backward takes.
  m.def("rms_norm(Tensor x, Tensor weight, float eps=1e-6) -> Tensor");
  m.def("rms_norm_forward(Tensor x, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("rms_norm_backward(Tensor grad, Tensor x, Tensor weight, Tensor rstd) -> (Tensor, Tensor)");
  // h = x + residual, then rms_norm(h); returns (y, h). _forward also returns rstd; _backward
  // takes both outputs' gradients (grad_h undefined when h got none) and returns (dh, dweight),
  // dh being both x's and residual's gradient.
  m.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps=1e-6) -> (Tensor, Tensor)");
  m.def("add_rms_norm_forward(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor, Tensor)");
  m.def("add_rms_norm_backward(Tensor grad, Tensor? grad_h, Tensor h, Tensor weight, Tensor rstd) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(opfuse, CPU, m) {
  m.impl("rms_norm", &opfuse::rms_norm_cpu);
  m.impl("rms_norm_forward", &opfuse::rms_norm_forward_cpu);
  m.impl("rms_norm_backward", &opfuse::rms_norm_backward_cpu);
  m.impl("add_rms_norm", &opfuse::add_rms_norm_cpu);
  m.impl("add_rms_norm_forward", &opfuse::add_rms_norm_forward_cpu);
  m.impl("add_rms_norm_backward", &opfuse::add_rms_norm_backward_cpu);
}

// Outputs as the CPU front end allocates them, without data (ops/meta.h): row-major, rstd one
// per row in the accumulation dtype.
TORCH_LIBRARY_IMPL(opfuse, Meta, m) {
  using namespace opfuse::meta;
  m.impl("rms_norm", [](const at::Tensor& x, const at::Tensor& weight, double eps) { return dense(x); });
  m.impl("rms_norm_forward", [](const at::Tensor& x, const at::Tensor& weight, double eps) {
    return std::make_tuple(dense(x), per_row(x));
  });
  m.impl("rms_norm_backward", [](const at::Tensor& grad, const at::Tensor& x, const at::Tensor& weight,
                                 const at::Tensor& rstd) { return std::make_tuple(dense(x), like(weight)); });
  m.impl("add_rms_norm", [](const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, double eps) {
    return std::make_tuple(dense(x), dense(x));
  });
  m.impl("add_rms_norm_forward", [](const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight,
                                        double eps) { return std::make_tuple(dense(x), dense(x), per_row(x)); });
  m.impl("add_rms_norm_backward", [](const at::Tensor& grad, const c10::optional<at::Tensor>& grad_h,
                                     const at::Tensor& h, const at::Tensor& weight, const at::Tensor& rstd) {
    return std::make_tuple(dense(h), like(weight));
  });
}

// The backward has no derivative of its own: double backward raises.
TORCH_LIBRARY_IMPL(opfuse, Autograd, m) {
  m.impl("rms_norm", [](const at::Tensor& x, const at::Tensor& weight, double eps) {
    return opfuse::RmsNormFunction::apply(x, weight, eps);
  });
  m.impl("rms_norm_forward", torch::autograd::autogradNotImplementedFallback());
  m.impl("rms_norm_backward", torch::autograd::autogradNotImplementedFallback());
  m.impl("add_rms_norm", [](const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, double eps) {
    const auto out = opfuse::AddRmsNormFunction::apply(x, residual, weight, eps);
    return std::make_tuple(out[0], out[1]);
  });
  m.impl("add_rms_norm_forward", torch::autograd::autogradNotImplementedFallback());
  m.impl("add_rms_norm_backward", torch::autograd::autogradNotImplementedFallback());
}
