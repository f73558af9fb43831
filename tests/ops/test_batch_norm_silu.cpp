// opfuse::batch_norm_silu against torch::batch_norm + silu in float64, on every CPU path.
//
// Stated bounds, per element. dz is the reference's gradient at BatchNorm's output and x̂ its
// normalized input; each gradient is bounded relative to the terms it is summed from, since
// with few values per channel dx cancels to far below them (at M = 2 it is 0 in exact math):
//                y              dx                      dweight, dbias           running stats
//   float32   1e-5·|y| + 1e-5·max|y|   1e-5·max|w·invstd·dz|   1e-5·Σ|dz·x̂|, Σ|dz|   1e-6·max|ref|
//   float64   1e-12 in place of 1e-5 and 1e-6
//   bfloat16  1e-2 (8-bit mantissa of x, y and dx)
// plus 1e-5·|ref| (float64 1e-12, bfloat16 1e-2) on each gradient. The statistics are double
// sums in every dtype, so the float32 bounds hold at any batch size.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "opfuse/ops.h"
#include "reference.h"

// The file's own namespace: the op tests are compiled a few to a unit.
namespace opfuse::testing::test_batch_norm_silu {
namespace {

struct Bound {
  double rtol, stol, stats_rtol;
};

Bound bound_for(at::ScalarType t) {
  if (t == torch::kDouble) return {1e-12, 1e-12, 1e-12};
  if (t == torch::kBFloat16) return {1e-2, 1e-2, 1e-2};
  return {1e-5, 1e-5, 1e-6};
}

double max_abs(const at::Tensor& t) { return t.numel() == 0 ? 0.0 : t.abs().max().item<double>(); }

// |actual − ref| ≤ rtol·|ref| + stol·scale, scale a tensor broadcast against ref.
void expect_near_ref(const at::Tensor& actual, const at::Tensor& ref, const Bound& b, const at::Tensor& scale,
                     const std::string& what) {
  expect_close(actual, ref, b.rtol * ref.abs() + b.stol * scale + 1e-300, what);
}

void expect_near_ref(const at::Tensor& actual, const at::Tensor& ref, const Bound& b, const std::string& what) {
  expect_near_ref(actual, ref, b, torch::full({}, max_abs(ref), torch::kDouble), what);
}

struct Params {
  at::Tensor weight, bias, running_mean, running_var;
};

Params params_for(int64_t c, at::ScalarType dtype) {
  // Running stats stay float32 beside bfloat16 x, as a bfloat16 model's BatchNorm keeps them.
  const auto stats_dtype = dtype == torch::kBFloat16 ? torch::kFloat : dtype;
  return {torch::randn({c}).to(dtype), torch::randn({c}).to(dtype), torch::randn({c}).to(stats_dtype),
          (torch::rand({c}) + 0.5).to(stats_dtype)};
}

// Runs the fused op and the float64 reference on the same data, forward and backward.
void check_against_reference(const at::Tensor& x_in, bool training, const std::string& what,
                             double momentum = 0.1, double eps = 1e-3) {
  const Bound b = bound_for(x_in.scalar_type());
  const Params p = params_for(x_in.size(1), x_in.scalar_type());
  at::Tensor x = x_in.detach().requires_grad_(), w = p.weight.clone().requires_grad_(),
             bias = p.bias.clone().requires_grad_();
  at::Tensor rm = p.running_mean.clone(), rv = p.running_var.clone();
  at::Tensor y = opfuse::batch_norm_silu(x, w, bias, rm, rv, training, momentum, eps);
  const at::Tensor g = torch::randn(x.sizes()).to(x.scalar_type());
  y.backward(g);

  auto d = [](const at::Tensor& t) { return t.detach().to(torch::kDouble); };
  at::Tensor xd = d(x_in).requires_grad_(), wd = d(p.weight).requires_grad_(), bd = d(p.bias).requires_grad_();
  at::Tensor rmd = d(p.running_mean), rvd = d(p.running_var);
  at::Tensor bn = torch::batch_norm(xd, wd, bd, rmd, rvd, training, momentum, eps, false);
  bn.retain_grad();
  at::Tensor yd = torch::silu(bn);
  yd.backward(d(g));

  // The scales of the terms each gradient is made of (see the bounds above).
  const at::Tensor dz = bn.grad();
  std::vector<int64_t> reduce_dims{0}, channel_shape(x.dim(), 1);
  for (int64_t i = 2; i < x.dim(); ++i) reduce_dims.push_back(i);
  channel_shape[1] = x.size(1);
  const at::Tensor w_ch = wd.detach().reshape(channel_shape);
  const at::Tensor xhat = (bn.detach() - bd.detach().reshape(channel_shape)) / w_ch;
  const at::Tensor invstd = training ? 1 / (xd.detach().var(reduce_dims, /*unbiased=*/false, true) + eps).sqrt()
                                     : 1 / (p.running_var.to(torch::kDouble).reshape(channel_shape) + eps).sqrt();
  const double dx_scale = max_abs(dz * w_ch * invstd);

  expect_near_ref(y, yd.detach(), b, what + " forward");
  expect_near_ref(x.grad(), xd.grad(), b, torch::full({}, dx_scale, torch::kDouble), what + " dx");
  expect_near_ref(w.grad(), wd.grad(), b, (dz * xhat).abs().sum(reduce_dims), what + " dweight");
  expect_near_ref(bias.grad(), bd.grad(), b, dz.abs().sum(reduce_dims), what + " dbias");
  const double stats_scale = std::max(max_abs(rmd), max_abs(rvd));
  expect_close(rm, rmd, torch::full({}, b.stats_rtol * stats_scale, torch::kDouble), what + " running_mean");
  expect_close(rv, rvd, torch::full({}, b.stats_rtol * stats_scale, torch::kDouble), what + " running_var");
}

const std::vector<std::vector<int64_t>>& shapes() {
  // C = 1, N = 1, H×W = 1, odd sizes, a plane longer than one 16384-element segment, [N, C], and
  // planes small enough to run as a sample's slots, in blocks of rows and (9000 or 10800 slots a
  // sample, the last vector partial) down stretches of columns.
  static const std::vector<std::vector<int64_t>> s{{4, 24, 28, 28}, {3, 19, 13, 11}, {2, 5, 1, 1},  {1, 1, 9, 9},
                                                   {1, 7, 3, 3},    {5, 1, 1, 1},    {2, 3, 130, 131}, {6, 10},
                                                   {2, 1},          {3, 600, 5, 3},  {2, 300, 6, 6}};
  return s;
}

class BatchNormSiluTest : public PathAndDtypeTest {};

TEST_P(BatchNormSiluTest, MatchesFloat64ReferenceOnFreshRandomData) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  for (const auto& shape : shapes())
    for (bool training : {true, false}) {
      const at::Tensor x = (torch::randn(shape) * 2 + 0.5).to(dtype);
      check_against_reference(x, training, c10::str(at::IntArrayRef(shape), training ? " training" : " eval"));
    }
}

TEST_P(BatchNormSiluTest, ChannelsLastAndNonContiguous) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  for (auto shape : std::vector<std::vector<int64_t>>{{2, 33, 7, 5}, {3, 130, 4, 4}, {1, 200, 2, 3}, {4, 16, 9, 9}}) {
    const at::Tensor cl = torch::randn(shape).to(dtype).contiguous(at::MemoryFormat::ChannelsLast);
    for (bool training : {true, false}) check_against_reference(cl, training, "channels_last " + c10::str(cl.sizes()));
    const Params p = params_for(cl.size(1), dtype);
    const at::Tensor y = opfuse::batch_norm_silu(cl, p.weight, p.bias, p.running_mean, p.running_var, true, 0.1, 1e-5);
    EXPECT_TRUE(y.is_contiguous(at::MemoryFormat::ChannelsLast)) << "output keeps channels_last";
  }
  const at::Tensor transposed = torch::randn({3, 10, 6, 9}).to(dtype).transpose(2, 3);
  ASSERT_FALSE(transposed.is_contiguous());
  check_against_reference(transposed, true, "transposed H, W");
}

INSTANTIATE_TEST_SUITE_P(Ops, BatchNormSiluTest, every_path_and_dtype(), path_and_dtype_name);

TEST(BatchNormSilu, RunningStatisticsAsTorchBatchNorm) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  for (auto dtype : {torch::kFloat, torch::kDouble})
    for (auto format : {at::MemoryFormat::Contiguous, at::MemoryFormat::ChannelsLast})
      for (double momentum : {0.01, 0.1, 0.9}) {
        const at::Tensor x = (torch::randn({8, 12, 10, 10}) * 3 - 1).to(dtype).contiguous(format);
        const Params p = params_for(12, dtype);
        at::Tensor rm = p.running_mean.clone(), rv = p.running_var.clone();
        at::Tensor rm_ref = p.running_mean.clone(), rv_ref = p.running_var.clone();
        // Three steps, so the update composes as torch's does.
        for (int step = 0; step < 3; ++step) {
          opfuse::batch_norm_silu(x, p.weight, p.bias, rm, rv, true, momentum, 1e-3);
          torch::batch_norm(x, p.weight, p.bias, rm_ref, rv_ref, true, momentum, 1e-3, false);
        }
        // torch's float32 update rounds too: ours must be as close to it as to float64.
        const double rtol = dtype == torch::kFloat ? 4e-6 : 1e-12;
        const std::string what = c10::str(dtype, " momentum ", momentum);
        const double scale = std::max(max_abs(rm_ref), max_abs(rv_ref));
        expect_close(rm, rm_ref.to(torch::kDouble), torch::full({}, rtol * scale, torch::kDouble), what + " running_mean");
        expect_close(rv, rv_ref.to(torch::kDouble), torch::full({}, rtol * scale, torch::kDouble), what + " running_var");
      }
}

TEST(BatchNormSilu, LargeMeanKeepsTheVarianceAccurate) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  // |mean| / std = 1e4: E[x²] − mean² in float would lose every digit of the variance. (The
  // output cannot be better than the float32 mean allows, here 3e-5 / 0.1 in x̂, as in ATen.)
  const at::Tensor x = torch::randn({4, 6, 20, 20}) * 0.1 + 1000;
  at::Tensor rm = torch::zeros({6}), rv = torch::ones({6});
  opfuse::batch_norm_silu(x, torch::ones({6}), torch::zeros({6}), rm, rv, true, 1.0, 1e-5);
  const at::Tensor var = x.to(torch::kDouble).var({0, 2, 3}, /*unbiased=*/true);
  expect_close(rv, var, 1e-6 * var, "unbiased variance at mean 1000, std 0.1");
}

TEST(BatchNormSilu, GradientMatchesFiniteDifferencesInFloat64) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  for (bool training : {true, false}) {
    at::Tensor x = torch::randn({2, 3, 4, 4}, torch::kDouble).requires_grad_();
    at::Tensor w = torch::randn({3}, torch::kDouble).requires_grad_();
    at::Tensor b = torch::randn({3}, torch::kDouble).requires_grad_();
    const at::Tensor rm = torch::randn({3}, torch::kDouble), rv = torch::rand({3}, torch::kDouble) + 0.5;
    const at::Tensor g = torch::randn({2, 3, 4, 4}, torch::kDouble);
    // Running stats are left out when training so repeated forwards see the same function.
    auto run = [&](const at::Tensor& xv, const at::Tensor& wv, const at::Tensor& bv) {
      return opfuse::batch_norm_silu(xv, wv, bv, training ? at::Tensor() : rm, training ? at::Tensor() : rv, training,
                                     0.1, 1e-3);
    };
    run(x, w, b).backward(g);
    auto f = [&](const at::Tensor& xv, const at::Tensor& wv, const at::Tensor& bv) {
      return (run(xv, wv, bv) * g).sum().item<double>();
    };
    const double h = 1e-6;
    auto check = [&](const at::Tensor& leaf, int which, int64_t step) {
      for (int64_t i = 0; i < leaf.numel(); i += step) {
        at::Tensor plus = leaf.detach().clone(), minus = leaf.detach().clone();
        plus.view({-1})[i] += h;
        minus.view({-1})[i] -= h;
        auto with = [&](const at::Tensor& v) {
          return f(which == 0 ? v : x.detach(), which == 1 ? v : w.detach(), which == 2 ? v : b.detach());
        };
        const double numeric = (with(plus) - with(minus)) / (2 * h);
        EXPECT_NEAR(leaf.grad().view({-1})[i].item<double>(), numeric, 1e-7 * (1 + std::abs(numeric)))
            << (training ? "training" : "eval") << " input " << which << " element " << i;
      }
    };
    check(x, 0, 3);
    check(w, 1, 1);
    check(b, 2, 1);
  }
}

TEST(BatchNormSilu, OneThreadEqualsTwoThreads) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  for (auto [format, shape] : {std::pair{at::MemoryFormat::Contiguous, std::vector<int64_t>{8, 40, 28, 28}},
                                {at::MemoryFormat::ChannelsLast, std::vector<int64_t>{8, 40, 28, 28}},
                                {at::MemoryFormat::Contiguous, std::vector<int64_t>{8, 1000, 3, 3}}})
    for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kDouble}) {
      const at::Tensor x = torch::randn(shape).to(dtype).contiguous(format);
      const Params p = params_for(shape[1], dtype);
      const at::Tensor g = torch::randn_like(x);
      auto run = [&](int threads) {
        ThreadScope scope(threads);
        at::Tensor xr = x.clone().requires_grad_(), w = p.weight.clone().requires_grad_(),
                   b = p.bias.clone().requires_grad_();
        at::Tensor rm = p.running_mean.clone(), rv = p.running_var.clone();
        at::Tensor y = opfuse::batch_norm_silu(xr, w, b, rm, rv, true, 0.1, 1e-3);
        y.backward(g);
        return std::vector<at::Tensor>{y.detach(), xr.grad(), w.grad(), b.grad(), rm, rv};
      };
      const auto one = run(1), two = run(2);
      const char* names[] = {"y", "dx", "dweight", "dbias", "running_mean", "running_var"};
      for (size_t i = 0; i < one.size(); ++i)
        EXPECT_TRUE(torch::equal(one[i], two[i])) << names[i] << " depends on the thread count (" << dtype << ")";
    }
}

TEST(BatchNormSilu, WithoutAffineParameters) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  at::Tensor x = torch::randn({4, 5, 6, 6}, torch::kDouble).requires_grad_();
  at::Tensor xd = x.detach().clone().requires_grad_();
  const at::Tensor g = torch::randn_like(x);
  opfuse::batch_norm_silu(x, {}, {}, {}, {}, true, 0.1, 1e-5).backward(g);
  torch::silu(torch::batch_norm(xd, {}, {}, {}, {}, true, 0.1, 1e-5, false)).backward(g);
  expect_near_ref(x.grad(), xd.grad(), bound_for(torch::kDouble), "no weight, no bias: dx");
}

TEST(BatchNormSilu, BadShapesAndDtypesAreClearErrors) {
  const at::Tensor x = torch::randn({2, 3, 4, 4}), c3 = torch::randn({3}), v3 = torch::rand({3}) + 1;
  auto call = [](const at::Tensor& xv, const at::Tensor& w, const at::Tensor& rm, bool training) {
    opfuse::batch_norm_silu(xv, w, w, rm, rm.defined() ? rm.abs() + 1 : rm, training, 0.1, 1e-5);
  };
  expect_error([&] { call(torch::randn({2, 3, 4}), c3, v3, true); }, "x must be [N, C] or [N, C, H, W]");
  expect_error([&] { call(torch::randn({6}), torch::randn({6}), {}, true); }, "x must be [N, C] or [N, C, H, W]");
  expect_error([&] { call(torch::randn({2, 3, 4, 4, 1}), c3, v3, true); }, "x must be [N, C] or [N, C, H, W]");
  expect_error([&] { call(x, torch::randn({4}), v3, true); }, "weight must have shape [3]");
  expect_error([&] { call(x, torch::randn({3, 1}), v3, true); }, "weight must have shape [3]");
  expect_error([&] { call(x, c3, torch::rand({2}), true); }, "running_mean must have shape [3]");
  expect_error([&] { call(x, c3.to(torch::kDouble), v3, true); }, "must have x's dtype");
  expect_error([&] { call(x.to(torch::kInt), c3.to(torch::kInt), {}, true); }, "must be float32, float64 or bfloat16");
  expect_error([&] { call(torch::randn({1, 3, 1, 1}), c3, v3, true); }, "more than 1 value per channel");
  expect_error([&] { call(x, c3, {}, false); }, "running_mean and running_var are required");
  expect_error([&] { opfuse::batch_norm_silu(x, c3, c3, v3, v3, true, 0.1, -1); }, "eps must be non-negative");
}

TEST(BatchNormSilu, EmptyBatchInEvalMode) {
  at::Tensor x = torch::randn({0, 4, 5, 5}).requires_grad_();
  const at::Tensor y = opfuse::batch_norm_silu(x, torch::ones({4}), torch::zeros({4}), torch::zeros({4}),
                                               torch::ones({4}), false, 0.1, 1e-5);
  EXPECT_EQ(y.sizes(), x.sizes());
  y.sum().backward();
  EXPECT_EQ(x.grad().sizes(), x.sizes());
}

}  // namespace
}  // namespace opfuse::testing::test_batch_norm_silu
