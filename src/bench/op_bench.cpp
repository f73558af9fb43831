// bench-op: forward+backward of the reference composite, ATen and the opfuse op, interleaved in
// one process (measure::interleave), each ratio from paired rounds — an absolute time on a shared
// 2-core machine means little, the ratio within one run does.
#include <ATen/Parallel.h>
#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <thread>

#include "opfuse/bench.h"
#include "opfuse/measure.h"
#include "opfuse/models.h"
#include "opfuse/stats.h"
#include "opfuse/ops.h"
#include "ops/cpu/capability.h"

namespace opfuse::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kDefaultNumel = 6'400'000;

struct Variant {
  std::string name, what;
  std::function<at::Tensor()> forward;  // builds the graph from the leaves
  std::function<void()> step;           // instead of forward+backward: an in-place update (an optimizer step)
};

struct Case {
  std::vector<at::Tensor> leaves;  // inputs that receive gradients
  at::Tensor grad_output;
  std::vector<Variant> variants;
  double bytes_per_step;  // bytes a single-pass forward+backward (or step) moves
  at::Tensor copied;      // what the bandwidth copy copies (default leaves[0]): as large as what the op streams
  std::string shape;      // for the report (default leaves[0]'s shape)
};

// se_gate runs on EfficientNet-like activations: 16 samples of 56×56 and as many channels as
// the requested size allows.
std::vector<int64_t> se_gate_shape(int64_t numel) {
  const int64_t n = 16, hw = 56 * 56;
  return {n, std::max<int64_t>(1, numel / (n * hw)), 56, 56};
}

// BatchNorm + Swish and drop connect run on an MBConv expansion's activation: [16, 96, 56, 56]
// by default, [16, C, 56, 56] of about --numel elements otherwise.
std::vector<int64_t> block_shape(int64_t numel) {
  return numel == 0 ? std::vector<int64_t>{16, 96, 56, 56} : se_gate_shape(numel);
}

// EfficientNet's BatchNorm: momentum 0.01, eps 1e-3, in training mode. Each variant updates
// its own running statistics.
Case batch_norm_silu_case(int64_t numel) {
  Case c;
  const auto shape = block_shape(numel);
  const int64_t channels = shape[1];
  at::Tensor x = torch::randn(shape).requires_grad_();
  at::Tensor w = (torch::rand({channels}) + 0.5).requires_grad_(), b = torch::randn({channels}).requires_grad_();
  c.leaves = {x, w, b};
  c.grad_output = torch::randn(shape);
  auto stats = [channels] { return std::make_pair(torch::zeros({channels}), torch::ones({channels})); };
  auto [rm0, rv0] = stats();
  auto [rm1, rv1] = stats();
  auto [rm2, rv2] = stats();
  c.variants = {
      {"reference", "torch::batch_norm, memory-efficient Swish",
       [=] { return models::memory_efficient_swish(torch::batch_norm(x, w, b, rm0, rv0, true, 0.01, 1e-3, false)); }},
      {"aten", "torch::batch_norm, torch::silu",
       [=] { return torch::silu(torch::batch_norm(x, w, b, rm1, rv1, true, 0.01, 1e-3, false)); }},
      {"opfuse", "opfuse::batch_norm_silu", [=] { return opfuse::batch_norm_silu(x, w, b, rm2, rv2, true, 0.01, 1e-3); }}};
  // forward reads x twice (statistics, output) and writes y; backward reads dy and x, writes
  // dz, then reads dz and x and writes dx
  c.bytes_per_step = 9.0 * x.numel() * sizeof(float);
  return c;
}

// The drop-connect rate of EfficientNet-B0's last blocks.
Case drop_connect_add_case(int64_t numel) {
  Case c;
  const auto shape = block_shape(numel);
  constexpr double p = 0.2, keep = 1 - p;
  at::Tensor x = torch::randn(shape).requires_grad_(), r = torch::randn(shape).requires_grad_();
  c.leaves = {x, r};
  c.grad_output = torch::randn(shape);
  auto mask = [x] { return torch::floor(keep + torch::rand({x.size(0), 1, 1, 1}, x.options())); };
  c.variants = {
      {"reference", "x / keep * floor(keep + rand) + residual (efficientnet_pytorch)",
       [=] { return x / keep * mask() + r; }},
      {"aten", "torch::addcmul(residual, x, mask / keep)", [=] { return torch::addcmul(r, x, mask() / keep); }},
      {"opfuse", "opfuse::drop_connect_add", [=] { return opfuse::drop_connect_add(x, r, p, true); }}};
  // forward reads x and residual, writes out; backward reads dy, writes dx
  c.bytes_per_step = 5.0 * x.numel() * sizeof(float);
  return c;
}

// A Llama-like RMSNorm: 4 × 256 tokens of 768 by default, --numel picks the number of tokens.
// ATen 1.13 has no rms_norm; its nearest single op, layer_norm, is the "aten" variant.
Case rms_norm_case(int64_t numel) {
  constexpr int64_t d = 768;
  constexpr double eps = 1e-5;
  const int64_t rows = numel == 0 ? 4 * 256 : std::max<int64_t>(1, numel / d);
  Case c;
  at::Tensor x = torch::randn({rows, d}).requires_grad_(), w = (torch::rand({d}) + 0.5).requires_grad_();
  c.leaves = {x, w};
  c.grad_output = torch::randn({rows, d});
  c.variants = {
      {"reference", "(x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).type_as(x) * w (Llama)",
       [=] {
         const at::Tensor xf = x.to(torch::kFloat);
         return (xf * torch::rsqrt(xf.pow(2).mean(-1, true) + eps)).type_as(x) * w;
       }},
      {"aten", "torch::layer_norm (the nearest single ATen op)",
       [=] { return torch::layer_norm(x, {d}, w, {}, eps); }},
      {"opfuse", "opfuse::rms_norm", [=] { return opfuse::rms_norm(x, w, eps); }}};
  // forward reads x and writes y; backward reads dy and x, writes dx (w and rstd are small)
  c.bytes_per_step = 5.0 * x.numel() * sizeof(float);
  return c;
}

// A Llama-like SwiGLU: 4 × 256 tokens of hidden width 2048 by default, --numel picks the size
// of gate (and of up).
Case swiglu_case(int64_t numel) {
  constexpr int64_t d = 2048;
  const int64_t rows = numel == 0 ? 4 * 256 : std::max<int64_t>(1, numel / d);
  Case c;
  at::Tensor g = torch::randn({rows, d}).requires_grad_(), u = torch::randn({rows, d}).requires_grad_();
  c.leaves = {g, u};
  c.grad_output = torch::randn({rows, d});
  c.variants = {{"reference", "gate * sigmoid(gate) * up (autograd)", [=] { return g * torch::sigmoid(g) * u; }},
                {"aten", "torch::silu(gate) * up", [=] { return torch::silu(g) * u; }},
                {"opfuse", "opfuse::swiglu", [=] { return opfuse::swiglu(g, u); }}};
  // forward reads gate and up, writes y; backward reads dy, gate and up, writes dgate and dup
  c.bytes_per_step = 8.0 * g.numel() * sizeof(float);
  return c;
}

// Llama-like rotary embedding on queries as the projection's view gives them, [B, T, H, D] = [4,
// 256, 8, 64] by default (--numel picks T). The composite is Hugging Face's rotate-half with its
// per-element cat(freqs, freqs) tables; the best ATen alternative found is Meta's complex form (one
// complex multiply each way, on interleaved pairs: the same bytes, another pairing).
Case rotary_embedding_case(int64_t numel) {
  constexpr int64_t B = 4, H = 8, D = 64, P = D / 2;
  const int64_t T = numel == 0 ? 256 : std::max<int64_t>(1, numel / (B * H * D));
  Case c;
  at::Tensor x = torch::randn({B, T, H, D}).requires_grad_();
  const at::Tensor theta = torch::outer(torch::arange(T).to(torch::kFloat),
                                        torch::pow(10000.0, -torch::arange(0, D, 2).to(torch::kFloat) / D))
                               .view({T, 1, P});
  const at::Tensor cos = torch::cos(theta), sin = torch::sin(theta);
  const at::Tensor cos_hf = torch::cat({cos, cos}, -1), sin_hf = torch::cat({sin, sin}, -1);
  const at::Tensor freqs_cis = torch::polar(torch::ones_like(theta), theta);
  c.leaves = {x};
  c.grad_output = torch::randn({B, T, H, D});
  c.variants = {
      {"reference", "q * cos + cat((-q2, q1), -1) * sin (Hugging Face's rotate_half)",
       [=] { return x * cos_hf + torch::cat({-x.narrow(-1, P, P), x.narrow(-1, 0, P)}, -1) * sin_hf; }},
      {"aten", "view_as_real(view_as_complex(q) * freqs_cis) (Meta's complex form, interleaved)",
       [=] { return torch::view_as_real(torch::view_as_complex(x.view({B, T, H, P, 2})) * freqs_cis).flatten(3); }},
      {"opfuse", "opfuse::rotary_embedding (rotate-half)", [=] { return opfuse::rotary_embedding(x, cos, sin); }}};
  // forward reads x and writes y; backward reads dy and writes dx (the tables are small)
  c.bytes_per_step = 4.0 * x.numel() * sizeof(float);
  return c;
}

// minGPT's causal self-attention on [B, H, T, D] heads: the mask a registered tril buffer sliced
// to T, attention dropout on the probabilities.
Case attention_case(const OpBenchOptions& o) {
  const int64_t B = 4, H = 6, T = o.seq_len, D = o.head_dim;
  const double p = o.dropout_p, scale = 1 / std::sqrt(double(D));
  if (T < 1 || D < 1) throw std::invalid_argument("--seq-len and --head-dim must be positive");
  if (o.numel != 0) throw std::invalid_argument("attention is sized by --seq-len and --head-dim, not --numel");
  if (p < 0 || p >= 1) throw std::invalid_argument("--dropout must be in [0, 1)");
  Case c;
  at::Tensor q = torch::randn({B, H, T, D}).requires_grad_(), k = torch::randn({B, H, T, D}).requires_grad_(),
             v = torch::randn({B, H, T, D}).requires_grad_();
  const at::Tensor bias = torch::ones({T, T}).tril().view({1, 1, T, T});
  c.leaves = {q, k, v};
  c.grad_output = torch::randn({B, H, T, D});
  c.variants = {
      {"reference", "softmax((q @ kᵀ * scale).masked_fill(bias[:T, :T] == 0, -inf)) → dropout → @ v (minGPT)",
       [=] {
         const at::Tensor att = torch::matmul(q, k.transpose(-2, -1)) * scale;
         const at::Tensor probs = torch::softmax(att.masked_fill(bias.slice(2, 0, T).slice(3, 0, T) == 0, -INFINITY), -1);
         return torch::matmul(torch::dropout(probs, p, true), v);
       }},
      {"aten", "at::_scaled_dot_product_attention (torch 1.13's composite)",
       [=] { return std::get<0>(at::_scaled_dot_product_attention(q, k, v, {}, p, false, true)); }},
      {"opfuse", "opfuse::attention (tiled, causal)",
       [=] { return opfuse::attention(q, k, v, true, c10::nullopt, c10::nullopt, p); }}};
  // forward reads q, k, v and writes o; backward reads them, o and do, writes dq, dk, dv
  c.bytes_per_step = 12.0 * q.numel() * sizeof(float);
  return c;
}

// llama2.c's stories15M (dim 288, 6 layers, hidden 768, vocab 32000, the output layer tied to
// the embedding): its 56 parameter tensors, one AdamW group.
std::vector<std::vector<int64_t>> llama_parameter_shapes() {
  constexpr int64_t dim = 288, layers = 6, hidden = 768, vocab = 32000;
  std::vector<std::vector<int64_t>> shapes{{vocab, dim}};
  for (int64_t l = 0; l < layers; ++l) {
    shapes.push_back({dim});  // attention_norm
    for (int w = 0; w < 4; ++w) shapes.push_back({dim, dim});  // wq, wk, wv, wo
    shapes.push_back({dim});  // ffn_norm
    shapes.insert(shapes.end(), {{hidden, dim}, {dim, hidden}, {hidden, dim}});  // w1, w2, w3
  }
  shapes.push_back({dim});  // the final norm
  return shapes;
}

// One AdamW step (torch's defaults, lr 1e-3) three ways. The variants step the same tensors in
// turn; their values do not change the time.
Case adamw_case(const OpBenchOptions& o) {
  if (o.numel != 0) throw std::invalid_argument("adamw steps stories15M's parameter set, not --numel elements");
  constexpr double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, wd = 1e-2;
  struct Group {
    std::vector<at::Tensor> p, g, m, v, steps;
  };
  auto group = std::make_shared<Group>();
  int64_t total = 0;
  for (const auto& shape : llama_parameter_shapes()) {
    group->p.push_back(torch::randn(shape));
    group->g.push_back(torch::randn(shape));
    group->m.push_back(torch::zeros(shape));
    group->v.push_back(torch::zeros(shape));
    group->steps.push_back(torch::tensor(0.0));
    total += group->p.back().numel();
  }
  Case c;
  c.leaves = group->p;
  c.copied = torch::randn({total});
  c.shape = fmt::format("{} tensors, {} parameters (stories15M)", group->p.size(), total);
  // torch.optim.AdamW(foreach=False)'s _single_tensor_adamw, op for op.
  auto per_tensor = [group] {
    const Group& s = *group;
    for (size_t i = 0; i < s.p.size(); ++i) {
      s.steps[i].add_(1);
      const double t = s.steps[i].item<double>();
      s.p[i].mul_(1 - lr * wd);
      s.m[i].mul_(beta1).add_(s.g[i], 1 - beta1);
      s.v[i].mul_(beta2).addcmul_(s.g[i], s.g[i], 1 - beta2);
      const at::Tensor denom = (s.v[i].sqrt() / std::sqrt(1 - std::pow(beta2, t))).add_(eps);
      s.p[i].addcdiv_(s.m[i], denom, -lr / (1 - std::pow(beta1, t)));
    }
  };
  // torch.optim.AdamW(foreach=True)'s _multi_tensor_adamw.
  auto foreach = [group] {
    const Group& s = *group;
    at::_foreach_add_(s.steps, 1);
    at::_foreach_mul_(s.p, 1 - lr * wd);
    at::_foreach_mul_(s.m, beta1);
    at::_foreach_add_(s.m, s.g, 1 - beta1);
    at::_foreach_mul_(s.v, beta2);
    at::_foreach_addcmul_(s.v, s.g, s.g, 1 - beta2);
    std::vector<at::Scalar> step_size, bias_correction2_sqrt;
    for (const at::Tensor& step : s.steps) {
      const double t = step.item<double>();
      step_size.push_back(-lr / (1 - std::pow(beta1, t)));
      bias_correction2_sqrt.push_back(std::sqrt(1 - std::pow(beta2, t)));
    }
    std::vector<at::Tensor> denom = at::_foreach_sqrt(s.v);
    at::_foreach_div_(denom, bias_correction2_sqrt);
    at::_foreach_add_(denom, eps);
    at::_foreach_addcdiv_(s.p, s.m, denom, step_size);
  };
  auto fused = [group] {
    const Group& s = *group;
    opfuse::adamw_(s.p, s.g, s.m, s.v, s.steps, lr, beta1, beta2, eps, wd);
  };
  c.variants = {{"reference", "torch.optim.AdamW(foreach=False): per tensor mul_, add_, addcmul_, sqrt, div, addcdiv_",
                 {}, per_tensor},
                {"aten", "torch.optim.AdamW(foreach=True): _foreach_mul_, _add_, _addcmul_, _sqrt, _div_, _addcdiv_",
                 {}, foreach},
                {"opfuse", "opfuse::adamw_ (one call, one pass)", {}, fused}};
  // reads p, g, m, v; writes p, m, v
  c.bytes_per_step = 7.0 * total * sizeof(float);
  return c;
}

// A Llama-like loss: 4 × 256 tokens over llama2.c's 32000-token vocabulary (--numel picks the
// logits' size, [numel / 32000, 32000]), no target ignored (pretraining; an ignored row would
// cost the fused op less). The loss's gradient is 1, as loss.backward() gives it.
constexpr int64_t kVocabulary = 32000;

int64_t loss_rows(int64_t numel) { return numel == 0 ? 4 * 256 : std::max<int64_t>(1, numel / kVocabulary); }

at::Tensor loss_targets(int64_t rows) { return torch::randint(kVocabulary, {rows}, torch::kLong); }

Case cross_entropy_case(int64_t numel) {
  const int64_t rows = loss_rows(numel);
  Case c;
  at::Tensor x = torch::randn({rows, kVocabulary}).requires_grad_();
  const at::Tensor t = loss_targets(rows);
  c.leaves = {x};
  c.grad_output = torch::ones({});
  c.variants = {{"reference", "nll_loss(log_softmax(x, -1), target) (two ops)",
                 [=] { return torch::nll_loss(torch::log_softmax(x, -1), t); }},
                {"aten", "at::cross_entropy_loss (F.cross_entropy)", [=] { return at::cross_entropy_loss(x, t); }},
                {"opfuse", "opfuse::cross_entropy", [=] { return opfuse::cross_entropy(x, t); }}};
  // forward reads the logits and writes their gradient; a loss gradient of 1 leaves it as it is
  c.bytes_per_step = 2.0 * x.numel() * sizeof(float);
  return c;
}

// The same loss after llama2.c's stories15M output layer: h [tokens, 288], weight [32000, 288].
Case linear_cross_entropy_case(int64_t numel) {
  constexpr int64_t hidden = 288;
  const int64_t rows = loss_rows(numel);
  Case c;
  at::Tensor h = torch::randn({rows, hidden}).requires_grad_();
  at::Tensor w = (torch::randn({kVocabulary, hidden}) / std::sqrt(double(hidden))).requires_grad_();
  const at::Tensor t = loss_targets(rows);
  c.leaves = {h, w};
  c.grad_output = torch::ones({});
  c.copied = w.detach();
  c.shape = fmt::format("h [{}, {}], weight [{}, {}]", rows, hidden, kVocabulary, hidden);
  c.variants = {{"reference", "nll_loss(log_softmax(linear(h, weight), -1), target)",
                 [=] { return torch::nll_loss(torch::log_softmax(torch::linear(h, w), -1), t); }},
                {"aten", "at::cross_entropy_loss(at::linear(h, weight), target)",
                 [=] { return at::cross_entropy_loss(torch::linear(h, w), t); }},
                {"opfuse", "opfuse::linear_cross_entropy (chunks of 48 MB of logits)",
                 [=] { return opfuse::linear_cross_entropy(h, w, t); }}};
  // the three matmuls read the weight, the last writes its gradient
  c.bytes_per_step = 4.0 * w.numel() * sizeof(float);
  return c;
}

Case make_case(const OpBenchOptions& options) {
  const std::string& op = options.op;
  const int64_t numel_option = options.numel;
  if (op == "attention") return attention_case(options);
  if (op == "adamw") return adamw_case(options);
  if (op == "batch_norm_silu") return batch_norm_silu_case(numel_option);
  if (op == "rms_norm") return rms_norm_case(numel_option);
  if (op == "swiglu") return swiglu_case(numel_option);
  if (op == "rotary_embedding") return rotary_embedding_case(numel_option);
  if (op == "drop_connect_add") return drop_connect_add_case(numel_option);
  if (op == "cross_entropy") return cross_entropy_case(numel_option);
  if (op == "linear_cross_entropy") return linear_cross_entropy_case(numel_option);
  const int64_t numel = numel_option == 0 ? kDefaultNumel : numel_option;
  Case c;
  if (op == "silu" || op == "swish") {
    at::Tensor x = torch::randn({numel}).requires_grad_();
    c.leaves = {x};
    c.grad_output = torch::randn({numel});
    auto fused = op == "silu" ? std::function<at::Tensor()>([x] { return opfuse::silu(x); })
                              : std::function<at::Tensor()>([x] { return opfuse::swish(x, 1.0); });
    c.variants = {
        {"reference", "memory-efficient Swish (autograd Function)", [x] { return models::memory_efficient_swish(x); }},
        {"aten", "torch::silu", [x] { return torch::silu(x); }},
        {"opfuse", fmt::format("opfuse::{}", op), fused}};
    // forward reads x, writes y; backward reads dy and x, writes dx
    c.bytes_per_step = 5.0 * numel * sizeof(float);
    return c;
  }
  if (op == "se_gate") {
    const auto shape = se_gate_shape(numel);
    at::Tensor x = torch::randn(shape).requires_grad_();
    at::Tensor g = torch::randn({shape[0], shape[1], 1, 1}).requires_grad_();
    c.leaves = {x, g};
    c.grad_output = torch::randn(shape);
    c.variants = {
        {"reference", "sigmoid(g) * x (autograd)", [x, g] { return models::composite_se_gate(x, g); }},
        {"aten", "x * torch::sigmoid(g) (autograd)", [x, g] { return x * torch::sigmoid(g); }},
        {"opfuse", "opfuse::se_gate", [x, g] { return opfuse::se_gate(x, g); }}};
    c.bytes_per_step = 5.0 * x.numel() * sizeof(float);
    return c;
  }
  throw std::invalid_argument(
      fmt::format("unknown op '{}' (expected {})", op, fmt::join(benchmarked_ops(), ", ")));
}

double elapsed_ms(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

void clear_grads(const Case& c) {
  for (const auto& leaf : c.leaves) leaf.mutable_grad() = at::Tensor();
}

// One forward+backward from fresh leaves, or the variant's step.
void run_variant(const Case& c, const Variant& v) {
  if (v.step) return v.step();
  v.forward().backward(c.grad_output);
}

double time_step(const Case& c, const Variant& v) {
  clear_grads(c);
  const auto start = Clock::now();
  run_variant(c, v);
  return elapsed_ms(start);
}

// Follows the bytes torch's CPU allocator holds: c10 reports each allocation and free to the
// memory hook installed on the thread (the profiler's mechanism; the autograd engine carries
// it into the backward).
class PeakMemory : public c10::MemoryReportingInfoBase {
 public:
  void reportMemoryUsage(void*, int64_t bytes, int64_t, int64_t, c10::Device) override {
    held_ += bytes;
    peak_ = std::max(peak_, held_);
  }
  bool memoryProfilingEnabled() const override { return true; }
  int64_t peak() const { return peak_; }

 private:
  int64_t held_ = 0, peak_ = 0;
};

int64_t peak_bytes(const Case& c, const Variant& v) {
  clear_grads(c);
  auto memory = std::make_shared<PeakMemory>();
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, memory);
    run_variant(c, v);
  }
  return memory->peak();
}

// Five calls per round: a call that stalls (see measure::Options::calls) is not the round's figure.
constexpr int kCallsPerRound = 5;

// A call repeats a short variant until it lasts about this long: a 0.2 ms op timed once per call
// met the host's stalls and timer ticks unaveraged (rms_norm's rounds spread 1.40×).
constexpr double kMinCallMs = 5;

// A Run of enough repetitions of `once` (returning its ms) to last kMinCallMs; its ms per repetition.
measure::Run repeated_to_last(const std::function<double()>& once) {
  once();  // first-call costs (lazy initialisation, cold caches) are not the op's
  const double ms = std::min(once(), once());
  const int reps = static_cast<int>(std::clamp(std::ceil(kMinCallMs / std::max(ms, 1e-3)), 1.0, 1000.0));
  return measure::per_step(once, reps);
}

std::string shape_string(at::IntArrayRef sizes) {
  return fmt::format("[{}]", fmt::join(sizes, ", "));
}

}  // namespace

const std::vector<std::string>& benchmarked_ops() {
  static const std::vector<std::string> ops{"silu",     "swish",     "se_gate",          "batch_norm_silu",
                                            "drop_connect_add", "rms_norm", "swiglu", "attention", "rotary_embedding", "adamw",
                                            "cross_entropy", "linear_cross_entropy"};
  return ops;
}

OpBenchResult bench_op(const OpBenchOptions& options) {
  if (options.numel < 0) throw std::invalid_argument("--numel must be positive");
  if (options.rounds < 1) throw std::invalid_argument("--rounds must be at least 1");
  const int threads = options.threads > 0 ? options.threads
                                          : static_cast<int>(std::thread::hardware_concurrency());
  at::set_num_threads(threads);
  torch::manual_seed(0);
  const Case c = make_case(options);

  // The copy runs as a fourth variant, so memory's bandwidth is measured under the same conditions.
  const at::Tensor src = c.copied.defined() ? c.copied : c.leaves[0].detach();
  at::Tensor dst = torch::empty_like(src);
  measure::keep_freed_memory();  // before the calibration's calls, so they allocate as rounds will
  std::vector<measure::Run> runs;
  for (const auto& v : c.variants) runs.push_back(repeated_to_last([&c, &v] { return time_step(c, v); }));
  runs.push_back(repeated_to_last([&] {
    const auto start = Clock::now();
    dst.copy_(src);
    return elapsed_ms(start);
  }));
  measure::Options m;
  m.warmup = options.warmup;
  m.rounds = options.rounds;
  m.calls = kCallsPerRound;
  m.progress = options.progress;
  const measure::Measurement timing = measure::interleave(runs, m);

  OpBenchResult result;
  result.op = options.op;
  result.shape = c.shape.empty() ? shape_string(c.leaves[0].sizes()) : c.shape;
  result.capability = cpu::capability_name(cpu::cpu_capability());
  result.timed = c.variants[0].step ? "one optimizer step" : "forward+backward";
  result.numel = src.numel();
  result.threads = threads;
  result.rounds = timing.rounds;
  result.machine = timing.machine;
  result.environment = measure::environment();
  for (size_t i = 0; i < c.variants.size(); ++i) {
    const measure::Series& s = timing.variants[i];
    result.variants.push_back({c.variants[i].name, c.variants[i].what, s, s.max / s.min, peak_bytes(c, c.variants[i])});
  }
  result.speedup_vs_reference = measure::ratio(timing, 0, 2);
  result.speedup_vs_aten = measure::ratio(timing, 1, 2);
  result.opfuse_gbps = c.bytes_per_step / (timing.variants[2].median * 1e6);
  result.copy_gbps = 2.0 * src.numel() * sizeof(float) / (timing.variants[3].median * 1e6);
  return result;
}

}  // namespace opfuse::bench
