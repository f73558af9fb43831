// opfuse::add_layer_norm against a float64 reference, on every CPU path.
//
// h = x + residual must be exactly ATen's add in the dtype (the norm reads that rounded h, as the
// composite does); the rest is checked against layer_norm(h) in float64 with gradients dy to y and
// dh to h. With x̂ = (h − μ)·r, ĥ = (|h − μ| + |μ|)·r (what x̂'s rounding scales with) and g = dy·w,
// the stated bounds per element are k·S with
//   S_y  = ĥ·|w| + |b|
//   S_dx = r·(|g| + Σ|g|/d + ĥ·Σ|g|·ĥ/d) + |dh|
//   S_dw = Σ_rows |dy|·ĥ        S_db = Σ_rows |dy|
// and k = 2e-6 (float32), 1e-13 (float64), 8e-3 (bfloat16: computed in float, rounded once to its
// 8-bit mantissa, 2^-8 = 3.9e-3, on inputs already bfloat16).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "opfuse/op_spec.h"
#include "reference.h"

// The file's own namespace: the op tests are compiled a few to a unit.
namespace opfuse::testing::test_add_layer_norm {
namespace {

std::tuple<at::Tensor, at::Tensor> add_layer_norm(const at::Tensor& x, const at::Tensor& residual,
                                                  const at::Tensor& weight, const at::Tensor& bias, double eps) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("opfuse::add_layer_norm", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                 const at::Tensor&, const at::Tensor&, double)>();
  return op.call(x, residual, weight, bias, eps);
}

double bound_for(at::ScalarType t) { return t == torch::kDouble ? 1e-13 : t == torch::kBFloat16 ? 8e-3 : 2e-6; }

at::Tensor sum_rows(const at::Tensor& t) {
  std::vector<int64_t> rows;
  for (int64_t k = 0; k + 1 < t.dim(); ++k) rows.push_back(k);
  return rows.empty() ? t : t.sum(rows);
}

// with_dh: h receives a gradient too (the residual stream's), as in a pre-norm block.
void check_against_reference(const at::Tensor& x_in, const at::Tensor& r_in, const at::Tensor& w_in,
                             const at::Tensor& b_in, double eps, bool with_dh, const std::string& what) {
  const at::ScalarType dtype = x_in.scalar_type();
  at::Tensor x = x_in.detach().requires_grad_(), r = r_in.detach().requires_grad_();
  at::Tensor w = w_in.detach().requires_grad_(), b = b_in.detach().requires_grad_();
  const at::Tensor dy = torch::randn(x.sizes()).to(dtype), dh = torch::randn(x.sizes()).to(dtype);
  const auto [y, h] = add_layer_norm(x, r, w, b, eps);
  if (with_dh)
    torch::autograd::backward({y, h}, {dy, dh});
  else
    y.backward(dy);
  ASSERT_EQ(y.scalar_type(), dtype);
  EXPECT_TRUE(torch::equal(h, x_in + r_in)) << what << ": h is not ATen's x + residual";

  const int64_t d = x.size(-1);
  const at::Tensor hd = (x_in + r_in).detach().to(torch::kDouble).requires_grad_();
  const at::Tensor wd = w_in.detach().to(torch::kDouble).requires_grad_();
  const at::Tensor bd = b_in.detach().to(torch::kDouble).requires_grad_();
  const at::Tensor dyd = dy.to(torch::kDouble), dhd = with_dh ? dh.to(torch::kDouble) : torch::zeros_like(dyd);
  const at::Tensor yd = at::layer_norm(hd, {d}, wd, bd, eps);
  yd.backward(dyd);
  const at::Tensor dxd = hd.grad() + dhd;

  const at::Tensor ha = hd.detach(), mu = ha.mean(-1, true);
  const at::Tensor rs = torch::rsqrt((ha - mu).pow(2).mean(-1, true) + eps);
  // |ĥ| as the terms that make it: an element near its row's mean still carries the rounding of
  // the mean and variance, which are on the scale of the row's spread, 1 in units of ĥ (seed
  // 2035381703: ĥ ≈ 0 at [4, 64, 288], off by 3.4e-9 where the bound without the 1 was 1.9e-9).
  const at::Tensor hhat = ((ha - mu).abs() + mu.abs()) * rs + 1, g = (dyd * wd.detach()).abs();
  const at::Tensor s_y = hhat * wd.detach().abs() + bd.detach().abs();
  const at::Tensor s_dx = rs * (g + g.sum(-1, true) / d + hhat * (g * hhat).sum(-1, true) / d) + dhd.abs();
  const double k = bound_for(dtype);
  expect_close(y, yd.detach(), k * s_y + 1e-37, what + " forward");
  expect_close(x.grad(), dxd, k * s_dx + 1e-37, what + " dx");
  expect_close(r.grad(), dxd, k * s_dx + 1e-37, what + " dresidual");
  expect_close(w.grad(), wd.grad(), k * sum_rows(dyd.abs() * hhat) + 1e-37, what + " dweight");
  expect_close(b.grad(), bd.grad(), k * sum_rows(dyd.abs()) + 1e-37, what + " dbias");
}

class AddLayerNormTest : public PathAndDtypeTest {};

TEST_P(AddLayerNormTest, MatchesFloat64ReferenceOnFreshRandomData) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  // The inputs as bench-op and the spec test make them: GPT-2-like rows, rows not a multiple of
  // any vector, one row, one column, a 1-D input.
  const OpSpec& spec = *find_op_spec("add_layer_norm");
  for (auto shape : std::vector<std::vector<int64_t>>{{4, 64, 288}, {3, 7, 77}, {1, 768}, {5, 1}, {33}, {2, 3, 17}}) {
    const OpCase c = spec.make({{shape}, dtype});
    for (bool with_dh : {true, false})
      check_against_reference(c.leaves[0], c.leaves[1], c.leaves[2], c.leaves[3], 1e-5, with_dh,
                              "shape " + c10::str(at::IntArrayRef(shape)) + (with_dh ? ", dh" : ""));
  }
}

TEST_P(AddLayerNormTest, StridedInputsLargeMeansAndEps) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  auto ones = [&](int64_t d) { return torch::ones({d}).to(dtype); };
  auto randn = [&](std::vector<int64_t> shape) { return torch::randn(shape).to(dtype); };
  const at::Tensor transposed = randn({40, 6}).t(), residual = randn({6, 40});
  ASSERT_FALSE(transposed.is_contiguous());
  check_against_reference(transposed, residual, ones(40), randn({40}), 1e-5, true, "transposed x");
  const at::Tensor sliced = randn({8, 64}).slice(1, 0, 64, 2);
  check_against_reference(sliced, sliced * 0.5, randn({64}).slice(0, 0, 64, 2), randn({32}), 1e-5, true,
                          "every other column");
  // A mean far from zero: the variance is summed from centred values.
  check_against_reference((torch::randn({6, 96}) + 50).to(dtype), randn({6, 96}), ones(96), randn({96}), 1e-5, true,
                          "mean 50");
  const at::Tensor x = randn({3, 20});
  check_against_reference(x, -x, ones(20), randn({20}), 1e-2, true, "h = 0");
}

INSTANTIATE_TEST_SUITE_P(Ops, AddLayerNormTest, every_path_and_dtype(), path_and_dtype_name);

TEST(AddLayerNorm, OnlyHGetsAGradient) {
  // y unused: x and residual get h's gradient as it is, weight and bias none.
  at::Tensor x = torch::randn({3, 8}).requires_grad_(), r = torch::randn({3, 8}).requires_grad_();
  at::Tensor w = torch::ones({8}).requires_grad_(), b = torch::zeros({8}).requires_grad_();
  const at::Tensor dh = torch::randn({3, 8});
  std::get<1>(add_layer_norm(x, r, w, b, 1e-5)).backward(dh);
  EXPECT_TRUE(torch::equal(x.grad(), dh));
  EXPECT_TRUE(torch::equal(r.grad(), dh));
  EXPECT_FALSE(w.grad().defined());
  EXPECT_FALSE(b.grad().defined());
}

TEST(AddLayerNorm, OneThreadEqualsTwoThreads) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  const at::Tensor x0 = torch::randn({64, 300}), r0 = torch::randn({64, 300});
  const at::Tensor w0 = torch::rand({300}) + 0.5, b0 = torch::randn({300});
  const at::Tensor dy = torch::randn({64, 300}), dh = torch::randn({64, 300});
  std::vector<at::Tensor> out;
  for (int threads : {1, 2}) {
    ThreadScope scope(threads);
    at::Tensor x = x0.clone().requires_grad_(), r = r0.clone().requires_grad_();
    at::Tensor w = w0.clone().requires_grad_(), b = b0.clone().requires_grad_();
    const auto [y, h] = add_layer_norm(x, r, w, b, 1e-5);
    torch::autograd::backward({y, h}, {dy, dh});
    out.insert(out.end(), {y.detach(), x.grad(), w.grad(), b.grad()});
  }
  for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(torch::equal(out[i], out[i + 4])) << i;
}

TEST(AddLayerNorm, DoubleBackwardRaises) {
  at::Tensor x = torch::randn({2, 8}, torch::kDouble).requires_grad_(), r = torch::randn({2, 8}, torch::kDouble);
  at::Tensor w = torch::ones({8}, torch::kDouble).requires_grad_(), b = torch::zeros({8}, torch::kDouble);
  const auto [y, h] = add_layer_norm(x, r, w, b, 1e-5);
  const auto grads = torch::autograd::grad({y.pow(2).sum()}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true);
  try {
    grads[0].sum().backward();
    ADD_FAILURE() << "double backward ran";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("opfuse::add_layer_norm_backward is not implemented"), std::string::npos)
        << e.what();
  }
}

TEST(AddLayerNorm, BadArgumentsNameTheOp) {
  const at::Tensor x = torch::randn({2, 8}), w = torch::ones({8}), b = torch::zeros({8});
  EXPECT_NE(error_message([&] { add_layer_norm(x, x, torch::ones({7}), b, 1e-5); }).find("opfuse::add_layer_norm"),
            std::string::npos);
  EXPECT_NE(error_message([&] { add_layer_norm(x, x, w, torch::zeros({9}), 1e-5); }).find("bias must be [8]"),
            std::string::npos);
  EXPECT_NE(error_message([&] { add_layer_norm(x, torch::randn({2, 7}), w, b, 1e-5); }).find("same shape"),
            std::string::npos);
  EXPECT_NE(error_message([&] { add_layer_norm(x, x.to(torch::kDouble), w, b, 1e-5); }).find("same dtype"),
            std::string::npos);
  EXPECT_NE(error_message([&] { add_layer_norm(x, x, w, b, -1); }).find("eps"), std::string::npos);
}

}  // namespace
}  // namespace opfuse::testing::test_add_layer_norm
