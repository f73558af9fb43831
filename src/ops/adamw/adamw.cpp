// opfuse::adamw_: the front end (checks, layouts, bias corrections) and the C++ API. The loop
// lives in cpu/adamw_loops.h.
#include <ATen/Dispatch.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/library.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "opfuse/ops.h"
#include "ops/adamw/adamw_kernel.h"
#include "ops/checks.h"
#include "ops/dense_operands.h"
#include "ops/dispatch.h"
#include "ops/meta.h"

namespace opfuse {
namespace {

constexpr const char* kOp = "opfuse::adamw_";

void check_lists(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                 at::TensorList steps) {
  const size_t n = params.size();
  TORCH_CHECK(grads.size() == n && exp_avgs.size() == n && exp_avg_sqs.size() == n && steps.size() == n, kOp,
              ": params, grads, exp_avgs, exp_avg_sqs and steps must have one entry per parameter, got ", n, ", ",
              grads.size(), ", ", exp_avgs.size(), ", ", exp_avg_sqs.size(), ", ", steps.size());
  for (size_t i = 0; i < n; ++i) {
    const std::string p = entry("params", i);
    check_input(params[i], kOp, p.c_str());
    TORCH_CHECK(params[i].scalar_type() == params[0].scalar_type(), kOp, ": every tensor must have params[0]'s dtype ",
                params[0].scalar_type(), ", got ", params[i].scalar_type(), " for ", p);
    const std::pair<at::TensorList, const char*> alike[] = {
        {grads, "grads"}, {exp_avgs, "exp_avgs"}, {exp_avg_sqs, "exp_avg_sqs"}};
    for (const auto& [list, name] : alike) {
      const std::string t = entry(name, i);
      check_input(list[i], kOp, t.c_str());
      check_same(params[i], list[i], kOp, p.c_str(), t.c_str());
    }
  }
}

void check_hyperparameters(double lr, double beta1, double beta2, double eps, double weight_decay) {
  TORCH_CHECK(lr >= 0, kOp, ": lr must not be negative, got ", lr);
  TORCH_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1, kOp, ": beta1 and beta2 must be in [0, 1), got ",
              beta1, " and ", beta2);
  TORCH_CHECK(eps >= 0, kOp, ": eps must not be negative, got ", eps);
  TORCH_CHECK(weight_decay >= 0, kOp, ": weight_decay must not be negative, got ", weight_decay);
}

void check_step(const at::Tensor& step, size_t i) {
  TORCH_CHECK(step.defined() && step.device().is_cpu() && step.numel() == 1, kOp, ": steps[", i,
              "] must be a one-element CPU tensor");
  const double taken = AT_DISPATCH_ALL_TYPES(step.scalar_type(), "opfuse::adamw_ step",
                                             [&] { return double(*step.data_ptr<scalar_t>()); });
  TORCH_CHECK(taken >= 0, kOp, ": steps[", i, "] must count the steps taken, 0 or more, got ", taken);
}

// torch.optim's `step_t += 1`, then the step being taken; in place without a dispatched op
// (torch 1.13's CPU _foreach_add_ is a loop of add_ and copies), so a profiled step shows
// opfuse::adamw_ alone.
double next_step(const at::Tensor& step) {
  return AT_DISPATCH_ALL_TYPES(step.scalar_type(), "opfuse::adamw_ step", [&] {
    scalar_t* t = step.data_ptr<scalar_t>();
    *t += 1;
    return double(*t);
  });
}

// As torch.optim.AdamW computes them, in double.
cpu::AdamWCoefficients coefficients_at(double t, double lr, double beta1, double beta2, double eps,
                                       double weight_decay, bool maximize) {
  const double bias_correction1 = 1 - std::pow(beta1, t), bias_correction2 = 1 - std::pow(beta2, t);
  return {1 - lr * weight_decay, beta1, beta2, eps, lr / bias_correction1, std::sqrt(bias_correction2), maximize};
}

void adamw_cpu(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
               at::TensorList steps, double lr, double beta1, double beta2, double eps, double weight_decay,
               bool maximize) {
  check_lists(params, grads, exp_avgs, exp_avg_sqs, steps);
  check_hyperparameters(lr, beta1, beta2, eps, weight_decay);
  for (size_t i = 0; i < steps.size(); ++i) check_step(steps[i], i);
  std::vector<cpu::AdamWCoefficients> coefficients;
  std::vector<at::Tensor> p, g, m, v;
  DenseOperands o;
  for (size_t i = 0; i < params.size(); ++i) {
    coefficients.push_back(coefficients_at(next_step(steps[i]), lr, beta1, beta2, eps, weight_decay, maximize));
    p.push_back(o.param(params[i]));
    g.push_back(o.like(grads[i], p.back(), false));
    m.push_back(o.like(exp_avgs[i], p.back(), true));
    v.push_back(o.like(exp_avg_sqs[i], p.back(), true));
  }
  cpu::adamw_kernel(p, g, m, v, coefficients);
  o.finish();
}

// Any sparse tensor sends the call here (sparse dispatch keys outrank CPU's).
void adamw_sparse(at::TensorList, at::TensorList, at::TensorList, at::TensorList, at::TensorList, double, double,
                  double, double, double, bool) {
  TORCH_CHECK(false, kOp, ": sparse tensors are not supported; AdamW takes dense gradients and state");
}

auto adamw_op() {
  static auto op = find_op<void(at::TensorList, at::TensorList, at::TensorList, at::TensorList, at::TensorList, double,
                                double, double, double, double, bool)>(kOp);
  return op;
}

// An optimizer step is not differentiable: it refuses a parameter that records gradients (call
// it under no_grad, as torch.optim does), and bumps the version counters of what it writes, so
// a tensor saved for a backward is seen to have changed.
void adamw_autograd(c10::DispatchKeySet keys, at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                    at::TensorList exp_avg_sqs, at::TensorList steps, double lr, double beta1, double beta2,
                    double eps, double weight_decay, bool maximize) {
  for (size_t i = 0; i < params.size(); ++i)
    TORCH_CHECK(!(at::GradMode::is_enabled() && params[i].requires_grad()), kOp, ": params[", i,
                "] requires grad; an optimizer step runs under torch.no_grad()");
  // A redispatch, not a second call: a profile shows the op once.
  adamw_op().redispatch(keys & c10::after_ADInplaceOrView_keyset, params, grads, exp_avgs, exp_avg_sqs, steps, lr,
                        beta1, beta2, eps, weight_decay, maximize);
  for (at::TensorList written : {params, exp_avgs, exp_avg_sqs, steps})
    for (const at::Tensor& t : written) torch::autograd::increment_version(t);
}

}  // namespace

void adamw_(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
            at::TensorList steps, double lr, double beta1, double beta2, double eps, double weight_decay,
            bool maximize) {
  adamw_op().call(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, eps, weight_decay, maximize);
}

}  // namespace opfuse

TORCH_LIBRARY_FRAGMENT(opfuse, m) {
  // One AdamW step (torch.optim.AdamW's formula) for a parameter group, in place: p, m, v
  // updated in one pass over p, g, m, v; steps[i] counts params[i]'s steps (torch.optim's
  // state['step']) and is incremented first, as torch's loop increments it.
  m.def("adamw_(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, "
        "Tensor(d!)[] steps, float lr, float beta1, float beta2, float eps, float weight_decay, bool maximize=False) -> ()");
}

TORCH_LIBRARY_IMPL(opfuse, CPU, m) { m.impl("adamw_", &opfuse::adamw_cpu); }

// An in-place step: nothing to allocate (ops/meta.h).
TORCH_LIBRARY_IMPL(opfuse, Meta, m) {
  m.impl("adamw_", [](at::TensorList params, at::TensorList grads, at::TensorList exp_avgs,
                      at::TensorList exp_avg_sqs, at::TensorList steps, double lr, double beta1, double beta2,
                      double eps, double weight_decay, bool maximize) {});
}
TORCH_LIBRARY_IMPL(opfuse, SparseCPU, m) { m.impl("adamw_", &opfuse::adamw_sparse); }
TORCH_LIBRARY_IMPL(opfuse, Autograd, m) { m.impl("adamw_", &opfuse::adamw_autograd); }
