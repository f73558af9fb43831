// opfuse::attention against a float64 composite (matmul, scale, mask, softmax, matmul and
// autograd's gradients), on every CPU path and dtype.
//
// Stated bounds, per element, against the magnitude of the terms that make it (|·| taken inside
// every sum: o ~ P·|V|, dv ~ Pᵀ·|dO|, ds ~ P·(|dO|·|V|ᵀ + Σ|dO|·o~), dq ~ scale·ds~·|K|,
// dk ~ scale·ds~ᵀ·|Q|; P the float64 probabilities):
//   float32   ≤ 2e-5 · terms   (scores are D-term float dot products; exp ≤ 2 ulp)
//   float64   ≤ 1e-12 · terms
//   bfloat16  ≤ 1e-2 · terms   (bfloat16 inputs, float arithmetic, each output rounded once)
// An additive mask that requires grad (T5's position bias) gets the scores' gradient ds summed over
// the dimensions it broadcasts along, bounded as ds's terms summed alike.
// Dropout is checked by reproducibility under a seed, by the kept fraction against its binomial
// spread, and by recovering the drawn mask (v = I) and checking the gradients against the
// composite with that mask.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "opfuse/ops.h"
#include "reference.h"

// The file's own namespace: the op tests are compiled a few to a unit.
namespace opfuse::testing::test_attention {
namespace {

double rtol_for(at::ScalarType t) {
  if (t == torch::kDouble) return 1e-12;
  if (t == torch::kBFloat16) return 1e-2;
  return 2e-5;
}

struct Case {
  at::Tensor q, k, v;
  bool causal = false;
  c10::optional<at::Tensor> mask{};
  c10::optional<double> scale{};
  bool mask_grad = false;  // the additive mask requires grad
};

// The float64 composite: its output and its gradients for the output gradient dout; keep (when
// given) multiplies the probabilities, as dropout's mask scaled by 1/(1 − p) does.
struct Reference {
  at::Tensor out, dq, dk, dv, dmask, out_terms, dq_terms, dk_terms, dv_terms, dmask_terms;
};

Reference reference(const Case& c, const at::Tensor& dout, const at::Tensor& keep = {}) {
  auto d = [](const at::Tensor& t) { return t.detach().to(torch::kDouble); };
  at::Tensor q = d(c.q).requires_grad_(), k = d(c.k).requires_grad_(), v = d(c.v).requires_grad_();
  const double scale = c.scale ? *c.scale : 1 / std::sqrt(double(c.q.size(-1)));
  at::Tensor s = torch::matmul(q, k.transpose(-2, -1)) * scale;
  const int64_t T = s.size(-2), S = s.size(-1);
  at::Tensor mask = c.mask ? d(*c.mask).requires_grad_(c.mask_grad) : at::Tensor();
  if (c.mask) s = c.mask->scalar_type() == torch::kBool ? s.masked_fill(c.mask->logical_not(), -INFINITY) : s + mask;
  if (c.causal) s = s.masked_fill(torch::ones({T, S}, torch::kBool).triu(1), -INFINITY);
  const at::Tensor p = torch::softmax(s, -1);
  const at::Tensor pd = keep.defined() ? p * d(keep) : p;
  Reference r;
  r.out = torch::matmul(pd, v);
  const at::Tensor g = d(dout);
  r.out.backward(g);
  r.dq = q.grad(), r.dk = k.grad(), r.dv = v.grad();
  const at::Tensor P = pd.detach().abs(), P0 = p.detach();
  const at::Tensor av = v.detach().abs(), ag = g.abs();
  r.out_terms = torch::matmul(P, av);
  r.dv_terms = torch::matmul(P.transpose(-2, -1), ag);
  const at::Tensor delta_terms = (ag * r.out_terms).sum(-1, true);
  const at::Tensor zeta = keep.defined() ? d(keep).abs() : torch::ones_like(P0);
  const at::Tensor ds_terms = P0 * (torch::matmul(ag, av.transpose(-2, -1)) * zeta + delta_terms);
  if (c.mask_grad) r.dmask = mask.grad(), r.dmask_terms = ds_terms.sum_to_size(mask.sizes()) + r.dmask.abs();
  r.dq_terms = scale * torch::matmul(ds_terms, k.detach().abs()) + r.dq.abs();
  r.dk_terms = scale * torch::matmul(ds_terms.transpose(-2, -1), q.detach().abs()) + r.dk.abs();
  r.out_terms = r.out_terms + r.out.detach().abs();
  r.dv_terms = r.dv_terms + r.dv.abs();
  return r;
}

struct Result {
  at::Tensor out, dq, dk, dv, dmask;
};

// seed (when given) seeds torch's generator just before the call, so dropout draws its mask from it.
Result run(const Case& c, const at::Tensor& dout, double dropout_p = 0, c10::optional<uint64_t> seed = {}) {
  if (seed) torch::manual_seed(*seed);
  at::Tensor q = c.q.detach().requires_grad_(), k = c.k.detach().requires_grad_(), v = c.v.detach().requires_grad_();
  c10::optional<at::Tensor> mask = c.mask;
  if (c.mask_grad) mask = c.mask->detach().requires_grad_();
  at::Tensor out = opfuse::attention(q, k, v, c.causal, c.scale, mask, dropout_p);
  out.backward(dout);
  return {out.detach(), q.grad(), k.grad(), v.grad(), c.mask_grad ? mask->grad() : at::Tensor()};
}

void check(const Case& c, const std::string& what, const at::Tensor& keep = {}, double dropout_p = 0,
           c10::optional<uint64_t> seed = {}) {
  const at::ScalarType dtype = c.q.scalar_type();
  auto out_shape = c.q.sizes().vec();
  out_shape.back() = c.v.size(-1);
  const at::Tensor dout = torch::randn(out_shape).to(dtype);
  const Result got = run(c, dout, dropout_p, seed);
  const Reference ref = reference(c, dout, keep);
  ASSERT_EQ(got.out.scalar_type(), dtype);
  const double rtol = rtol_for(dtype);
  expect_close(got.out, ref.out.detach(), rtol * ref.out_terms, what + " out");
  expect_close(got.dq, ref.dq, rtol * ref.dq_terms, what + " dq");
  expect_close(got.dk, ref.dk, rtol * ref.dk_terms, what + " dk");
  expect_close(got.dv, ref.dv, rtol * ref.dv_terms, what + " dv");
  if (c.mask_grad) {
    ASSERT_TRUE(got.dmask.defined()) << what << ": the mask got no gradient";
    EXPECT_EQ(got.dmask.scalar_type(), c.mask->scalar_type());
    expect_close(got.dmask, ref.dmask, rtol * ref.dmask_terms, what + " dmask");
  }
}

Case random_case(std::vector<int64_t> q_shape, int64_t S, int64_t Dv, at::ScalarType dtype) {
  auto k_shape = q_shape, v_shape = q_shape;
  k_shape[k_shape.size() - 2] = S;
  v_shape[v_shape.size() - 2] = S, v_shape.back() = Dv;
  return {torch::randn(q_shape).to(dtype), torch::randn(k_shape).to(dtype), torch::randn(v_shape).to(dtype)};
}

class AttentionTest : public PathAndDtypeTest {};

TEST_P(AttentionTest, MatchesFloat64CompositeOnFreshRandomData) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  // Rows and keys not multiples of a tile or a vector; several tiles; head dims 32–128; from
  // T = 512 on, 128 × 128 tiles.
  const std::vector<std::vector<int64_t>> shapes{{2, 3, 77, 48}, {1, 2, 130, 64}, {2, 1, 40, 128}, {1, 1, 530, 32}};
  for (bool causal : {false, true})
    for (const auto& shape : shapes) {
      Case c = random_case(shape, shape[2], shape[3], dtype);
      c.causal = causal;
      check(c, c10::str(at::IntArrayRef(shape), " causal=", causal));
    }
  // More keys than queries, Dv ≠ D, an explicit scale, and the [B·H, T, D] form.
  Case cross = random_case({2, 2, 5, 32}, 200, 40, dtype);
  cross.scale = 0.3;
  check(cross, "cross attention");
  check(random_case({6, 33, 16}, 33, 16, dtype), "[B·H, T, D]");
  // Empty: no queries, no keys.
  check(random_case({1, 2, 0, 16}, 5, 16, dtype), "T = 0");
  check(random_case({1, 2, 5, 16}, 0, 16, dtype), "S = 0");
}

TEST_P(AttentionTest, BooleanAndAdditiveMasks) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  const int64_t T = 70, S = 90;
  // Every row keeps its first key, so no row is masked whole.
  at::Tensor keep = torch::rand({T, S}) > 0.4;
  keep.select(1, 0).fill_(true);
  Case b = random_case({2, 3, T, 32}, S, 32, dtype);
  b.mask = keep;
  check(b, "bool mask [T, S]");
  b.causal = true;
  check(b, "bool mask and causal");
  Case a = random_case({2, 3, T, 32}, S, 32, dtype);
  a.mask = torch::randn({2, 1, T, S}) * 2;
  check(a, "additive mask [B, 1, T, S]");
}

// T5 adds a trained position bias [1, H, T, S] (plus the padding mask [B, 1, 1, S]) to unscaled
// scores: the bias gets ds summed over the batch. Also a mask per sample and one [T, S] for all.
TEST_P(AttentionTest, AnAdditiveMaskThatRequiresGradGetsTheScoresGradient) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  const int64_t B = 2, H = 3, T = 70, S = 90;
  for (bool causal : {false, true})
    for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{1, H, T, S}, {B, H, T, S}, {T, S}}) {
      Case c = random_case({B, H, T, 32}, S, 32, dtype);
      c.causal = causal, c.scale = 1.0, c.mask = (torch::randn(shape) * 2).to(dtype), c.mask_grad = true;
      check(c, c10::str("mask ", at::IntArrayRef(shape), " causal=", causal));
    }
  Case heads = random_case({6, 33, 16}, 33, 16, dtype);
  heads.mask = torch::randn({6, 33, 33}).to(dtype), heads.mask_grad = true;
  check(heads, "[B·H, T, D] and a mask [B·H, T, S]");
}

// Padding masks add a large finite value (−1e9, finfo.min) rather than −inf, and a padded query
// row is then masked whole: every score of it sits near that value, which absorbs the scores
// (softmax is uniform over the row, in float64 too at −1e30) and absorbed log l when the
// backward kept only m + log l. Those rows' gradients were then off by O(1).
TEST_P(AttentionTest, RowsMaskedWholeByAFiniteValue) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  const int64_t T = 70, S = 70;
  at::Tensor mask = torch::zeros({2, 1, T, S});
  mask.select(0, 0).narrow(1, 0, 5).fill_(-1e30);       // sample 0's first 5 rows: masked whole
  mask.select(0, 1).narrow(2, 0, 20).fill_(-1e30);      // sample 1's first 20 keys: padding
  Case c = random_case({2, 3, T, 32}, S, 32, dtype);
  c.mask = mask;
  check(c, "rows masked whole by -1e30");
  c.causal = true;
  check(c, "padding and causal");
}

// minGPT's mask: a registered tril [1, 1, 128, 128] sliced to T. Exactly causal, so it runs as
// causal (the same bits as causal=true); one key more or less and it is a mask like any other.
TEST_P(AttentionTest, AnExactlyCausalMaskRunsAsCausal) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  const int64_t T = 70;
  const at::Tensor bias = torch::ones({128, 128}).tril().view({1, 1, 128, 128});
  Case c = random_case({2, 3, T, 32}, T, 32, dtype);
  c.mask = bias.slice(2, 0, T).slice(3, 0, T) != 0;
  check(c, "tril mask");
  const at::Tensor dout = torch::randn({2, 3, T, 32}).to(dtype);
  const Result masked = run(c, dout);
  Case causal = c;
  causal.mask = c10::nullopt;
  causal.causal = true;
  const Result plain = run(causal, dout);
  EXPECT_TRUE(torch::equal(masked.out, plain.out) && torch::equal(masked.dq, plain.dq) &&
              torch::equal(masked.dk, plain.dk) && torch::equal(masked.dv, plain.dv));
  at::Tensor almost = c.mask->clone();
  almost.index_put_({0, 0, 40, 41}, true);  // one key past the diagonal
  c.mask = almost;
  check(c, "tril mask but one key");
}

TEST_P(AttentionTest, StridedInputs) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  // minGPT's layout: one [B, T, 3·C] projection split and viewed as heads.
  const int64_t B = 2, T = 67, H = 3, D = 32;
  const at::Tensor qkv = torch::randn({B, T, 3 * H * D}).to(dtype);
  auto head = [&](int64_t i) { return qkv.narrow(2, i * H * D, H * D).view({B, T, H, D}).transpose(1, 2); };
  Case c{head(0), head(1), head(2), true};
  ASSERT_FALSE(c.q.is_contiguous());
  check(c, "split qkv");
  // Last dimension not unit-stride.
  Case t{torch::randn({B, H, D, T}).to(dtype).transpose(-1, -2), torch::randn({B, H, T, D}).to(dtype),
         torch::randn({B, H, D, T}).to(dtype).transpose(-1, -2)};
  check(t, "transposed q and v");
}

TEST_P(AttentionTest, DropoutIsReproducibleAndMatchesItsMask) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  const double p = 0.3;
  const int64_t B = 2, H = 2, T = 75, S = 75;
  Case c = random_case({B, H, T, 32}, S, 32, dtype);
  c.causal = true;
  const at::Tensor dout = torch::randn({B, H, T, 32}).to(dtype);
  const uint64_t seed = torch::randint(1 << 30, {1}).item<int64_t>();
  const Result first = run(c, dout, p, seed);
  const Result again = run(c, dout, p, seed);
  EXPECT_TRUE(torch::equal(first.out, again.out) && torch::equal(first.dq, again.dq) &&
              torch::equal(first.dk, again.dk) && torch::equal(first.dv, again.dv))
      << "the same seed must give the same mask, forward and backward";
  const Result other = run(c, dout, p);
  EXPECT_FALSE(torch::equal(first.out, other.out)) << "a new draw must give a new mask";

  // v = I makes the output the dropped probabilities themselves: its zeros are the mask.
  torch::manual_seed(seed);
  const at::Tensor eye = torch::eye(S).to(dtype).expand({B, H, S, S});
  const at::Tensor dropped = opfuse::attention(c.q, c.k, eye, true, c10::nullopt, c10::nullopt, p);
  const at::Tensor causal = torch::ones({T, S}, torch::kBool).tril();
  const at::Tensor kept = (dropped != 0) & causal;
  const double n = causal.sum().item<double>() * B * H, fraction = kept.sum().item<double>() / n;
  EXPECT_NEAR(fraction, 1 - p, 5 * std::sqrt(p * (1 - p) / n)) << "kept fraction of " << n << " probabilities";

  const at::Tensor keep = kept.to(torch::kDouble) / (1 - p);
  check(c, "dropout with its recovered mask", keep, p, seed);
  // The mask is drawn by place, whatever is added to the scores: T5's trained bias under dropout.
  c.mask = (torch::randn({1, H, T, S}) * 2).to(dtype), c.mask_grad = true;
  check(c, "dropout and a mask that requires grad", keep, p, seed);
}

TEST_P(AttentionTest, SameBitsForAnyThreadCount) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  Case c = random_case({2, 3, 100, 32}, 100, 32, dtype);
  c.causal = true;
  const at::Tensor dout = torch::randn({2, 3, 100, 32}).to(dtype);
  Result one, two;
  {
    ThreadScope threads(1);
    one = run(c, dout);
  }
  {
    ThreadScope threads(2);
    two = run(c, dout);
  }
  EXPECT_TRUE(torch::equal(one.out, two.out) && torch::equal(one.dq, two.dq) && torch::equal(one.dk, two.dk) &&
              torch::equal(one.dv, two.dv));
}

INSTANTIATE_TEST_SUITE_P(Ops, AttentionTest, every_path_and_dtype(), path_and_dtype_name);

TEST(Attention, ClearErrors) {
  const at::Tensor q = torch::randn({2, 3, 8, 16}), k = torch::randn({2, 3, 9, 16}), v = torch::randn({2, 3, 9, 16});
  expect_error([&] { opfuse::attention(q, k.narrow(-1, 0, 8), v); }, "k's last dimension");
  expect_error([&] { opfuse::attention(q, k, v.to(torch::kDouble)); }, "one dtype");
  expect_error([&] { opfuse::attention(q, k, v, false, c10::nullopt, torch::ones({8, 5}, torch::kBool)); },
               "does not broadcast");
  expect_error([&] { opfuse::attention(q, k, v, false, c10::nullopt, c10::nullopt, 1.5); }, "dropout_p");
  expect_error([&] { opfuse::attention(q[0], k[0], v[0], false, c10::nullopt, torch::zeros({1, 1, 8, 9})); },
               "more dimensions than q");
  // A mask changed in place between forward and backward is named, as autograd names any saved input.
  const at::Tensor bias = torch::zeros({8, 9}).requires_grad_();
  at::Tensor biased = bias * 1;
  const at::Tensor attended = opfuse::attention(q.clone().requires_grad_(), k, v, false, c10::nullopt, biased);
  biased.add_(1);
  expect_error([&] { attended.sum().backward(); }, "modified by an inplace operation");
  // The backward has no derivative of its own (autograd's fallback throws a std::runtime_error).
  at::Tensor qr = q.clone().requires_grad_();
  const at::Tensor out = opfuse::attention(qr, k, v);
  try {
    const auto grads = torch::autograd::grad({out.sum()}, {qr}, {}, true, true);
    grads[0].sum().backward();
    ADD_FAILURE() << "double backward ran";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("opfuse::attention_backward is not implemented"), std::string::npos);
  }
}

}  // namespace
}  // namespace opfuse::testing::test_attention
