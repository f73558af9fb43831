// sgd: one SGD step with momentum 0.9 and weight decay 1e-5 (the recipe tune's C++ models train
// with) over a parameter group, by default llama2.c's stories15M, its momentum buffers already
// made. The variants step the same tensors in turn; their values do not change the time.
#include <memory>

#include "opfuse/ops.h"
#include "ops/specs/inputs.h"

namespace opfuse::specs {
namespace {

constexpr double lr = 1e-2, momentum = 0.9, dampening = 0, wd = 1e-5;

struct Group {
  std::vector<at::Tensor> p, g, b;
};

// torch.optim.SGD(foreach=False)'s _single_tensor_sgd, op for op.
void per_tensor_step(const Group& s) {
  for (size_t i = 0; i < s.p.size(); ++i) {
    const at::Tensor d = s.g[i].add(s.p[i], wd);
    s.b[i].mul_(momentum).add_(d, 1 - dampening);
    s.p[i].add_(s.b[i], -lr);
  }
}

// torch.optim.SGD(fused=True): ATen's one fused kernel (CPU since 2.4), buffers already made.
void fused_step(const Group& s) {
  at::_fused_sgd_(s.p, s.g, s.b, wd, momentum, lr, dampening, false, false, false);
}

// shapes: one per parameter tensor.
OpCase sgd_case(const OpArgs& a) {
  if (a.shapes.empty()) throw std::invalid_argument("sgd: no parameter shapes");
  auto group = std::make_shared<Group>();
  int64_t total = 0;
  for (const auto& shape : a.shapes) {
    group->p.push_back(randn(shape, a.dtype));
    group->g.push_back(randn(shape, a.dtype));
    group->b.push_back(randn(shape, a.dtype));
    total += group->p.back().numel();
  }
  OpCase c;
  c.leaves = group->p;
  c.shape = parameter_set_name(a.shapes);
  c.variants = {{"reference", "torch.optim.SGD(foreach=False): per tensor add, mul_, add_, add_", {},
                 [group] { per_tensor_step(*group); }},
                {"aten", "torch.optim.SGD(fused=True): _fused_sgd_", {}, [group] { fused_step(*group); }},
                {"opfuse", "opfuse::sgd_ (one call, one pass)", {},
                 [group] { opfuse::sgd_(group->p, group->g, group->b, lr, momentum, dampening, wd); }}};
  // reads p, g, b; writes p, b
  c.bytes_per_step = 5.0 * total * group->p[0].element_size();
  return c;
}

}  // namespace

OpSpec sgd_spec() {
  return {"sgd", [](const BenchSize& s) { return optimizer_bench_shapes(s, "sgd"); }, sgd_case,
          {{{5, 3}, {7}, {17, 2}}}};
}

const OpSpecRegistration sgd_registered{sgd_spec};

}  // namespace opfuse::specs
