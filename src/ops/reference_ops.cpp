// The reference composites (opfuse/reference_ops.h), kept as their models wrote them.
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include "opfuse/reference_ops.h"

namespace opfuse::reference {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class SwishImplementation : public torch::autograd::Function<SwishImplementation> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& i) {
    ctx->save_for_backward({i});
    return i * torch::sigmoid(i);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor i = ctx->get_saved_variables()[0];
    const at::Tensor sigmoid_i = torch::sigmoid(i);
    return {grads[0] * (sigmoid_i * (1 + i * (1 - sigmoid_i)))};
  }
};

}  // namespace

// Recorded under the Function's name, as PyTorch's profiler shows a Python autograd Function,
// so sigmoid and mul appear nested inside SwishImplementation in a trace.
at::Tensor memory_efficient_swish(const at::Tensor& x) {
  // The sequence number the Function is about to take links its forward to its backward node.
  RECORD_FUNCTION("SwishImplementation", std::vector<c10::IValue>({x}), at::sequence_number::peek());
  return SwishImplementation::apply(x);
}

at::Tensor composite_swish(const at::Tensor& x) { return x * torch::sigmoid(x); }

at::Tensor composite_se_gate(const at::Tensor& x, const at::Tensor& gate) {
  return torch::sigmoid(gate) * x;
}

}  // namespace opfuse::reference
