// opfuse::se_gate against a float64 reference, on both CPU paths.
//
// Stated bounds, per element, with s = sigmoid(gate):
//   float32   y, dx ≤ 2.4e-7·|ref|     dgate ≤ 1e-6·s(1 − s)·Σ_hw|dy·x|   (float sums of ≤ 16 partials)
//   float64   y, dx ≤ 1e-14·|ref|     dgate ≤ 1e-13·s(1 − s)·Σ_hw|dy·x|
//   bfloat16  y, dx ≤ 4e-3·|ref|      dgate ≤ 4e-3·|ref| + 1e-5·s(1 − s)·Σ_hw|dy·x|
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "opfuse/ops.h"
#include "reference.h"

// The file's own namespace: the op tests are compiled a few to a unit.
namespace opfuse::testing::test_se_gate {
namespace {

struct Bound {
  double elementwise_rtol, gate_rtol, gate_scale;
};

Bound bound_for(at::ScalarType t) {
  if (t == torch::kDouble) return {1e-14, 0, 1e-13};
  if (t == torch::kBFloat16) return {4e-3, 4e-3, 1e-5};
  return {2.4e-7, 0, 1e-6};
}

at::Tensor gate_like(const at::Tensor& x) {
  std::vector<int64_t> shape(x.dim(), 1);
  shape[0] = x.size(0);
  shape[1] = x.size(1);
  return (torch::randn(shape) * 3).to(x.scalar_type());
}

void check_against_reference(const at::Tensor& x_in, const at::Tensor& gate_in, const std::string& what) {
  const Bound b = bound_for(x_in.scalar_type());
  at::Tensor x = x_in.detach().requires_grad_(), gate = gate_in.detach().requires_grad_();
  at::Tensor g = torch::randn(x.sizes()).to(x.scalar_type());
  at::Tensor y = opfuse::se_gate(x, gate);
  y.backward(g);

  at::Tensor xd = x_in.detach().to(torch::kDouble).requires_grad_();
  at::Tensor yd = xd * torch::sigmoid(gate_in.detach().to(torch::kDouble));
  yd.backward(g.to(torch::kDouble));

  std::vector<int64_t> spatial;
  for (int64_t d = 2; d < x.dim(); ++d) spatial.push_back(d);
  // ATen's own sigmoid backward, s·(1 − s), cancels when s rounds to 1 even in float64 (at
  // gate = 30 it is off by 1e-3), so the gate's reference uses sigmoid(g)·sigmoid(−g).
  const at::Tensor gd = gate_in.detach().to(torch::kDouble);
  const at::Tensor ds = torch::sigmoid(gd) * torch::sigmoid(-gd);
  const at::Tensor dydx = g.to(torch::kDouble) * xd.detach();
  const at::Tensor dgate_ref = ds * (spatial.empty() ? dydx : dydx.sum(spatial, /*keepdim=*/true));
  const at::Tensor gate_scale = ds * (spatial.empty() ? dydx.abs() : dydx.abs().sum(spatial, /*keepdim=*/true));

  // Below float32's smallest normal (1.2e-38) a denormal or zero is as good as it gets.
  expect_close(y, yd.detach(), b.elementwise_rtol * yd.detach().abs() + 1e-37, what + " forward");
  expect_close(x.grad(), xd.grad(), b.elementwise_rtol * xd.grad().abs() + 1e-37, what + " dx");
  expect_close(gate.grad(), dgate_ref, b.gate_rtol * dgate_ref.abs() + b.gate_scale * gate_scale + 1e-37,
               what + " dgate");
}

class SeGateTest : public PathAndDtypeTest {};

TEST_P(SeGateTest, MatchesFloat64ReferenceOnFreshRandomData) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  for (auto shape : std::vector<std::vector<int64_t>>{{4, 24, 28, 28}, {3, 19, 13, 11}, {2, 5, 1, 1},
                                                      {1, 1, 9, 9}, {1, 7, 3, 3}, {4, 6, 50}, {5, 3},
                                                      {3, 300, 6, 6}, {2, 700, 3, 3}, {2, 50, 7, 7}}) {
    const at::Tensor x = torch::randn(shape).to(dtype);
    check_against_reference(x, gate_like(x), "shape " + c10::str(at::IntArrayRef(shape)));
  }
}

TEST_P(SeGateTest, ChannelsLastAndNonContiguous) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  for (auto shape : std::vector<std::vector<int64_t>>{{2, 33, 7, 5}, {3, 130, 4, 4}, {1, 200, 2, 3}}) {
    const at::Tensor cl = torch::randn(shape).to(dtype).contiguous(at::MemoryFormat::ChannelsLast);
    check_against_reference(cl, gate_like(cl), "channels_last " + c10::str(cl.sizes()));
    EXPECT_TRUE(opfuse::se_gate(cl, gate_like(cl)).is_contiguous(at::MemoryFormat::ChannelsLast));
  }
  const at::Tensor transposed = torch::randn({3, 10, 6, 9}).to(dtype).transpose(2, 3);
  ASSERT_FALSE(transposed.is_contiguous());
  check_against_reference(transposed, gate_like(transposed), "transposed H, W");
  const at::Tensor x = torch::randn({2, 8, 5, 5}).to(dtype);
  const at::Tensor strided_gate = torch::randn({2, 16, 1, 1}).to(dtype).slice(1, 0, 16, 2);
  check_against_reference(x, strided_gate, "strided gate");
}

TEST(SeGate, SaturatedGatesAndLargeInputs) {
  for (auto cap : capabilities()) {
    CapabilityScope scope(cap);
    for (auto dtype : {torch::kFloat, torch::kDouble}) {
      SCOPED_TRACE(std::string(cpu::capability_name(cap)) + " " + c10::toString(dtype));
      at::Tensor x = torch::randn({2, 4, 6, 6}).to(dtype) * 1e4;
      at::Tensor gate = torch::tensor({100.0, -100.0, 1e4, -1e4, 0.0, 30.0, -30.0, 5.0}, torch::kDouble)
                            .reshape({2, 4, 1, 1})
                            .to(dtype);
      check_against_reference(x, gate, "gates ±100, ±1e4");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, SeGateTest, every_path_and_dtype(), path_and_dtype_name);

TEST(SeGate, GradientMatchesFiniteDifferencesInFloat64) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  at::Tensor x = torch::randn({2, 3, 4, 4}, torch::kDouble).requires_grad_();
  at::Tensor gate = torch::randn({2, 3, 1, 1}, torch::kDouble).requires_grad_();
  at::Tensor g = torch::randn({2, 3, 4, 4}, torch::kDouble);
  opfuse::se_gate(x, gate).backward(g);
  auto f = [&](const at::Tensor& xv, const at::Tensor& gv) { return (opfuse::se_gate(xv, gv) * g).sum().item<double>(); };
  const double h = 1e-6;
  for (int64_t i = 0; i < gate.numel(); ++i) {
    at::Tensor gp = gate.detach().clone().reshape({-1}), gm = gp.clone();
    gp[i] += h;
    gm[i] -= h;
    const double numeric = (f(x.detach(), gp.reshape(gate.sizes())) - f(x.detach(), gm.reshape(gate.sizes()))) / (2 * h);
    EXPECT_NEAR(gate.grad().reshape({-1})[i].item<double>(), numeric, 1e-7 * (1 + std::abs(numeric)));
  }
  for (int64_t i = 0; i < x.numel(); i += 7) {
    at::Tensor xp = x.detach().clone().reshape({-1}), xm = xp.clone();
    xp[i] += h;
    xm[i] -= h;
    const double numeric = (f(xp.reshape(x.sizes()), gate.detach()) - f(xm.reshape(x.sizes()), gate.detach())) / (2 * h);
    EXPECT_NEAR(x.grad().reshape({-1})[i].item<double>(), numeric, 1e-7 * (1 + std::abs(numeric)));
  }
}

TEST(SeGate, OneThreadEqualsTwoThreads) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  for (auto [format, hw] : {std::pair{at::MemoryFormat::Contiguous, int64_t{28}}, {at::MemoryFormat::ChannelsLast, 28},
                            {at::MemoryFormat::Contiguous, 3}}) {  // 3×3: small planes, in stretches
    for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
      const at::Tensor x = torch::randn({8, 96, hw, hw}).to(dtype).contiguous(format);
      const at::Tensor gate = torch::randn({8, 96, 1, 1}).to(dtype);
      const at::Tensor g = torch::randn_like(x);
      auto run = [&](int threads) {
        ThreadScope scope(threads);
        at::Tensor xr = x.clone().requires_grad_(), gr = gate.clone().requires_grad_();
        at::Tensor y = opfuse::se_gate(xr, gr);
        y.backward(g);
        return std::make_tuple(y.detach(), xr.grad(), gr.grad());
      };
      const auto one = run(1), two = run(2);
      EXPECT_TRUE(torch::equal(std::get<0>(one), std::get<0>(two)));
      EXPECT_TRUE(torch::equal(std::get<1>(one), std::get<1>(two)));
      EXPECT_TRUE(torch::equal(std::get<2>(one), std::get<2>(two))) << "gate gradient depends on thread count";
    }
  }
}

TEST(SeGate, EmptyBatch) {
  at::Tensor x = torch::randn({0, 4, 5, 5}).requires_grad_();
  at::Tensor gate = torch::randn({0, 4, 1, 1}).requires_grad_();
  at::Tensor y = opfuse::se_gate(x, gate);
  EXPECT_EQ(y.sizes(), x.sizes());
  y.sum().backward();
  EXPECT_EQ(gate.grad().sizes(), gate.sizes());
  at::Tensor x2 = torch::randn({2, 4, 0, 5}).requires_grad_();
  at::Tensor gate2 = torch::randn({2, 4, 1, 1}).requires_grad_();
  opfuse::se_gate(x2, gate2).sum().backward();
  EXPECT_TRUE(torch::equal(gate2.grad(), torch::zeros_like(gate2))) << "no pixels, no gradient";
}

TEST(SeGate, BadShapesAndDtypesAreClearErrors) {
  const at::Tensor x = torch::randn({2, 3, 4, 4});
  expect_error([&] { opfuse::se_gate(x, torch::randn({2, 3, 2, 1})); }, "gate must have shape [2, 3, 1, 1]");
  expect_error([&] { opfuse::se_gate(x, torch::randn({3})); }, "gate must have shape");
  expect_error([&] { opfuse::se_gate(x, torch::randn({1, 3, 1, 1})); }, "gate must have shape");
  expect_error([&] { opfuse::se_gate(x, torch::randn({2, 3, 1, 1}, torch::kDouble)); }, "same dtype");
  expect_error([&] { opfuse::se_gate(x.to(torch::kInt), torch::zeros({2, 3, 1, 1}, torch::kInt)); },
               "must be float32, float64 or bfloat16");
  expect_error([&] { opfuse::se_gate(torch::randn({5}), torch::randn({5})); }, "at least 2 dims");
  expect_error([&] { opfuse::se_gate(torch::randn({}), torch::randn({})); }, "at least 2 dims");
}

}  // namespace
}  // namespace opfuse::testing::test_se_gate
