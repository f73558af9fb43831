// opfuse::attention: front end, autograd and the C++ API. The tiles live in
// cpu/attention_loops.h, the layout of heads in cpu/attention_kernel.cpp.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ExpandUtils.h>
#include <ATen/OpMathType.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <mutex>

#include "opfuse/ops.h"
#include "ops/attention/attention_kernel.h"
#include "ops/checks.h"
#include "ops/dispatch.h"
#include "ops/meta.h"

namespace opfuse {
namespace {

using OptTensor = c10::optional<at::Tensor>;

// [B·H, T, D] is one head per batch entry.
at::Tensor as_heads(const at::Tensor& t) { return t.dim() == 3 ? t.unsqueeze(1) : t; }
// With such q, a mask [B·H, T, S] (or [B·H, 1, S]) is one per entry too. A mask of more dimensions
// than q would broadcast the composite's output to them: refused.
OptTensor mask_as_heads(const OptTensor& mask, const at::Tensor& q, const char* op) {
  if (!mask || !mask->defined()) return mask;
  TORCH_CHECK(mask->dim() <= q.dim(), op, ": attn_mask ", mask->sizes(), " has more dimensions than q ", q.sizes());
  return q.dim() == 3 && mask->dim() == 3 ? OptTensor(mask->unsqueeze(1)) : mask;
}

void check_qkv(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const char* op) {
  check_input(q, op, "q");
  check_input(k, op, "k");
  check_input(v, op, "v");
  TORCH_CHECK(q.dim() == 4 || q.dim() == 3, op, ": q must be [B, H, T, D] or [B·H, T, D], got ", q.sizes());
  TORCH_CHECK(k.dim() == q.dim() && v.dim() == q.dim(), op, ": q, k and v must have as many dimensions, got ",
              q.sizes(), ", ", k.sizes(), " and ", v.sizes());
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(), op,
              ": q, k and v must have one dtype, got ", q.scalar_type(), ", ", k.scalar_type(), " and ", v.scalar_type());
  const int64_t n = q.dim();
  TORCH_CHECK(k.sizes().slice(0, n - 2) == q.sizes().slice(0, n - 2) && v.sizes().slice(0, n - 2) == q.sizes().slice(0, n - 2),
              op, ": q, k and v must share their leading dimensions, got ", q.sizes(), ", ", k.sizes(), " and ", v.sizes());
  TORCH_CHECK(k.size(-1) == q.size(-1), op, ": k's last dimension must be q's (", q.size(-1), "), got ", k.sizes());
  TORCH_CHECK(v.size(-2) == k.size(-2), op, ": v must have as many rows as k (", k.size(-2), "), got ", v.sizes());
}

double scale_of(const at::Tensor& q, c10::optional<double> scale) {
  return scale ? *scale : 1.0 / std::sqrt(double(q.size(-1)));
}

// The mask as the kernel reads it: bool, or the accumulation dtype (converted before it is
// broadcast, so a [T, S] mask is not copied per head), viewed as [B, H, T, S].
at::Tensor mask_view(const OptTensor& mask, const at::Tensor& q, int64_t S, const char* op) {
  if (!mask || !mask->defined()) return at::Tensor();
  const at::Tensor& m = *mask;
  TORCH_CHECK(m.device().is_cpu(), op, ": attn_mask must be a CPU tensor, got ", m.device());
  TORCH_CHECK(m.scalar_type() == at::kBool || at::isFloatingType(m.scalar_type()), op,
              ": attn_mask must be bool (true takes part) or floating (added to the scores), got ", m.scalar_type());
  const std::vector<int64_t> full{q.size(0), q.size(1), q.size(2), S};
  TORCH_CHECK(at::is_expandable_to(m.sizes(), full), op, ": attn_mask ", m.sizes(), " does not broadcast to [B, H, T, S] = ",
              at::IntArrayRef(full));
  const at::Tensor typed = m.scalar_type() == at::kBool ? m : m.to(at::toOpMathType(q.scalar_type()));
  return typed.expand(full);
}

// A boolean mask that keeps exactly keys j ≤ i for every head (minGPT's registered tril, sliced):
// run as causal, so the tiles above the diagonal are skipped rather than computed and masked.
// Reading T·S booleans costs far less than one tile product per row block.
bool exactly_causal(const at::Tensor& mask, int64_t T, int64_t S) {
  if (mask.scalar_type() != at::kBool || mask.dim() < 2 || mask.size(-2) != T || mask.size(-1) != S) return false;
  return at::equal(mask, at::ones({T, S}, at::kBool).tril().expand(mask.sizes()));
}

// The mask the kernel reads and whether it runs causal: an exactly causal mask becomes causal.
at::Tensor kernel_mask(const OptTensor& mask, const at::Tensor& q, int64_t S, bool& causal, const char* op) {
  at::Tensor m = mask_view(mask, q, S, op);
  if (m.defined() && exactly_causal(*mask, q.size(2), S)) {
    causal = true;
    return at::Tensor();
  }
  return m;
}

cpu::AttentionOptions options_of(const at::Tensor& q, bool causal, c10::optional<double> scale, double dropout_p,
                                 const char* op) {
  TORCH_CHECK(dropout_p >= 0 && dropout_p <= 1, op, ": dropout_p must be in [0, 1], got ", dropout_p);
  return {causal, scale_of(q, scale), dropout_p, 0};
}

// One 64-bit draw from the generator (torch's default unless given): the dropout mask's seed.
uint64_t draw_seed(c10::optional<at::Generator> generator) {
  auto* gen = at::get_generator_or_default<at::CPUGeneratorImpl>(generator, at::detail::getDefaultCPUGenerator());
  std::lock_guard<std::mutex> lock(gen->mutex_);
  return gen->random64();
}

// The seed travels as an int64 tensor [1] holding its bits.
at::Tensor seed_tensor(uint64_t seed) {
  at::Tensor t = at::empty({1}, at::kLong);
  std::memcpy(t.data_ptr<int64_t>(), &seed, sizeof seed);
  return t;
}

uint64_t seed_of(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.numel() == 1 && t.scalar_type() == at::kLong, op, ": seed must be the int64 [1] that _forward returned");
  uint64_t seed;
  const int64_t bits = t.contiguous().data_ptr<int64_t>()[0];
  std::memcpy(&seed, &bits, sizeof seed);
  return seed;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_forward_cpu(const at::Tensor& q_in, const at::Tensor& k_in,
                                                                     const at::Tensor& v_in, bool causal,
                                                                     c10::optional<double> scale, const OptTensor& mask,
                                                                     double dropout_p,
                                                                     c10::optional<at::Generator> generator) {
  constexpr const char* op = "opfuse::attention";
  check_qkv(q_in, k_in, v_in, op);
  const at::Tensor q = as_heads(q_in), k = as_heads(k_in), v = as_heads(v_in);
  const at::Tensor m = kernel_mask(mask_as_heads(mask, q_in, op), q, k.size(2), causal, op);
  cpu::AttentionOptions options = options_of(q, causal, scale, dropout_p, op);
  if (dropout_p > 0) options.seed = draw_seed(generator);
  at::Tensor out = at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
  at::Tensor stats =
      at::empty({q.size(0), q.size(1), q.size(2), 2}, q.options().dtype(at::toOpMathType(q.scalar_type())));
  if (k.size(2) == 0) {  // softmax over no keys is empty: the output sums nothing
    out.zero_(), stats.select(-1, 0).fill_(-INFINITY), stats.select(-1, 1).zero_();
  } else {
    cpu::attention_forward_kernel(q, k, v, m, options, out, stats);
  }
  if (q_in.dim() == 3) out = out.squeeze(1), stats = stats.squeeze(1);
  return {out, stats, seed_tensor(options.seed)};
}

at::Tensor attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                         c10::optional<double> scale, const OptTensor& mask, double dropout_p,
                         c10::optional<at::Generator> generator) {
  return std::get<0>(attention_forward_cpu(q, k, v, causal, scale, mask, dropout_p, generator));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_backward_cpu(
    const at::Tensor& grad, const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
    const at::Tensor& out_in, const at::Tensor& stats_in, const at::Tensor& seed, bool causal,
    c10::optional<double> scale, const OptTensor& mask, double dropout_p, bool mask_grad) {
  constexpr const char* op = "opfuse::attention_backward";
  check_qkv(q_in, k_in, v_in, op);
  check_input(grad, op, "grad");
  check_input(out_in, op, "out");
  const at::Tensor q = as_heads(q_in), k = as_heads(k_in), v = as_heads(v_in);
  const at::Tensor out = as_heads(out_in), dout = as_heads(grad);
  const std::vector<int64_t> out_shape{q.size(0), q.size(1), q.size(2), v.size(3)};
  TORCH_CHECK(out.sizes() == at::IntArrayRef(out_shape) && dout.sizes() == out.sizes(), op,
              ": grad and out must be [B, H, T, Dv] = ", at::IntArrayRef(out_shape), ", got ", grad.sizes(), " and ",
              out_in.sizes());
  TORCH_CHECK(grad.scalar_type() == q.scalar_type() && out.scalar_type() == q.scalar_type(), op,
              ": grad and out must have q's dtype");
  const at::Tensor stats = (q_in.dim() == 3 ? stats_in.unsqueeze(1) : stats_in).contiguous();
  const std::vector<int64_t> stats_shape{q.size(0), q.size(1), q.size(2), 2};
  TORCH_CHECK(stats.sizes() == at::IntArrayRef(stats_shape) && stats.scalar_type() == at::toOpMathType(q.scalar_type()),
              op, ": stats must be the [B, H, T, 2] ", at::toOpMathType(q.scalar_type()),
              " (each row's score max and sum) that _forward returned, got ", stats_in.sizes(), " ",
              stats_in.scalar_type());
  const at::Tensor m = kernel_mask(mask_as_heads(mask, q_in, op), q, k.size(2), causal, op);
  cpu::AttentionOptions options = options_of(q, causal, scale, dropout_p, op);
  options.seed = seed_of(seed, op);
  at::Tensor dq = at::empty(q.sizes(), q.options()), dk = at::empty(k.sizes(), k.options()),
             dv = at::empty(v.sizes(), v.options()), dscores;
  if (mask_grad)  // zeros: the tiles a causal run skips hold none
    dscores = at::zeros({q.size(0), q.size(1), q.size(2), k.size(2)}, stats.options());
  cpu::attention_backward_kernel(dout, q, k, v, out, stats, m, options, dq, dk, dv, dscores);
  if (q_in.dim() == 3) {
    dq = dq.squeeze(1), dk = dk.squeeze(1), dv = dv.squeeze(1);
    if (mask_grad) dscores = dscores.squeeze(1);
  }
  return {dq, dk, dv, dscores};
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

auto attention_op() {
  static auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, bool,
                                      c10::optional<double>, const OptTensor&, double, c10::optional<at::Generator>)>(
      "opfuse::attention");
  return op;
}
auto forward_op() {
  static auto op = find_op<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, bool, c10::optional<double>, const OptTensor&, double,
      c10::optional<at::Generator>)>("opfuse::attention_forward");
  return op;
}
auto backward_op() {
  static auto op = find_op<std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
      const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
      const at::Tensor&, bool, c10::optional<double>, const OptTensor&, double, bool)>("opfuse::attention_backward");
  return op;
}

// Saves q, k, v, the output, each row's score max and sum and the dropout seed: O(T·D) per head. The
// probabilities are recomputed tile by tile in the backward. An additive mask that requires grad
// (T5's trained position bias) gets the scores' gradient, summed over the dimensions it was
// broadcast along: a [B, H, T, S] tensor in the backward, as the composite's softmax backward makes.
class AttentionFunction : public torch::autograd::Function<AttentionFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            bool causal, c10::optional<double> scale, const OptTensor& mask, double dropout_p,
                            c10::optional<at::Generator> generator) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [out, stats, seed] = forward_op().call(q, k, v, causal, scale, mask, dropout_p, generator);
    // the mask saved as a variable: a change in place before the backward is an error, not wrong gradients
    ctx->save_for_backward({q, k, v, out, stats, seed, mask ? *mask : at::Tensor()});
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale ? c10::IValue(*scale) : c10::IValue();
    ctx->saved_data["dropout_p"] = dropout_p;
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list none(8);
    if (!grads[0].defined()) return none;
    const auto s = ctx->get_saved_variables();
    const auto& d = ctx->saved_data;
    const c10::optional<double> scale = d.at("scale").isNone() ? c10::nullopt : c10::optional<double>(d.at("scale").toDouble());
    const OptTensor mask = s[6].defined() ? OptTensor(s[6]) : c10::nullopt;
    const bool mask_grad = mask && ctx->needs_input_grad(3);  // edges: q, k, v, the mask
    auto [dq, dk, dv, dscores] = backward_op().call(grads[0], s[0], s[1], s[2], s[3], s[4], s[5],
                                                    d.at("causal").toBool(), scale, mask, d.at("dropout_p").toDouble(),
                                                    mask_grad);
    variable_list result = none;
    result[0] = dq, result[1] = dk, result[2] = dv;
    if (mask_grad) result[5] = dscores.sum_to_size(mask->sizes()).to(mask->scalar_type());
    return result;
  }
};

}  // namespace

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                     c10::optional<double> scale, const c10::optional<at::Tensor>& attn_mask, double dropout_p,
                     c10::optional<at::Generator> generator) {
  return attention_op().call(q, k, v, causal, scale, attn_mask, dropout_p, generator);
}

}  // namespace opfuse

TORCH_LIBRARY_FRAGMENT(opfuse, m) {
  // softmax(scale · q kᵀ + mask) · v over q [B, H, T, D], k, v [B, H, S, *], tiled (no [T, S]
  // matrix stored); scale defaults to 1/sqrt(D); attn_mask is bool (true takes part) or
  // additive, broadcast to [B, H, T, S]. _forward also returns each row's score max and sum
  // and the dropout seed that _backward takes; _backward's fourth result, with mask_grad, is the
  // scores' gradient [B, H, T, S] (the additive mask's before its broadcast is summed), in the
  // accumulation dtype; without it, an undefined tensor (None in Python).
  m.def("attention(Tensor q, Tensor k, Tensor v, bool causal=False, float? scale=None, Tensor? attn_mask=None, "
        "float dropout_p=0.0, Generator? generator=None) -> Tensor");
  m.def("attention_forward(Tensor q, Tensor k, Tensor v, bool causal, float? scale, Tensor? attn_mask, "
        "float dropout_p, Generator? generator) -> (Tensor, Tensor, Tensor)");
  m.def("attention_backward(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor out, Tensor stats, Tensor seed, "
        "bool causal, float? scale, Tensor? attn_mask, float dropout_p, bool mask_grad=False) "
        "-> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(opfuse, CPU, m) {
  m.impl("attention", &opfuse::attention_cpu);
  m.impl("attention_forward", &opfuse::attention_forward_cpu);
  m.impl("attention_backward", &opfuse::attention_backward_cpu);
}

// Outputs as the CPU front end allocates them, without data (ops/meta.h), for [B, H, T, D] heads
// or [B·H, T, D]: out [..., T, Dv]; stats [..., T, 2] and the scores' gradient [..., T, S] in the
// accumulation dtype; the dropout seed one int64.
namespace opfuse {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_forward_meta(const at::Tensor& q, const at::Tensor& k,
                                                                      const at::Tensor& v, bool, c10::optional<double>,
                                                                      const OptTensor&, double,
                                                                      c10::optional<at::Generator>) {
  return {meta::empty(meta::sizes_with_last(q, v.sym_size(-1)), q),
          meta::empty(meta::sizes_with_last(q, 2), q, at::toOpMathType(q.scalar_type())), meta::empty({1}, q, at::kLong)};
}

}  // namespace
}  // namespace opfuse

TORCH_LIBRARY_IMPL(opfuse, Meta, m) {
  using namespace opfuse::meta;
  m.impl("attention", [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                         c10::optional<double> scale, const opfuse::OptTensor& mask, double dropout_p,
                         c10::optional<at::Generator> generator) {
    return std::get<0>(opfuse::attention_forward_meta(q, k, v, causal, scale, mask, dropout_p, generator));
  });
  m.impl("attention_forward", &opfuse::attention_forward_meta);
  m.impl("attention_backward", [](const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& out, const at::Tensor& stats, const at::Tensor& seed, bool causal,
                                  c10::optional<double> scale, const opfuse::OptTensor& mask, double dropout_p,
                                  bool mask_grad) {
    const at::Tensor dscores =
        mask_grad ? empty(sizes_with_last(q, k.sym_size(-2)), q, at::toOpMathType(q.scalar_type())) : at::Tensor();
    return std::make_tuple(empty(q.sym_sizes(), q), empty(k.sym_sizes(), k), empty(v.sym_sizes(), v), dscores);
  });
}

// The backward has no derivative of its own: double backward raises.
TORCH_LIBRARY_IMPL(opfuse, Autograd, m) {
  m.impl("attention", [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                         c10::optional<double> scale, const c10::optional<at::Tensor>& mask, double dropout_p,
                         c10::optional<at::Generator> generator) {
    return opfuse::AttentionFunction::apply(q, k, v, causal, scale, mask, dropout_p, generator);
  });
  m.impl("attention_forward", torch::autograd::autogradNotImplementedFallback());
  m.impl("attention_backward", torch::autograd::autogradNotImplementedFallback());
}
