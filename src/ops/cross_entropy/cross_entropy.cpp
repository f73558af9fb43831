// opfuse::cross_entropy and opfuse::linear_cross_entropy: front ends, autograd and the C++ API.
// The loops live in cpu/cross_entropy_loops.h.
//
// The forward computes the gradient wrt the logits (for a loss gradient of 1) and saves it in
// place of F.cross_entropy's log-probabilities; the backward scales it by the loss's gradient
// where it lies. So one [N, V] tensor is held from forward to backward and none is made after,
// where log_softmax + nll_loss hold the log-probabilities, then make nll_loss's gradient and
// log_softmax's: three.
#include <ATen/OpMathType.h>
#include <ATen/core/Reduction.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/library.h>

#include "opfuse/ops.h"
#include "ops/checks.h"
#include "ops/cross_entropy/cross_entropy_kernel.h"
#include "ops/dispatch.h"
#include "ops/meta.h"

namespace opfuse {
namespace {

constexpr const char* kOp = "opfuse::cross_entropy";
constexpr const char* kLinearOp = "opfuse::linear_cross_entropy";

void check_options(int64_t reduction, double label_smoothing, const char* op) {
  TORCH_CHECK(reduction == at::Reduction::None || reduction == at::Reduction::Mean || reduction == at::Reduction::Sum,
              op, ": reduction must be 0 (none), 1 (mean) or 2 (sum), got ", reduction);
  TORCH_CHECK(label_smoothing >= 0 && label_smoothing <= 1, op, ": label_smoothing must be in [0, 1], got ",
              label_smoothing);
}

// target holds a class index per row ([rows], the logits' leading dimensions), each in
// [0, classes) or ignore_index. Returns the number of rows not ignored.
int64_t count_targets(const at::Tensor& target, at::IntArrayRef rows, int64_t classes, int64_t ignore_index,
                      const char* op) {
  TORCH_CHECK(target.defined() && target.device().is_cpu(), op, ": target must be a CPU tensor");
  TORCH_CHECK(target.scalar_type() == at::kLong, op, ": target must hold int64 class indices, got ",
              target.scalar_type());
  TORCH_CHECK(target.sizes() == rows, op, ": target must be ", rows, " (a class per row of logits), got ",
              target.sizes());
  const at::Tensor t = target.contiguous();
  const int64_t* p = t.data_ptr<int64_t>();
  int64_t valid = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (p[i] == ignore_index) continue;
    TORCH_CHECK(p[i] >= 0 && p[i] < classes, op, ": target ", p[i], " (row ", i, ") is out of range: a class in [0, ",
                classes, ") or ignore_index (", ignore_index, ") expected");
    ++valid;
  }
  return valid;
}

// The gradient's scale c: the mean divides by the rows not ignored (none left: NaN loss, zero
// gradient, as torch).
double grad_scale(int64_t reduction, int64_t valid) {
  return reduction == at::Reduction::Mean ? 1.0 / double(valid) : 1.0;
}

// The per-row losses (double) reduced in row order, so the bits do not depend on threads.
at::Tensor reduce(const at::Tensor& losses, int64_t reduction, int64_t valid, at::IntArrayRef rows,
                  at::ScalarType dtype) {
  if (reduction == at::Reduction::None) return losses.to(dtype).view(rows);
  const double* p = losses.data_ptr<double>();
  double sum = 0;
  for (int64_t i = 0; i < losses.numel(); ++i) sum += p[i];
  if (reduction == at::Reduction::Mean) sum /= double(valid);
  return at::scalar_tensor(sum, losses.options().dtype(dtype));
}

// The stride between rows of x's last dimension when its rows can be walked as [rows, n] with
// each row dense (a slice of a wider matrix, every other row, a broadcast row), else −1.
int64_t row_stride(const at::Tensor& x) {
  const int64_t n = x.size(-1);
  if (n > 1 && x.stride(-1) != 1) return -1;
  int64_t stride = -1, next = 0;
  for (int64_t d = x.dim() - 2; d >= 0; --d) {
    if (x.size(d) == 1) continue;
    if (stride < 0) {
      stride = x.stride(d);
    } else if (x.stride(d) != next) {
      return -1;
    }
    next = x.stride(d) * x.size(d);
  }
  return stride < 0 ? n : stride;
}

at::IntArrayRef leading(const at::Tensor& x) { return x.sizes().slice(0, x.dim() - 1); }

std::tuple<at::Tensor, at::Tensor> cross_entropy_forward(const at::Tensor& logits_in, const at::Tensor& target,
                                                         int64_t ignore_index, int64_t reduction, double label_smoothing,
                                                         bool with_grad) {
  check_input(logits_in, kOp, "logits");
  TORCH_CHECK(logits_in.dim() >= 1 && logits_in.size(-1) > 0, kOp,
              ": logits must be [..., classes] with at least one class, got ", logits_in.sizes());
  check_options(reduction, label_smoothing, kOp);
  const int64_t valid = count_targets(target, leading(logits_in), logits_in.size(-1), ignore_index, kOp);
  int64_t stride = row_stride(logits_in);
  const at::Tensor logits = stride < 0 ? logits_in.contiguous() : logits_in;
  if (stride < 0) stride = logits.size(-1);
  at::Tensor losses = at::empty({target.numel()}, logits.options().dtype(at::kDouble));
  at::Tensor grad = with_grad ? at::empty(logits.sizes(), logits.options().memory_format(at::MemoryFormat::Contiguous))
                              : at::Tensor();
  cpu::cross_entropy_forward_kernel(logits, stride, target.contiguous(), {ignore_index, label_smoothing},
                                    grad_scale(reduction, valid), losses, grad);
  return {reduce(losses, reduction, valid, leading(logits), logits.scalar_type()), grad};
}

at::Tensor cross_entropy_cpu(const at::Tensor& logits, const at::Tensor& target, int64_t ignore_index,
                             int64_t reduction, double label_smoothing) {
  return std::get<0>(cross_entropy_forward(logits, target, ignore_index, reduction, label_smoothing, false));
}

std::tuple<at::Tensor, at::Tensor> cross_entropy_forward_cpu(const at::Tensor& logits, const at::Tensor& target,
                                                             int64_t ignore_index, int64_t reduction,
                                                             double label_smoothing) {
  return cross_entropy_forward(logits, target, ignore_index, reduction, label_smoothing, true);
}

// grad_logits ← grad_logits · grad, grad the loss's gradient: a scalar, or one per row.
void cross_entropy_backward_cpu(at::Tensor& grad_logits, const at::Tensor& grad) {
  constexpr const char* op = "opfuse::cross_entropy_backward_";
  check_input(grad_logits, op, "grad_logits");
  check_input(grad, op, "grad");
  TORCH_CHECK(grad_logits.dim() >= 1 && (grad.dim() == 0 || grad.sizes() == leading(grad_logits)), op,
              ": grad must be the loss's gradient, a scalar or one per row of ", grad_logits.sizes(), ", got ",
              grad.sizes());
  if (grad.dim() > 0)
    grad_logits.mul_(grad.unsqueeze(-1));
  else if (grad.item<double>() != 1)  // loss.backward()'s gradient of 1 would change no bit
    grad_logits.mul_(grad);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> linear_cross_entropy_forward(
    const at::Tensor& h, const at::Tensor& weight, const at::Tensor& target, int64_t ignore_index, int64_t reduction,
    double label_smoothing, bool with_grad_h, bool with_grad_weight) {
  check_input(h, kLinearOp, "h");
  check_input(weight, kLinearOp, "weight");
  TORCH_CHECK(h.dim() >= 1 && weight.dim() == 2 && weight.size(1) == h.size(-1) && weight.size(0) > 0, kLinearOp,
              ": h must be [..., H] and weight [classes, H], got ", h.sizes(), " and ", weight.sizes());
  TORCH_CHECK(h.scalar_type() == weight.scalar_type(), kLinearOp, ": h and weight must have the same dtype, got ",
              h.scalar_type(), " and ", weight.scalar_type());
  check_options(reduction, label_smoothing, kLinearOp);
  TORCH_CHECK(reduction != at::Reduction::None, kLinearOp,
              ": reduction must be 1 (mean) or 2 (sum): weight's gradient is summed over the rows in the forward, "
              "so per-row losses could not be weighted afterwards");
  const int64_t valid = count_targets(target, leading(h), weight.size(0), ignore_index, kLinearOp);
  // bfloat16 goes through float copies of h and weight, its weight gradient summed in float.
  const at::ScalarType dtype = h.scalar_type(), acc = at::toOpMathType(dtype);
  const int64_t hidden = h.size(-1), rows = target.numel();
  const at::Tensor h2 = h.reshape({rows, hidden}).to(acc).contiguous(), w = weight.to(acc).contiguous();
  at::Tensor losses = at::empty({rows}, h.options().dtype(at::kDouble));
  at::Tensor grad_h = with_grad_h ? at::empty({rows, hidden}, h2.options()) : at::Tensor();
  at::Tensor grad_weight = with_grad_weight ? at::empty(w.sizes(), w.options()) : at::Tensor();
  cpu::linear_cross_entropy_kernel(h2, w, target.contiguous(), {ignore_index, label_smoothing},
                                   grad_scale(reduction, valid), losses, grad_h, grad_weight);
  if (grad_h.defined()) grad_h = grad_h.to(dtype).view(h.sizes());
  if (grad_weight.defined()) grad_weight = grad_weight.to(dtype);
  return {reduce(losses, reduction, valid, leading(h), dtype), grad_h, grad_weight};
}

at::Tensor linear_cross_entropy_cpu(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& target,
                                    int64_t ignore_index, int64_t reduction, double label_smoothing) {
  return std::get<0>(
      linear_cross_entropy_forward(h, weight, target, ignore_index, reduction, label_smoothing, false, false));
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

auto cross_entropy_op() {
  static auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, int64_t, double)>(
      "opfuse::cross_entropy");
  return op;
}
auto forward_op() {
  static auto op =
      find_op<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, int64_t, int64_t, double)>(
          "opfuse::cross_entropy_forward");
  return op;
}
auto backward_op() {
  static auto op = find_op<void(at::Tensor&, const at::Tensor&)>("opfuse::cross_entropy_backward_");
  return op;
}
auto linear_op() {
  static auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, int64_t,
                                      double)>("opfuse::linear_cross_entropy");
  return op;
}
auto linear_forward_op() {
  static auto op = find_op<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, int64_t, double, bool, bool)>(
      "opfuse::linear_cross_entropy_forward");
  return op;
}

// The forward's gradient scaled by the loss's, where it lies, unless the graph is kept for
// another backward (retain_graph): then a copy of it. Differentiating it again would need the
// inputs, which are not kept: create_graph raises here rather than return a gradient that
// silently lacks its own (the engine runs a backward in grad mode only under create_graph).
at::Tensor scaled(at::Tensor saved, const at::Tensor& grad, const char* op) {
  TORCH_CHECK(!at::GradMode::is_enabled(), op,
              ": double backward (create_graph=True) is not implemented: the forward keeps the gradient, not its inputs");
  if (!saved.defined()) return saved;
  if (torch::autograd::get_current_graph_task_keep_graph()) saved = saved.clone();
  backward_op().call(saved, grad);
  return saved;
}

// Saves the gradient wrt the logits, never the log-probabilities.
class CrossEntropyFunction : public torch::autograd::Function<CrossEntropyFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& target,
                            int64_t ignore_index, int64_t reduction, double label_smoothing) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [loss, grad_logits] = forward_op().call(logits, target, ignore_index, reduction, label_smoothing);
    ctx->save_for_backward({grad_logits});
    return loss;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    return {scaled(ctx->get_saved_variables()[0], grads[0], kOp), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Saves grad_h and grad_weight, both computed in the forward chunk by chunk.
class LinearCrossEntropyFunction : public torch::autograd::Function<LinearCrossEntropyFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& weight,
                            const at::Tensor& target, int64_t ignore_index, int64_t reduction, double label_smoothing) {
    const bool with_grad_h = h.requires_grad(), with_grad_weight = weight.requires_grad();
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [loss, grad_h, grad_weight] = linear_forward_op().call(h, weight, target, ignore_index, reduction,
                                                                label_smoothing, with_grad_h, with_grad_weight);
    ctx->save_for_backward({grad_h, grad_weight});
    return loss;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return variable_list(6);
    const auto saved = ctx->get_saved_variables();
    return {scaled(saved[0], grads[0], kLinearOp), scaled(saved[1], grads[0], kLinearOp), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

// Without a gradient to keep (no_grad, inference, inputs that need none) only the loss is computed.
at::Tensor cross_entropy_autograd(const at::Tensor& logits, const at::Tensor& target, int64_t ignore_index,
                                  int64_t reduction, double label_smoothing) {
  if (at::GradMode::is_enabled() && logits.requires_grad())
    return CrossEntropyFunction::apply(logits, target, ignore_index, reduction, label_smoothing);
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return cross_entropy_op().call(logits, target, ignore_index, reduction, label_smoothing);
}

at::Tensor linear_cross_entropy_autograd(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& target,
                                         int64_t ignore_index, int64_t reduction, double label_smoothing) {
  if (at::GradMode::is_enabled() && (h.requires_grad() || weight.requires_grad()))
    return LinearCrossEntropyFunction::apply(h, weight, target, ignore_index, reduction, label_smoothing);
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  return linear_op().call(h, weight, target, ignore_index, reduction, label_smoothing);
}

}  // namespace

at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& target, int64_t ignore_index, int64_t reduction,
                         double label_smoothing) {
  return cross_entropy_op().call(logits, target, ignore_index, reduction, label_smoothing);
}

at::Tensor linear_cross_entropy(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& target,
                                int64_t ignore_index, int64_t reduction, double label_smoothing) {
  return linear_op().call(h, weight, target, ignore_index, reduction, label_smoothing);
}

}  // namespace opfuse

TORCH_LIBRARY_FRAGMENT(opfuse, m) {
  // Cross entropy over rows of logits [..., classes] with a class index (int64) per row, as
  // F.cross_entropy(logits.view(-1, classes), target.view(-1), ...) (reduction 0 none, 1 mean,
  // 2 sum). _forward also returns the loss's gradient wrt the logits (for a loss gradient of 1),
  // which _backward_ scales by the loss's gradient in place (returning nothing, so that
  // functionalization, torch.compile's, can take it).
  m.def("cross_entropy(Tensor logits, Tensor target, int ignore_index=-100, int reduction=1, "
        "float label_smoothing=0.0) -> Tensor");
  m.def("cross_entropy_forward(Tensor logits, Tensor target, int ignore_index, int reduction, "
        "float label_smoothing) -> (Tensor, Tensor)");
  m.def("cross_entropy_backward_(Tensor(a!) grad_logits, Tensor grad) -> ()");
  // cross_entropy(h @ weight.T, target, ...) without the logits ever held whole; _forward also
  // returns grad_h and grad_weight (undefined where not asked for), each scaled by
  // cross_entropy_backward_ in the backward. Reduction mean or sum.
  m.def("linear_cross_entropy(Tensor h, Tensor weight, Tensor target, int ignore_index=-100, int reduction=1, "
        "float label_smoothing=0.0) -> Tensor");
  m.def("linear_cross_entropy_forward(Tensor h, Tensor weight, Tensor target, int ignore_index, int reduction, "
        "float label_smoothing, bool grad_h, bool grad_weight) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(opfuse, CPU, m) {
  m.impl("cross_entropy", &opfuse::cross_entropy_cpu);
  m.impl("cross_entropy_forward", &opfuse::cross_entropy_forward_cpu);
  m.impl("cross_entropy_backward_", &opfuse::cross_entropy_backward_cpu);
  m.impl("linear_cross_entropy", &opfuse::linear_cross_entropy_cpu);
  m.impl("linear_cross_entropy_forward", &opfuse::linear_cross_entropy_forward);
}

// Outputs as the CPU front end allocates them, without data (ops/meta.h): a scalar loss (mean,
// sum) or one per row (none), the saved gradient row-major.
namespace opfuse {
namespace {

at::Tensor loss_meta(const at::Tensor& x, const at::Tensor& target, int64_t reduction) {
  return reduction == 0 ? meta::empty(target.sym_sizes(), x) : meta::empty({}, x);
}

}  // namespace
}  // namespace opfuse

TORCH_LIBRARY_IMPL(opfuse, Meta, m) {
  using namespace opfuse::meta;
  m.impl("cross_entropy", [](const at::Tensor& logits, const at::Tensor& target, int64_t ignore_index,
                             int64_t reduction, double label_smoothing) {
    return opfuse::loss_meta(logits, target, reduction);
  });
  m.impl("cross_entropy_forward", [](const at::Tensor& logits, const at::Tensor& target, int64_t ignore_index,
                                     int64_t reduction, double label_smoothing) {
    return std::make_tuple(opfuse::loss_meta(logits, target, reduction), dense(logits));
  });
  m.impl("cross_entropy_backward_", [](at::Tensor& grad_logits, const at::Tensor& grad) {});
  m.impl("linear_cross_entropy", [](const at::Tensor& h, const at::Tensor& weight, const at::Tensor& target,
                                    int64_t ignore_index, int64_t reduction, double label_smoothing) {
    return empty({}, h);
  });
  m.impl("linear_cross_entropy_forward", [](const at::Tensor& h, const at::Tensor& weight, const at::Tensor& target,
                                            int64_t ignore_index, int64_t reduction, double label_smoothing,
                                            bool grad_h, bool grad_weight) {
    return std::make_tuple(empty({}, h), grad_h ? dense(h) : at::Tensor(), grad_weight ? dense(weight) : at::Tensor());
  });
}

// The backward has no derivative of its own: double backward raises (see scaled()).
TORCH_LIBRARY_IMPL(opfuse, Autograd, m) {
  m.impl("cross_entropy", &opfuse::cross_entropy_autograd);
  m.impl("linear_cross_entropy", &opfuse::linear_cross_entropy_autograd);
  m.impl("cross_entropy_forward", torch::autograd::autogradNotImplementedFallback());
  m.impl("cross_entropy_backward_", torch::autograd::autogradNotImplementedFallback());
  m.impl("linear_cross_entropy_forward", torch::autograd::autogradNotImplementedFallback());
}
