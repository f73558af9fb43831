// opfuse::sgd_ against a float64 reference of torch.optim.SGD's formula, on every CPU path and
// dtype, step by step: each step's output is compared with the reference step taken from the same
// (already rounded) state.
//
// Stated bounds, per element, with u the arithmetic's unit roundoff (float32 and bfloat16 2^-24,
// float64 2^-53), s the storage's (bfloat16 2^-8, else 0), and the magnitudes of the terms
//   D = |g| + wd·|p|     B = momentum·|b| + (1 − dampening)·D (D on a fresh buffer)
//   N = D + momentum·B with Nesterov, else B (D without momentum)
//   b:  ≤ 8u·B + s·|ref|          p:  ≤ 8u·(|p| + |lr|·N) + s·|ref|
// 8u: d takes 2 roundings, b 3 more, Nesterov's sum 2, p's update 2.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "opfuse/ops.h"
#include "reference.h"

// The file's own namespace: the op tests are compiled a few to a unit.
namespace opfuse::testing::test_sgd {
namespace {

struct Hyper {
  double lr = 1e-2, momentum = 0.9, dampening = 0, weight_decay = 1e-2;
  bool nesterov = false, maximize = false;
};

struct Group {
  std::vector<at::Tensor> p, g, b;  // b empty without momentum
};


Group random_group(const std::vector<std::vector<int64_t>>& shapes, at::ScalarType dtype, bool momentum) {
  Group group;
  for (const auto& shape : shapes) {
    group.p.push_back(torch::randn(shape).to(dtype));
    group.g.push_back(torch::randn(shape).to(dtype));
    if (momentum) group.b.push_back(torch::randn(shape).to(dtype));
  }
  return group;
}

Group clone(const Group& group) {
  Group copy;
  for (const at::Tensor& t : group.p) copy.p.push_back(t.clone());
  for (const at::Tensor& t : group.g) copy.g.push_back(t.clone());
  for (const at::Tensor& t : group.b) copy.b.push_back(t.clone());
  return copy;
}

void step(Group& group, const Hyper& h, bool fresh = false) {
  opfuse::sgd_(group.p, group.g, group.b, h.lr, h.momentum, h.dampening, h.weight_decay, h.nesterov, h.maximize, fresh);
}

// The reference step from tensor i's state before the step, compared with the state after it.
void check_step(const Group& before, const Group& after, size_t i, const Hyper& h, bool fresh, const std::string& what) {
  const at::ScalarType dtype = after.p[i].scalar_type();
  const double u = 8 * unit_roundoff(dtype), s = storage_roundoff(dtype);
  auto f64 = [](const at::Tensor& x) { return x.to(torch::kDouble); };
  const at::Tensor p = f64(before.p[i]), g = h.maximize ? -f64(before.g[i]) : f64(before.g[i]);
  const at::Tensor d = g + h.weight_decay * p, d_terms = g.abs() + h.weight_decay * p.abs();
  at::Tensor direction = d, terms = d_terms;
  if (!before.b.empty()) {
    const at::Tensor b = f64(before.b[i]);
    const at::Tensor b_ref = fresh ? d : h.momentum * b + (1 - h.dampening) * d;
    const at::Tensor b_terms = fresh ? d_terms : h.momentum * b.abs() + (1 - h.dampening) * d_terms;
    expect_close(after.b[i], b_ref, u * b_terms + s * b_ref.abs(), what + " momentum_buffer");
    direction = h.nesterov ? d + h.momentum * b_ref : b_ref;
    terms = h.nesterov ? d_terms + h.momentum * b_terms : b_terms;
  }
  const at::Tensor p_ref = p - h.lr * direction;
  expect_close(after.p[i], p_ref, u * (p.abs() + std::abs(h.lr) * terms) + s * p_ref.abs(), what + " param");
}

// Steps the group `steps` times with fresh gradients (the first with fresh buffers if asked),
// checking each step of each tensor.
void check_steps(Group& group, const Hyper& h, int steps, bool fresh_first, const std::string& what) {
  for (int k = 0; k < steps; ++k) {
    for (auto& g : group.g) g.copy_(torch::randn(g.sizes()) * 3);
    const bool fresh = fresh_first && k == 0;
    const Group before = clone(group);
    step(group, h, fresh);
    for (size_t i = 0; i < group.p.size(); ++i)
      check_step(before, group, i, h, fresh, c10::str(what, " step ", k, " tensor ", i, " ", group.p[i].sizes()));
  }
}

class SgdTest : public PathAndDtypeTest {};

TEST_P(SgdTest, MatchesFloat64ReferenceOnFreshRandomData) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  for (bool fresh : {true, false}) {
    Group group = random_group(kParameterShapes, dtype, true);
    check_steps(group, Hyper{}, 3, fresh, c10::str("fresh buffers ", fresh));
  }
}

TEST_P(SgdTest, NesterovDampeningMaximizeAndNoMomentum) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  // and what torch's functional form takes from a group unchecked: a negative lr (ascent), Nesterov
  // with the momentum at 0 (plain SGD)
  const Hyper nesterov{0.1, 0.9, 0, 1e-4, true, false}, dampened{0.5, 0.8, 0.3, 0, false, true},
      plain{0.05, 0, 0, 0.1, false, false}, bare{0.05, 0, 0, 0, false, true}, ascent{-0.05, 0, 0, 0.1, true, false};
  for (const Hyper& h : {nesterov, dampened, plain, bare, ascent}) {
    Group group = random_group({{33, 7}, {20000}}, dtype, h.momentum != 0);
    check_steps(group, h, 3, h.momentum != 0, c10::str("momentum ", h.momentum, " dampening ", h.dampening,
                                                       " nesterov ", h.nesterov, " maximize ", h.maximize));
  }
}

TEST_P(SgdTest, StridedLayouts) {
  const auto [cap, dtype] = GetParam();
  CapabilityScope scope(cap);
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  Group group = random_group({{40, 30}, {8, 6, 5, 5}, {20, 50}}, dtype, true);
  // A transposed weight (dense, its grad and buffer contiguous: taken through copies), a
  // channels_last weight with channels_last grad and buffer (updated where it lies), a column
  // slice (not dense).
  group.p[0] = group.p[0].t();
  group.g[0] = group.g[0].t().contiguous();
  group.b[0] = group.b[0].t().contiguous();
  for (auto* list : {&group.p, &group.g, &group.b}) (*list)[1] = (*list)[1].contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor whole = group.p[2], others = whole.slice(1, 1, 50, 2).clone();
  for (auto* list : {&group.p, &group.g, &group.b}) (*list)[2] = (*list)[2].slice(1, 0, 50, 2);
  ASSERT_FALSE(group.p[0].is_contiguous() || group.p[1].is_contiguous() || group.p[2].is_contiguous());
  check_steps(group, Hyper{}, 2, false, "strided");
  EXPECT_TRUE(torch::equal(whole.slice(1, 1, 50, 2), others)) << "the columns between the slice's are left alone";
}

INSTANTIATE_TEST_SUITE_P(Ops, SgdTest, every_path_and_dtype(), path_and_dtype_name);

// -ffp-contract=off: the wide paths give the scalar path's bits, whatever the number of threads.
TEST(Sgd, EveryPathAndThreadCountGivesTheSameBits) {
  SCOPED_TRACE("seed " + std::to_string(fresh_seed()));
  for (at::ScalarType dtype : {torch::kFloat, torch::kBFloat16}) {
    const Group start = random_group({{300, 301}, {77}}, dtype, true);
    const Hyper h{0.1, 0.9, 0, 1e-4, true, false};
    std::vector<Group> results;
    for (auto cap : capabilities())
      for (int threads : {1, 2}) {
        CapabilityScope path(cap);
        ThreadScope scope(threads);
        results.push_back(clone(start));
        step(results.back(), h);
      }
    for (const Group& r : results)
      for (size_t i = 0; i < r.p.size(); ++i) {
        EXPECT_TRUE(torch::equal(r.p[i], results[0].p[i])) << dtype << " param " << i;
        EXPECT_TRUE(torch::equal(r.b[i], results[0].b[i])) << dtype << " momentum_buffer " << i;
      }
  }
}

TEST(Sgd, BadArgumentsNameTheOpAndTheEntry) {
  torch::NoGradGuard no_grad;
  const Group group = random_group({{4, 3}, {5}}, torch::kFloat, true);
  auto call = [](const Group& g, Hyper h = Hyper{}) { return [g, h] { Group copy = g; step(copy, h); }; };
  Group short_list = group;
  short_list.g.pop_back();
  expect_error(call(short_list), "opfuse::sgd_: params and grads must have one entry per parameter, got 2 and 1");
  Group no_buffers = group;
  no_buffers.b.clear();
  expect_error(call(no_buffers), "opfuse::sgd_: momentum_buffers must have one entry per parameter, got 0 for 2 params");
  expect_error(call(group, Hyper{1e-2, 0}), "opfuse::sgd_: momentum_buffers must be empty without momentum, got 2");
  Group shape = group;
  shape.b[1] = torch::randn({6});
  expect_error(call(shape), "opfuse::sgd_: params[1] and momentum_buffers[1] must have the same shape");
  Group mixed = group;
  for (auto* list : {&mixed.p, &mixed.g, &mixed.b}) (*list)[1] = (*list)[1].to(torch::kDouble);
  expect_error(call(mixed), "opfuse::sgd_: every tensor must have params[0]'s dtype Float, got Double for params[1]");
  Group integer = group;
  integer.p[0] = integer.p[0].to(torch::kLong);
  expect_error(call(integer), "opfuse::sgd_: params[0] must be float32, float64 or bfloat16");
  Group sparse = group;
  sparse.g[0] = sparse.g[0].to_sparse();
  expect_error(call(sparse), "opfuse::sgd_: sparse tensors are not supported");
}

TEST(Sgd, RefusesToRunUnderAutogradOnALeafThatRequiresGrad) {
  Group group = random_group({{4}}, torch::kFloat, true);
  group.p[0].requires_grad_();
  expect_error([&] { step(group, Hyper{}); }, "opfuse::sgd_: params[0] requires grad; an optimizer step runs under "
                                              "torch.no_grad()");
  torch::NoGradGuard no_grad;
  const int64_t version = group.p[0]._version(), buffer_version = group.b[0]._version();
  step(group, Hyper{});
  EXPECT_GT(group.p[0]._version(), version) << "the step bumps the version counter";
  EXPECT_GT(group.b[0]._version(), buffer_version);
}

}  // namespace
}  // namespace opfuse::testing::test_sgd
