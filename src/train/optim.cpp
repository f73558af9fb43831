// opfuse::optim::AdamW and SGD: torch::optim's state and options, stepped by opfuse::adamw_ and
// opfuse::sgd_.
#include "opfuse/optim.h"

#include <torch/torch.h>

#include <array>
#include <map>
#include <set>
#include <utility>

#include "opfuse/ops.h"

namespace opfuse::optim {
namespace {

using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;

void refuse_amsgrad(const AdamWOptions& options) {
  TORCH_CHECK(!options.amsgrad(), "opfuse::optim::AdamW: amsgrad is not supported (use torch::optim::AdamW for it)");
}

// One opfuse::adamw_ call's tensors.
struct Lists {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
  std::vector<AdamWParamState*> states;
};

}  // namespace

AdamW::AdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups, AdamWOptions defaults)
    : torch::optim::AdamW(std::move(param_groups), defaults) {
  refuse_amsgrad(defaults);
}

AdamW::AdamW(std::vector<at::Tensor> params, AdamWOptions defaults)
    : AdamW(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(std::move(params))},
            defaults) {}

at::Tensor& AdamW::step_count(void* key, const AdamWParamState& state) {
  at::Tensor& count = step_counts_[key];
  if (!count.defined()) count = at::empty({}, at::kLong);
  *count.data_ptr<int64_t>() = state.step();  // the saved count rules, e.g. after load()
  return count;
}

at::Tensor AdamW::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const AdamWOptions&>(group.options());
    refuse_amsgrad(options);
    std::map<at::ScalarType, Lists> by_dtype;
    for (const at::Tensor& p : group.params()) {
      if (!p.grad().defined()) continue;
      void* const key = p.unsafeGetTensorImpl();
      auto& slot = state_[key];
      if (!slot) {
        auto fresh = std::make_unique<AdamWParamState>();
        fresh->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto& state = static_cast<AdamWParamState&>(*slot);
      Lists& lists = by_dtype[p.scalar_type()];
      lists.params.push_back(p);
      lists.grads.push_back(p.grad());
      lists.exp_avgs.push_back(state.exp_avg());
      lists.exp_avg_sqs.push_back(state.exp_avg_sq());
      lists.steps.push_back(step_count(key, state));
      lists.states.push_back(&state);
    }
    const auto [beta1, beta2] = options.betas();
    for (auto& [dtype, l] : by_dtype) {
      opfuse::adamw_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, l.steps, options.lr(), beta1, beta2, options.eps(),
                     options.weight_decay());
      for (AdamWParamState* state : l.states) state->step(state->step() + 1);
    }
  }
  return loss;
}

SGD::SGD(std::vector<torch::optim::OptimizerParamGroup> param_groups, torch::optim::SGDOptions defaults)
    : torch::optim::SGD(std::move(param_groups), defaults) {}

SGD::SGD(std::vector<at::Tensor> params, torch::optim::SGDOptions defaults)
    : SGD(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(std::move(params))},
          defaults) {}

namespace {

// Whether every parameter with a gradient can be stepped by opfuse::sgd_: a dense CPU gradient of
// a dtype it takes, and no tensor listed twice in a group (torch's loop steps it twice; one fused
// call would have two threads update it at once).
bool fusable(const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  for (const auto& group : groups) {
    std::set<const void*> seen;
    for (const at::Tensor& p : group.params()) {
      if (!seen.insert(p.unsafeGetTensorImpl()).second) return false;
      const at::Tensor& g = p.grad();
      if (!g.defined()) continue;
      const at::ScalarType t = p.scalar_type();
      if (!p.device().is_cpu() || g.layout() != at::kStrided || (t != at::kFloat && t != at::kDouble && t != at::kBFloat16))
        return false;
    }
  }
  return true;
}

}  // namespace

at::Tensor SGD::step(LossClosure closure) {
  if (!fusable(param_groups_)) return torch::optim::SGD::step(closure);
  torch::NoGradGuard no_grad;
  at::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  using torch::optim::SGDParamState;
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    // (dtype, buffers made in this step) -> one opfuse::sgd_ call's tensors
    std::map<std::pair<at::ScalarType, bool>, std::array<std::vector<at::Tensor>, 3>> calls;
    for (const at::Tensor& p : group.params()) {
      if (!p.grad().defined()) continue;
      at::Tensor buffer;
      bool fresh = false;
      if (o.momentum() != 0) {
        const auto kept = state_.find(p.unsafeGetTensorImpl());
        fresh = kept == state_.end();
        buffer = fresh ? at::empty_like(p, at::MemoryFormat::Preserve)  // written whole by the op
                       : static_cast<SGDParamState&>(*kept->second).momentum_buffer();
      }
      auto& [params, grads, buffers] = calls[{p.scalar_type(), fresh}];
      params.push_back(p);
      grads.push_back(p.grad());
      if (buffer.defined()) buffers.push_back(buffer);
    }
    for (auto& [key, tensors] : calls) {
      auto& [params, grads, buffers] = tensors;
      opfuse::sgd_(params, grads, buffers, o.lr(), o.momentum(), o.dampening(), o.weight_decay(), o.nesterov(), false,
                   key.second);
      if (!key.second) continue;
      for (size_t i = 0; i < params.size(); ++i) {  // kept once the op has run
        auto made = std::make_unique<SGDParamState>();
        made->momentum_buffer(buffers[i]);
        state_[params[i].unsafeGetTensorImpl()] = std::move(made);
      }
    }
  }
  return loss;
}

}  // namespace opfuse::optim
