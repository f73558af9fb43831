// opfuse::rms_norm against a float64 reference, on every CPU path.
//
// Stated bounds, per element, with r = rstd, g = dy·w, c = Σ g·x / d over the row:
//   float32   y ≤ 5e-7·|ref|      dx ≤ 1e-6·(|g|·r + |x|·r³·Σ|g·x|/d)   dw ≤ 2e-6·Σ_rows |dy·x·r|
//             (dw: float partials of ≤ 16 rows, (16 + 2 products)·2^-24 = 1.1e-6, then double)
//   float64   y ≤ 1e-14·|ref|     dx ≤ 1e-13·(…)                        dw ≤ 1e-13·Σ_rows |dy·x·r|
//   bfloat16  y ≤ 4e-3·|ref|      dx ≤ 4e-3·(|dx_ref| + …) + 1e-6·(…)   dw ≤ 4e-3·|ref| + 1e-5·Σ|…|
// (bfloat16 is computed in float and rounded once to its 8-bit mantissa: 2^-8 = 3.9e-3.)
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "opfuse/ops.h"
#include "reference.h"

// The file's own namespace: the op tests are compiled a few to a unit.
namespace opfuse::testing::test_rms_norm {
namespace {

struct Bound {
  double rtol, scale;  // of |ref|, and of the terms' magnitudes
};

Bound bound_for(at::ScalarType t, bool gradient) {
  if (t == torch::kDouble) return {1e-14, gradient ? 1e-13 : 0};
  if (t == torch::kBFloat16) return {4e-3, gradient ? 1e-5 : 0};
  return {gradient ? 0 : 5e-7, gradient ? 1e-6 : 0};
}

// dweight's own scale: float partials of up to 16 rows (see the bounds above).
double dweight_scale(at::ScalarType t) {
  if (t == torch::kFloat) return 2e-6;
  return bound_for(t, true).scale;
}

void check_against_reference(const at::Tensor& x_in, const at::Tensor& w_in, double eps, const std::string& what) {
  const at::ScalarType dtype = x_in.scalar_type();
  at::Tensor x = x_in.detach().requires_grad_(), w = w_in.detach().requires_grad_();
  const at::Tensor dy = torch::randn(x.sizes()).to(dtype);
  const at::Tensor y = opfuse::rms_norm(x, w, eps);
  y.backward(dy);
  ASSERT_EQ(y.scalar_type(), dtype);

  const int64_t d = x.size(-1);
  const at::Tensor xd = x_in.detach().to(torch::kDouble).requires_grad_();
  const at::Tensor wd = w_in.detach().to(torch::kDouble).requires_grad_();
  const at::Tensor dyd = dy.to(torch::kDouble);
  const at::Tensor r = torch::rsqrt(xd.detach().pow(2).mean(-1, true) + eps);
  const at::Tensor yd = xd * torch::rsqrt(xd.pow(2).mean(-1, true) + eps) * wd;
  yd.backward(dyd);

  const at::Tensor g = dyd * wd.detach(), xa = xd.detach();
  const at::Tensor dx_scale = g.abs() * r + xa.abs() * r.pow(3) * (g * xa).abs().sum(-1, true) / d;
  std::vector<int64_t> row_dims;
  for (int64_t k = 0; k + 1 < x.dim(); ++k) row_dims.push_back(k);
  const at::Tensor dw_terms = (dyd * xa * r).abs();
  const at::Tensor dw_scale = row_dims.empty() ? dw_terms : dw_terms.sum(row_dims);

  const Bound by = bound_for(dtype, false), bg = bound_for(dtype, true);
  expect_close(y, yd.detach(), by.rtol * yd.detach().abs() + 1e-37, what + " forward");
  expect_close(x.grad(), xd.grad(), bg.rtol * xd.grad().abs() + bg.scale * dx_scale + 1e-37, what + " dx");
  expect_close(w.grad(), wd.grad(), bg.rtol * wd.grad().abs() + dweight_scale(dtype) * dw_scale + 1e-37,
               what + " dweight");
}

class RmsNormTest : public PathAndDtypeTest {};

TEST_P(RmsNormTest, MatchesFloat64ReferenceOnFreshRandomData) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  // Llama-like rows, rows not a multiple of any vector, one row, one column, a 1-D input.
  for (auto shape : std::vector<std::vector<int64_t>>{{4, 64, 288}, {3, 7, 77}, {1, 768}, {5, 1}, {33}, {2, 3, 17}}) {
    const int64_t d = shape.back();
    const at::Tensor x = (torch::randn(shape) * 3 + 0.5).to(dtype);
    const at::Tensor w = (torch::rand({d}) + 0.5).to(dtype);
    check_against_reference(x, w, 1e-5, "shape " + c10::str(at::IntArrayRef(shape)));
  }
}

TEST_P(RmsNormTest, StridedInputsAndEps) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  const at::Tensor transposed = torch::randn({40, 6}).to(dtype).t();
  ASSERT_FALSE(transposed.is_contiguous());
  check_against_reference(transposed, (torch::rand({40}) + 0.5).to(dtype), 1e-6, "transposed");
  const at::Tensor sliced = torch::randn({8, 64}).to(dtype).slice(1, 0, 64, 2);
  check_against_reference(sliced, torch::randn({32}).to(dtype).slice(0, 0, 32), 1e-6, "every other column");
  check_against_reference(torch::zeros({3, 20}).to(dtype), torch::ones({20}).to(dtype), 1e-2, "zero rows");
  check_against_reference((torch::randn({4, 50}) * 1e-3).to(dtype), torch::ones({50}).to(dtype), 1.0, "eps dominates");
}

INSTANTIATE_TEST_SUITE_P(Ops, RmsNormTest, every_path_and_dtype(), path_and_dtype_name);

TEST(RmsNorm, VectorPathsAgree) {
  // avx512 runs the same operations 16 lanes wide; only the row sums' order differs.
  if (cpu::best_cpu_capability() < cpu::Capability::avx512) GTEST_SKIP() << "no AVX-512 here";
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  const at::Tensor x = torch::randn({16, 256}), w = torch::rand({256}) + 0.5;
  at::Tensor a, b;
  {
    CapabilityScope scope(cpu::Capability::avx2);
    a = opfuse::rms_norm(x, w, 1e-6);
  }
  {
    CapabilityScope scope(cpu::Capability::avx512);
    b = opfuse::rms_norm(x, w, 1e-6);
  }
  // rstd comes from double sums whose order differs, so a float rstd may differ by an ulp.
  EXPECT_TRUE(torch::allclose(a, b, 3e-7, 0));
}

TEST(RmsNorm, OneThreadEqualsTwoThreads) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  const at::Tensor x0 = torch::randn({64, 300}), w0 = torch::rand({300}) + 0.5, dy = torch::randn({64, 300});
  std::vector<at::Tensor> dw;
  for (int threads : {1, 2}) {
    ThreadScope scope(threads);
    at::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
    opfuse::rms_norm(x, w, 1e-6).backward(dy);
    dw.push_back(w.grad());
  }
  EXPECT_TRUE(torch::equal(dw[0], dw[1]));
}

TEST(RmsNorm, GradientMatchesFiniteDifferencesInFloat64) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  at::Tensor x = torch::randn({3, 5}, torch::kDouble).requires_grad_();
  at::Tensor w = (torch::rand({5}, torch::kDouble) + 0.5).requires_grad_();
  const at::Tensor g = torch::randn({3, 5}, torch::kDouble);
  opfuse::rms_norm(x, w, 1e-5).backward(g);
  auto f = [&](const at::Tensor& xv, const at::Tensor& wv) { return (opfuse::rms_norm(xv, wv, 1e-5) * g).sum().item<double>(); };
  const double h = 1e-6;
  for (int64_t i = 0; i < x.numel(); ++i) {
    at::Tensor xp = x.detach().clone().reshape({-1}), xm = xp.clone();
    xp[i] += h;
    xm[i] -= h;
    const double numeric = (f(xp.reshape(x.sizes()), w.detach()) - f(xm.reshape(x.sizes()), w.detach())) / (2 * h);
    EXPECT_NEAR(x.grad().reshape({-1})[i].item<double>(), numeric, 1e-7 * (1 + std::abs(numeric)));
  }
  for (int64_t i = 0; i < w.numel(); ++i) {
    at::Tensor wp = w.detach().clone(), wm = wp.clone();
    wp[i] += h;
    wm[i] -= h;
    const double numeric = (f(x.detach(), wp) - f(x.detach(), wm)) / (2 * h);
    EXPECT_NEAR(w.grad()[i].item<double>(), numeric, 1e-7 * (1 + std::abs(numeric)));
  }
}

TEST(RmsNorm, DoubleBackwardRaises) {
  at::Tensor x = torch::randn({2, 8}, torch::kDouble).requires_grad_();
  at::Tensor w = torch::ones({8}, torch::kDouble).requires_grad_();
  const at::Tensor y = opfuse::rms_norm(x, w, 1e-6);
  const auto grads = torch::autograd::grad({y.sum()}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true);
  try {
    grads[0].sum().backward();
    ADD_FAILURE() << "double backward ran";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("opfuse::rms_norm_backward is not implemented"), std::string::npos) << e.what();
  }
}

TEST(RmsNorm, BadArgumentsNameTheOp) {
  const at::Tensor x = torch::randn({2, 8});
  EXPECT_NE(error_message([&] { opfuse::rms_norm(x, torch::ones({7}), 1e-6); }).find("opfuse::rms_norm"), std::string::npos);
  EXPECT_NE(error_message([&] { opfuse::rms_norm(x, torch::ones({8}, torch::kDouble), 1e-6); }).find("same dtype"),
            std::string::npos);
  EXPECT_NE(error_message([&] { opfuse::rms_norm(x, torch::ones({8}), -1); }).find("eps"), std::string::npos);
  EXPECT_NE(error_message([&] { opfuse::rms_norm(x.to(torch::kInt), torch::ones({8}), 1e-6); }).find("float32"),
            std::string::npos);
}

}  // namespace
}  // namespace opfuse::testing::test_rms_norm
