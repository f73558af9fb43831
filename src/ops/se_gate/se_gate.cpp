// opfuse::se_gate: x · sigmoid(gate) with the gate broadcast over the spatial dims, front end,
// autograd and the C++ API. The loops live in cpu/se_gate_kernel.cpp.
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "opfuse/ops.h"
#include "ops/checks.h"
#include "ops/dispatch.h"
#include "ops/layout.h"
#include "ops/meta.h"
#include "ops/se_gate/se_gate_kernel.h"

namespace opfuse {
namespace {

void check_gate(const at::Tensor& x, const at::Tensor& gate, const char* op) {
  check_input(x, op, "x");
  check_input(gate, op, "gate");
  TORCH_CHECK(x.dim() >= 2, op, ": x must be [N, C, ...] with at least 2 dims, got ", x.sizes());
  TORCH_CHECK(gate.scalar_type() == x.scalar_type(), op, ": x and gate must have the same dtype, got ",
              x.scalar_type(), " and ", gate.scalar_type());
  std::vector<int64_t> expected(x.dim(), 1);
  expected[0] = x.size(0);
  expected[1] = x.size(1);
  TORCH_CHECK(gate.sizes() == at::IntArrayRef(expected), op, ": gate must have shape ",
              at::IntArrayRef(expected), " for x of shape ", x.sizes(), ", got ", gate.sizes());
}

at::Tensor se_gate_cpu(const at::Tensor& x, const at::Tensor& gate) {
  check_gate(x, gate, "opfuse::se_gate");
  const auto format = kernel_layout(x);
  const at::Tensor xin = x.contiguous(format);
  at::Tensor out = at::empty_like(xin, format);
  cpu::se_gate_forward_kernel(xin, gate.contiguous(), out);
  return out;
}

std::tuple<at::Tensor, at::Tensor> se_gate_backward_cpu(const at::Tensor& grad, const at::Tensor& x,
                                                        const at::Tensor& gate) {
  check_gate(x, gate, "opfuse::se_gate_backward");
  check_input(grad, "opfuse::se_gate_backward", "grad");
  check_same(grad, x, "opfuse::se_gate_backward", "grad", "x");
  const auto format = kernel_layout(x);
  const at::Tensor xin = x.contiguous(format);
  const at::Tensor dy = grad.contiguous(format);
  at::Tensor dx = at::empty_like(xin, format);
  at::Tensor dgate = at::empty(gate.sizes(), gate.options());
  cpu::se_gate_backward_kernel(dy, xin, gate.contiguous(), dx, dgate);
  return {dx, dgate};
}

auto se_gate_op() {
  static auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&)>("opfuse::se_gate");
  return op;
}

auto se_gate_backward_op() {
  static auto op = find_op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&)>("opfuse::se_gate_backward");
  return op;
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Saves x and the gate (N·C values), not the output: backward needs dy·x for the gate's sum.
class SeGateFunction : public torch::autograd::Function<SeGateFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& gate) {
    ctx->save_for_backward({x, gate});
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return se_gate_op().call(x, gate);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    const auto saved = ctx->get_saved_variables();
    auto [dx, dgate] = se_gate_backward_op().call(grads[0], saved[0], saved[1]);
    return {dx, dgate};
  }
};

}  // namespace

at::Tensor se_gate(const at::Tensor& x, const at::Tensor& gate) { return se_gate_op().call(x, gate); }

}  // namespace opfuse

TORCH_LIBRARY_FRAGMENT(opfuse, m) {
  m.def("se_gate(Tensor x, Tensor gate) -> Tensor");
  m.def("se_gate_backward(Tensor grad, Tensor x, Tensor gate) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(opfuse, CPU, m) {
  m.impl("se_gate", &opfuse::se_gate_cpu);
  m.impl("se_gate_backward", &opfuse::se_gate_backward_cpu);
}

// Outputs as the CPU front end allocates them, without data (ops/meta.h).
TORCH_LIBRARY_IMPL(opfuse, Meta, m) {
  using namespace opfuse::meta;
  m.impl("se_gate", [](const at::Tensor& x, const at::Tensor& gate) { return in_kernel_layout(x); });
  m.impl("se_gate_backward", [](const at::Tensor& grad, const at::Tensor& x, const at::Tensor& gate) {
    return std::make_tuple(in_kernel_layout(x), empty(gate.sym_sizes(), gate));
  });
}

TORCH_LIBRARY_IMPL(opfuse, Autograd, m) {
  m.impl("se_gate", [](const at::Tensor& x, const at::Tensor& gate) {
    return opfuse::SeGateFunction::apply(x, gate);
  });
  m.impl("se_gate_backward", torch::autograd::autogradNotImplementedFallback());
}
