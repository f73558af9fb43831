// opfuse::silu and opfuse::swish against float64 references, on both CPU paths.
//
// Stated bounds, per element, for y = x·sigmoid(βx) and dx = dy·d/dx[x·sigmoid(βx)]:
//   float32   forward |y − ref| ≤ 2.4e-7·|ref|·κ (2 ulp)   backward ≤ 1e-6·|dy|·(1 + |βx|)
//   float64   forward ≤ 1e-14·|ref|                     backward ≤ 1e-13·|dy|·(1 + |βx|)
//   bfloat16  forward ≤ 4e-3·|ref| (one bf16 rounding)   backward ≤ 4e-3·|ref| + 1e-5·|dy|·(1 + |βx|)
// κ = 1 for silu; for swish κ = 1 + |βx|, the condition number of sigmoid at βx, since βx is
// itself rounded to the working precision before sigmoid sees it.
// The backward bound scales with |dy|·(1 + |βx|), not |ref|, because s·(1 + βx(1 − s)) cancels
// to zero near βx ≈ −1.28 in any formula.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "opfuse/ops.h"
#include "reference.h"
#include "ops/dispatch.h"

// The file's own namespace: the op tests are compiled a few to a unit.
namespace opfuse::testing::test_silu {
namespace {

struct Bound {
  double forward_rtol, backward_rtol, backward_scale;
};

Bound bound_for(at::ScalarType t) {
  if (t == torch::kDouble) return {1e-14, 0, 1e-13};
  if (t == torch::kBFloat16) return {4e-3, 4e-3, 1e-5};
  return {2.4e-7, 0, 1e-6};
}

at::Tensor swish_backward(const at::Tensor& grad, const at::Tensor& x, double beta) {
  static auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&, double)>("opfuse::swish_backward");
  return op.call(grad, x, beta);
}

at::Tensor run_swish(const at::Tensor& x, double beta) {
  return beta == 1.0 ? opfuse::silu(x) : opfuse::swish(x, beta);
}

// Forward and backward of x·sigmoid(βx) in float64 through ATen's own autograd.
std::pair<at::Tensor, at::Tensor> reference(const at::Tensor& x, const at::Tensor& g, double beta) {
  at::Tensor xd = x.detach().to(torch::kDouble).requires_grad_();
  at::Tensor y = xd * torch::sigmoid(beta * xd);
  y.backward(g.to(torch::kDouble));
  return {y.detach(), xd.grad()};
}

void check_against_reference(const at::Tensor& x_in, double beta, const std::string& what) {
  const Bound b = bound_for(x_in.scalar_type());
  at::Tensor x = x_in.detach().requires_grad_();
  at::Tensor g = torch::randn(x.sizes(), x.options().requires_grad(false));
  at::Tensor y = run_swish(x, beta);
  EXPECT_EQ(y.scalar_type(), x.scalar_type()) << what;
  y.backward(g);
  const auto [y_ref, dx_ref] = reference(x_in, g, beta);
  const at::Tensor xd = x_in.detach().to(torch::kDouble), gd = g.to(torch::kDouble);
  const at::Tensor kappa = beta == 1.0 ? torch::ones_like(xd) : 1 + (beta * xd).abs();
  expect_close(y, y_ref, b.forward_rtol * y_ref.abs() * kappa + 1e-30, what + " forward");
  expect_close(x.grad(), dx_ref, b.backward_rtol * dx_ref.abs() + b.backward_scale * gd.abs() * (1 + (beta * xd).abs()),
               what + " backward");
}

class SwishTest : public ::testing::TestWithParam<std::tuple<cpu::Capability, at::ScalarType, double>> {};

TEST_P(SwishTest, MatchesFloat64ReferenceOnFreshRandomData) {
  const auto [cap, dtype, beta] = GetParam();
  CapabilityScope scope(cap);
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // Odd length: the vector body, the ragged tail and several thread chunks all run.
  check_against_reference((torch::randn({100003}) * 4).to(dtype), beta, "randn·4");
  check_against_reference((torch::rand({4099}) * 200 - 100).to(dtype), beta, "uniform ±100");
}

TEST_P(SwishTest, NonContiguousAndChannelsLast) {
  const auto [cap, dtype, beta] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  const at::Tensor transposed = torch::randn({37, 53}).to(dtype).t();
  ASSERT_FALSE(transposed.is_contiguous());
  check_against_reference(transposed, beta, "transposed");
  check_against_reference(torch::randn({40, 90}).to(dtype).slice(1, 0, 90, 3), beta, "strided slice");
  const at::Tensor cl = torch::randn({3, 17, 5, 7}).to(dtype).contiguous(at::MemoryFormat::ChannelsLast);
  check_against_reference(cl, beta, "channels_last");
  EXPECT_TRUE(run_swish(cl, beta).is_contiguous(at::MemoryFormat::ChannelsLast))
      << "the output keeps the input's channels_last layout";
}

TEST(Swish, SpecialValuesGiveWhatTheReferenceGives) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  std::vector<double> values{nan, inf, -inf, 100, -100, 1e4, -1e4, 0.0, -0.0, 88.5, -88.5, 87.5, -87.5, 20, -20, 1e-30};
  for (auto cap : capabilities()) {
    CapabilityScope scope(cap);
    for (auto dtype : {torch::kFloat, torch::kDouble}) {
      for (double beta : {1.0, 1.702}) {
        SCOPED_TRACE(std::string(cpu::capability_name(cap)) + " " + c10::toString(dtype) + " beta " + std::to_string(beta));
        // Repeated so the values reach both the 8-lane body and the ragged tail.
        at::Tensor x = torch::tensor(values, torch::kDouble).repeat({3}).to(dtype);
        check_against_reference(x, beta, "NaN, ±Inf, ±100, ±1e4");
      }
    }
  }
}

std::string swish_case_name(const ::testing::TestParamInfo<SwishTest::ParamType>& info) {
  const auto [cap, dtype, beta] = info.param;
  return std::string(cpu::capability_name(cap)) + "_" + c10::toString(dtype) + (beta == 1.0 ? "_silu" : "_swish");
}

INSTANTIATE_TEST_SUITE_P(Ops, SwishTest,
                         ::testing::Combine(::testing::ValuesIn(capabilities()),
                                            ::testing::Values(torch::kFloat, torch::kDouble, torch::kBFloat16),
                                            ::testing::Values(1.0, 1.702)),
                         swish_case_name);

TEST(Silu, GradientMatchesFiniteDifferencesInFloat64) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  for (double beta : {1.0, 0.5, 1.702}) {
    at::Tensor x = (torch::randn({64}, torch::kDouble) * 3).requires_grad_();
    at::Tensor g = torch::randn({64}, torch::kDouble);
    run_swish(x, beta).backward(g);
    const double h = 1e-6;
    auto f = [&](const at::Tensor& v) { return (run_swish(v, beta) * g).sum().item<double>(); };
    for (int64_t i = 0; i < 64; ++i) {
      at::Tensor xp = x.detach().clone(), xm = x.detach().clone();
      xp[i] += h;
      xm[i] -= h;
      const double numeric = (f(xp) - f(xm)) / (2 * h);
      EXPECT_NEAR(x.grad()[i].item<double>(), numeric, 1e-7 * (1 + std::abs(numeric))) << "beta " << beta << " i " << i;
    }
  }
}

TEST(Silu, AutogradRunsTheFusedBackwardKernel) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  at::Tensor x = torch::randn({1000}).requires_grad_();
  at::Tensor g = torch::randn({1000});
  at::Tensor y = opfuse::silu(x);
  ASSERT_TRUE(y.requires_grad());
  y.backward(g);
  static auto backward_op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&)>("opfuse::silu_backward");
  EXPECT_TRUE(torch::equal(x.grad(), backward_op.call(g, x.detach())));
  EXPECT_TRUE(torch::equal(opfuse::swish(x, 1.0), y)) << "swish(β=1) is silu bit for bit";
}

TEST(Silu, DoubleBackwardIsAnErrorNotASilentZero) {
  at::Tensor x = torch::randn({10}, torch::kDouble).requires_grad_();
  at::Tensor y = opfuse::silu(x);
  auto grads = torch::autograd::grad({y}, {x}, {torch::ones_like(y)}, /*retain_graph=*/true, /*create_graph=*/true);
  try {
    grads[0].sum().backward();
    ADD_FAILURE() << "double backward ran";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("opfuse::silu_backward is not implemented"), std::string::npos) << e.what();
  }
}

TEST(Silu, OneThreadEqualsTwoThreads) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kDouble}) {
    const at::Tensor x = (torch::randn({(1 << 20) + 13}) * 5).to(dtype);
    const at::Tensor g = torch::randn_like(x);
    auto run = [&](int threads) {
      ThreadScope scope(threads);
      at::Tensor xr = x.clone().requires_grad_();
      at::Tensor y = opfuse::silu(xr);
      y.backward(g);
      return std::make_pair(y.detach(), xr.grad());
    };
    const auto one = run(1), two = run(2);
    EXPECT_TRUE(torch::equal(one.first, two.first)) << c10::toString(dtype);
    EXPECT_TRUE(torch::equal(one.second, two.second)) << c10::toString(dtype);
  }
}

TEST(Silu, SixteenLanesGiveTheSameBitsAsEight) {
  if (cpu::best_cpu_capability() < cpu::Capability::avx512) GTEST_SKIP() << "this CPU has no AVX-512";
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const at::Tensor x = (torch::randn({100003}) * 8).to(dtype), g = torch::randn({100003}).to(dtype);
    auto run = [&](cpu::Capability c) {
      CapabilityScope scope(c);
      return std::make_pair(opfuse::swish(x, 1.702), swish_backward(g, x, 1.702));
    };
    const auto eight = run(cpu::Capability::avx2), sixteen = run(cpu::Capability::avx512);
    EXPECT_TRUE(torch::equal(eight.first, sixteen.first)) << c10::toString(dtype);
    EXPECT_TRUE(torch::equal(eight.second, sixteen.second)) << c10::toString(dtype);
  }
}

TEST(Silu, EmptyAndZeroDimTensors) {
  at::Tensor empty = torch::randn({0, 3}).requires_grad_();
  at::Tensor y = opfuse::silu(empty);
  EXPECT_EQ(y.sizes(), empty.sizes());
  y.sum().backward();
  EXPECT_EQ(empty.grad().sizes(), empty.sizes());

  at::Tensor scalar = torch::tensor(0.75, torch::kDouble).requires_grad_();
  at::Tensor ys = opfuse::silu(scalar);
  EXPECT_EQ(ys.dim(), 0);
  ys.backward();
  const double s = 1 / (1 + std::exp(-0.75));
  EXPECT_NEAR(ys.item<double>(), 0.75 * s, 1e-15);
  EXPECT_NEAR(scalar.grad().item<double>(), s * (1 + 0.75 * (1 - s)), 1e-15);
}

TEST(Silu, IntegerAndHalfInputsAreRejectedWithAClearMessage) {
  for (auto dtype : {torch::kInt, torch::kLong, torch::kHalf, torch::kBool}) {
    try {
      opfuse::silu(torch::zeros({4}, dtype));
      ADD_FAILURE() << "no error for " << c10::toString(dtype);
    } catch (const c10::Error& e) {
      EXPECT_NE(std::string(e.what()).find("must be float32, float64 or bfloat16"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(opfuse::swish(torch::arange(5), 2.0), c10::Error);
}

}  // namespace
}  // namespace opfuse::testing::test_silu
