// Where a trace's steps come from: ProfilerStep markers, the user's count, or, with neither, the
// main thread's top-level ops repeating whole (a training loop profiled without a schedule).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "opfuse/analyze.h"

namespace opfuse::analyze {
namespace {

// Top-level ops on thread 1, 10 µs apart and 8 µs long (names as written, "aten::" included);
// thread 2 gets a few ops of its own, as an autograd or data-loading thread would.
std::string ops_trace(const std::vector<std::string>& names, double gap = 10) {
  std::string ev;
  double ts = 0;
  auto slice = [&](const std::string& name, double at, int tid) {
    ev += fmt::format(R"({}{{"ph":"X","cat":"cpu_op","name":"{}","pid":1,"tid":{},"ts":{},"dur":8}})", ev.empty() ? "" : ",\n",
                      name, tid, at);
  };
  for (const std::string& n : names) slice(n, ts, 1), ts += gap;
  for (int k = 0; k < 3; ++k) slice("aten::copy_", 5.0 * k, 2);
  return "[" + ev + "]";
}

Summary summary_of(const std::string& json, int64_t given = 0) {
  const trace::Trace t = trace::parse_trace(json, "t.json");
  Options o;
  o.steps = given;
  return analyze(t, "t.json", {}, o).trace;
}

std::vector<std::string> repeat(const std::vector<std::string>& step, int times) {
  std::vector<std::string> out;
  for (int k = 0; k < times; ++k) out.insert(out.end(), step.begin(), step.end());
  return out;
}

const std::vector<std::string> kStep = {"aten::linear", "aten::relu", "aten::linear", "aten::mse_loss",
                                        "aten::ones_like", "Optimizer.step#SGD.step", "Optimizer.zero_grad#SGD.zero_grad"};

TEST(Steps, WholeRepeatsOfATrainingStep) {
  const Summary s = summary_of(ops_trace(repeat(kStep, 3)));
  EXPECT_EQ(s.steps, 3);
  EXPECT_EQ(s.steps_from, "repeated pattern");
  EXPECT_DOUBLE_EQ(s.step_us, 70);  // 7 ops, 10 µs apart (the last step: 68, to its last op's end)
}

// The profiler started inside a step and stopped inside another: the whole repeats between count.
TEST(Steps, APartialStepAtEitherEnd) {
  std::vector<std::string> names(kStep.begin() + 4, kStep.end());  // the end of a step
  const auto whole = repeat(kStep, 2);
  names.insert(names.end(), whole.begin(), whole.end());
  names.insert(names.end(), kStep.begin(), kStep.begin() + 2);  // the start of one
  const Summary s = summary_of(ops_trace(names));
  EXPECT_EQ(s.steps, 2);  // 3 + 14 + 2 ops: two whole periods of 7 fit
  EXPECT_EQ(s.steps_from, "repeated pattern");
  EXPECT_DOUBLE_EQ(s.step_us, 70);
}

TEST(Steps, ABackwardOpShowsTrainingToo) {
  const Summary s = summary_of(ops_trace(repeat({"aten::mul", "MulBackward0", "aten::add_"}, 4)));
  EXPECT_EQ(s.steps, 4);
  EXPECT_EQ(s.steps_from, "repeated pattern");
}

// Real loops differ a little between steps (an allocation, the first step's lazy state): the
// optimizer steps still split them, when each step nearly repeats the median one.
TEST(Steps, NearRepeatsSplitAtTheOptimizerStep) {
  auto almost = repeat(kStep, 4);
  almost[9] = "aten::gelu";                       // one op differs in the second step
  almost.insert(almost.begin() + 15, "aten::zeros");  // and the third has one more
  Summary s = summary_of(ops_trace(almost));
  EXPECT_EQ(s.steps, 4);
  EXPECT_EQ(s.steps_from, "repeated pattern");
  EXPECT_DOUBLE_EQ(s.step_us, 70);  // median of 58 (the first step, from its first op), 70, 80, 70
  // Started mid-step: the ops before the first optimizer step are too few to be one.
  almost.erase(almost.begin(), almost.begin() + 3);
  s = summary_of(ops_trace(almost));
  EXPECT_EQ(s.steps, 3);
}

// Conservative: what does not clearly repeat a training step stays a total.
TEST(Steps, NoStepsWithoutAClearRepeat) {
  auto other = repeat(kStep, 3);
  for (size_t i = 7; i < 11; ++i) other[i] = "aten::conv2d";  // the second step is another loop's
  EXPECT_EQ(summary_of(ops_trace(other)).steps, 0);
  // Identical layers in a forward pass repeat, but train nothing.
  EXPECT_EQ(summary_of(ops_trace(repeat({"aten::linear", "aten::relu"}, 6))).steps, 0);
  // One op over and over is no step.
  EXPECT_EQ(summary_of(ops_trace(repeat({"Optimizer.step#SGD.step"}, 6))).steps, 0);
  // A single step.
  const Summary one = summary_of(ops_trace(kStep));
  EXPECT_EQ(one.steps, 0);
  EXPECT_EQ(one.steps_from, "");
}

TEST(Steps, MarkersAndTheUsersCountComeFirst) {
  EXPECT_EQ(summary_of(ops_trace(repeat(kStep, 3)), 5).steps, 5);
  EXPECT_EQ(summary_of(ops_trace(repeat(kStep, 3)), 5).steps_from, "given");
  std::string marked = ops_trace(repeat(kStep, 4));
  marked.insert(1, R"({"ph":"X","cat":"user_annotation","name":"ProfilerStep#7","pid":1,"tid":1,"ts":-1,"dur":300},)");
  const Summary s = summary_of(marked);
  EXPECT_EQ(s.steps, 1);
  EXPECT_EQ(s.steps_from, "ProfilerStep");
}

}  // namespace
}  // namespace opfuse::analyze
