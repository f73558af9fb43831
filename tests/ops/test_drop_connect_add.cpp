// opfuse::drop_connect_add against the reference's drop_connect + residual add.
//
// The fused op draws the mask as the reference does and rounds as it does, so for the same
// seed the outputs and gradients are asserted bit-identical to the composite's, not merely close.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "opfuse/ops.h"
#include "reference.h"

// The file's own namespace: the op tests are compiled a few to a unit.
namespace opfuse::testing::test_drop_connect_add {
namespace {

// efficientnet_pytorch's drop_connect, then the block's residual add.
at::Tensor composite(const at::Tensor& x, const at::Tensor& residual, double p, bool training) {
  if (!training || p == 0) return x + residual;
  const double keep = 1 - p;
  const at::Tensor random = keep + torch::rand({x.size(0), 1, 1, 1}, x.options());
  return x / keep * torch::floor(random) + residual;
}

// Forward and both gradients of one implementation, the generator seeded first.
std::vector<at::Tensor> run(bool fused, const at::Tensor& x_in, const at::Tensor& r_in, const at::Tensor& g, double p,
                            bool training, uint64_t seed) {
  at::Tensor x = x_in.detach().clone().requires_grad_(), r = r_in.detach().clone().requires_grad_();
  torch::manual_seed(seed);
  // The composite's mask broadcasts as [N, 1, 1, 1]; a lower-rank x gets it flattened.
  at::Tensor y = fused ? opfuse::drop_connect_add(x, r, p, training)
                       : x_in.dim() == 4 ? composite(x, r, p, training)
                                         : composite(x.reshape({x.size(0), -1, 1, 1}), r.reshape({r.size(0), -1, 1, 1}), p,
                                                     training).reshape(x.sizes());
  y.backward(g);
  return {y.detach(), x.grad(), r.grad()};
}

void expect_identical(const at::Tensor& x, double p, bool training, const std::string& what) {
  const at::Tensor r = torch::randn(x.sizes()).to(x.scalar_type()).contiguous(x.suggest_memory_format());
  const at::Tensor g = torch::randn(x.sizes()).to(x.scalar_type());
  const uint64_t seed = std::random_device{}();
  const auto fused = run(true, x, r, g, p, training, seed), ref = run(false, x, r, g, p, training, seed);
  const char* names[] = {"out", "dx", "dresidual"};
  for (size_t i = 0; i < fused.size(); ++i)
    EXPECT_TRUE(torch::equal(fused[i], ref[i])) << what << ": " << names[i] << " differs (mask seed " << seed << ")";
}

class DropConnectAddTest : public PathAndDtypeTest {};

TEST_P(DropConnectAddTest, SameBitsAsTheReferenceForTheSameSeed) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  for (auto shape : std::vector<std::vector<int64_t>>{{16, 24, 28, 28}, {3, 5, 7, 9}, {1, 4, 3, 3}, {7, 1, 1, 1}, {9, 10}, {5}})
    for (double p : {0.2, 0.5, 0.0125, 0.0})
      for (bool training : {true, false}) {
        const at::Tensor x = torch::randn(shape).to(dtype);
        expect_identical(x, p, training, c10::str(at::IntArrayRef(shape), " p ", p, training ? " training" : " eval"));
      }
}

TEST_P(DropConnectAddTest, ChannelsLastAndNonContiguous) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  const at::Tensor cl = torch::randn({6, 33, 7, 5}).to(dtype).contiguous(at::MemoryFormat::ChannelsLast);
  expect_identical(cl, 0.3, true, "channels_last");
  const at::Tensor r = torch::randn(cl.sizes()).to(dtype).contiguous(at::MemoryFormat::ChannelsLast);
  EXPECT_TRUE(opfuse::drop_connect_add(cl, r, 0.3, true).is_contiguous(at::MemoryFormat::ChannelsLast));
  const at::Tensor transposed = torch::randn({4, 6, 8, 9}).to(dtype).transpose(2, 3);
  expect_identical(transposed, 0.3, true, "transposed H, W");
}

INSTANTIATE_TEST_SUITE_P(Ops, DropConnectAddTest, every_path_and_dtype(), path_and_dtype_name);

TEST(DropConnectAdd, KeepsAboutOneMinusPOfTheSamples) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  const at::Tensor x = torch::ones({20000, 2}), r = torch::zeros({20000, 2});
  const at::Tensor y = opfuse::drop_connect_add(x, r, 0.3, true);
  const at::Tensor kept = (y.select(1, 0) != 0).to(torch::kDouble);
  EXPECT_NEAR(kept.mean().item<double>(), 0.7, 0.015);  // 4.6 standard deviations
  EXPECT_TRUE(torch::allclose(y.select(1, 0).masked_select(kept.to(torch::kBool)), torch::full({1}, 1 / 0.7f)));
  EXPECT_TRUE(torch::equal(y.select(1, 0), y.select(1, 1))) << "one mask value per sample";
}

TEST(DropConnectAdd, EvalAndZeroRateDrawNothing) {
  const at::Tensor x = torch::randn({4, 3, 2, 2}), r = torch::randn({4, 3, 2, 2});
  for (auto [p, training] : std::vector<std::pair<double, bool>>{{0.3, false}, {0.0, true}}) {
    torch::manual_seed(5);
    EXPECT_TRUE(torch::equal(opfuse::drop_connect_add(x, r, p, training), x + r));
    const at::Tensor next = torch::rand({1});
    torch::manual_seed(5);
    EXPECT_TRUE(torch::equal(next, torch::rand({1}))) << "the generator moved";
  }
}

TEST(DropConnectAdd, GradientMatchesFiniteDifferencesInFloat64) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  at::Tensor x = torch::randn({6, 2, 3, 3}, torch::kDouble).requires_grad_();
  at::Tensor r = torch::randn({6, 2, 3, 3}, torch::kDouble).requires_grad_();
  const at::Tensor g = torch::randn({6, 2, 3, 3}, torch::kDouble);
  const uint64_t mask_seed = std::random_device{}();
  auto call = [&](const at::Tensor& xv, const at::Tensor& rv) {
    torch::manual_seed(mask_seed);  // the same mask for every evaluation
    return opfuse::drop_connect_add(xv, rv, 0.4, true);
  };
  call(x, r).backward(g);
  const double h = 1e-6;
  for (int which = 0; which < 2; ++which) {
    const at::Tensor& leaf = which == 0 ? x : r;
    for (int64_t i = 0; i < leaf.numel(); i += 5) {
      at::Tensor plus = leaf.detach().clone(), minus = leaf.detach().clone();
      plus.view({-1})[i] += h;
      minus.view({-1})[i] -= h;
      auto f = [&](const at::Tensor& v) {
        return (call(which == 0 ? v : x.detach(), which == 1 ? v : r.detach()) * g).sum().item<double>();
      };
      const double numeric = (f(plus) - f(minus)) / (2 * h);
      EXPECT_NEAR(leaf.grad().view({-1})[i].item<double>(), numeric, 1e-7 * (1 + std::abs(numeric)))
          << "input " << which << " element " << i;
    }
  }
}

TEST(DropConnectAdd, OneThreadEqualsTwoThreads) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  const at::Tensor x = torch::randn({16, 40, 28, 28}), r = torch::randn({16, 40, 28, 28});
  const at::Tensor g = torch::randn_like(x);
  auto go = [&](int threads) {
    ThreadScope scope(threads);
    return run(true, x, r, g, 0.5, true, 11);
  };
  const auto one = go(1), two = go(2);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(torch::equal(one[i], two[i])) << i;
}

TEST(DropConnectAdd, EmptyBatch) {
  at::Tensor x = torch::randn({0, 4, 5, 5}).requires_grad_();
  at::Tensor y = opfuse::drop_connect_add(x, torch::randn({0, 4, 5, 5}), 0.2, true);
  EXPECT_EQ(y.sizes(), x.sizes());
  y.sum().backward();
  EXPECT_EQ(x.grad().sizes(), x.sizes());
}

TEST(DropConnectAdd, BadArgumentsAreClearErrors) {
  const at::Tensor x = torch::randn({2, 3, 4, 4});
  expect_error([&] { opfuse::drop_connect_add(x, torch::randn({2, 3, 4, 5}), 0.2, true); }, "same shape");
  expect_error([&] { opfuse::drop_connect_add(x, x.to(torch::kDouble), 0.2, true); }, "same dtype");
  expect_error([&] { opfuse::drop_connect_add(x, x, 1.0, true); }, "p must be in [0, 1)");
  expect_error([&] { opfuse::drop_connect_add(x, x, -0.1, true); }, "p must be in [0, 1)");
  expect_error([&] { opfuse::drop_connect_add(torch::randn({}), torch::randn({}), 0.2, true); }, "at least 1 dim");
  expect_error([&] { opfuse::drop_connect_add(x.to(torch::kInt), x.to(torch::kInt), 0.2, true); },
               "must be float32, float64 or bfloat16");
}

}  // namespace
}  // namespace opfuse::testing::test_drop_connect_add
