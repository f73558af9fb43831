// What a model holds before a profile begins, for the trace's "memory_before".
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <unordered_set>

#include "opfuse/profile.h"

namespace opfuse::profile {
namespace {

// The tensors of one parameter's optimizer state, for the optimizers opfuse's workloads use.
std::vector<at::Tensor> state_tensors(const torch::optim::OptimizerParamState& state) {
  if (const auto* s = dynamic_cast<const torch::optim::SGDParamState*>(&state)) return {s->momentum_buffer()};
  if (const auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(&state))
    return {s->exp_avg(), s->exp_avg_sq(), s->max_exp_avg_sq()};
  if (const auto* s = dynamic_cast<const torch::optim::AdamParamState*>(&state))
    return {s->exp_avg(), s->exp_avg_sq(), s->max_exp_avg_sq()};
  return {};
}

}  // namespace

std::map<std::string, int64_t> held_memory(const std::vector<at::Tensor>& parameters,
                                           const torch::optim::Optimizer* optimizer,
                                           const std::vector<at::Tensor>& inputs) {
  std::unordered_set<const void*> seen;
  std::map<std::string, int64_t> held;
  auto count = [&](const std::string& what, const at::Tensor& t) {
    if (!t.defined() || !t.device().is_cpu() || t.numel() == 0) return;
    const c10::Storage& storage = t.storage();
    if (!seen.insert(storage.data()).second) return;
    held[what] += static_cast<int64_t>(storage.nbytes());
  };
  for (const at::Tensor& p : parameters) count("parameters", p);
  if (optimizer != nullptr)
    for (const auto& [key, state] : optimizer->state())
      for (const at::Tensor& t : state_tensors(*state)) count("optimizer state", t);
  for (const at::Tensor& x : inputs) count("inputs", x);
  return held;
}

}  // namespace opfuse::profile
