// Optimizers whose step is one fused opfuse op per parameter group.
#pragma once

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <string>
#include <unordered_map>
#include <vector>

namespace opfuse::optim {

// torch::optim::AdamW with its step made one opfuse::adamw_ call per parameter group (per dtype,
// if a group mixes them): the same options, the same per-parameter state (AdamWParamState), so
// torch::save/torch::load archives of either load in the other, and the same arithmetic
// (float64 agrees to rounding). CPU parameters; amsgrad is refused.
class AdamW : public torch::optim::AdamW {
 public:
  explicit AdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups, torch::optim::AdamWOptions defaults = {});
  explicit AdamW(std::vector<at::Tensor> params, torch::optim::AdamWOptions defaults = {});

  at::Tensor step(LossClosure closure = nullptr) override;

 private:
  // The op counts steps in a tensor; one per parameter, kept so a step allocates nothing.
  // AdamWParamState::step stays the count that is saved and loaded.
  at::Tensor& step_count(void* key, const torch::optim::AdamWParamState& state);

  std::unordered_map<void*, at::Tensor> step_counts_;  // by TensorImpl, as torch::optim keys its state
};

// torch::optim::SGD with its step made one opfuse::sgd_ call per parameter group and dtype (and
// apart for the buffers made this step, which torch clones from the step's direction): the same
// options and per-parameter state (SGDParamState's momentum_buffer), the same arithmetic (float64
// agrees to rounding; bfloat16 computed in float). A step with a sparse gradient, a parameter off
// the CPU or of another dtype, or a tensor listed twice in a group is torch's own.
class SGD : public torch::optim::SGD {
 public:
  explicit SGD(std::vector<torch::optim::OptimizerParamGroup> param_groups, torch::optim::SGDOptions defaults);
  explicit SGD(std::vector<at::Tensor> params, torch::optim::SGDOptions defaults);

  at::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace opfuse::optim
