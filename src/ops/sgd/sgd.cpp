// opfuse::sgd_: the front end (checks, layouts) and the C++ API. The loop lives in
// cpu/sgd_loops.h.
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/library.h>

#include <string>
#include <vector>

#include "opfuse/ops.h"
#include "ops/checks.h"
#include "ops/dense_operands.h"
#include "ops/dispatch.h"
#include "ops/meta.h"
#include "ops/sgd/sgd_kernel.h"

namespace opfuse {
namespace {

constexpr const char* kOp = "opfuse::sgd_";

void check_lists(at::TensorList params, at::TensorList grads, at::TensorList buffers, double momentum) {
  const size_t n = params.size();
  TORCH_CHECK(grads.size() == n, kOp, ": params and grads must have one entry per parameter, got ", n, " and ",
              grads.size());
  TORCH_CHECK(momentum == 0 ? buffers.empty() : buffers.size() == n, kOp, ": momentum_buffers must ",
              momentum == 0 ? "be empty without momentum" : "have one entry per parameter", ", got ", buffers.size(),
              " for ", n, " params");
  for (size_t i = 0; i < n; ++i) {
    const std::string p = entry("params", i), g = entry("grads", i);
    check_input(params[i], kOp, p.c_str());
    TORCH_CHECK(params[i].scalar_type() == params[0].scalar_type(), kOp, ": every tensor must have params[0]'s dtype ",
                params[0].scalar_type(), ", got ", params[i].scalar_type(), " for ", p);
    check_input(grads[i], kOp, g.c_str());
    check_same(params[i], grads[i], kOp, p.c_str(), g.c_str());
    if (!buffers.empty()) {
      const std::string b = entry("momentum_buffers", i);
      check_input(buffers[i], kOp, b.c_str());
      check_same(params[i], buffers[i], kOp, p.c_str(), b.c_str());
    }
  }
}

void sgd_cpu(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers, double lr, double momentum,
             double dampening, double weight_decay, bool nesterov, bool maximize, bool fresh_buffers) {
  // The hyperparameters are taken as torch's functional sgd takes them, unchecked (a group may
  // set a negative lr, or keep nesterov with its momentum at 0: plain SGD); the optimizers'
  // constructors check their defaults as torch's do.
  check_lists(params, grads, momentum_buffers, momentum);
  std::vector<at::Tensor> p, g, b;
  DenseOperands o;
  for (size_t i = 0; i < params.size(); ++i) {
    p.push_back(o.param(params[i]));
    g.push_back(o.like(grads[i], p.back(), false));
    if (!momentum_buffers.empty()) b.push_back(o.like(momentum_buffers[i], p.back(), true));
  }
  cpu::sgd_kernel(p, g, b, {lr, momentum, dampening, weight_decay, nesterov, maximize, fresh_buffers});
  o.finish();
}

// Any sparse tensor sends the call here (sparse dispatch keys outrank CPU's).
void sgd_sparse(at::TensorList, at::TensorList, at::TensorList, double, double, double, double, bool, bool, bool) {
  TORCH_CHECK(false, kOp, ": sparse tensors are not supported; step a sparse gradient with torch.optim.SGD");
}

auto sgd_op() {
  static auto op = find_op<void(at::TensorList, at::TensorList, at::TensorList, double, double, double, double, bool,
                                bool, bool)>(kOp);
  return op;
}

// As adamw_: refuses a parameter that records gradients, redispatches (a profile shows the op
// once) and bumps the version counters of what it writes.
void sgd_autograd(c10::DispatchKeySet keys, at::TensorList params, at::TensorList grads,
                  at::TensorList momentum_buffers, double lr, double momentum, double dampening, double weight_decay,
                  bool nesterov, bool maximize, bool fresh_buffers) {
  for (size_t i = 0; i < params.size(); ++i)
    TORCH_CHECK(!(at::GradMode::is_enabled() && params[i].requires_grad()), kOp, ": params[", i,
                "] requires grad; an optimizer step runs under torch.no_grad()");
  sgd_op().redispatch(keys & c10::after_ADInplaceOrView_keyset, params, grads, momentum_buffers, lr, momentum,
                      dampening, weight_decay, nesterov, maximize, fresh_buffers);
  for (at::TensorList written : {params, momentum_buffers})
    for (const at::Tensor& t : written) torch::autograd::increment_version(t);
}

}  // namespace

void sgd_(at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers, double lr, double momentum,
          double dampening, double weight_decay, bool nesterov, bool maximize, bool fresh_buffers) {
  sgd_op().call(params, grads, momentum_buffers, lr, momentum, dampening, weight_decay, nesterov, maximize,
                fresh_buffers);
}

}  // namespace opfuse

TORCH_LIBRARY_FRAGMENT(opfuse, m) {
  // One SGD step (torch.optim.SGD's formula) for a parameter group, in place: p and its momentum
  // buffer updated in one pass over p, g, b; momentum_buffers empty when momentum is 0, and taking
  // the step's direction, whatever they hold, when fresh_buffers (a buffer's first step).
  m.def("sgd_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] momentum_buffers, float lr, float momentum=0.0, "
        "float dampening=0.0, float weight_decay=0.0, bool nesterov=False, bool maximize=False, "
        "bool fresh_buffers=False) -> ()");
}

TORCH_LIBRARY_IMPL(opfuse, CPU, m) { m.impl("sgd_", &opfuse::sgd_cpu); }

// An in-place step: nothing to allocate (ops/meta.h).
TORCH_LIBRARY_IMPL(opfuse, Meta, m) {
  m.impl("sgd_", [](at::TensorList params, at::TensorList grads, at::TensorList momentum_buffers, double lr,
                    double momentum, double dampening, double weight_decay, bool nesterov, bool maximize,
                    bool fresh_buffers) {});
}
TORCH_LIBRARY_IMPL(opfuse, SparseCPU, m) { m.impl("sgd_", &opfuse::sgd_sparse); }
TORCH_LIBRARY_IMPL(opfuse, Autograd, m) { m.impl("sgd_", &opfuse::sgd_autograd); }
