// opfuse::drop_connect_add: EfficientNet's drop connect followed by the residual add,
//   out = x / keep · mask[n] + residual,   mask[n] = floor(keep + U[0, 1)),  keep = 1 − p
// front end, autograd and the C++ API. The mask is drawn exactly as the reference's
// drop_connect draws it (torch::rand of [N, 1, 1, 1] in x's dtype from the default
// generator), so a torch::manual_seed gives the composite's mask; the pass over the data lives
// in cpu/drop_connect_add_kernel.cpp. Not training, or p = 0: out = x + residual, nothing drawn.
#include <ATen/TensorOperators.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "opfuse/ops.h"
#include "ops/checks.h"
#include "ops/dispatch.h"
#include "ops/drop_connect_add/drop_connect_add_kernel.h"
#include "ops/layout.h"
#include "ops/meta.h"

namespace opfuse {
namespace {

void check_drop_connect_args(const at::Tensor& x, const at::Tensor& residual, double p, const char* op) {
  check_input(x, op, "x");
  check_input(residual, op, "residual");
  check_same(x, residual, op, "x", "residual");
  TORCH_CHECK(x.dim() >= 1, op, ": x must be [N, ...] with at least 1 dim, got ", x.sizes());
  TORCH_CHECK(p >= 0 && p < 1, op, ": p must be in [0, 1), got ", p);
}

// Sample n must be the n-th contiguous block of x and residual alike: both dense in the same
// memory format (NCHW or channels_last), else both made contiguous.
at::MemoryFormat shared_layout(const at::Tensor& x, const at::Tensor& residual) {
  const auto cl = at::MemoryFormat::ChannelsLast;
  return is_channels_last(x) && residual.is_contiguous(cl) ? cl : at::MemoryFormat::Contiguous;
}

// The reference's mask: floor(keep + rand([N, 1, 1, 1])), 0 or 1 per sample.
at::Tensor draw_mask(const at::Tensor& x, double keep) {
  return at::floor(keep + at::rand({x.size(0), 1, 1, 1}, x.options()));
}

std::tuple<at::Tensor, at::Tensor> drop_connect_add_forward_cpu(const at::Tensor& x, const at::Tensor& residual,
                                                                double p, bool training) {
  check_drop_connect_args(x, residual, p, "opfuse::drop_connect_add");
  if (!training || p == 0) return {at::add(x, residual), at::Tensor()};
  const double keep = 1 - p;
  const at::Tensor mask = draw_mask(x, keep);
  const auto format = shared_layout(x, residual);
  const at::Tensor xin = x.contiguous(format), rin = residual.contiguous(format);
  at::Tensor out = at::empty_like(xin, format);
  cpu::drop_connect_add_forward_kernel(xin, rin, mask, keep, out);
  return {out, mask.reshape({x.size(0)})};
}

at::Tensor drop_connect_add_cpu(const at::Tensor& x, const at::Tensor& residual, double p, bool training) {
  return std::get<0>(drop_connect_add_forward_cpu(x, residual, p, training));
}

// dx = dy · mask[n] / keep; an undefined mask (nothing was dropped) passes a copy of dy through
// (the schema promises a new tensor; the autograd Function passes dy itself without calling this).
at::Tensor drop_connect_add_backward_cpu(const at::Tensor& grad, const c10::optional<at::Tensor>& mask, double p) {
  const char* op = "opfuse::drop_connect_add_backward";
  check_input(grad, op, "grad");
  if (!mask.has_value() || !mask->defined()) return grad.clone();
  TORCH_CHECK(grad.dim() >= 1 && mask->dim() == 1 && mask->size(0) == grad.size(0) &&
                  mask->scalar_type() == grad.scalar_type(),
              op, ": mask must be [N] of grad's dtype for grad ", grad.sizes(), ", got ", mask->sizes());
  const auto format = shared_layout(grad, grad);
  const at::Tensor dy = grad.contiguous(format);
  at::Tensor dx = at::empty_like(dy, format);
  cpu::drop_connect_add_backward_kernel(dy, mask->contiguous(), 1 - p, dx);
  return dx;
}

auto forward_op() {
  static auto op = find_op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, double, bool)>(
      "opfuse::drop_connect_add_forward");
  return op;
}

auto backward_op() {
  static auto op = find_op<at::Tensor(const at::Tensor&, const c10::optional<at::Tensor>&, double)>(
      "opfuse::drop_connect_add_backward");
  return op;
}

auto drop_connect_add_op() {
  static auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&, double, bool)>("opfuse::drop_connect_add");
  return op;
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Saves only the [N] mask: neither gradient needs x or residual.
class DropConnectAddFunction : public torch::autograd::Function<DropConnectAddFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& residual, double p,
                            bool training) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [out, mask] = forward_op().call(x, residual, p, training);
    ctx->save_for_backward({mask});
    ctx->saved_data["p"] = p;
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const at::Tensor mask = ctx->get_saved_variables()[0];
    const at::Tensor dx = mask.defined() ? backward_op().call(grads[0], mask, ctx->saved_data["p"].toDouble()) : grads[0];
    return {dx, grads[0], at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor drop_connect_add(const at::Tensor& x, const at::Tensor& residual, double p, bool training) {
  return drop_connect_add_op().call(x, residual, p, training);
}

}  // namespace opfuse

TORCH_LIBRARY_FRAGMENT(opfuse, m) {
  // x / (1 − p) · mask[n] + residual with a per-sample mask drawn from the default generator;
  // _forward also returns the [N] mask (undefined when nothing is dropped).
  m.def("drop_connect_add(Tensor x, Tensor residual, float p, bool training) -> Tensor");
  m.def("drop_connect_add_forward(Tensor x, Tensor residual, float p, bool training) -> (Tensor, Tensor)");
  m.def("drop_connect_add_backward(Tensor grad, Tensor? mask, float p) -> Tensor");
}

TORCH_LIBRARY_IMPL(opfuse, CPU, m) {
  m.impl("drop_connect_add", &opfuse::drop_connect_add_cpu);
  m.impl("drop_connect_add_forward", &opfuse::drop_connect_add_forward_cpu);
  m.impl("drop_connect_add_backward", &opfuse::drop_connect_add_backward_cpu);
}

// Outputs as the CPU front end allocates them, without data (ops/meta.h): channels_last when x
// and the residual both are, a mask of one value per sample.
namespace opfuse {
namespace {

at::MemoryFormat drop_connect_layout(const at::Tensor& x, const at::Tensor& residual) {
  const bool channels_last = kernel_layout(x) == at::MemoryFormat::ChannelsLast &&
                             residual.is_contiguous(at::MemoryFormat::ChannelsLast);
  return channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
}

std::tuple<at::Tensor, at::Tensor> drop_connect_add_forward_meta(const at::Tensor& x, const at::Tensor& residual,
                                                                 double p, bool training) {
  if (!training || p == 0) return {x + residual, at::Tensor()};
  return {at::empty_like(x, x.options(), drop_connect_layout(x, residual)), meta::empty({x.sym_size(0)}, x)};
}

}  // namespace
}  // namespace opfuse

TORCH_LIBRARY_IMPL(opfuse, Meta, m) {
  m.impl("drop_connect_add", [](const at::Tensor& x, const at::Tensor& residual, double p, bool training) {
    return std::get<0>(opfuse::drop_connect_add_forward_meta(x, residual, p, training));
  });
  m.impl("drop_connect_add_forward", &opfuse::drop_connect_add_forward_meta);
  m.impl("drop_connect_add_backward", [](const at::Tensor& grad, const c10::optional<at::Tensor>& mask, double p) {
    if (!mask.has_value() || !mask->defined()) return grad.clone();
    return at::empty_like(grad, grad.options(), opfuse::drop_connect_layout(grad, grad));
  });
}

TORCH_LIBRARY_IMPL(opfuse, Autograd, m) {
  m.impl("drop_connect_add", [](const at::Tensor& x, const at::Tensor& residual, double p, bool training) {
    return opfuse::DropConnectAddFunction::apply(x, residual, p, training);
  });
  m.impl("drop_connect_add_forward", torch::autograd::autogradNotImplementedFallback());
  m.impl("drop_connect_add_backward", torch::autograd::autogradNotImplementedFallback());
}
