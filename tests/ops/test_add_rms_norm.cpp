// opfuse::add_rms_norm against a float64 reference, on every CPU path.
//
// h = x + residual must be exactly ATen's add in the dtype (the norm reads that rounded h, as the
// composite does); the rest is checked against rms_norm(h) in float64 with gradients dy to y and
// dh to h. Stated bounds, per element, with r = rstd, g = dy·w over the row (as test_rms_norm.cpp):
//   float32   y ≤ 5e-7·|ref|    dx = dresidual ≤ 1.2e-7·|ref| + 1e-6·(|g|·r + |h|·r³·Σ|g·h|/d)
//             dw ≤ 2e-6·Σ_rows |dy·h·r|      (dx: rms_norm's bound, then one rounding of + dh)
//   float64   y ≤ 1e-14·|ref|   dx ≤ 1e-14·|ref| + 1e-13·(…)     dw ≤ 1e-13·Σ_rows |dy·h·r|
//   bfloat16  y ≤ 4e-3·|ref|    dx ≤ 4e-3·|ref| + 1e-5·(…)       dw ≤ 4e-3·|ref| + 1e-5·Σ|…|
// (bfloat16 is computed in float and rounded once to its 8-bit mantissa: 2^-8 = 3.9e-3.)
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "opfuse/op_spec.h"
#include "opfuse/ops.h"
#include "reference.h"

// The file's own namespace: the op tests are compiled a few to a unit.
namespace opfuse::testing::test_add_rms_norm {
namespace {

struct Bound {
  double y, dx_rtol, dx_scale, dw_rtol, dw_scale;
};

Bound bound_for(at::ScalarType t) {
  if (t == torch::kDouble) return {1e-14, 1e-14, 1e-13, 1e-14, 1e-13};
  if (t == torch::kBFloat16) return {4e-3, 4e-3, 1e-5, 4e-3, 1e-5};
  return {5e-7, 1.2e-7, 1e-6, 0, 2e-6};
}

// with_dh: h receives a gradient too (the residual stream's), as in a Llama block.
void check_against_reference(const at::Tensor& x_in, const at::Tensor& r_in, const at::Tensor& w_in, double eps,
                             bool with_dh, const std::string& what) {
  const at::ScalarType dtype = x_in.scalar_type();
  at::Tensor x = x_in.detach().requires_grad_(), r = r_in.detach().requires_grad_(), w = w_in.detach().requires_grad_();
  const at::Tensor dy = torch::randn(x.sizes()).to(dtype), dh = torch::randn(x.sizes()).to(dtype);
  const auto [y, h] = opfuse::add_rms_norm(x, r, w, eps);
  if (with_dh)
    torch::autograd::backward({y, h}, {dy, dh});
  else
    y.backward(dy);
  ASSERT_EQ(y.scalar_type(), dtype);
  ASSERT_EQ(h.scalar_type(), dtype);
  EXPECT_TRUE(torch::equal(h, x_in + r_in)) << what << ": h is not ATen's x + residual";

  const int64_t d = x.size(-1);
  const at::Tensor hd = (x_in + r_in).detach().to(torch::kDouble).requires_grad_();
  const at::Tensor wd = w_in.detach().to(torch::kDouble).requires_grad_();
  const at::Tensor dyd = dy.to(torch::kDouble), dhd = with_dh ? dh.to(torch::kDouble) : torch::zeros_like(dyd);
  const at::Tensor yd = hd * torch::rsqrt(hd.pow(2).mean(-1, true) + eps) * wd;
  yd.backward(dyd);
  const at::Tensor dxd = hd.grad() + dhd;

  const at::Tensor ha = hd.detach(), rs = torch::rsqrt(ha.pow(2).mean(-1, true) + eps), g = dyd * wd.detach();
  const at::Tensor dx_scale = g.abs() * rs + ha.abs() * rs.pow(3) * (g * ha).abs().sum(-1, true) / d;
  std::vector<int64_t> row_dims;
  for (int64_t k = 0; k + 1 < x.dim(); ++k) row_dims.push_back(k);
  const at::Tensor dw_terms = (dyd * ha * rs).abs();
  const at::Tensor dw_scale = row_dims.empty() ? dw_terms : dw_terms.sum(row_dims);

  const Bound b = bound_for(dtype);
  expect_close(y, yd.detach(), b.y * yd.detach().abs() + 1e-37, what + " forward");
  const at::Tensor dx_tolerance = b.dx_rtol * dxd.abs() + b.dx_scale * dx_scale + 1e-37;
  expect_close(x.grad(), dxd, dx_tolerance, what + " dx");
  expect_close(r.grad(), dxd, dx_tolerance, what + " dresidual");
  expect_close(w.grad(), wd.grad(), b.dw_rtol * wd.grad().abs() + b.dw_scale * dw_scale + 1e-37, what + " dweight");
}

class AddRmsNormTest : public PathAndDtypeTest {};

TEST_P(AddRmsNormTest, MatchesFloat64ReferenceOnFreshRandomData) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  // The inputs as bench-op and the spec test make them: Llama-like rows, rows not a multiple of
  // any vector, one row, one column, a 1-D input.
  const OpSpec& spec = *find_op_spec("add_rms_norm");
  for (auto shape : std::vector<std::vector<int64_t>>{{4, 64, 288}, {3, 7, 77}, {1, 768}, {5, 1}, {33}, {2, 3, 17}}) {
    const OpCase c = spec.make({{shape}, dtype});
    for (bool with_dh : {true, false})
      check_against_reference(c.leaves[0], c.leaves[1], c.leaves[2], 1e-5, with_dh,
                              "shape " + c10::str(at::IntArrayRef(shape)) + (with_dh ? ", dh" : ""));
  }
}

TEST_P(AddRmsNormTest, StridedInputsAndEps) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  const at::Tensor transposed = torch::randn({40, 6}).to(dtype).t(), residual = torch::randn({6, 40}).to(dtype);
  ASSERT_FALSE(transposed.is_contiguous());
  check_against_reference(transposed, residual, (torch::rand({40}) + 0.5).to(dtype), 1e-6, true, "transposed x");
  check_against_reference(residual, transposed, (torch::rand({40}) + 0.5).to(dtype), 1e-6, true, "transposed residual");
  const at::Tensor sliced = torch::randn({8, 64}).to(dtype).slice(1, 0, 64, 2);
  check_against_reference(sliced, sliced * 0.5, torch::randn({64}).to(dtype).slice(0, 0, 64, 2), 1e-6, true,
                          "every other column");
  const at::Tensor x = torch::randn({3, 20}).to(dtype);
  check_against_reference(x, -x, torch::ones({20}).to(dtype), 1e-2, true, "h = 0");
  check_against_reference((torch::randn({4, 50}) * 1e-3).to(dtype), torch::zeros({4, 50}).to(dtype),
                          torch::ones({50}).to(dtype), 1.0, false, "eps dominates");
}

INSTANTIATE_TEST_SUITE_P(Ops, AddRmsNormTest, every_path_and_dtype(), path_and_dtype_name);

TEST(AddRmsNorm, OnlyHGetsAGradient) {
  // y unused: x and residual get h's gradient as it is, the weight none.
  at::Tensor x = torch::randn({3, 8}).requires_grad_(), r = torch::randn({3, 8}).requires_grad_();
  at::Tensor w = torch::ones({8}).requires_grad_();
  const at::Tensor dh = torch::randn({3, 8});
  std::get<1>(opfuse::add_rms_norm(x, r, w, 1e-6)).backward(dh);
  EXPECT_TRUE(torch::equal(x.grad(), dh));
  EXPECT_TRUE(torch::equal(r.grad(), dh));
  EXPECT_FALSE(w.grad().defined());
}

TEST(AddRmsNorm, OneThreadEqualsTwoThreads) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  const at::Tensor x0 = torch::randn({64, 300}), r0 = torch::randn({64, 300}), w0 = torch::rand({300}) + 0.5;
  const at::Tensor dy = torch::randn({64, 300}), dh = torch::randn({64, 300});
  std::vector<at::Tensor> grads;
  for (int threads : {1, 2}) {
    ThreadScope scope(threads);
    at::Tensor x = x0.clone().requires_grad_(), r = r0.clone().requires_grad_(), w = w0.clone().requires_grad_();
    const auto [y, h] = opfuse::add_rms_norm(x, r, w, 1e-6);
    torch::autograd::backward({y, h}, {dy, dh});
    grads.insert(grads.end(), {y.detach(), x.grad(), w.grad()});
  }
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(grads[i], grads[i + 3])) << i;
}

TEST(AddRmsNorm, GradientMatchesFiniteDifferencesInFloat64) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  at::Tensor x = torch::randn({3, 5}, torch::kDouble).requires_grad_(), r = torch::randn({3, 5}, torch::kDouble);
  at::Tensor w = (torch::rand({5}, torch::kDouble) + 0.5).requires_grad_();
  r.requires_grad_();
  const at::Tensor gy = torch::randn({3, 5}, torch::kDouble), gh = torch::randn({3, 5}, torch::kDouble);
  auto f = [&](const at::Tensor& xv, const at::Tensor& rv, const at::Tensor& wv) {
    const auto [y, h] = opfuse::add_rms_norm(xv, rv, wv, 1e-5);
    return (y * gy).sum() + (h * gh).sum();
  };
  f(x, r, w).backward();
  const double step = 1e-6;
  // Central differences of the scalar f along each element of each input.
  for (int input = 0; input < 3; ++input) {
    at::Tensor t = input == 0 ? x : input == 1 ? r : w;
    for (int64_t i = 0; i < t.numel(); ++i) {
      std::vector<at::Tensor> plus{x.detach().clone(), r.detach().clone(), w.detach().clone()}, minus = plus;
      for (auto& m : minus) m = m.clone();
      plus[input].view({-1})[i] += step;
      minus[input].view({-1})[i] -= step;
      const double numeric =
          (f(plus[0], plus[1], plus[2]).item<double>() - f(minus[0], minus[1], minus[2]).item<double>()) / (2 * step);
      EXPECT_NEAR(t.grad().view({-1})[i].item<double>(), numeric, 1e-7 * (1 + std::abs(numeric))) << input << " " << i;
    }
  }
}

TEST(AddRmsNorm, DoubleBackwardRaises) {
  at::Tensor x = torch::randn({2, 8}, torch::kDouble).requires_grad_(), r = torch::randn({2, 8}, torch::kDouble);
  at::Tensor w = torch::ones({8}, torch::kDouble).requires_grad_();
  const auto [y, h] = opfuse::add_rms_norm(x, r, w, 1e-6);
  const auto grads = torch::autograd::grad({y.sum()}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true);
  try {
    grads[0].sum().backward();
    ADD_FAILURE() << "double backward ran";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("opfuse::add_rms_norm_backward is not implemented"), std::string::npos)
        << e.what();
  }
}

TEST(AddRmsNorm, BadArgumentsNameTheOp) {
  const at::Tensor x = torch::randn({2, 8});
  EXPECT_NE(error_message([&] { opfuse::add_rms_norm(x, x, torch::ones({7}), 1e-6); }).find("opfuse::add_rms_norm"),
            std::string::npos);
  EXPECT_NE(error_message([&] { opfuse::add_rms_norm(x, torch::randn({2, 7}), torch::ones({8}), 1e-6); }).find("same shape"),
            std::string::npos);
  EXPECT_NE(error_message([&] { opfuse::add_rms_norm(x, x.to(torch::kDouble), torch::ones({8}), 1e-6); }).find("same dtype"),
            std::string::npos);
  EXPECT_NE(error_message([&] { opfuse::add_rms_norm(x, x, torch::ones({8}), -1); }).find("eps"), std::string::npos);
}

}  // namespace
}  // namespace opfuse::testing::test_add_rms_norm
