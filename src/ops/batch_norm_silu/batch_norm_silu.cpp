// opfuse::batch_norm_silu: silu(batch_norm(x)) — its semantics (checks, statistics, running
// statistics, the per-channel coefficients of each pass), autograd and the C++ API. The passes
// over x live in cpu/batch_norm_silu_kernel.cpp.
//
// Saved for backward: x (which the caller's graph usually holds anyway) and four [C] vectors —
// not the normalized tensor nor BatchNorm's output, which ATen's batch_norm + silu keeps as
// silu's input: one activation-sized tensor less per layer.
#include <ATen/AccumulateType.h>
#include <ATen/Dispatch.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <cmath>

#include "opfuse/ops.h"
#include "ops/batch_norm_silu/batch_norm_silu_kernel.h"
#include "ops/checks.h"
#include "ops/dispatch.h"
#include "ops/layout.h"
#include "ops/meta.h"

namespace opfuse {
namespace {

using OptTensor = c10::optional<at::Tensor>;

at::Tensor value_or_undefined(const OptTensor& t) { return t.has_value() ? *t : at::Tensor(); }

void check_channel_vector(const at::Tensor& t, const at::Tensor& x, const char* op, const char* name) {
  if (!t.defined()) return;
  check_input(t, op, name);
  TORCH_CHECK(t.dim() == 1 && t.size(0) == x.size(1), op, ": ", name, " must have shape [", x.size(1),
              "] (one value per channel of x ", x.sizes(), "), got ", t.sizes());
}

void check_batch_norm_args(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                           const at::Tensor& running_mean, const at::Tensor& running_var, bool training,
                           double eps, const char* op) {
  check_input(x, op, "x");
  TORCH_CHECK(x.dim() == 2 || x.dim() == 4, op, ": x must be [N, C] or [N, C, H, W], got ", x.sizes());
  check_channel_vector(weight, x, op, "weight");
  check_channel_vector(bias, x, op, "bias");
  check_channel_vector(running_mean, x, op, "running_mean");
  check_channel_vector(running_var, x, op, "running_var");
  for (const at::Tensor* t : {&weight, &bias})
    TORCH_CHECK(!t->defined() || t->scalar_type() == x.scalar_type(), op,
                ": weight and bias must have x's dtype ", x.scalar_type(), ", got ", t->scalar_type());
  TORCH_CHECK(eps >= 0, op, ": eps must be non-negative, got ", eps);
  const int64_t count = x.size(1) == 0 ? 0 : x.numel() / x.size(1);
  TORCH_CHECK(!training || count > 1, op, ": expected more than 1 value per channel when training, got x of shape ",
              x.sizes());
  TORCH_CHECK(training || (running_mean.defined() && running_var.defined()), op,
              ": running_mean and running_var are required when not training");
}

// Per-channel values are computed in double and kept in the accumulation dtype.
at::ScalarType accumulation_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// The [C]-sized arithmetic runs in plain loops: as ATen ops it would be some twenty tiny ops per
// call, more than the fused op saves in a trace's op count.
std::vector<double> read_channels(const at::Tensor& t, int64_t channels, double fill) {
  std::vector<double> v(channels, fill);
  if (!t.defined()) return v;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, t.scalar_type(), "opfuse::batch_norm_silu", [&] {
    const scalar_t* p = t.data_ptr<scalar_t>();
    for (int64_t c = 0; c < channels; ++c) v[c] = static_cast<double>(p[c * t.stride(0)]);
  });
  return v;
}

at::Tensor channel_tensor(const std::vector<double>& v, at::ScalarType dtype) {
  at::Tensor t = at::empty({static_cast<int64_t>(v.size())}, at::TensorOptions().dtype(dtype));
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, dtype, "opfuse::batch_norm_silu", [&] {
    scalar_t* p = t.data_ptr<scalar_t>();
    for (size_t c = 0; c < v.size(); ++c) p[c] = static_cast<scalar_t>(v[c]);
  });
  return t;
}

at::Tensor channel_vector(const at::Tensor& x) {
  return at::empty({x.size(1)}, x.options().dtype(at::kDouble).memory_format(at::MemoryFormat::Contiguous));
}

// As torch::batch_norm (ATen's batch_norm_cpu_update_stats_template), in the running stats'
// type P: running_mean = m·mean + (1 − m)·running_mean, running_var = m·var_sum/(M − 1) +
// (1 − m)·running_var, the unbiased variance taken in P's accumulation type.
template <typename P>
void update_running_stats(const at::Tensor& mean, const at::Tensor& var_sum, int64_t count,
                          const at::Tensor& running_mean, const at::Tensor& running_var, double momentum) {
  using acc_t = at::acc_type<P, /*is_cuda=*/false>;
  const P m = static_cast<P>(momentum);
  const double* mu = mean.data_ptr<double>();
  const double* vs = var_sum.data_ptr<double>();
  for (int64_t c = 0; c < mean.numel(); ++c) {
    if (running_mean.defined()) {
      P& rm = running_mean.data_ptr<P>()[c * running_mean.stride(0)];
      rm = m * static_cast<P>(mu[c]) + (1 - m) * rm;
    }
    if (running_var.defined()) {
      P& rv = running_var.data_ptr<P>()[c * running_var.stride(0)];
      const acc_t unbiased = static_cast<P>(vs[c]) / static_cast<P>(count - 1);
      rv = static_cast<P>(m * unbiased + (1 - m) * rv);
    }
  }
}

// Training: the batch's mean and invstd = 1/√(var + eps), var biased, and the running stats
// moved. Otherwise: the running stats' mean and invstd.
std::tuple<at::Tensor, at::Tensor> statistics(const at::Tensor& x, const at::Tensor& running_mean,
                                              const at::Tensor& running_var, bool training, double momentum,
                                              double eps) {
  at::Tensor mean = channel_vector(x), invstd = channel_vector(x);
  if (training) {
    at::Tensor var_sum = channel_vector(x);
    cpu::batch_norm_moments_kernel(x, mean, var_sum);
    const int64_t count = x.numel() / x.size(1);
    const double* vs = var_sum.data_ptr<double>();
    for (int64_t c = 0; c < x.size(1); ++c) invstd.data_ptr<double>()[c] = 1 / std::sqrt(vs[c] / count + eps);
    const at::Tensor& stats = running_mean.defined() ? running_mean : running_var;
    if (stats.defined())
      AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, stats.scalar_type(), "opfuse::batch_norm_silu", [&] {
        update_running_stats<scalar_t>(mean, var_sum, count, running_mean, running_var, momentum);
      });
  } else {
    const std::vector<double> rm = read_channels(running_mean, x.size(1), 0), rv = read_channels(running_var, x.size(1), 1);
    for (int64_t c = 0; c < x.size(1); ++c) {
      mean.data_ptr<double>()[c] = rm[c];
      invstd.data_ptr<double>()[c] = 1 / std::sqrt(rv[c] + eps);
    }
  }
  const auto dtype = accumulation_dtype(x);
  return {channel_tensor(read_channels(mean, x.size(1), 0), dtype), channel_tensor(read_channels(invstd, x.size(1), 0), dtype)};
}

// z = w·(x − mean)·invstd + b = x·scale + shift, in double from the saved values so forward and
// backward recompute the same z.
std::tuple<at::Tensor, at::Tensor> affine(const at::Tensor& weight, const at::Tensor& bias, const at::Tensor& mean,
                                          const at::Tensor& invstd) {
  const int64_t channels = invstd.numel();
  const std::vector<double> w = read_channels(weight, channels, 1), b = read_channels(bias, channels, 0);
  const std::vector<double> mu = read_channels(mean, channels, 0), inv = read_channels(invstd, channels, 0);
  std::vector<double> scale(channels), shift(channels);
  for (int64_t c = 0; c < channels; ++c) {
    scale[c] = w[c] * inv[c];
    shift[c] = b[c] - mu[c] * scale[c];
  }
  return {channel_tensor(scale, invstd.scalar_type()), channel_tensor(shift, invstd.scalar_type())};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_silu_forward_cpu(
    const at::Tensor& x_in, const OptTensor& weight_opt, const OptTensor& bias_opt, const OptTensor& running_mean_opt,
    const OptTensor& running_var_opt, bool training, double momentum, double eps) {
  const at::Tensor weight = value_or_undefined(weight_opt), bias = value_or_undefined(bias_opt);
  const at::Tensor running_mean = value_or_undefined(running_mean_opt), running_var = value_or_undefined(running_var_opt);
  check_batch_norm_args(x_in, weight, bias, running_mean, running_var, training, eps, "opfuse::batch_norm_silu");
  const auto format = kernel_layout(x_in);
  const at::Tensor x = x_in.contiguous(format);
  auto [mean, invstd] = statistics(x, running_mean, running_var, training, momentum, eps);
  auto [scale, shift] = affine(weight, bias, mean, invstd);
  at::Tensor out = at::empty_like(x, format);
  if (x.numel() > 0) cpu::batch_norm_silu_forward_kernel(x, scale, shift, out);
  return {out, mean, invstd};
}

at::Tensor batch_norm_silu_cpu(const at::Tensor& x, const OptTensor& weight, const OptTensor& bias,
                               const OptTensor& running_mean, const OptTensor& running_var, bool training,
                               double momentum, double eps) {
  return std::get<0>(batch_norm_silu_forward_cpu(x, weight, bias, running_mean, running_var, training, momentum, eps));
}

// With dz = dy·silu'(z) and M values per channel:
//   dbias = Σdz,  dweight = invstd·Σdz·(x − mean)
//   dx    = w·invstd·(dz − Σdz/M − (x − mean)·invstd²·Σdz·(x − mean)/M)   training
//   dx    = w·invstd·dz                                                  running stats
std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_silu_backward_cpu(
    const at::Tensor& grad, const at::Tensor& x_in, const OptTensor& weight_opt, const OptTensor& bias_opt,
    const at::Tensor& mean, const at::Tensor& invstd, bool training) {
  const char* op = "opfuse::batch_norm_silu_backward";
  const at::Tensor weight = value_or_undefined(weight_opt), bias = value_or_undefined(bias_opt);
  check_input(x_in, op, "x");
  check_input(grad, op, "grad");
  check_same(grad, x_in, op, "grad", "x");
  TORCH_CHECK(x_in.dim() == 2 || x_in.dim() == 4, op, ": x must be [N, C] or [N, C, H, W], got ", x_in.sizes());
  check_channel_vector(weight, x_in, op, "weight");
  check_channel_vector(bias, x_in, op, "bias");
  const auto dtype = accumulation_dtype(x_in);
  TORCH_CHECK(mean.scalar_type() == dtype && invstd.scalar_type() == dtype && mean.numel() == x_in.size(1) &&
                  invstd.numel() == x_in.size(1),
              op, ": mean and invstd must be [C] of ", dtype, " as batch_norm_silu_forward returns them");
  const auto format = kernel_layout(x_in);
  const at::Tensor x = x_in.contiguous(format), dy = grad.contiguous(format);
  auto [scale, shift] = affine(weight, bias, mean, invstd);
  at::Tensor dx = at::empty_like(x, format);
  // Training keeps dz for the second pass in dx's memory (in float beside a bfloat16 dx);
  // with running stats dx = scale·dz is final after the first pass.
  at::Tensor dz = !training ? dx : x.scalar_type() == at::kBFloat16 ? at::empty_like(x, x.options().dtype(at::kFloat), format) : dx;
  const at::Tensor store_scale = training ? channel_tensor(std::vector<double>(x.size(1), 1.0), scale.scalar_type()) : scale;
  at::Tensor sum_dz = channel_vector(x), sum_dz_xc = channel_vector(x);
  if (x.numel() > 0) cpu::batch_norm_silu_grad_sums_kernel(dy, x, scale, shift, mean, store_scale, dz, sum_dz, sum_dz_xc);
  else sum_dz.zero_(), sum_dz_xc.zero_();
  const int64_t channels = x.size(1);
  const std::vector<double> inv = read_channels(invstd, channels, 0), alpha = read_channels(scale, channels, 0);
  const std::vector<double> s_dz = read_channels(sum_dz, channels, 0), s_dz_xc = read_channels(sum_dz_xc, channels, 0);
  if (training && x.numel() > 0) {
    const double count = static_cast<double>(x.numel() / channels);
    std::vector<double> beta(channels), delta(channels);
    for (int64_t c = 0; c < channels; ++c) {
      beta[c] = -alpha[c] * inv[c] * inv[c] * s_dz_xc[c] / count;
      delta[c] = -alpha[c] * s_dz[c] / count;
    }
    cpu::batch_norm_silu_grad_input_kernel(dz, x, scale, channel_tensor(beta, dtype), channel_tensor(delta, dtype), mean, dx);
  }
  std::vector<double> dw(channels);
  for (int64_t c = 0; c < channels; ++c) dw[c] = s_dz_xc[c] * inv[c];
  at::Tensor dweight = weight.defined() ? channel_tensor(dw, weight.scalar_type()) : at::Tensor();
  at::Tensor dbias = bias.defined() ? channel_tensor(s_dz, bias.scalar_type()) : at::Tensor();
  return {dx, dweight, dbias};
}

using ForwardSignature = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const OptTensor&, const OptTensor&, const OptTensor&, const OptTensor&, bool, double, double);
using BackwardSignature = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const OptTensor&, const OptTensor&, const at::Tensor&, const at::Tensor&, bool);
using OpSignature = at::Tensor(const at::Tensor&, const OptTensor&, const OptTensor&, const OptTensor&,
                               const OptTensor&, bool, double, double);

auto forward_op() {
  static auto op = find_op<ForwardSignature>("opfuse::batch_norm_silu_forward");
  return op;
}

auto backward_op() {
  static auto op = find_op<BackwardSignature>("opfuse::batch_norm_silu_backward");
  return op;
}

auto batch_norm_silu_op() {
  static auto op = find_op<OpSignature>("opfuse::batch_norm_silu");
  return op;
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Saves x, weight, bias and the [C] mean and invstd; backward recomputes z from them.
class BatchNormSiluFunction : public torch::autograd::Function<BatchNormSiluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const OptTensor& weight, const OptTensor& bias,
                            const OptTensor& running_mean, const OptTensor& running_var, bool training,
                            double momentum, double eps) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [out, mean, invstd] = forward_op().call(x, weight, bias, running_mean, running_var, training, momentum, eps);
    ctx->save_for_backward({x, value_or_undefined(weight), value_or_undefined(bias), mean, invstd});
    ctx->saved_data["training"] = training;
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list result(8);
    if (!grads[0].defined()) return result;
    const auto s = ctx->get_saved_variables();
    auto [dx, dweight, dbias] = backward_op().call(grads[0], s[0], OptTensor(s[1]), OptTensor(s[2]), s[3], s[4],
                                                   ctx->saved_data["training"].toBool());
    result[0] = dx;
    result[1] = dweight;
    result[2] = dbias;
    return result;
  }
};

OptTensor optional_of(const at::Tensor& t) { return t.defined() ? OptTensor(t) : OptTensor(); }

}  // namespace

at::Tensor batch_norm_silu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                           const at::Tensor& running_mean, const at::Tensor& running_var, bool training,
                           double momentum, double eps) {
  return batch_norm_silu_op().call(x, optional_of(weight), optional_of(bias), optional_of(running_mean),
                                   optional_of(running_var), training, momentum, eps);
}

}  // namespace opfuse

TORCH_LIBRARY_FRAGMENT(opfuse, m) {
  // silu(batch_norm(x)); running stats are updated in place when training. _forward also
  // returns the per-channel mean and invstd that _backward takes.
  m.def("batch_norm_silu(Tensor x, Tensor? weight, Tensor? bias, Tensor(a!)? running_mean, "
        "Tensor(b!)? running_var, bool training, float momentum, float eps) -> Tensor");
  m.def("batch_norm_silu_forward(Tensor x, Tensor? weight, Tensor? bias, Tensor(a!)? running_mean, "
        "Tensor(b!)? running_var, bool training, float momentum, float eps) -> (Tensor, Tensor, Tensor)");
  m.def("batch_norm_silu_backward(Tensor grad, Tensor x, Tensor? weight, Tensor? bias, Tensor mean, "
        "Tensor invstd, bool training) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(opfuse, CPU, m) {
  m.impl("batch_norm_silu", &opfuse::batch_norm_silu_cpu);
  m.impl("batch_norm_silu_forward", &opfuse::batch_norm_silu_forward_cpu);
  m.impl("batch_norm_silu_backward", &opfuse::batch_norm_silu_backward_cpu);
}

// Outputs as the CPU front end allocates them, without data (ops/meta.h): per-channel statistics
// in the accumulation dtype, per-channel gradients in their parameter's.
namespace opfuse {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_silu_forward_meta(const at::Tensor& x, const OptTensor&,
                                                                            const OptTensor&, const OptTensor&,
                                                                            const OptTensor&, bool, double, double) {
  const at::ScalarType acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const c10::SymInt channels = x.sym_size(1);
  return {meta::in_kernel_layout(x), meta::empty({channels}, x, acc), meta::empty({channels}, x, acc)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm_silu_backward_meta(const at::Tensor& grad, const at::Tensor& x,
                                                                             const OptTensor& weight, const OptTensor& bias,
                                                                             const at::Tensor&, const at::Tensor&, bool) {
  auto channel_grad = [&](const OptTensor& t) {
    return t.has_value() && t->defined() ? meta::empty({x.sym_size(1)}, *t) : at::Tensor();
  };
  return {meta::in_kernel_layout(x), channel_grad(weight), channel_grad(bias)};
}

}  // namespace
}  // namespace opfuse

TORCH_LIBRARY_IMPL(opfuse, Meta, m) {
  m.impl("batch_norm_silu", [](const at::Tensor& x, const opfuse::OptTensor& w, const opfuse::OptTensor& b,
                               const opfuse::OptTensor& rm, const opfuse::OptTensor& rv, bool training, double momentum,
                               double eps) { return opfuse::meta::in_kernel_layout(x); });
  m.impl("batch_norm_silu_forward", &opfuse::batch_norm_silu_forward_meta);
  m.impl("batch_norm_silu_backward", &opfuse::batch_norm_silu_backward_meta);
}

TORCH_LIBRARY_IMPL(opfuse, Autograd, m) {
  m.impl("batch_norm_silu", [](const at::Tensor& x, const opfuse::OptTensor& weight, const opfuse::OptTensor& bias,
                               const opfuse::OptTensor& running_mean, const opfuse::OptTensor& running_var,
                               bool training, double momentum, double eps) {
    return opfuse::BatchNormSiluFunction::apply(x, weight, bias, running_mean, running_var, training, momentum, eps);
  });
  m.impl("batch_norm_silu_forward", torch::autograd::autogradNotImplementedFallback());
  m.impl("batch_norm_silu_backward", torch::autograd::autogradNotImplementedFallback());
}
