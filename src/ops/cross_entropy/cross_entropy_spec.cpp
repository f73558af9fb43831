// cross_entropy and linear_cross_entropy: a Llama-like loss, 4 × 256 tokens over llama2.c's
// 32000-token vocabulary (--numel picks the logits' size, [numel / 32000, 32000]), no target
// ignored (pretraining; an ignored row would cost the fused op less). The loss's gradient is 1,
// as loss.backward() gives it.
#include <cmath>

#include "opfuse/ops.h"
#include "ops/specs/inputs.h"

namespace opfuse::specs {
namespace {

constexpr int64_t kVocabulary = 32000;

int64_t loss_rows(int64_t numel) { return rows_for(numel, kVocabulary, 4 * 256); }

// shapes: logits [N, V] (the target [N] is drawn in [0, V))
OpCase cross_entropy_case(const OpArgs& a) {
  expect_shapes(a.shapes, 1, 2, 2, "cross_entropy");
  const int64_t rows = a.shapes[0][0], classes = a.shapes[0][1];
  const at::Tensor x = leaf(randn(a.shapes[0], a.dtype));
  const at::Tensor t = torch::randint(classes, {rows}, torch::kLong);
  OpCase c;
  c.leaves = {x};
  c.grad_output = torch::ones({}, a.dtype);
  c.variants = {{"reference", "nll_loss(log_softmax(x, -1), target) (two ops)",
                 [=] { return torch::nll_loss(torch::log_softmax(x, -1), t); }},
                {"aten", "at::cross_entropy_loss (F.cross_entropy)", [=] { return at::cross_entropy_loss(x, t); }},
                {"opfuse", "opfuse::cross_entropy", [=] { return opfuse::cross_entropy(x, t); }}};
  // forward reads the logits and writes their gradient; a loss gradient of 1 leaves it as it is
  c.bytes_per_step = 2.0 * x.numel() * x.element_size();
  return c;
}

// The same loss after llama2.c's stories15M output layer. shapes: h [N, H], weight [V, H] (in
// that order; the target [N] is drawn in [0, V)).
OpCase linear_cross_entropy_case(const OpArgs& a) {
  expect_shapes(a.shapes, 2, 2, 2, "linear_cross_entropy");
  const auto &hs = a.shapes[0], &ws = a.shapes[1];
  if (ws.size() != 2 || ws[1] != hs[1]) throw std::invalid_argument("linear_cross_entropy: weight must be [V, H]");
  const at::Tensor h = leaf(randn(hs, a.dtype));
  const at::Tensor w = leaf(randn(ws, a.dtype) / std::sqrt(double(hs[1])));
  const at::Tensor t = torch::randint(ws[0], {hs[0]}, torch::kLong);
  OpCase c;
  c.leaves = {h, w};
  c.grad_output = torch::ones({}, a.dtype);
  c.shape = fmt::format("h [{}, {}], weight [{}, {}]", hs[0], hs[1], ws[0], ws[1]);
  c.variants = {{"reference", "nll_loss(log_softmax(linear(h, weight), -1), target)",
                 [=] { return torch::nll_loss(torch::log_softmax(torch::linear(h, w), -1), t); }},
                {"aten", "at::cross_entropy_loss(at::linear(h, weight), target)",
                 [=] { return at::cross_entropy_loss(torch::linear(h, w), t); }},
                {"opfuse", "opfuse::linear_cross_entropy (chunks of 48 MB of logits)",
                 [=] { return opfuse::linear_cross_entropy(h, w, t); }}};
  // the three matmuls read the weight, the last writes its gradient
  c.bytes_per_step = 4.0 * w.numel() * w.element_size();
  return c;
}

}  // namespace

OpSpec cross_entropy_spec() {
  return {"cross_entropy", [](const BenchSize& s) { return InputShapes{{loss_rows(s.numel), kVocabulary}}; },
          cross_entropy_case, {{{5, 37}}, {{1, 2}}}};
}

OpSpec linear_cross_entropy_spec() {
  return {"linear_cross_entropy",
          [](const BenchSize& s) { return InputShapes{{loss_rows(s.numel), 288}, {kVocabulary, 288}}; },
          linear_cross_entropy_case, {{{5, 8}, {37, 8}}}};
}

const OpSpecRegistration cross_entropy_registered{cross_entropy_spec};
const OpSpecRegistration linear_cross_entropy_registered{linear_cross_entropy_spec};

}  // namespace opfuse::specs
