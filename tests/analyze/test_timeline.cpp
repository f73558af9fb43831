// The timeline of one step, time per module and the kernel table, on hand-written traces whose
// answers are worked out by hand.
#include <gtest/gtest.h>

#include <string>

#include "opfuse/analyze.h"

namespace opfuse::analyze {
namespace {

std::string slice(const std::string& cat, const std::string& name, double ts, double dur, int tid = 1,
                  const std::string& args = "") {
  return R"({"ph":"X","cat":")" + cat + R"(","name":")" + name + R"(","pid":1,"tid":)" + std::to_string(tid) +
         R"(,"ts":)" + std::to_string(ts) + R"(,"dur":)" + std::to_string(dur) +
         (args.empty() ? "" : R"(,"args":{)" + args + "}") + "}";
}

std::string kernel(const std::string& name, double ts, double dur, int correlation) {
  return R"({"ph":"X","cat":"kernel","name":")" + name + R"(","pid":0,"tid":7,"ts":)" + std::to_string(ts) +
         R"(,"dur":)" + std::to_string(dur) + R"(,"args":{"correlation":)" + std::to_string(correlation) + "}}";
}

std::string launch(double ts, int correlation) {
  return slice("cuda_runtime", "cudaLaunchKernel", ts, 2, 1, R"("correlation":)" + std::to_string(correlation));
}

// Steps of 10, 30, 20 and a cut-short 5 µs: the median of the first three is ProfilerStep#3.
// In it, sigmoid nests a launch whose kernel runs past the step's end; a kernel launched in
// step 2 is not shown. The finding marked on sigmoid covers its launch and its kernel too.
struct StepTrace {
  trace::Trace t;
  trace::Links m;
  std::vector<int32_t> marks;
  StepTrace()
      : t(trace::parse_trace(
            "[" + slice("user_annotation", "ProfilerStep#1", 0, 10) + "," +
                slice("user_annotation", "ProfilerStep#2", 10, 30) + "," + launch(12, 1) + "," +
                slice("user_annotation", "ProfilerStep#3", 40, 20) + "," +
                slice("cpu_op", "aten::sigmoid", 41, 8, 1, R"("Module Hierarchy":"_blocks.0._swish")") + "," +
                launch(42, 2) + "," + slice("cpu_op", "aten::mul", 50, 5) + "," +
                slice("user_annotation", "ProfilerStep#4", 60, 5) + "," + kernel("sgemm", 20, 4, 1) + "," +
                kernel("sigmoid_kernel", 57, 6, 2) + "]",
            "t.json")),
        m(trace::build_links(t)),
        marks(t.events.size(), -1) {
    marks[4] = 0;  // aten::sigmoid
  }
};

TEST(Timeline, ShowsTheMedianStepWithItsDeviceWork) {
  StepTrace s;
  const Timeline tl = step_timeline(s.t, s.m, s.marks);
  EXPECT_EQ(tl.step, "ProfilerStep#3");
  EXPECT_EQ(tl.steps, 4);
  EXPECT_DOUBLE_EQ(tl.begin_us, 40);
  EXPECT_DOUBLE_EQ(tl.dur_us, 23);  // to the end of the kernel launched at 42, at 63
  ASSERT_EQ(tl.lanes.size(), 2u);
  EXPECT_FALSE(tl.lanes[0].device);
  EXPECT_TRUE(tl.lanes[1].device);
  EXPECT_EQ(tl.lanes[0].rows, 3);  // step, sigmoid, its launch
  ASSERT_EQ(tl.slices.size(), 5u);  // step 3, sigmoid, launch, mul, one kernel
  auto named = [&](const std::string& name) {
    for (const auto& x : tl.slices)
      if (tl.names[x.name] == name) return x;
    ADD_FAILURE() << name << " not on the timeline";
    return TimelineSlice{};
  };
  EXPECT_EQ(named("ProfilerStep#3").row, 0);
  const TimelineSlice sigmoid = named("aten::sigmoid"), call = named("cudaLaunchKernel"), k = named("sigmoid_kernel");
  EXPECT_EQ(sigmoid.row, 1);
  EXPECT_DOUBLE_EQ(sigmoid.start_us, 1);
  EXPECT_EQ(call.row, 2);
  EXPECT_EQ(sigmoid.finding, 0);
  EXPECT_EQ(call.finding, 0);  // inside the marked op
  EXPECT_EQ(k.finding, 0);     // launched by it
  EXPECT_EQ(k.lane, 1);
  EXPECT_EQ(named("aten::mul").finding, -1);
  ASSERT_GE(sigmoid.module, 0);
  EXPECT_EQ(tl.names[sigmoid.module], "_blocks.0._swish");
  EXPECT_EQ(tl.names[k.module], "_blocks.0._swish");  // the launcher's module
  for (const auto& x : tl.slices) EXPECT_NE(tl.names[x.name], "sgemm");  // launched in step 2
}

TEST(Timeline, WholeTraceWithoutSteps) {
  const trace::Trace t = trace::parse_trace(
      "[" + slice("cpu_op", "aten::add", 5, 10) + "," + slice("cpu_op", "aten::mul", 20, 10, 2) + "]", "t.json");
  const Timeline tl = step_timeline(t, trace::build_links(t), {});
  EXPECT_EQ(tl.step, "");
  EXPECT_DOUBLE_EQ(tl.dur_us, 25);
  EXPECT_EQ(tl.lanes.size(), 2u);  // two threads
  for (const auto& x : tl.slices) EXPECT_EQ(x.finding, -1);
}

// Past the cap, the marked slices stay and the rest go deepest and shortest first.
TEST(Timeline, CapsSlicesKeepingFindings) {
  std::string events = slice("cpu_op", "aten::outer", 0, 1e6);
  const size_t n = Timeline::kMaxSlices + 10;
  for (size_t i = 0; i < n; ++i) events += "," + slice("cpu_op", "aten::inner", 10.0 + 20.0 * i, 1 + (i % 7));
  const trace::Trace t = trace::parse_trace("[" + events + "]", "t.json");
  std::vector<int32_t> marks(t.events.size(), -1);
  marks[t.events.size() - 1] = 0;  // the last inner op, among the shortest
  const Timeline tl = step_timeline(t, trace::build_links(t), marks);
  EXPECT_EQ(tl.slices.size(), Timeline::kMaxSlices);
  EXPECT_EQ(tl.left_out, static_cast<int64_t>(n + 1 - Timeline::kMaxSlices));
  EXPECT_EQ(tl.names[tl.slices.front().name], "aten::outer");
  EXPECT_EQ(tl.slices.back().finding, 0);
  for (size_t i = 1; i < tl.slices.size(); ++i) EXPECT_LE(tl.slices[i - 1].start_us, tl.slices[i].start_us);
}

// Scopes: model [0, 100) holds block [10, 50) twice-over; self time leaves the nested block out.
TEST(ModuleTime, ScopesInclusiveAndSelf) {
  const trace::Trace t = trace::parse_trace(
      "[" + slice("user_annotation", "model", 0, 100) + "," + slice("user_annotation", "model.block", 10, 40) + "," +
          slice("cpu_op", "aten::mul", 12, 5) + "," + slice("user_annotation", "model.block", 60, 20) + "]",
      "t.json");
  const auto modules = module_time(t, trace::build_links(t));
  ASSERT_EQ(modules.size(), 2u);
  EXPECT_EQ(modules[0].module, "model");
  EXPECT_DOUBLE_EQ(modules[0].total_us, 100);
  EXPECT_DOUBLE_EQ(modules[0].self_us, 40);
  EXPECT_EQ(modules[1].module, "model.block");
  EXPECT_EQ(modules[1].calls, 2);
  EXPECT_DOUBLE_EQ(modules[1].total_us, 60);
}

// Module Hierarchy only: an op nested in an op of the same module is not counted twice.
TEST(ModuleTime, HierarchyCountsOutermostOps) {
  const std::string swish = R"("Module Hierarchy":"swish")";
  const trace::Trace t = trace::parse_trace(
      "[" + slice("cpu_op", "aten::sigmoid", 0, 10, 1, swish) + "," + slice("cpu_op", "aten::empty", 1, 2, 1, swish) +
          "," + slice("cpu_op", "aten::mul", 10, 5, 1, swish) + "," + slice("cpu_op", "aten::conv2d", 20, 30) + "]",
      "t.json");
  const auto modules = module_time(t, trace::build_links(t));
  ASSERT_EQ(modules.size(), 1u);
  EXPECT_EQ(modules[0].calls, 2);
  EXPECT_DOUBLE_EQ(modules[0].total_us, 15);
}

TEST(KernelTable, ByNameLargestFirst) {
  StepTrace s;
  const auto kernels = kernel_table(s.t, s.m);
  ASSERT_EQ(kernels.size(), 2u);
  EXPECT_EQ(kernels[0].name, "sigmoid_kernel");
  EXPECT_DOUBLE_EQ(kernels[0].total_us, 6);
  EXPECT_EQ(kernels[1].count, 1);
}

}  // namespace
}  // namespace opfuse::analyze
