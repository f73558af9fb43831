// The gated units: opfuse::swiglu (silu(gate) · up), its packed form, and opfuse::geglu
// (gelu(gate, tanh) · up): front ends, autograd and the C++ API. The loops live in
// cpu/swiglu_loops.h.
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <utility>

#include "opfuse/ops.h"
#include "ops/checks.h"
#include "ops/dispatch.h"
#include "ops/meta.h"
#include "ops/swiglu/swiglu_kernel.h"

namespace opfuse {
namespace {

int64_t last_dim(const at::Tensor& t) { return t.dim() == 0 ? 1 : t.size(-1); }

using cpu::Gate;

// The op names of a gated unit: {forward, backward}.
template <Gate kGate>
constexpr std::pair<const char*, const char*> kNames =
    kGate == Gate::silu ? std::pair{"opfuse::swiglu", "opfuse::swiglu_backward"}
                        : std::pair{"opfuse::geglu", "opfuse::geglu_backward"};

template <Gate kGate>
at::Tensor gated_cpu(const at::Tensor& gate_in, const at::Tensor& up_in) {
  const char* op = kNames<kGate>.first;
  check_input(gate_in, op, "gate");
  check_input(up_in, op, "up");
  check_same(gate_in, up_in, op, "gate", "up");
  const at::Tensor gate = gate_in.contiguous(), up = up_in.contiguous();
  at::Tensor y = at::empty_like(gate, at::MemoryFormat::Contiguous);
  cpu::gated_forward_kernel(kGate, gate, up, last_dim(gate), y);
  return y;
}

template <Gate kGate>
std::tuple<at::Tensor, at::Tensor> gated_backward_cpu(const at::Tensor& grad, const at::Tensor& gate_in,
                                                      const at::Tensor& up_in) {
  const char* op = kNames<kGate>.second;
  check_input(grad, op, "grad");
  check_input(gate_in, op, "gate");
  check_same(gate_in, up_in, op, "gate", "up");
  check_same(grad, gate_in, op, "grad", "gate");
  const at::Tensor gate = gate_in.contiguous(), up = up_in.contiguous(), dy = grad.contiguous();
  at::Tensor dgate = at::empty_like(gate, at::MemoryFormat::Contiguous), dup = at::empty_like(dgate);
  cpu::gated_backward_kernel(kGate, dy, gate, up, last_dim(gate), dgate, dup);
  return {dgate, dup};
}

// x [..., 2d]: gate its first d of the last dimension, up the second.
void check_packed(const at::Tensor& x, const char* op) {
  check_input(x, op, "x");
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) % 2 == 0, op, ": x's last dimension must be even (gate, then up), got ",
              x.sizes());
}

at::Tensor swiglu_packed_cpu(const at::Tensor& x_in) {
  check_packed(x_in, "opfuse::swiglu_packed");
  const at::Tensor x = x_in.contiguous();
  const int64_t d = x.size(-1) / 2;
  at::Tensor y = at::empty_like(x.narrow(-1, 0, d), at::MemoryFormat::Contiguous);
  cpu::gated_forward_kernel(Gate::silu, x.narrow(-1, 0, d), x.narrow(-1, d, d), 2 * d, y);
  return y;
}

at::Tensor swiglu_packed_backward_cpu(const at::Tensor& grad, const at::Tensor& x_in) {
  constexpr const char* op = "opfuse::swiglu_packed_backward";
  check_packed(x_in, op);
  check_input(grad, op, "grad");
  const int64_t d = x_in.size(-1) / 2;
  TORCH_CHECK(grad.sizes() == x_in.narrow(-1, 0, d).sizes() && grad.scalar_type() == x_in.scalar_type(), op,
              ": grad must be x's half, got ", grad.sizes(), " ", grad.scalar_type());
  const at::Tensor x = x_in.contiguous(), dy = grad.contiguous();
  at::Tensor dx = at::empty_like(x, at::MemoryFormat::Contiguous);
  at::Tensor dgate = dx.narrow(-1, 0, d), dup = dx.narrow(-1, d, d);
  cpu::gated_backward_kernel(Gate::silu, dy, x.narrow(-1, 0, d), x.narrow(-1, d, d), 2 * d, dgate, dup);
  return dx;
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

template <Gate kGate>
auto gated_op() {
  static auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&)>(kNames<kGate>.first);
  return op;
}
template <Gate kGate>
auto gated_backward_op() {
  static auto op = find_op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, const at::Tensor&)>(
      kNames<kGate>.second);
  return op;
}
auto packed_op() {
  static auto op = find_op<at::Tensor(const at::Tensor&)>("opfuse::swiglu_packed");
  return op;
}
auto packed_backward_op() {
  static auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&)>("opfuse::swiglu_packed_backward");
  return op;
}

// Saves its inputs only; the activation is recomputed in the backward's one pass.
template <Gate kGate>
class GatedFunction : public torch::autograd::Function<GatedFunction<kGate>> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    ctx->save_for_backward({gate, up});
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return gated_op<kGate>().call(gate, up);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    const auto saved = ctx->get_saved_variables();
    auto [dgate, dup] = gated_backward_op<kGate>().call(grads[0], saved[0], saved[1]);
    return {dgate, dup};
  }
};

class PackedFunction : public torch::autograd::Function<PackedFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    ctx->save_for_backward({x});
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return packed_op().call(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor()};
    return {packed_backward_op().call(grads[0], ctx->get_saved_variables()[0])};
  }
};

}  // namespace

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) { return gated_op<Gate::silu>().call(gate, up); }
at::Tensor swiglu(const at::Tensor& x) { return packed_op().call(x); }
at::Tensor geglu(const at::Tensor& gate, const at::Tensor& up) { return gated_op<Gate::gelu_tanh>().call(gate, up); }

}  // namespace opfuse

TORCH_LIBRARY_FRAGMENT(opfuse, m) {
  // silu(gate) · up; _packed takes one tensor whose last dimension holds gate, then up.
  m.def("swiglu(Tensor gate, Tensor up) -> Tensor");
  m.def("swiglu_backward(Tensor grad, Tensor gate, Tensor up) -> (Tensor, Tensor)");
  m.def("swiglu_packed(Tensor x) -> Tensor");
  m.def("swiglu_packed_backward(Tensor grad, Tensor x) -> Tensor");
  // gelu(gate, approximate='tanh') · up (Gemma's, T5 v1.1's gated GELU)
  m.def("geglu(Tensor gate, Tensor up) -> Tensor");
  m.def("geglu_backward(Tensor grad, Tensor gate, Tensor up) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(opfuse, CPU, m) {
  using opfuse::cpu::Gate;
  m.impl("swiglu", &opfuse::gated_cpu<Gate::silu>);
  m.impl("swiglu_backward", &opfuse::gated_backward_cpu<Gate::silu>);
  m.impl("swiglu_packed", &opfuse::swiglu_packed_cpu);
  m.impl("swiglu_packed_backward", &opfuse::swiglu_packed_backward_cpu);
  m.impl("geglu", &opfuse::gated_cpu<Gate::gelu_tanh>);
  m.impl("geglu_backward", &opfuse::gated_backward_cpu<Gate::gelu_tanh>);
}

// Outputs as the CPU front end allocates them, without data (ops/meta.h): row-major.
TORCH_LIBRARY_IMPL(opfuse, Meta, m) {
  using namespace opfuse::meta;
  auto gated = [](const at::Tensor& gate, const at::Tensor& up) { return dense(gate); };
  auto gated_backward = [](const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up) {
    return std::make_tuple(dense(gate), dense(gate));
  };
  m.impl("swiglu", gated);
  m.impl("swiglu_backward", gated_backward);
  m.impl("geglu", gated);
  m.impl("geglu_backward", gated_backward);
  m.impl("swiglu_packed", [](const at::Tensor& x) { return empty(sizes_with_last(x, x.sym_size(-1) / 2), x); });
  m.impl("swiglu_packed_backward", [](const at::Tensor& grad, const at::Tensor& x) { return dense(x); });
}

// The backward ops have no derivative of their own: double backward raises.
TORCH_LIBRARY_IMPL(opfuse, Autograd, m) {
  using opfuse::cpu::Gate;
  m.impl("swiglu", [](const at::Tensor& gate, const at::Tensor& up) {
    return opfuse::GatedFunction<Gate::silu>::apply(gate, up);
  });
  m.impl("geglu", [](const at::Tensor& gate, const at::Tensor& up) {
    return opfuse::GatedFunction<Gate::gelu_tanh>::apply(gate, up);
  });
  m.impl("swiglu_packed", [](const at::Tensor& x) { return opfuse::PackedFunction::apply(x); });
  m.impl("swiglu_backward", torch::autograd::autogradNotImplementedFallback());
  m.impl("geglu_backward", torch::autograd::autogradNotImplementedFallback());
  m.impl("swiglu_packed_backward", torch::autograd::autogradNotImplementedFallback());
}
