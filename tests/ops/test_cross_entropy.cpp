// opfuse::cross_entropy and opfuse::linear_cross_entropy against torch's F.cross_entropy
// (at::cross_entropy_loss, and at::linear before it) in float64, on every CPU path.
//
// Stated bounds. For row r with logits x (the double reference's), m = max_j x_j, r_j = |x_j − m|,
// p = softmax(x), R = Σ_j p_j·r_j, c the reduction's scale (1/valid rows for mean, else 1), dy
// the loss's gradient, and u the unit roundoff of the accumulation type (2^-24 float, 2^-53
// double), κ the exp's bound (2 ulp = 2^-22 float; (V + 8)·2^-53 double, the double sum of V
// terms included):
//   loss_r      ≤ 2·(κ + u·R)                          (lse from float exps summed in double)
//   dlogits_rj  ≤ |dy|·(c·p_j·(2κ + 2u + u·(r_j + R)) + u·|g_j| + 2u·c·(s/V + (1 − s)·[j = t]))
//                + u·|dy·g_j|   (the exp's error, x_j − m rounded, c/Σe and the fma rounded, the
//                label smoothing's constants rounded, then the scaling)
// the reductions add their rows' bounds (mean: divided by the valid rows), and the loss is
// rounded to its dtype (u_out·|loss|: 2^-24 float32, 2^-53 float64). bfloat16 is that computed
// in float, then the loss rounded once (2^-8·|loss|) and the gradient twice (stored, then
// scaled: 2·2^-8·|dlogits|). The float64 reference has rounding errors of its own, which matter
// against float64: for the loss Σ_r |loss_r|·rows·2^-53, for the gradient
// (c·p_j·(2 + |x_j| + |lse|) + 2·|g_j|)·|dy|·2^-53 (p from exp(x − lse) with lse rounded).
// linear_cross_entropy adds the matmuls' rounding, bounded as a K-term sum (γ_K = K·u) of the
// products' magnitudes: the logits z = h·Wᵀ within δz = γ_H·|h|·|W|ᵀ, which moves the loss by
// ≤ 3·max_j δz_j and the gradient wrt z by c·p_j·(δz_j + Σ_k p_k·δz_k); grad_h = g·W and
// grad_W = gᵀ·h then carry that through |W| and |h| plus γ_V·|g|·|W| and γ_N·|g|ᵀ·|h|.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "opfuse/ops.h"
#include "reference.h"

// The file's own namespace: the op tests are compiled a few to a unit.
namespace opfuse::testing::test_cross_entropy {
namespace {

constexpr int64_t kNone = 0, kMean = 1, kSum = 2;

double exp_bound(at::ScalarType t, int64_t classes) {
  return t == torch::kDouble ? double(classes + 8) * std::ldexp(1.0, -53) : std::ldexp(1.0, -22);
}

// Random targets with about a quarter of the rows ignored.
at::Tensor targets(at::IntArrayRef rows, int64_t classes, int64_t ignore_index) {
  at::Tensor t = torch::randint(classes, rows, torch::kLong);
  return torch::where(torch::rand(rows) < 0.25, torch::full(rows, ignore_index, torch::kLong), t);
}

struct Case {
  int64_t ignore_index = -100, reduction = kMean;
  double smoothing = 0;
  std::string name() const {
    return c10::str("reduction ", reduction, ", label_smoothing ", smoothing, ", ignore_index ", ignore_index);
  }
};

std::vector<Case> every_case() {
  std::vector<Case> cases;
  for (int64_t reduction : {kNone, kMean, kSum})
    for (double smoothing : {0.0, 0.1})
      for (int64_t ignore_index : {int64_t{-100}, int64_t{2}}) cases.push_back({ignore_index, reduction, smoothing});
  return cases;
}

// The loss's gradient: random (or exactly 1, loss.backward()'s), a scalar or one per row.
at::Tensor loss_gradient(const at::Tensor& loss, bool one) {
  return one ? torch::ones_like(loss) : (torch::randn(loss.sizes()) * 2).to(loss.scalar_type());
}

// The error bounds above, per row (loss) and per logit (gradient before dy), from the double
// reference's logits [rows, V] and targets [rows].
struct CrossEntropyBounds {
  at::Tensor loss_rows, grad;  // [rows], [rows, V]
};

CrossEntropyBounds cross_entropy_bounds(const at::Tensor& xd, const at::Tensor& target, const Case& k, double c,
                                        at::ScalarType dtype) {
  const int64_t classes = xd.size(-1);
  const double u = unit_roundoff(dtype), kappa = exp_bound(dtype, classes);
  const at::Tensor r = (xd - std::get<0>(xd.max(-1, true))).abs();
  const at::Tensor p = torch::softmax(xd, -1);
  const at::Tensor R = (p * r).sum(-1, true);
  const at::Tensor valid = (target != k.ignore_index).to(torch::kDouble).unsqueeze(-1);
  const at::Tensor onehot =
      torch::zeros_like(xd).scatter_(-1, torch::where(target == k.ignore_index, 0, target).unsqueeze(-1), 1.0);
  const at::Tensor g = c * (p - (1 - k.smoothing) * onehot - k.smoothing / classes) * valid;
  const at::Tensor lse = torch::logsumexp(xd, -1, true);
  const double v = std::ldexp(1.0, -53);  // the reference's own roundings
  // the smoothing's constants (s/V, and 1 − s at the target) are rounded, and so is their product
  // with c: an error of their size, which p − s/V may cancel down to far less
  const at::Tensor smoothing_terms = c * (k.smoothing / classes + (1 - k.smoothing) * onehot);
  const at::Tensor grad = (c * p * (2 * kappa + 2 * u + u * (r + R)) + 3 * u * g.abs() + 2 * u * smoothing_terms +
                           v * (c * p * (2 + xd.abs() + lse.abs()) + 2 * g.abs())) *
                          valid;
  return {(2 * (kappa + u * R) * valid).squeeze(-1), grad};
}

// The reduced bound of the per-row bounds, and of the bfloat16 rounding of the result.
at::Tensor reduced(const at::Tensor& rows, int64_t reduction, double valid) {
  if (reduction == kNone) return rows;
  const at::Tensor sum = rows.sum();
  return reduction == kMean ? sum / valid : sum;
}

// The loss's bound: its rows' (reduced), the output's rounding, the reference's own summation.
at::Tensor loss_bound(const at::Tensor& rows_bound, const Case& k, const at::Tensor& xd, const at::Tensor& target,
                      double valid, const at::Tensor& reference, at::ScalarType dtype) {
  const double u_out = dtype == torch::kBFloat16 ? std::ldexp(1.0, -8) : unit_roundoff(dtype);
  const at::Tensor row_losses = at::cross_entropy_loss(xd, target, {}, kNone, k.ignore_index, k.smoothing).abs();
  const double rows = double(target.numel());
  const at::Tensor summed = reduced(row_losses * rows, k.reduction, valid) * std::ldexp(1.0, -53);
  return reduced(rows_bound, k.reduction, valid) + u_out * reference.detach().abs() + summed + 1e-300;
}

double valid_rows(const at::Tensor& target, int64_t ignore_index) {
  return double((target != ignore_index).sum().item<int64_t>());
}

// c; every row ignored (NaN mean), no row has a gradient to bound.
double scale_of(int64_t reduction, double valid) { return reduction != kMean ? 1 : valid > 0 ? 1 / valid : 0; }

void check_cross_entropy(const at::Tensor& logits_in, const at::Tensor& target, const Case& k, bool unit_gradient,
                         const std::string& what) {
  const at::ScalarType dtype = logits_in.scalar_type();
  const int64_t classes = logits_in.size(-1);
  at::Tensor logits = logits_in.detach().requires_grad_();
  const at::Tensor loss = opfuse::cross_entropy(logits, target, k.ignore_index, k.reduction, k.smoothing);
  ASSERT_EQ(loss.scalar_type(), dtype) << what;
  const at::Tensor dy = loss_gradient(loss, unit_gradient);
  loss.backward(dy);

  const at::Tensor xd = logits_in.detach().to(torch::kDouble).reshape({-1, classes}).requires_grad_();
  const at::Tensor t = target.reshape({-1});
  const at::Tensor ld = at::cross_entropy_loss(xd, t, {}, k.reduction, k.ignore_index, k.smoothing);
  const at::Tensor dyd = dy.to(torch::kDouble).reshape(ld.sizes());
  ld.backward(dyd);

  const double valid = valid_rows(t, k.ignore_index), c = scale_of(k.reduction, valid);
  const CrossEntropyBounds b = cross_entropy_bounds(xd.detach(), t, k, c, dtype);
  const double s = storage_roundoff(dtype);
  const at::Tensor dy_rows = k.reduction == kNone ? dyd.abs().unsqueeze(-1) : dyd.abs();
  const at::Tensor dx_ref = xd.grad();
  expect_close(loss.reshape(ld.sizes()), ld.detach(), loss_bound(b.loss_rows, k, xd.detach(), t, valid, ld, dtype),
               what + " loss");
  expect_close(logits.grad().reshape({-1, classes}), dx_ref, dy_rows * b.grad + 2 * s * dx_ref.abs() + 1e-300,
               what + " dlogits");
}

class CrossEntropyTest : public PathAndDtypeTest {};

TEST_P(CrossEntropyTest, MatchesFloat64ReferenceOnFreshRandomData) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  // Llama's vocabulary, rows not a multiple of any vector, [B, T, V], one class.
  for (auto shape : std::vector<std::vector<int64_t>>{{6, 32000}, {9, 77}, {2, 5, 33}, {4, 1}}) {
    const int64_t classes = shape.back();
    const at::Tensor logits = (torch::randn(shape) * 3 + 1).to(dtype);
    for (const Case& k : every_case()) {
      const at::Tensor target = targets(at::IntArrayRef(shape).slice(0, shape.size() - 1), classes, k.ignore_index);
      for (bool one : {false, true})
        check_cross_entropy(logits, target, k, one,
                            c10::str("shape ", at::IntArrayRef(shape), ", ", k.name(), one ? ", dy 1" : ""));
    }
  }
}

TEST_P(CrossEntropyTest, StridedLogits) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  const Case k{-100, kMean, 0.1};
  const at::Tensor wide = (torch::randn({12, 150}) * 2).to(dtype);
  const at::Tensor sliced = wide.slice(1, 0, 131);
  ASSERT_FALSE(sliced.is_contiguous());
  check_cross_entropy(sliced, targets({12}, 131, -100), k, false, "a slice of a wider matrix");
  check_cross_entropy(wide.slice(0, 0, 12, 3), targets({4}, 150, -100), k, false, "every third row");
  check_cross_entropy(wide.t(), targets({150}, 12, -100), k, false, "transposed");
  check_cross_entropy(wide.slice(0, 0, 1).expand({5, 150}), targets({5}, 150, -100), {-100, kNone, 0}, false,
                      "one row broadcast");
  check_cross_entropy(torch::randn({3, 4, 40}).to(dtype).transpose(0, 1), targets({4, 3}, 40, -100), k, false,
                      "[T, B, V] seen as [B, T, V]");
}

INSTANTIATE_TEST_SUITE_P(Ops, CrossEntropyTest, every_path_and_dtype(), path_and_dtype_name);

TEST(CrossEntropy, EveryRowIgnoredGivesTorchsNanMeanAndZeroGradient) {
  at::Tensor x = torch::randn({3, 7}).requires_grad_();
  const at::Tensor t = torch::full({3}, -100, torch::kLong);
  const at::Tensor loss = opfuse::cross_entropy(x, t);
  EXPECT_TRUE(std::isnan(loss.item<double>()));
  EXPECT_TRUE(std::isnan(at::cross_entropy_loss(x.detach(), t).item<double>()));
  loss.backward();
  EXPECT_TRUE(torch::equal(x.grad(), torch::zeros_like(x)));
  EXPECT_EQ(opfuse::cross_entropy(x, t, -100, kSum).item<double>(), 0);
}

TEST(CrossEntropy, GradientMatchesFiniteDifferencesInFloat64) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  for (const Case& k : every_case()) {
    const at::Tensor t = torch::tensor({1, 2, 0, 4}, torch::kLong);
    at::Tensor x = torch::randn({4, 5}, torch::kDouble).requires_grad_();
    const at::Tensor loss = opfuse::cross_entropy(x, t, k.ignore_index, k.reduction, k.smoothing);
    const at::Tensor g = torch::randn(loss.sizes(), torch::kDouble);
    loss.backward(g);
    auto f = [&](const at::Tensor& xv) {
      return (opfuse::cross_entropy(xv, t, k.ignore_index, k.reduction, k.smoothing) * g).sum().item<double>();
    };
    const double h = 1e-6;
    for (int64_t i = 0; i < x.numel(); ++i) {
      at::Tensor xp = x.detach().clone().reshape({-1}), xm = xp.clone();
      xp[i] += h;
      xm[i] -= h;
      const double numeric = (f(xp.reshape(x.sizes())) - f(xm.reshape(x.sizes()))) / (2 * h);
      EXPECT_NEAR(x.grad().reshape({-1})[i].item<double>(), numeric, 1e-8 * (1 + std::abs(numeric))) << k.name();
    }
  }
}

TEST(CrossEntropy, RetainedGraphGivesTheSameGradientTwice) {
  at::Tensor x = torch::randn({5, 9}).requires_grad_();
  const at::Tensor t = torch::randint(9, {5}, torch::kLong);
  const at::Tensor loss = opfuse::cross_entropy(x, t, -100, kSum, 0.05);
  loss.backward(torch::tensor(3.0), /*retain_graph=*/true);
  const at::Tensor first = x.grad().clone();
  loss.backward(torch::tensor(3.0));
  EXPECT_TRUE(torch::allclose(x.grad(), 2 * first, 0, 0)) << "the saved gradient was scaled twice";
}

TEST(CrossEntropy, WithoutGradientOnlyTheLoss) {
  const at::Tensor x = torch::randn({4, 30}), t = torch::randint(30, {4}, torch::kLong);
  at::Tensor xg = x.clone().requires_grad_();
  const at::Tensor with_grad = opfuse::cross_entropy(xg, t);
  EXPECT_TRUE(with_grad.requires_grad());
  at::Tensor without;
  {
    torch::NoGradGuard no_grad;
    without = opfuse::cross_entropy(xg, t);
  }
  EXPECT_FALSE(without.requires_grad());
  EXPECT_TRUE(torch::equal(with_grad.detach(), without));
  EXPECT_TRUE(torch::equal(opfuse::cross_entropy(x, t), without));
}

TEST(CrossEntropy, OneThreadEqualsTwoThreads) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  const at::Tensor x0 = torch::randn({64, 3000}), t = torch::randint(3000, {64}, torch::kLong);
  std::vector<at::Tensor> out;
  for (int threads : {1, 2}) {
    ThreadScope scope(threads);
    at::Tensor x = x0.clone().requires_grad_();
    const at::Tensor loss = opfuse::cross_entropy(x, t, -100, kMean, 0.1);
    loss.backward(torch::tensor(0.7));
    out.push_back(loss.detach());
    out.push_back(x.grad());
  }
  EXPECT_TRUE(torch::equal(out[0], out[2]));
  EXPECT_TRUE(torch::equal(out[1], out[3]));
}

// The gradient of a gradient would need the logits, which are not kept: a backward that builds
// a graph (create_graph) raises at once rather than return a gradient without one.
void expect_double_backward_raises(const at::Tensor& loss, const at::Tensor& input, const std::string& op) {
  try {
    const auto grads = torch::autograd::grad({loss}, {input}, {}, /*retain_graph=*/true, /*create_graph=*/true);
    ADD_FAILURE() << "create_graph ran; its gradient " << (grads[0].requires_grad() ? "has" : "lacks") << " a graph";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(op + ": double backward (create_graph=True) is not implemented"),
              std::string::npos)
        << e.what();
  }
}

TEST(CrossEntropy, DoubleBackwardRaises) {
  at::Tensor x = torch::randn({2, 8}, torch::kDouble).requires_grad_();
  expect_double_backward_raises(opfuse::cross_entropy(x, torch::tensor({1, 3}, torch::kLong)), x,
                                "opfuse::cross_entropy");
}

TEST(CrossEntropy, BadArgumentsNameTheOpAndTheProblem) {
  const at::Tensor x = torch::randn({3, 5}), t = torch::tensor({0, 4, 2}, torch::kLong);
  auto says = [](const std::function<void()>& f, const std::string& part) {
    const std::string m = error_message(f);
    EXPECT_NE(m.find("opfuse::cross_entropy"), std::string::npos) << m;
    EXPECT_NE(m.find(part), std::string::npos) << m;
  };
  says([&] { opfuse::cross_entropy(x, t.to(torch::kInt)); }, "int64");
  says([&] { opfuse::cross_entropy(x, torch::tensor({0, 1}, torch::kLong)); }, "target must be [3]");
  says([&] { opfuse::cross_entropy(x, torch::tensor({0, 5, 1}, torch::kLong)); }, "target 5 (row 1) is out of range");
  says([&] { opfuse::cross_entropy(x, torch::tensor({0, -1, 1}, torch::kLong)); }, "target -1 (row 1)");
  says([&] { opfuse::cross_entropy(x, t, -100, 3); }, "reduction");
  says([&] { opfuse::cross_entropy(x, t, -100, kMean, 1.5); }, "label_smoothing");
  says([&] { opfuse::cross_entropy(x.to(torch::kInt), t); }, "float32");
  says([&] { opfuse::cross_entropy(torch::randn({3, 0}), t); }, "at least one class");
}

// linear_cross_entropy ------------------------------------------------------------------------

// |a|·|b|ᵀ in double, the magnitudes a matmul's rounding is bounded by.
at::Tensor abs_mm(const at::Tensor& a, const at::Tensor& b) { return torch::mm(a.abs(), b.abs()); }

void check_linear(const at::Tensor& h_in, const at::Tensor& w_in, const at::Tensor& target, const Case& k,
                  const std::string& what) {
  const at::ScalarType dtype = h_in.scalar_type();
  const int64_t hidden = h_in.size(-1), classes = w_in.size(0);
  at::Tensor h = h_in.detach().requires_grad_(), w = w_in.detach().requires_grad_();
  const at::Tensor loss = opfuse::linear_cross_entropy(h, w, target, k.ignore_index, k.reduction, k.smoothing);
  ASSERT_EQ(loss.scalar_type(), dtype) << what;
  const at::Tensor dy = loss_gradient(loss, false);
  loss.backward(dy);

  const at::Tensor hd = h_in.detach().to(torch::kDouble).reshape({-1, hidden}).requires_grad_();
  const at::Tensor wd = w_in.detach().to(torch::kDouble).requires_grad_();
  const at::Tensor t = target.reshape({-1});
  const at::Tensor zd = at::linear(hd, wd);
  const at::Tensor ld = at::cross_entropy_loss(zd, t, {}, k.reduction, k.ignore_index, k.smoothing);
  const double dyd = dy.item<double>();
  ld.backward(dy.to(torch::kDouble));

  const double valid = valid_rows(t, k.ignore_index), c = scale_of(k.reduction, valid);
  const double u = unit_roundoff(dtype), s = storage_roundoff(dtype);
  const int64_t rows = t.numel();
  const at::Tensor z = zd.detach(), hv = hd.detach(), wv = wd.detach();
  // the logits' rounding, ours and the reference's (each a K-term sum: γ_K = K·u)
  const at::Tensor dz = 2 * double(hidden) * u * abs_mm(hv, wv.t());
  const at::Tensor p = torch::softmax(z, -1);
  const at::Tensor valid_rows_mask = (t != k.ignore_index).to(torch::kDouble).unsqueeze(-1);
  const CrossEntropyBounds b = cross_entropy_bounds(z, t, k, c, dtype);
  const at::Tensor loss_rows = b.loss_rows + 3 * std::get<0>(dz.max(-1)) * valid_rows_mask.squeeze(-1);
  const at::Tensor g_tol = b.grad + c * p * (dz + (p * dz).sum(-1, true)) * valid_rows_mask;
  const at::Tensor g_abs = c * (p + 1) * valid_rows_mask;  // |g| ≤ c·(p + (1 − ε)·[j = t] + ε/V)
  const at::Tensor dh_tol =
      std::abs(dyd) * (torch::mm(g_tol, wv.abs()) + 2 * double(classes) * u * torch::mm(g_abs, wv.abs()));
  const at::Tensor dw_tol =
      std::abs(dyd) * (torch::mm(g_tol.t(), hv.abs()) + 2 * double(rows) * u * torch::mm(g_abs.t(), hv.abs()));

  expect_close(loss, ld.detach(), loss_bound(loss_rows, k, z, t, valid, ld, dtype), what + " loss");
  expect_close(h.grad().reshape({-1, hidden}), hd.grad(), dh_tol + (u + 2 * s) * hd.grad().abs() + 1e-300,
               what + " grad_h");
  expect_close(w.grad(), wd.grad(), dw_tol + (u + 2 * s) * wd.grad().abs() + 1e-300, what + " grad_weight");
}

class LinearCrossEntropyTest : public PathAndDtypeTest {};

TEST_P(LinearCrossEntropyTest, MatchesFloat64ReferenceOnFreshRandomData) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  struct Shape {
    std::vector<int64_t> h;
    int64_t classes;
  };
  // Small and odd sizes, h [B, T, H]: one chunk each (see RowsInChunksOf… for several).
  for (const Shape& shape : std::vector<Shape>{{{9, 13}, 77}, {{2, 5, 16}, 40}, {{33, 8}, 1000}}) {
    const int64_t hidden = shape.h.back();
    const at::Tensor h = torch::randn(shape.h).to(dtype);
    const at::Tensor w = (torch::randn({shape.classes, hidden}) / std::sqrt(double(hidden)) * 3).to(dtype);
    const at::IntArrayRef rows = at::IntArrayRef(shape.h).slice(0, shape.h.size() - 1);
    for (const Case& k : every_case()) {
      if (k.reduction == kNone) continue;
      check_linear(h, w, targets(rows, shape.classes, k.ignore_index), k,
                   c10::str("h ", h.sizes(), ", weight ", w.sizes(), ", ", k.name()));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, LinearCrossEntropyTest, every_path_and_dtype(), path_and_dtype_name);

// 100 rows of a 128000 vocabulary (Llama 3's): chunks of 98 rows, the last of 2. The chunk loop
// is the same on every CPU path and dtype (only the row loop differs, checked above); the float64
// reference of 12.8M logits is slow, so float32 once.
TEST(LinearCrossEntropy, RowsInChunksOfA128000Vocabulary) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  const at::Tensor h = torch::randn({100, 16}), w = torch::randn({128000, 16}) / 4 * 3;
  check_linear(h, w, targets({100}, 128000, -100), {-100, kMean, 0.1}, "float32, 2 chunks");
}

TEST(LinearCrossEntropy, StridedInputsAndOneGradient) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  const at::Tensor h = torch::randn({16, 40}).t(), w = torch::randn({30, 20}).slice(1, 0, 16);
  const at::Tensor t = targets({40}, 30, -100);
  check_linear(h, w, t, {-100, kMean, 0.1}, "transposed h, sliced weight");
  // Only the weight learns (frozen features): h gets no gradient, the loss is the same.
  at::Tensor wg = w.clone().requires_grad_();
  const at::Tensor loss = opfuse::linear_cross_entropy(h, wg, t);
  loss.backward();
  EXPECT_TRUE(wg.grad().defined());
  EXPECT_TRUE(torch::equal(loss.detach(), opfuse::linear_cross_entropy(h, w, t)));
}

TEST(LinearCrossEntropy, GradientMatchesFiniteDifferencesInFloat64) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  const at::Tensor t = torch::tensor({1, 2, 0, 4}, torch::kLong);
  for (const Case& k : every_case()) {
    if (k.reduction == kNone) continue;
    at::Tensor h = torch::randn({4, 3}, torch::kDouble).requires_grad_();
    at::Tensor w = torch::randn({5, 3}, torch::kDouble).requires_grad_();
    const double g = 1.7;
    opfuse::linear_cross_entropy(h, w, t, k.ignore_index, k.reduction, k.smoothing).backward(torch::tensor(g, torch::kDouble));
    auto f = [&](const at::Tensor& hv, const at::Tensor& wv) {
      return g * opfuse::linear_cross_entropy(hv, wv, t, k.ignore_index, k.reduction, k.smoothing).item<double>();
    };
    const double step = 1e-6;
    for (auto [x, other, is_h] : {std::make_tuple(h, w, true), std::make_tuple(w, h, false)}) {
      for (int64_t i = 0; i < x.numel(); ++i) {
        at::Tensor xp = x.detach().clone().reshape({-1}), xm = xp.clone();
        xp[i] += step;
        xm[i] -= step;
        const at::Tensor a = xp.reshape(x.sizes()), b = xm.reshape(x.sizes()), o = other.detach();
        const double numeric = is_h ? (f(a, o) - f(b, o)) / (2 * step) : (f(o, a) - f(o, b)) / (2 * step);
        EXPECT_NEAR(x.grad().reshape({-1})[i].item<double>(), numeric, 1e-8 * (1 + std::abs(numeric)))
            << k.name() << (is_h ? " h" : " weight");
      }
    }
  }
}

TEST(LinearCrossEntropy, DoubleBackwardRaises) {
  at::Tensor h = torch::randn({2, 4}, torch::kDouble).requires_grad_();
  at::Tensor w = torch::randn({6, 4}, torch::kDouble).requires_grad_();
  expect_double_backward_raises(opfuse::linear_cross_entropy(h, w, torch::tensor({1, 3}, torch::kLong)), h,
                                "opfuse::linear_cross_entropy");
}

TEST(LinearCrossEntropy, BadArgumentsNameTheOpAndTheProblem) {
  const at::Tensor h = torch::randn({3, 4}), w = torch::randn({5, 4}), t = torch::tensor({0, 4, 2}, torch::kLong);
  auto says = [](const std::function<void()>& f, const std::string& part) {
    const std::string m = error_message(f);
    EXPECT_NE(m.find("opfuse::linear_cross_entropy"), std::string::npos) << m;
    EXPECT_NE(m.find(part), std::string::npos) << m;
  };
  says([&] { opfuse::linear_cross_entropy(h, torch::randn({5, 3}), t); }, "weight [classes, H]");
  says([&] { opfuse::linear_cross_entropy(h, w.to(torch::kDouble), t); }, "same dtype");
  says([&] { opfuse::linear_cross_entropy(h, w, t, -100, kNone); }, "reduction must be 1 (mean) or 2 (sum)");
  says([&] { opfuse::linear_cross_entropy(h, w, torch::tensor({0, 1, 5}, torch::kLong)); }, "out of range");
  says([&] { opfuse::linear_cross_entropy(h, w, t.to(torch::kInt)); }, "int64");
  says([&] { opfuse::linear_cross_entropy(h, w, t.slice(0, 0, 2)); }, "target must be [3]");
}

}  // namespace
}  // namespace opfuse::testing::test_cross_entropy
