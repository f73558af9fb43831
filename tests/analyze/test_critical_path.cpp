// The critical path on hand-written traces whose answers are worked out by hand: one thread with
// its gaps, a thread that waits on another, a device stream fed by launches and waited on by a
// synchronize, and what a finding on the path would take off it.
#include <gtest/gtest.h>

#include <string>

#include "opfuse/analyze.h"

namespace opfuse::analyze {
namespace {

std::string x(const std::string& cat, const std::string& name, double ts, double dur, int tid, int correlation = -1,
              const std::string& dims = "") {
  std::string args;
  if (correlation >= 0) args = R"("correlation":)" + std::to_string(correlation);
  if (!dims.empty()) args += std::string(args.empty() ? "" : ",") + R"("Input Dims":)" + dims;
  return R"({"ph":"X","cat":")" + cat + R"(","name":")" + name + R"(","pid":)" + (cat == "kernel" ? "0" : "1") +
         R"(,"tid":)" + std::to_string(tid) + R"(,"ts":)" + std::to_string(ts) + R"(,"dur":)" + std::to_string(dur) +
         R"(,"args":{)" + args + "}}";
}

CriticalPath path_of(const std::string& events) {
  const trace::Trace t = trace::parse_trace("[" + events + "]", "t.json");
  return critical_path(t, trace::build_links(t));
}

TEST(CriticalPath, OneThreadIsItsOpsAndGaps) {
  const CriticalPath p = path_of(x("cpu_op", "a", 0, 10, 1) + "," + x("cpu_op", "b", 12, 8, 1) + "," +
                                 x("cpu_op", "c", 50, 10, 1));
  EXPECT_DOUBLE_EQ(p.length_us, 60);
  EXPECT_DOUBLE_EQ(p.host_us, 28);
  EXPECT_DOUBLE_EQ(p.idle_us, 32);
  EXPECT_DOUBLE_EQ(p.device_us, 0);
}

// The main thread waits from 10 to 40 for a worker that runs 5..38, started by main's first op.
TEST(CriticalPath, AWaitFollowsTheThreadWaitedOn) {
  const CriticalPath p = path_of(x("cpu_op", "main1", 0, 10, 1) + "," + x("cpu_op", "main2", 40, 10, 1) + "," +
                                 x("cpu_op", "worker", 5, 33, 2));
  EXPECT_DOUBLE_EQ(p.length_us, 50);
  EXPECT_DOUBLE_EQ(p.host_us, 10 + 33 + 5);  // main2, the worker, main1 until it started the worker
  EXPECT_DOUBLE_EQ(p.idle_us, 2);
  ASSERT_EQ(p.on_path.size(), 3u);
  EXPECT_DOUBLE_EQ(p.on_path[0], 5);
  EXPECT_DOUBLE_EQ(p.on_path[2], 33);
}

// Two launches, two kernels in a row, a synchronize: the path is the launch of the first kernel,
// both kernels, and the host after the synchronize returned.
TEST(CriticalPath, LaunchesKernelsAndASynchronize) {
  const CriticalPath p = path_of(
      x("cpu_op", "a", 0, 10, 1) + "," + x("cuda_runtime", "cudaLaunchKernel", 2, 2, 1, 1) + "," +
      x("cpu_op", "b", 10, 10, 1) + "," + x("cuda_runtime", "cudaLaunchKernel", 12, 2, 1, 2) + "," +
      x("cpu_op", "sync", 20, 80, 1) + "," + x("cuda_runtime", "cudaDeviceSynchronize", 21, 78, 1) + "," +
      x("kernel", "k1", 5, 45, 7, 1) + "," + x("kernel", "k2", 50, 48, 7, 2));
  EXPECT_DOUBLE_EQ(p.length_us, 100);
  EXPECT_DOUBLE_EQ(p.device_us, 45 + 48);
  EXPECT_DOUBLE_EQ(p.host_us, 1 + 4);  // after the synchronize; a until k1's launch returned
  EXPECT_DOUBLE_EQ(p.idle_us, 1 + 1);  // k2's end to the synchronize's; the launch's return to k1's start
}

// sigmoid + mul on the only thread: all of the silu finding is on the path, and its saving is.
TEST(CriticalPath, AFindingOnThePathTakesItsSavingOff) {
  const std::string dims = "[[64,64]]", dims2 = "[[64,64],[64,64]]";
  const std::string json = "[" + x("cpu_op", "aten::sigmoid", 0, 100, 1, -1, dims) + "," +
                           x("cpu_op", "aten::mul", 101, 100, 1, -1, dims2) + "," +
                           x("cpu_op", "aten::mm", 202, 300, 1, -1, "[[64,64],[64,64]]") + "]";
  const trace::Trace t = trace::parse_trace(json, "t.json");
  const Analysis a = analyze(t, "t.json", default_rules(), {});
  const auto silu = std::find_if(a.findings.begin(), a.findings.end(), [](const Finding& f) { return f.rule == "silu"; });
  ASSERT_NE(silu, a.findings.end());
  EXPECT_DOUBLE_EQ(silu->critical_share, 1);
  EXPECT_GT(silu->est_saving_us, 0);
  EXPECT_DOUBLE_EQ(silu->saving_on_path_us, silu->est_saving_us);
  EXPECT_DOUBLE_EQ(a.critical_path.length_us, 502);
  EXPECT_TRUE(a.critical_path.on_path.empty());  // dropped once used
}

}  // namespace
}  // namespace opfuse::analyze
