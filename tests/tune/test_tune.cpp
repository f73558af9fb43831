// tune: verification, rewrites on EfficientNet and on TorchScript modules, and the loop end to end
// on a tiny configuration.
#include <gtest/gtest.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/torch.h>

#include <cstdlib>
#include <limits>
#include <random>

#include "../temp_dir.h"
#include "opfuse/bench.h"
#include "opfuse/rewrite.h"
#include "opfuse/tune.h"
#include "tune/model_workload.h"

namespace opfuse::tune {
namespace {

TuneOptions tiny(int image_size = 64, int batch = 4) {
  TuneOptions o;
  o.image_size = image_size;
  o.batch_size = batch;
  o.num_classes = 10;
  o.seed = static_cast<uint64_t>(std::random_device{}());
  return o;
}

// The model as tune sees it: with batches drawn from the options' seed.
std::shared_ptr<ModelWorkload> workload(std::unique_ptr<rewrite::Target> model, const TuneOptions& o) {
  auto batches = std::make_shared<const Batches>(make_batches(o, *model));
  return std::make_shared<ModelWorkload>(std::move(model), batches, o.lr);
}

const analyze::Rule& rule(const std::vector<analyze::Rule>& rules, const std::string& name) {
  for (const auto& r : rules)
    if (r.name == name) return r;
  throw std::runtime_error("no rule " + name);
}

// What analyze's estimates time: an op's variants (the opfuse op by default; its reference and
// torch's op for the chain it replaces), forward and backward, on activations in torch's default
// layout or in the order a trace recorded, and a convolution in a layout; anything else it
// cannot time.
TEST(FusedOpTimer, TimesEachVariantAndLayoutItIsAskedFor) {
  for (const char* op : {"silu", "silu@reference", "silu@aten", "silu_backward@aten", "batch_norm_silu_backward@reference",
                         "batch_norm_silu_backward@aten+order=0,2,3,1", "attention_backward@reference+order=0,2,1,3"})
    EXPECT_GT(bench::time_fused_op(op, "4,8,6,6"), 0) << op;
  const std::string conv = "2,8,9,9;8,1,3,3;2,8,9,9;1,1;1,1;8";
  EXPECT_GT(bench::time_fused_op("conv2d_backward@channels_last", conv), 0);
  for (const char* op : {"silu@eager", "nosuch@reference", "conv2d@sideways", "conv2d@contiguous+order=0,2,3,1"})
    EXPECT_EQ(bench::time_fused_op(op, op[0] == 'c' ? conv : "4,8"), -1) << op;
  for (const char* order : {"0,2,3", "0,1,1,3", "0,2,3,4", "x"})  // not a permutation of the 4 dimensions
    EXPECT_EQ(bench::time_fused_op(std::string("silu+order=") + order, "4,8,6,6"), -1) << order;
}

TEST(Decide, KeepsOnlyWhatTheIntervalSupports) {
  EXPECT_EQ(decide(0.05, {0.03, 0.08}, 0.02), Decision::kept);
  EXPECT_EQ(decide(0.05, {0.02, 0.08}, 0.02), Decision::kept);
  EXPECT_EQ(decide(-0.01, {-0.04, 0.01}, 0.02), Decision::rolled_back);
  EXPECT_EQ(decide(0.01, {-0.01, 0.05}, 0.02), Decision::inconclusive);
  EXPECT_EQ(decide(0.0, {-0.5, 0.5}, -1), Decision::kept);  // -1 keeps every verified rewrite
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(decide(0.0, {-1, inf}, 0.02), Decision::inconclusive);  // one round: nothing is known
}

TEST(Decide, KeepsAGainAboveZeroWhoseMedianClearsTheMinimum) {
  // llama2.c's rotary: +3.4% [+1.9, +4.5] with --min-gain 2% is a gain the user would lose.
  EXPECT_EQ(decide(0.034, {0.019, 0.045}, 0.02), Decision::kept);
  EXPECT_EQ(decide(0.015, {0.001, 0.030}, 0.02), Decision::inconclusive);  // above zero, median short
  EXPECT_EQ(decide(0.030, {0.000, 0.045}, 0.02), Decision::inconclusive);  // the interval touches zero
  EXPECT_EQ(decide(0.030, {-0.01, 0.045}, 0.02), Decision::inconclusive);
}

TEST(Decide, SmallOrUnclearGainsAreTimedAgainAsAGroup) {
  auto measured = [](Decision d, double lo, double hi, bool kept = false) {
    Replacement r;
    r.measured = r.verdict.passed = true;
    r.decision = d, r.gain_ci = {lo, hi}, r.kept = kept;
    return r;
  };
  EXPECT_TRUE(worth_a_group(measured(Decision::inconclusive, -0.01, 0.03)));
  EXPECT_TRUE(worth_a_group(measured(Decision::rolled_back, 0.005, 0.017)));  // Qwen2's add + RMSNorm
  EXPECT_FALSE(worth_a_group(measured(Decision::rolled_back, 0.0, 0.015)));   // no evidence of a gain
  EXPECT_FALSE(worth_a_group(measured(Decision::rolled_back, -0.02, -0.01)));
  EXPECT_FALSE(worth_a_group(measured(Decision::kept, 0.03, 0.05, true)));
  EXPECT_FALSE(worth_a_group(measured(Decision::inconclusive, -0.01, 0.03, true)));  // --keep-inconclusive kept it
  Replacement failed = measured(Decision::inconclusive, -0.01, 0.03);
  failed.verdict.passed = false;
  EXPECT_FALSE(worth_a_group(failed));
}

TEST(Decide, NamesItsDecisions) {
  EXPECT_STREQ(decision_name(Decision::rolled_back), "rolled back");
}

TEST(Verify, AnUnchangedModelHasNoError) {
  const TuneOptions o = tiny();
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  auto model = workload(rewrite::efficientnet("efficientnet-b0", o.image_size, o.num_classes, o.seed), o);
  const Verdict v = verify(*model, *model, o.seed);
  EXPECT_TRUE(v.passed) << v.error;
  EXPECT_EQ(v.float32_error, 0);
  EXPECT_EQ(v.float64_error, 0);
}

// A workload reduced to its probe: a fixed output and gradient, and an optimizer step of
// learning-rate size whose update is off by `update_error` (relative).
class StepOnly : public Workload {
 public:
  explicit StepOnly(double update_error) : update_error_(update_error) {}
  std::string name() const override { return "step only"; }
  std::string describe() const override { return ""; }
  int64_t samples_per_step() const override { return 1; }
  std::shared_ptr<Workload> clone() const override { return std::make_shared<StepOnly>(update_error_); }
  double step() override { return 0; }
  Probe probe(at::ScalarType dtype, uint64_t seed, double nudge) override {
    at::Tensor w = torch::linspace(-1, 1, 64, torch::dtype(dtype));
    w = w * (1 + nudge * torch::sin(w * 1000));  // a rounding-sized nudge
    const at::Tensor update = -1e-3 * w.sign() * (1 + update_error_);
    return {{w * 2}, {{"w", w}}, {{"w", update}}};
  }
  std::vector<Rewrite> rewrites_for(const analyze::Rule&) const override { return {}; }
  std::vector<std::string> save(const std::string&) const override { return {}; }

 private:
  double update_error_;
};

TEST(Verify, AnOptimizerStepIsJudgedOnItsOwnScale) {
  // A 1e-4 relative error in the update is 1e-7 absolute: nothing beside gradients of size 1,
  // but a wrong step on the update's own scale.
  const Verdict right = verify(StepOnly(0), StepOnly(0), 1);
  EXPECT_TRUE(right.passed) << right.error;
  const Verdict wrong = verify(StepOnly(0), StepOnly(1e-4), 1);
  EXPECT_FALSE(wrong.passed);
  EXPECT_EQ(wrong.worst, "optimizer update of w (float64)");
  EXPECT_NE(rejection(wrong).find("optimizer update of w"), std::string::npos) << rejection(wrong);
}

TEST(Verify, FusedSwishAndGateAgreeWithTheReference) {
  const TuneOptions o = tiny();
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  auto model = workload(rewrite::efficientnet("efficientnet-b0", o.image_size, o.num_classes, o.seed), o);
  const auto rules = analyze::default_rules();
  for (const char* name : {"silu", "se_gate"}) {
    auto candidate = model->clone();
    const auto rewrites = model->rewrites_for(rule(rules, name));
    ASSERT_FALSE(rewrites.empty());
    EXPECT_GT(rewrites.front().apply(*candidate), 0);
    const Verdict v = verify(*model, *candidate, o.seed);
    std::printf("%s: float32 %.3g float64 %.3g (worst: %s)\n", name, v.float32_error, v.float64_error, v.worst.c_str());
    EXPECT_TRUE(v.passed) << name << ": " << rejection(v);
  }
}

// A scripted module built in C++: a conv, Swish as x * sigmoid(x) (both operand orders), a
// squeeze-and-excitation gate x * sigmoid(g) with g [N, C, 1, 1], a linear head.
std::unique_ptr<rewrite::Target> scripted_net(const std::string& dir) {
  torch::jit::Module m("TinyNet");
  m.register_parameter("w", torch::randn({8, 3, 3, 3}) * 0.3, false);
  m.register_parameter("se_w", torch::randn({8, 8, 1, 1}) * 0.3, false);
  m.register_parameter("se_b", torch::randn({8}) * 0.1, false);
  m.register_parameter("fc", torch::randn({8, 5}) * 0.3, false);
  m.define(R"(
def forward(self, x):
    y = torch.conv2d(x, self.w, None, [1, 1], [1, 1])
    y = y * torch.sigmoid(y)
    g = torch.conv2d(torch.mean(y, [2, 3], True), self.se_w, self.se_b)
    y = y * torch.sigmoid(g)
    y = torch.sigmoid(y) * y
    return torch.matmul(torch.mean(y, [2, 3]), self.fc)
)");
  const std::string path = dir + "/net.pt";
  m.save(path);
  return rewrite::load_torchscript(path);
}


TEST(TorchScript, DefaultRewritesReplaceSwishAndGateAndVerify) {
  TuneOptions o = tiny();
  o.inputs = {{{3, 3, 12, 12}}};
  o.model = "net.pt";
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  torch::manual_seed(o.seed);
  const testing::TempDir dir;
  auto model = workload(scripted_net(dir.str()), o);
  const auto rules = analyze::default_rules();
  auto rewritten = model->clone();
  auto rewrite = [&](const char* name, Workload& w) { return model->rewrites_for(rule(rules, name)).back().apply(w); };
  // The gate's pattern must not take x * sigmoid(x), which silu covers: two Swish places, one gate.
  EXPECT_EQ(rewrite("se_gate", *rewritten), 1);
  EXPECT_EQ(rewrite("silu", *rewritten), 2);
  EXPECT_EQ(rewrite("silu", *rewritten), 0) << "a second pass finds nothing";
  const Verdict v = verify(*model, *rewritten, o.seed);
  EXPECT_TRUE(v.passed) << rejection(v);
  EXPECT_LT(v.float64_error, 1e-12);
  // The original is untouched: its clone shares no graph with the rewritten one.
  auto again = model->clone();
  EXPECT_EQ(rewrite("silu", *again), 2);
}

TEST(TorchScript, FusedSgdTakesTheOptimizersPlaceAndVerifiesOnItsUpdates) {
  TuneOptions o = tiny();
  o.inputs = {{{3, 3, 12, 12}}};
  o.model = "net.pt";
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  const testing::TempDir dir;
  auto model = workload(scripted_net(dir.str()), o);
  const auto rewrites = model->rewrites_for(rule(analyze::default_rules(), "fused_sgd"));
  ASSERT_EQ(rewrites.size(), 1u);
  auto fused = model->clone();
  EXPECT_EQ(rewrites[0].apply(*fused), 1);
  EXPECT_EQ(rewrites[0].apply(*fused), 0) << "swapped once";
  EXPECT_NE(fused->describe().find("optimizer=opfuse::optim::SGD"), std::string::npos) << fused->describe();
  EXPECT_NE(fused->clone()->describe().find("optimizer=opfuse::optim::SGD"), std::string::npos) << "a clone keeps it";
  const Probe probe = fused->clone()->probe(torch::kDouble, o.seed, 0);
  ASSERT_EQ(probe.updates.size(), 4u) << "every parameter's two steps";
  EXPECT_GT(probe.updates[0].second.abs().max().item<double>(), 0);
  const Verdict v = verify(*model, *fused, o.seed);
  EXPECT_TRUE(v.passed) << rejection(v);
  EXPECT_LT(v.float64_error, 1e-12);
  fused->step();  // trains
}

// channels_last on both C++ targets, with opfuse's fused SGD stepping: the 4-d weights not
// channels-last already move (once), a clone keeps the layout, and the model verifies.
TEST(ChannelsLast, MovesTheWeightsKeepsThemInAClonesAndVerifies) {
  TuneOptions o = tiny();
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  const auto rules = analyze::default_rules();
  auto moved_weight = [](Workload& w) {
    for (auto& [name, p] : dynamic_cast<ModelWorkload&>(w).model().named_parameters())
      if (p.dim() == 4 && p.size(1) > 1 && p.size(2) * p.size(3) > 1) return p.is_contiguous(at::MemoryFormat::ChannelsLast);
    return false;
  };
  const testing::TempDir dir;
  TuneOptions scripted = o;
  scripted.inputs = {{{3, 3, 12, 12}}};
  scripted.model = "net.pt";
  torch::manual_seed(o.seed);
  for (auto model : {workload(rewrite::efficientnet("efficientnet-b0", o.image_size, o.num_classes, o.seed), o),
                     workload(scripted_net(dir.str()), scripted)}) {
    auto fused = model->clone();
    EXPECT_EQ(model->rewrites_for(rule(rules, "fused_sgd")).front().apply(*fused), 1);
    const auto rewrites = model->rewrites_for(rule(rules, "channels_last"));
    ASSERT_EQ(rewrites.size(), 1u);
    auto candidate = fused->clone();
    EXPECT_EQ(rewrites[0].apply(*candidate), 1) << "the stem's 3x3 over RGB; 1x1 and depthwise weights are both layouts";
    EXPECT_EQ(rewrites[0].apply(*candidate), 0) << "moved once";
    EXPECT_TRUE(moved_weight(*candidate));
    EXPECT_TRUE(moved_weight(*candidate->clone())) << "a clone keeps the layout";
    EXPECT_FALSE(moved_weight(*model)) << "the original is untouched";
    EXPECT_NE(candidate->describe().find("channels"), std::string::npos) << candidate->describe();
    const Verdict v = verify(*fused, *candidate, o.seed);
    EXPECT_TRUE(v.passed) << rejection(v);
    EXPECT_LT(v.float64_error, 1e-12);
    candidate->step();  // trains
  }
}

// An LM head tied to its embedding: one tensor under two names. It is one parameter, it stays
// one in a clone, and a step moves it by one SGD step (momentum's first step: lr * (g + wd * w)),
// not two.
TEST(TorchScript, ATiedWeightIsOneParameterAndStepsOnce) {
  TuneOptions o = tiny();
  o.inputs = {{{4, 6}}};
  o.loss = "mse";
  o.model = "tied.pt";
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  torch::manual_seed(o.seed);
  const testing::TempDir dir;
  torch::jit::Module m("Tied");
  const at::Tensor w = torch::randn({6, 6}) * 0.3;
  m.register_parameter("embed", w, false);
  m.register_parameter("head", w, false);
  m.define(R"(
def forward(self, x):
    return torch.matmul(torch.tanh(torch.matmul(x, self.embed)), self.head)
)");
  m.save(dir.str() + "/tied.pt");
  auto model = workload(rewrite::load_torchscript(dir.str() + "/tied.pt"), o);
  auto trained = std::static_pointer_cast<ModelWorkload>(model->clone());
  const auto params = trained->model().named_parameters();
  ASSERT_EQ(params.size(), 1u) << "one tensor, one parameter";
  EXPECT_EQ(params[0].first, "embed");
  const at::Tensor before = params[0].second.detach().clone();
  trained->step();
  const at::Tensor& p = params[0].second;
  ASSERT_TRUE(p.grad().defined());
  const at::Tensor expected = before - o.lr * (p.grad() + 1e-5 * before);
  EXPECT_TRUE(torch::allclose(p.detach(), expected, 1e-5, 1e-7))
      << "moved by " << (p.detach() - before).abs().max().item<double>() << ", one step is "
      << (expected - before).abs().max().item<double>();
  EXPECT_EQ(model->clone()->probe(torch::kDouble, o.seed, 0).updates.size(), 1u);
}

TEST(TorchScript, AWrongRewriteFailsVerification) {
  TuneOptions o = tiny();
  o.inputs = {{{3, 3, 12, 12}}};
  o.model = "net.pt";
  const testing::TempDir dir;
  auto model = workload(scripted_net(dir.str()), o);
  const auto rules = analyze::load_rules(OPFUSE_TEST_DATA "/rules/wrong_silu.yaml");
  auto rewritten = model->clone();
  EXPECT_EQ(model->rewrites_for(rule(rules, "wrong_silu")).back().apply(*rewritten), 1);
  const Verdict v = verify(*model, *rewritten, o.seed);
  EXPECT_FALSE(v.passed);
  EXPECT_GT(v.margin, 100) << v.worst;
  auto& graph = std::dynamic_pointer_cast<ModelWorkload>(rewritten)->model();
  EXPECT_THROW(rewrite::rewrite_graph(graph, "graph(%x):\n  %y = aten::nope(", "graph(%x):\n  return (%x)"),
               std::invalid_argument);
}

TEST(TorchScript, ARewriteThatFailsToRunIsRejectedWithItsError) {
  TuneOptions o = tiny();
  o.inputs = {{{3, 3, 12, 12}}};
  o.model = "net.pt";
  const testing::TempDir dir;
  auto model = workload(scripted_net(dir.str()), o);
  // se_gate on two same-shaped tensors: the op rejects the gate's shape at run time.
  auto rewritten = model->clone();
  EXPECT_EQ(rewrite::rewrite_graph(std::dynamic_pointer_cast<ModelWorkload>(rewritten)->model(), R"(
graph(%x):
  %s = aten::sigmoid(%x)
  %y = aten::mul(%x, %s)
  return (%y))",
                                   R"(
graph(%x):
  %y = opfuse::se_gate(%x, %x)
  return (%y))"),
            1);
  const Verdict v = verify(*model, *rewritten, o.seed);
  EXPECT_FALSE(v.passed);
  EXPECT_NE(v.error.find("gate"), std::string::npos) << v.error;
}

}  // namespace
}  // namespace opfuse::tune
