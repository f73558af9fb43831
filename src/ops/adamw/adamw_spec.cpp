// adamw: one AdamW step (torch's defaults, lr 1e-3, weight decay 1e-2) over a parameter group,
// by default llama2.c's stories15M. The variants step the same tensors in turn; their values do
// not change the time.
#include <cmath>
#include <memory>

#include "opfuse/ops.h"
#include "ops/specs/inputs.h"

namespace opfuse::specs {
namespace {

constexpr double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, wd = 1e-2;

struct Group {
  std::vector<at::Tensor> p, g, m, v, steps;
};

// torch.optim.AdamW(foreach=False)'s _single_tensor_adamw, op for op.
void per_tensor_step(const Group& s) {
  for (size_t i = 0; i < s.p.size(); ++i) {
    s.steps[i].add_(1);
    const double t = s.steps[i].item<double>();
    s.p[i].mul_(1 - lr * wd);
    s.m[i].mul_(beta1).add_(s.g[i], 1 - beta1);
    s.v[i].mul_(beta2).addcmul_(s.g[i], s.g[i], 1 - beta2);
    const at::Tensor denom = (s.v[i].sqrt() / std::sqrt(1 - std::pow(beta2, t))).add_(eps);
    s.p[i].addcdiv_(s.m[i], denom, -lr / (1 - std::pow(beta1, t)));
  }
}

// torch.optim.AdamW(fused=True): the steps counted, then ATen's one fused kernel (CPU since 2.4).
void fused_step(const Group& s) {
  at::_foreach_add_(s.steps, 1);
  at::_fused_adamw_(s.p, s.g, s.m, s.v, {}, s.steps, lr, beta1, beta2, wd, eps, false, false);
}

// shapes: one per parameter tensor.
OpCase adamw_case(const OpArgs& a) {
  if (a.shapes.empty()) throw std::invalid_argument("adamw: no parameter shapes");
  auto group = std::make_shared<Group>();
  int64_t total = 0;
  for (const auto& shape : a.shapes) {
    group->p.push_back(randn(shape, a.dtype));
    group->g.push_back(randn(shape, a.dtype));
    group->m.push_back(torch::zeros(shape, a.dtype));
    group->v.push_back(torch::zeros(shape, a.dtype));
    group->steps.push_back(torch::tensor(0.0));
    total += group->p.back().numel();
  }
  OpCase c;
  c.leaves = group->p;
  c.shape = parameter_set_name(a.shapes);
  c.variants = {{"reference", "torch.optim.AdamW(foreach=False): per tensor mul_, add_, addcmul_, sqrt, div, addcdiv_",
                 {}, [group] { per_tensor_step(*group); }},
                {"aten", "torch.optim.AdamW(fused=True): _foreach_add_ on the steps, _fused_adamw_", {},
                 [group] { fused_step(*group); }},
                {"opfuse", "opfuse::adamw_ (one call, one pass)", {},
                 [group] { opfuse::adamw_(group->p, group->g, group->m, group->v, group->steps, lr, beta1, beta2, eps, wd); }}};
  // reads p, g, m, v; writes p, m, v
  c.bytes_per_step = 7.0 * total * group->p[0].element_size();
  return c;
}

}  // namespace

OpSpec adamw_spec() {
  return {"adamw", [](const BenchSize& s) { return optimizer_bench_shapes(s, "adamw"); }, adamw_case,
          {{{5, 3}, {7}, {17, 2}}}};
}

const OpSpecRegistration adamw_registered{adamw_spec};

}  // namespace opfuse::specs
