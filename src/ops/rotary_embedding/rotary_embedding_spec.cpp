// rotary_embedding: Llama-like rotary embedding on queries as the projection's view gives them,
// [B, T, H, D] = [4, 256, 8, 64] by default (--numel picks T). The composite is Hugging Face's
// rotate-half with its per-element cat(freqs, freqs) tables; the best ATen alternative found is
// Meta's complex form (one complex multiply each way, on interleaved pairs: the same bytes,
// another pairing).
#include "opfuse/ops.h"
#include "ops/specs/inputs.h"

namespace opfuse::specs {
namespace {

OpCase rotary_embedding_case(const OpArgs& a) {
  expect_shapes(a.shapes, 1, 4, 4, "rotary_embedding");
  const auto& shape = a.shapes[0];
  const int64_t B = shape[0], T = shape[1], H = shape[2], D = shape[3], P = D / 2;
  if (D % 2 != 0) throw std::invalid_argument("rotary_embedding: x's last dimension must be even");
  // the tables are float for bfloat16 x
  const at::ScalarType table = a.dtype == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor x = leaf(randn(shape, a.dtype));
  const at::Tensor theta =
      torch::outer(torch::arange(T).to(table), torch::pow(10000.0, -torch::arange(0, D, 2).to(table) / D)).view({T, 1, P});
  const at::Tensor cos = torch::cos(theta), sin = torch::sin(theta);
  const at::Tensor cos_hf = torch::cat({cos, cos}, -1), sin_hf = torch::cat({sin, sin}, -1);
  const at::Tensor freqs_cis = torch::polar(torch::ones_like(theta), theta);
  OpCase c;
  c.leaves = {x};
  c.grad_output = randn(shape, a.dtype);
  c.variants = {
      {"reference", "q * cos + cat((-q2, q1), -1) * sin (Hugging Face's rotate_half)",
       [=] { return x * cos_hf + torch::cat({-x.narrow(-1, P, P), x.narrow(-1, 0, P)}, -1) * sin_hf; }},
      {"aten", "view_as_real(view_as_complex(q) * freqs_cis) (Meta's complex form, interleaved)",
       [=] { return torch::view_as_real(torch::view_as_complex(x.view({B, T, H, P, 2})) * freqs_cis).flatten(3); }},
      {"opfuse", "opfuse::rotary_embedding (rotate-half)", [=] { return opfuse::rotary_embedding(x, cos, sin); }}};
  // forward reads x and writes y; backward reads dy and writes dx (the tables are small)
  c.bytes_per_step = 4.0 * x.numel() * x.element_size();
  return c;
}

}  // namespace

OpSpec rotary_embedding_spec() {
  return {"rotary_embedding",
          [](const BenchSize& s) { return InputShapes{{4, rows_for(s.numel, 4 * 8 * 64, 256), 8, 64}}; },
          rotary_embedding_case, {{{2, 5, 3, 8}}, {{1, 3, 2, 34}}}};
}

const OpSpecRegistration rotary_embedding_registered{rotary_embedding_spec};

}  // namespace opfuse::specs
