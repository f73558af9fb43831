// opfuse::rotary_embedding (rotate-half and interleaved) against a float64 reference composite,
// on every CPU path.
//
// Each output is one pair's y_a = a·x_a + b·x_b (a, b from cos and sin), computed as
// fma(a, x_a, RN(b·x_b)): within 2u·T(1 + u) of the exact value, T = |a·x_a| + |b·x_b|, u the unit
// roundoff; the backward is the same map transposed, with T = |a·dy_a| + |c·dy_b|. Stated bounds,
// per element (the inputs, tables included, are exact in float64):
//   float32   ≤ 1.25e-7·T                   (2u = 2^-23 = 1.19e-7)
//   float64   ≤ 5e-16·T                     (the op's 2u and the reference's own 2u, u = 2^-53)
//   bfloat16  ≤ 3.92e-3·|ref| + 1.3e-7·T    (float arithmetic, then one rounding: 2^-8 = 3.906e-3)
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <tuple>

#include "opfuse/ops.h"
#include "reference.h"

// The file's own namespace: the op tests are compiled a few to a unit.
namespace opfuse::testing::test_rotary_embedding {
namespace {

struct Bound {
  double rtol, terms;  // of |ref|, and of T
};

Bound bound_for(at::ScalarType t) {
  if (t == torch::kDouble) return {0, 5e-16};
  if (t == torch::kBFloat16) return {3.92e-3, 1.3e-7};
  return {0, 1.25e-7};
}

// Each element's partner with the sign the composite gives it: rotate-half cat(−x₂, x₁),
// interleaved (−x₁, x₀, −x₃, x₂, …).
at::Tensor rot(const at::Tensor& x, bool interleaved) {
  const int64_t P = x.size(-1) / 2;
  if (!interleaved) return torch::cat({-x.narrow(-1, P, P), x.narrow(-1, 0, P)}, -1);
  const at::Tensor even = x.slice(-1, 0, 2 * P, 2), odd = x.slice(-1, 1, 2 * P, 2);
  return torch::stack({-odd, even}, -1).flatten(-2);
}

// Per-pair tables widened to a value per element, as the composite reads them.
at::Tensor per_element(const at::Tensor& t, int64_t d, bool interleaved) {
  if (t.size(-1) == d) return t;
  return interleaved ? t.repeat_interleave(2, -1) : torch::cat({t, t}, -1);
}

// The composite, x·cos + rot(x)·sin, in float64.
at::Tensor composite(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool interleaved) {
  const int64_t d = x.size(-1);
  const at::Tensor c = per_element(cos.to(torch::kDouble), d, interleaved);
  const at::Tensor s = per_element(sin.to(torch::kDouble), d, interleaved);
  return x * c + rot(x, interleaved) * s;
}

// cos θ and sin θ of angles as Llama's positions × frequencies spread them, rounded to dtype.
std::pair<at::Tensor, at::Tensor> angle_tables(std::vector<int64_t> shape, at::ScalarType dtype) {
  const at::Tensor theta = torch::rand(shape, torch::kDouble) * 2000 - 1000;
  return {torch::cos(theta).to(dtype), torch::sin(theta).to(dtype)};
}

void check_against_reference(const at::Tensor& x_in, const at::Tensor& cos, const at::Tensor& sin, bool interleaved,
                             const std::string& what) {
  const at::ScalarType dtype = x_in.scalar_type();
  at::Tensor x = x_in.detach().requires_grad_();
  const at::Tensor dy = torch::randn(x.sizes()).to(dtype);
  const at::Tensor y = opfuse::rotary_embedding(x, cos, sin, interleaved);
  y.backward(dy);
  ASSERT_EQ(y.scalar_type(), dtype);
  ASSERT_EQ(x.grad().scalar_type(), dtype);

  const int64_t d = x.size(-1);
  const at::Tensor xd = x_in.detach().to(torch::kDouble).requires_grad_(), dyd = dy.to(torch::kDouble);
  const at::Tensor yd = composite(xd, cos, sin, interleaved);
  yd.backward(dyd);
  const at::Tensor c = per_element(cos.to(torch::kDouble), d, interleaved).abs();
  const at::Tensor s = per_element(sin.to(torch::kDouble), d, interleaved).abs();
  // |rot(·)| permutes magnitudes, so the backward's terms are |dy|·|c| + |rot(|dy|·|s|)|.
  const at::Tensor y_terms = xd.detach().abs() * c + rot(xd.detach(), interleaved).abs() * s;
  const at::Tensor dx_terms = dyd.abs() * c + rot(dyd.abs() * s, interleaved).abs();

  const Bound b = bound_for(dtype);
  expect_close(y, yd.detach(), b.rtol * yd.detach().abs() + b.terms * y_terms, what + " forward");
  expect_close(x.grad(), xd.grad(), b.rtol * xd.grad().abs() + b.terms * dx_terms, what + " dx");
}

struct Case {
  std::vector<int64_t> x, table;
};

class RotaryEmbeddingTest : public PathAndDtypeTest {};

TEST_P(RotaryEmbeddingTest, MatchesFloat64ReferenceOnFreshRandomData) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  const std::vector<Case> cases{
      {{2, 7, 3, 64}, {7, 1, 32}},     // [B, T, H, D], an angle per pair
      {{2, 3, 7, 64}, {7, 32}},        // [B, H, T, D]
      {{2, 7, 3, 64}, {7, 1, 64}},     // Hugging Face's per-element tables
      {{2, 5, 4, 8}, {2, 5, 1, 4}},    // a table per sample (position ids)
      {{3, 5, 2, 46}, {5, 1, 23}},     // 23 pairs: a partial vector on every path
      {{4, 10}, {4, 5}},               // fewer pairs than one vector
      {{6}, {3}},                      // one row
      {{1, 40, 2, 200}, {40, 1, 200}}, // a long row, per-element
  };
  for (const Case& k : cases) {
    for (bool interleaved : {false, true}) {
      const at::Tensor x = (torch::randn(k.x) * 3).to(dtype);
      const auto [cos, sin] = angle_tables(k.table, dtype);
      check_against_reference(x, cos, sin, interleaved,
                              c10::str(interleaved ? "interleaved " : "rotate-half ", at::IntArrayRef(k.x), " tables ",
                                       at::IntArrayRef(k.table)));
    }
  }
}

// Per-element tables need not be rotations: the composite's x·cos + rot(x)·sin is computed as written.
TEST_P(RotaryEmbeddingTest, PerElementTablesThatAreNotRotations) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  for (bool interleaved : {false, true}) {
    const at::Tensor x = torch::randn({3, 9, 2, 36}).to(dtype);
    const at::Tensor cos = torch::randn({9, 1, 36}).to(dtype), sin = torch::randn({9, 1, 36}).to(dtype);
    check_against_reference(x, cos, sin, interleaved, interleaved ? "interleaved" : "rotate-half");
  }
}

TEST_P(RotaryEmbeddingTest, StridedInputsAndEmpty) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  for (bool interleaved : {false, true}) {
    // q.transpose(1, 2) of [B, T, H, D]: [B, H, T, D], not contiguous.
    const at::Tensor x = torch::randn({2, 11, 3, 32}).to(dtype).transpose(1, 2);
    ASSERT_FALSE(x.is_contiguous());
    // Hugging Face's per-element table cut to its first half: a strided [T, D/2] view.
    const auto [cos_full, sin_full] = angle_tables({11, 32}, dtype);
    const at::Tensor cos = cos_full.narrow(-1, 0, 16), sin = sin_full.narrow(-1, 0, 16);
    ASSERT_FALSE(cos.is_contiguous());
    check_against_reference(x, cos, sin, interleaved, "transposed x, strided tables");
    // Every other element of the last dimension.
    const at::Tensor every_other = torch::randn({5, 4, 40}).to(dtype).slice(-1, 0, 40, 2);
    const auto [c2, s2] = angle_tables({4, 10}, dtype);
    check_against_reference(every_other, c2, s2, interleaved, "last-dimension stride 2");

    for (auto [xs, ts] : std::vector<Case>{{{0, 4, 8}, {4, 4}}, {{2, 0, 8}, {4}}, {{2, 3, 0}, {3, 0}}}) {
      const auto [ec, es] = angle_tables(ts, dtype);
      at::Tensor e = torch::randn(xs).to(dtype).requires_grad_();
      const at::Tensor y = opfuse::rotary_embedding(e, ec, es, interleaved);
      EXPECT_EQ(y.sizes(), e.sizes());
      y.sum().backward();
      EXPECT_EQ(e.grad().sizes(), e.sizes());
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, RotaryEmbeddingTest, every_path_and_dtype(), path_and_dtype_name);

// A float64 gradcheck: the op is linear in x, so its Jacobian is read off the forward (columns,
// f(e_j)) and off the backward (rows, Jᵀe_i); they must agree, and a central difference of
// ⟨dy, f(x)⟩ must match ⟨dx, v⟩.
TEST(RotaryEmbedding, BackwardIsTheForwardsTransposeInFloat64) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  for (bool interleaved : {false, true}) {
    for (int64_t table_width : {5, 10}) {
      const auto [cos, sin] = angle_tables({3, 1, table_width}, torch::kDouble);
      const int64_t n = 2 * 3 * 2 * 10;
      const at::Tensor eye = torch::eye(n, torch::kDouble);
      at::Tensor columns = torch::empty({n, n}, torch::kDouble), rows = torch::empty({n, n}, torch::kDouble);
      for (int64_t j = 0; j < n; ++j) {
        const at::Tensor e = eye[j].view({2, 3, 2, 10});
        columns.select(1, j).copy_(opfuse::rotary_embedding(e, cos, sin, interleaved).reshape(-1));
        at::Tensor x = torch::randn({2, 3, 2, 10}, torch::kDouble).requires_grad_();
        opfuse::rotary_embedding(x, cos, sin, interleaved).backward(e);
        rows.select(0, j).copy_(x.grad().reshape(-1));
      }
      EXPECT_TRUE(torch::allclose(rows, columns, 0, 1e-15)) << (rows - columns).abs().max().item<double>();

      const at::Tensor x = torch::randn({2, 3, 2, 10}, torch::kDouble), v = torch::randn_like(x), dy = torch::randn_like(x);
      at::Tensor xg = x.clone().requires_grad_();
      opfuse::rotary_embedding(xg, cos, sin, interleaved).backward(dy);
      constexpr double eps = 1e-6;
      const double plus = (dy * opfuse::rotary_embedding(x + eps * v, cos, sin, interleaved)).sum().item<double>();
      const double minus = (dy * opfuse::rotary_embedding(x - eps * v, cos, sin, interleaved)).sum().item<double>();
      const double analytic = (xg.grad() * v).sum().item<double>();
      EXPECT_NEAR((plus - minus) / (2 * eps), analytic, 1e-7 * (1 + std::abs(analytic)));
    }
  }
}

TEST(RotaryEmbedding, SameBitsOnEveryPathAndThreadCount) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  for (at::ScalarType dtype : {torch::kFloat, torch::kBFloat16}) {
    for (bool interleaved : {false, true}) {
      // 8192 rows of 64: several parallel_for chunks; 40 pairs: a partial vector per row.
      for (auto [xs, ts] : std::vector<Case>{{{4, 256, 8, 64}, {256, 1, 32}}, {{2, 64, 4, 80}, {64, 1, 40}}}) {
        const at::Tensor x0 = torch::randn(xs).to(dtype), dy = torch::randn(xs).to(dtype);
        const auto [cos, sin] = angle_tables(ts, dtype);
        std::vector<at::Tensor> ys, dxs;
        for (auto cap : capabilities()) {
          for (int threads : {1, 2}) {
            CapabilityScope path(cap);
            ThreadScope scope(threads);
            at::Tensor x = x0.clone().requires_grad_();
            ys.push_back(opfuse::rotary_embedding(x, cos, sin, interleaved));
            ys.back().backward(dy);
            dxs.push_back(x.grad());
          }
        }
        for (size_t i = 1; i < ys.size(); ++i) {
          EXPECT_TRUE(torch::equal(ys[0], ys[i])) << "run " << i << " " << c10::toString(dtype) << interleaved;
          EXPECT_TRUE(torch::equal(dxs[0], dxs[i])) << "run " << i << " " << c10::toString(dtype) << interleaved;
        }
      }
    }
  }
}

// llama2.c's spelling with bfloat16 activations: float tables, x.float() … .type_as(x).
TEST(RotaryEmbedding, FloatTablesForBfloat16) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  for (bool interleaved : {false, true}) {
    const at::Tensor x = torch::randn({2, 9, 3, 16}).to(torch::kBFloat16);
    const auto [cos, sin] = angle_tables({9, 1, 8}, torch::kFloat);
    check_against_reference(x, cos, sin, interleaved, "bfloat16 x, float tables");
  }
}

TEST(RotaryEmbedding, DoubleBackwardRaises) {
  const auto [cos, sin] = angle_tables({4, 3}, torch::kDouble);
  at::Tensor x = torch::randn({2, 4, 6}, torch::kDouble).requires_grad_();
  const auto grads = torch::autograd::grad({opfuse::rotary_embedding(x, cos, sin).pow(2).sum()}, {x}, {}, true, true);
  try {
    grads[0].sum().backward();
    ADD_FAILURE() << "double backward ran";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("opfuse::rotary_embedding_backward is not implemented"), std::string::npos)
        << e.what();
  }
}

void expect_refused(const std::function<void()>& call, const std::string& message) {
  try {
    call();
    ADD_FAILURE() << "accepted; expected: " << message;
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
}

TEST(RotaryEmbedding, BadArgumentsNameTheOp) {
  const at::Tensor x = torch::randn({2, 5, 3, 8});
  at::Tensor cos, sin;
  std::tie(cos, sin) = angle_tables({5, 1, 4}, torch::kFloat);
  expect_refused([&] { opfuse::rotary_embedding(torch::randn({2, 5, 3, 7}), cos, sin); },
                 "opfuse::rotary_embedding: x's last dimension must be even");
  expect_refused([&] { opfuse::rotary_embedding(x, cos.narrow(-1, 0, 3), sin.narrow(-1, 0, 3)); },
                 "cos and sin's last dimension must be 4 (an angle per pair) or 8");
  // [T, D/2] against [B, T, H, D] would pair T with H: refused, not guessed.
  expect_refused([&] { opfuse::rotary_embedding(x, cos.view({5, 4}), sin.view({5, 4})); }, "do not broadcast to x");
  expect_refused([&] { opfuse::rotary_embedding(x, cos, sin.view({5, 4})); }, "cos and sin must have the same shape");
  expect_refused([&] { opfuse::rotary_embedding(x, cos.to(torch::kDouble), sin.to(torch::kDouble)); },
                 "cos and sin must have x's dtype");
  expect_refused([&] { opfuse::rotary_embedding(x, cos.clone().requires_grad_(), sin); },
                 "cos and sin are constant tables and get no gradient");
}

}  // namespace
}  // namespace opfuse::testing::test_rotary_embedding
