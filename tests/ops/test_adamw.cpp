// opfuse::adamw_ against a float64 reference of torch.optim.AdamW's formula, on every CPU path
// and dtype, step by step: each step's output is compared with the reference step taken from
// the same (already rounded) state, so the bound does not grow with the number of steps.
//
// Stated bounds, per element, with u the arithmetic's unit roundoff (float32 and bfloat16
// 2^-24, float64 2^-53), s the storage's (bfloat16 2^-8, else 0), and the magnitudes of the terms
//   M = β1·|m| + (1 − β1)·|g|        V = β2·v + (1 − β2)·g²        D = sqrt(V̂) + eps (reference)
//   m, v:  ≤ 16u·M, 16u·V  + s·|ref|
//   p:     ≤ 16u·(|p| + step_size·M / D)  + s·|ref|
// 16u: m and v take ≤ 5 roundings (coefficient casts, two products, a sum), the update ≤ 14
// (m's, sqrt's, the divisions', eps's), p·decay 2, the last sum 1.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "opfuse/ops.h"
#include "reference.h"

// The file's own namespace: the op tests are compiled a few to a unit.
namespace opfuse::testing::test_adamw {
namespace {

struct Hyper {
  double lr = 1e-2, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.1;
  bool maximize = false;
};

struct Group {
  std::vector<at::Tensor> p, g, m, v, steps;
};

// A group partway through training: moments of plausible size, t + i steps taken by tensor i
// (counts differ across a group when a parameter missed a step).
Group random_group(const std::vector<std::vector<int64_t>>& shapes, at::ScalarType dtype, double t) {
  Group group;
  for (size_t i = 0; i < shapes.size(); ++i) {
    group.p.push_back(torch::randn(shapes[i]).to(dtype));
    group.g.push_back(torch::randn(shapes[i]).to(dtype));
    group.m.push_back((torch::randn(shapes[i]) * 0.1).to(dtype));
    group.v.push_back((torch::rand(shapes[i]) * 0.01).to(dtype));
    group.steps.push_back(torch::tensor(float(t + i)));
  }
  return group;
}

void step(Group& group, const Hyper& h) {
  opfuse::adamw_(group.p, group.g, group.m, group.v, group.steps, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay,
                 h.maximize);
}

// The reference step from tensor i's state before the step, compared with the state after it.
void check_step(const Group& before, const Group& after, size_t i, const Hyper& h, const std::string& what) {
  const at::ScalarType dtype = after.p[i].scalar_type();
  const double u = 16 * unit_roundoff(dtype), s = storage_roundoff(dtype), t = before.steps[i].item<double>() + 1;
  auto f64 = [](const at::Tensor& x) { return x.to(torch::kDouble); };
  const at::Tensor p = f64(before.p[i]), m = f64(before.m[i]), v = f64(before.v[i]);
  const at::Tensor g = h.maximize ? -f64(before.g[i]) : f64(before.g[i]);
  const double step_size = h.lr / (1 - std::pow(h.beta1, t)), bias_correction2 = 1 - std::pow(h.beta2, t);

  const at::Tensor m_ref = h.beta1 * m + (1 - h.beta1) * g, v_ref = h.beta2 * v + (1 - h.beta2) * g * g;
  const at::Tensor denom = (v_ref / bias_correction2).sqrt() + h.eps;
  const at::Tensor p_ref = p * (1 - h.lr * h.weight_decay) - step_size * m_ref / denom;
  const at::Tensor m_terms = h.beta1 * m.abs() + (1 - h.beta1) * g.abs(), v_terms = h.beta2 * v + (1 - h.beta2) * g * g;

  expect_close(after.m[i], m_ref, u * m_terms + s * m_ref.abs(), what + " exp_avg");
  expect_close(after.v[i], v_ref, u * v_terms + s * v_ref, what + " exp_avg_sq");
  expect_close(after.p[i], p_ref, u * (p.abs() + step_size * m_terms / denom) + s * p_ref.abs(), what + " param");
}

Group clone(const Group& group) {
  Group copy;
  for (size_t i = 0; i < group.p.size(); ++i) {
    copy.p.push_back(group.p[i].clone());
    copy.g.push_back(group.g[i].clone());
    copy.m.push_back(group.m[i].clone());
    copy.v.push_back(group.v[i].clone());
    copy.steps.push_back(group.steps[i].clone());
  }
  return copy;
}

// Steps the group `steps` times with fresh gradients, checking each step of each tensor.
void check_steps(Group& group, const Hyper& h, int steps, const std::string& what) {
  for (int k = 0; k < steps; ++k) {
    for (auto& g : group.g) g.copy_(torch::randn(g.sizes()) * 3);
    const Group before = clone(group);
    step(group, h);
    for (size_t i = 0; i < group.p.size(); ++i) {
      ASSERT_EQ(group.steps[i].item<double>(), before.steps[i].item<double>() + 1) << "the step is counted";
      check_step(before, group, i, h, c10::str(what, " step ", group.steps[i].item<double>(), " tensor ", i, " ",
                                               group.p[i].sizes()));
    }
  }
}

class AdamWTest : public PathAndDtypeTest {};

TEST_P(AdamWTest, MatchesFloat64ReferenceOnFreshRandomData) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  for (double taken : {0.0, 1000.0}) {
    Group group = random_group(kParameterShapes, dtype, taken);
    check_steps(group, Hyper{}, 4, c10::str("after ", taken, " steps"));
  }
}

TEST_P(AdamWTest, HyperparametersAndMaximize) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  for (const Hyper& h : {Hyper{1e-3, 0.8, 0.99, 1e-6, 0.0, true}, Hyper{0.5, 0.0, 0.5, 0.0, 1.0, false}}) {
    Group group = random_group({{33, 7}, {20000}}, dtype, 0);
    check_steps(group, h, 3, c10::str("lr ", h.lr, " maximize ", h.maximize));
  }
}

TEST_P(AdamWTest, StridedLayouts) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  Group group = random_group({{40, 30}, {8, 6, 5, 5}, {20, 50}}, dtype, 0);
  // A transposed weight (dense, its state contiguous: updated through copies), a channels_last
  // weight with channels_last state and grad (updated where it lies), a column slice (not dense).
  group.p[0] = group.p[0].t();
  group.g[0] = group.g[0].t().contiguous();
  group.m[0] = group.m[0].t().contiguous(), group.v[0] = group.v[0].t().contiguous();
  for (auto* list : {&group.p, &group.g, &group.m, &group.v})
    (*list)[1] = (*list)[1].contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor whole = group.p[2], others = whole.slice(1, 1, 50, 2).clone();
  for (auto* list : {&group.p, &group.g, &group.m, &group.v}) (*list)[2] = (*list)[2].slice(1, 0, 50, 2);
  ASSERT_FALSE(group.p[0].is_contiguous() || group.p[1].is_contiguous() || group.p[2].is_contiguous());
  check_steps(group, Hyper{}, 2, "strided");
  EXPECT_TRUE(torch::equal(whole.slice(1, 1, 50, 2), others)) << "the columns between the slice's are left alone";
}

INSTANTIATE_TEST_SUITE_P(Ops, AdamWTest, every_path_and_dtype(), path_and_dtype_name);

// -ffp-contract=off and correctly rounded sqrt and division: the wide paths give the scalar
// path's bits, whatever the number of threads.
TEST(AdamW, EveryPathAndThreadCountGivesTheSameBits) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  for (at::ScalarType dtype : {torch::kFloat, torch::kBFloat16}) {
    const Group start = random_group({{300, 301}, {77}}, dtype, 3);
    std::vector<Group> results;
    for (auto cap : capabilities())
      for (int threads : {1, 2}) {
        CapabilityScope path(cap);
        ThreadScope scope(threads);
        results.push_back(clone(start));
        step(results.back(), Hyper{});
      }
    for (const Group& r : results)
      for (size_t i = 0; i < r.p.size(); ++i) {
        EXPECT_TRUE(torch::equal(r.p[i], results[0].p[i])) << dtype << " param " << i;
        EXPECT_TRUE(torch::equal(r.m[i], results[0].m[i])) << dtype << " exp_avg " << i;
        EXPECT_TRUE(torch::equal(r.v[i], results[0].v[i])) << dtype << " exp_avg_sq " << i;
      }
  }
}

TEST(AdamW, BadArgumentsNameTheOpAndTheEntry) {
  torch::NoGradGuard no_grad;
  Group group = random_group({{4, 3}, {5}}, torch::kFloat, 1);
  const Hyper h;
  auto call = [&](const Group& g, double lr = 1e-3) {
    return [g, lr, h] {
      opfuse::adamw_(g.p, g.g, g.m, g.v, g.steps, lr, h.beta1, h.beta2, h.eps, h.weight_decay);
    };
  };
  Group short_list = group;
  short_list.v.pop_back();
  expect_error(call(short_list), "opfuse::adamw_: params, grads, exp_avgs, exp_avg_sqs and steps must have one entry "
                                 "per parameter, got 2, 2, 2, 1, 2");
  Group shape = group;
  shape.g[1] = torch::randn({6});
  expect_error(call(shape), "opfuse::adamw_: params[1] and grads[1] must have the same shape");
  Group dtype = group;
  dtype.m[0] = dtype.m[0].to(torch::kDouble);
  expect_error(call(dtype), "opfuse::adamw_: params[0] and exp_avgs[0] must have the same dtype");
  Group mixed = group;
  for (auto* list : {&mixed.p, &mixed.g, &mixed.m, &mixed.v}) (*list)[1] = (*list)[1].to(torch::kDouble);
  expect_error(call(mixed), "opfuse::adamw_: every tensor must have params[0]'s dtype Float, got Double for params[1]");
  Group integer = group;
  integer.p[0] = integer.p[0].to(torch::kLong);
  expect_error(call(integer), "opfuse::adamw_: params[0] must be float32, float64 or bfloat16");
  Group negative = group;
  negative.steps[1] = torch::tensor(-1.0);
  expect_error(call(negative), "opfuse::adamw_: steps[1] must count the steps taken, 0 or more, got -1");
  Group two = group;
  two.steps[0] = torch::zeros({2});
  expect_error(call(two), "opfuse::adamw_: steps[0] must be a one-element CPU tensor");
  EXPECT_EQ(group.steps[0].item<double>(), 1) << "a refused call counts no step";
  Group sparse = group;
  sparse.g[0] = sparse.g[0].to_sparse();
  expect_error(call(sparse), "opfuse::adamw_: sparse tensors are not supported");
  expect_error(call(group, -1), "opfuse::adamw_: lr must not be negative");
}

TEST(AdamW, RefusesToRunUnderAutogradOnALeafThatRequiresGrad) {
  Group group = random_group({{4}}, torch::kFloat, 1);
  group.p[0].requires_grad_();
  expect_error([&] { step(group, Hyper{}); }, "opfuse::adamw_: params[0] requires grad; an optimizer step runs under "
                                              "torch.no_grad()");
  torch::NoGradGuard no_grad;
  const int64_t version = group.p[0]._version();
  step(group, Hyper{});
  EXPECT_GT(group.p[0]._version(), version) << "the step bumps the version counter";
}

}  // namespace
}  // namespace opfuse::testing::test_adamw
