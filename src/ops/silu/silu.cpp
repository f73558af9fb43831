// opfuse::silu and opfuse::swish: front ends, autograd and the C++ API. The formulas live in
// cpu/silu_kernel.cpp.
#include <ATen/native/TensorIterator.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "opfuse/ops.h"
#include "ops/checks.h"
#include "ops/dispatch.h"
#include "ops/meta.h"
#include "ops/silu/silu_kernel.h"

namespace opfuse {
namespace {

at::Tensor swish_cpu(const at::Tensor& x, double beta) {
  check_input(x, "opfuse::swish", "x");
  at::Tensor out = at::empty_like(x);  // keeps a dense input's strides (channels_last too)
  auto iter = at::TensorIteratorConfig().add_output(out).add_input(x).build();
  cpu::swish_forward_kernel(iter, beta);
  return out;
}

at::Tensor swish_backward_cpu(const at::Tensor& grad, const at::Tensor& x, double beta) {
  check_input(x, "opfuse::swish_backward", "x");
  check_input(grad, "opfuse::swish_backward", "grad");
  check_same(grad, x, "opfuse::swish_backward", "grad", "x");
  at::Tensor dx = at::empty_like(x);
  auto iter = at::TensorIteratorConfig().add_output(dx).add_input(grad).add_input(x).build();
  cpu::swish_backward_kernel(iter, beta);
  return dx;
}

at::Tensor silu_cpu(const at::Tensor& x) { return swish_cpu(x, 1.0); }
at::Tensor silu_backward_cpu(const at::Tensor& grad, const at::Tensor& x) {
  return swish_backward_cpu(grad, x, 1.0);
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

auto silu_backward_op() {
  static auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&)>("opfuse::silu_backward");
  return op;
}

auto swish_backward_op() {
  static auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&, double)>("opfuse::swish_backward");
  return op;
}

auto silu_op() {
  static auto op = find_op<at::Tensor(const at::Tensor&)>("opfuse::silu");
  return op;
}

auto swish_op() {
  static auto op = find_op<at::Tensor(const at::Tensor&, double)>("opfuse::swish");
  return op;
}

// Saves only x, as the memory-efficient Swish does; backward recomputes sigmoid in its one pass.
class SiluFunction : public torch::autograd::Function<SiluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    ctx->save_for_backward({x});
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return silu_op().call(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor()};
    const at::Tensor x = ctx->get_saved_variables()[0];
    return {silu_backward_op().call(grads[0], x)};
  }
};

class SwishFunction : public torch::autograd::Function<SwishFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, double beta) {
    ctx->save_for_backward({x});
    ctx->saved_data["beta"] = beta;
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return swish_op().call(x, beta);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    const at::Tensor x = ctx->get_saved_variables()[0];
    const double beta = ctx->saved_data["beta"].toDouble();
    return {swish_backward_op().call(grads[0], x, beta), at::Tensor()};
  }
};

}  // namespace

at::Tensor silu(const at::Tensor& x) { return silu_op().call(x); }
at::Tensor swish(const at::Tensor& x, double beta) { return swish_op().call(x, beta); }

}  // namespace opfuse

TORCH_LIBRARY_FRAGMENT(opfuse, m) {
  m.def("silu(Tensor x) -> Tensor");
  m.def("silu_backward(Tensor grad, Tensor x) -> Tensor");
  m.def("swish(Tensor x, float beta=1.0) -> Tensor");
  m.def("swish_backward(Tensor grad, Tensor x, float beta) -> Tensor");
}

TORCH_LIBRARY_IMPL(opfuse, CPU, m) {
  m.impl("silu", &opfuse::silu_cpu);
  m.impl("silu_backward", &opfuse::silu_backward_cpu);
  m.impl("swish", &opfuse::swish_cpu);
  m.impl("swish_backward", &opfuse::swish_backward_cpu);
}

// Outputs as the CPU front end allocates them, without data (ops/meta.h).
TORCH_LIBRARY_IMPL(opfuse, Meta, m) {
  using opfuse::meta::like;
  m.impl("silu", [](const at::Tensor& x) { return like(x); });
  m.impl("silu_backward", [](const at::Tensor& grad, const at::Tensor& x) { return like(x); });
  m.impl("swish", [](const at::Tensor& x, double beta) { return like(x); });
  m.impl("swish_backward", [](const at::Tensor& grad, const at::Tensor& x, double beta) { return like(x); });
}

// The backward kernels have no derivative of their own: asking for one (double backward)
// raises an error instead of silently returning a gradient that ignores them.
TORCH_LIBRARY_IMPL(opfuse, Autograd, m) {
  m.impl("silu", [](const at::Tensor& x) { return opfuse::SiluFunction::apply(x); });
  m.impl("swish", [](const at::Tensor& x, double beta) { return opfuse::SwishFunction::apply(x, beta); });
  m.impl("silu_backward", torch::autograd::autogradNotImplementedFallback());
  m.impl("swish_backward", torch::autograd::autogradNotImplementedFallback());
}
