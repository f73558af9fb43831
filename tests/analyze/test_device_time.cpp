// Device time on hand-written GPU traces whose answers are worked out by hand: the union over
// streams (not their sum), the breakdown by kind of work, HTA's last-step filter, launch
// statistics, and the 1.8-era layout. The samples are checked against an independent script in
// check_device_time.py.
#include <gtest/gtest.h>

#include <string>

#include "opfuse/analyze.h"

namespace opfuse::analyze {
namespace {

std::vector<DeviceTime> device_time_of(const std::string& events) {
  const trace::Trace t = trace::parse_trace("[" + events + "]", "t.json");
  return device_time(t, trace::build_model(t));
}

std::string slice(const std::string& cat, const std::string& name, double ts, double dur, const std::string& pid,
                  const std::string& tid, int correlation = -1) {
  std::string e = R"({"ph":"X","cat":")" + cat + R"(","name":")" + name + R"(","pid":)" + pid + R"(,"tid":)" + tid +
                  R"(,"ts":)" + std::to_string(ts) + R"(,"dur":)" + std::to_string(dur);
  if (correlation >= 0) e += R"(,"args":{"correlation":)" + std::to_string(correlation) + "}";
  return e + "}";
}

// Two compute kernels on stream 7, an NCCL kernel on stream 13 overlapping both, a memcpy later.
// No steps, so every event counts.
TEST(DeviceTime, BusyIsTheUnionOverStreams) {
  const auto devices = device_time_of(
      slice("kernel", "ampere_sgemm", 0, 10, "0", "7") + "," + slice("kernel", "ampere_sgemm", 20, 10, "0", "7") + "," +
      slice("kernel", "ncclDevKernel_AllReduce", 5, 20, "0", "13") + "," +
      slice("gpu_memcpy", "Memcpy HtoD", 40, 5, "0", "7"));
  ASSERT_EQ(devices.size(), 1u);
  const DeviceTime& d = devices[0];
  EXPECT_EQ(d.device, "0");
  EXPECT_EQ(d.steps, 0);
  EXPECT_EQ(d.events, 4);
  EXPECT_DOUBLE_EQ(d.window_us, 45);
  EXPECT_DOUBLE_EQ(d.busy_us, 35);  // [0, 30) and [40, 45); summed per stream it would be 45
  EXPECT_DOUBLE_EQ(d.idle_us, 10);
  EXPECT_DOUBLE_EQ(d.compute_us, 20);
  EXPECT_DOUBLE_EQ(d.communication_us, 20);
  EXPECT_DOUBLE_EQ(d.memory_us, 5);
  ASSERT_EQ(d.streams.size(), 2u);
  EXPECT_EQ(d.streams[0].stream, "7");
  EXPECT_DOUBLE_EQ(d.streams[0].busy_us, 25);
  EXPECT_EQ(d.streams[1].stream, "13");
  EXPECT_DOUBLE_EQ(d.streams[1].busy_us, 20);
  EXPECT_EQ(d.launch.kernels, 3);  // the memcpy is no kernel
  EXPECT_EQ(d.launch.launched, 0);
}

// Steps [0, 100) and [100, 200). Kept: what was launched before 100, even the kernel that runs
// past it; left out: a launch at 150 and a kernel whose launch is not in the trace.
std::string two_step_trace(const std::string& op_cat, const std::string& runtime_cat, const std::string& kernel_cat,
                           const std::string& stream) {
  return slice("user_annotation", "ProfilerStep#1", 0, 100, "1", "1") + "," +
         slice("user_annotation", "ProfilerStep#2", 100, 100, "1", "1") + "," +
         slice(op_cat, "aten::mul", 9, 20, "1", "1") + "," +
         slice(runtime_cat, "cudaLaunchKernel", 10, 15, "1", "1", 1) + "," +
         slice(runtime_cat, "cudaLaunchKernel", 90, 2, "1", "1", 2) + "," +
         slice(runtime_cat, "cudaLaunchKernel", 150, 2, "1", "1", 3) + "," +
         slice(kernel_cat, "k1", 20, 5, "0", stream, 1) + "," + slice(kernel_cat, "k2", 95, 35, "0", stream, 2) + "," +
         slice(kernel_cat, "k3", 160, 10, "0", stream, 3) + "," + slice(kernel_cat, "k_orphan", 60, 10, "0", stream, 99) +
         "," + slice("gpu_user_annotation", "ProfilerStep#1", 20, 110, "0", stream);  // Kineto's copy: no step
}

void expect_two_step_figures(const DeviceTime& d) {
  EXPECT_EQ(d.steps, 1);  // the window spans the steps before the last
  EXPECT_EQ(d.events, 2);
  EXPECT_EQ(d.left_out, 2);
  EXPECT_DOUBLE_EQ(d.window_us, 110);  // 20 .. 130
  EXPECT_DOUBLE_EQ(d.busy_us, 40);
  EXPECT_DOUBLE_EQ(d.idle_us, 70);
  EXPECT_DOUBLE_EQ(d.compute_us, 40);
  ASSERT_EQ(d.streams.size(), 1u);
  EXPECT_EQ(d.streams[0].stream, "7");
  const LaunchStats& l = d.launch;
  EXPECT_EQ(l.kernels, 2);
  EXPECT_EQ(l.launched, 2);
  EXPECT_DOUBLE_EQ(l.delay_median_us, 7.5);  // delays 10 and 5
  EXPECT_DOUBLE_EQ(l.delay_p90_us, 9.5);     // 5 + 0.9 × (10 − 5)
  EXPECT_EQ(l.shorter_than_launch, 1);       // k1: 5 µs after a 15 µs launch
  EXPECT_DOUBLE_EQ(l.small_kernel_time_pct, 100.0 * 5 / 40);
}

TEST(DeviceTime, KeepsWhatWasLaunchedBeforeTheLastStep) {
  const auto devices = device_time_of(two_step_trace("cpu_op", "cuda_runtime", "kernel", "7"));
  ASSERT_EQ(devices.size(), 1u);
  expect_two_step_figures(devices[0]);
}

TEST(DeviceTime, ReadsTheKineto18Layout) {
  const auto devices = device_time_of(two_step_trace("Operator", "Runtime", "Kernel", "\"stream 7\""));
  ASSERT_EQ(devices.size(), 1u);
  expect_two_step_figures(devices[0]);
}

TEST(DeviceTime, OneStepIsTakenWhole) {
  const auto devices = device_time_of(slice("user_annotation", "ProfilerStep#1", 0, 100, "1", "1") + "," +
                                      slice("cuda_runtime", "cudaLaunchKernel", 150, 2, "1", "1", 3) + "," +
                                      slice("kernel", "k3", 160, 10, "0", "7", 3));
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(devices[0].steps, 1);
  EXPECT_EQ(devices[0].events, 1);
  EXPECT_DOUBLE_EQ(devices[0].busy_us, 10);
}

// A launch call that runs 5 µs past its op is left out of the op tree, but still launched the
// kernel: HTA joins on the correlation id alone.
TEST(DeviceTime, ALaunchOverhangingItsOpStillCounts) {
  const auto devices = device_time_of(slice("user_annotation", "ProfilerStep#1", 0, 100, "1", "1") + "," +
                                      slice("user_annotation", "ProfilerStep#2", 100, 100, "1", "1") + "," +
                                      slice("cpu_op", "aten::mul", 9, 5, "1", "1") + "," +
                                      slice("cuda_runtime", "cudaLaunchKernel", 10, 9, "1", "1", 1) + "," +
                                      slice("kernel", "k1", 20, 5, "0", "7", 1));
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(devices[0].events, 1);
  EXPECT_EQ(devices[0].launch.launched, 1);
}

TEST(DeviceTime, DevicesApartBusiestFirst) {
  const auto devices = device_time_of(slice("kernel", "a", 0, 10, "0", "7") + "," + slice("kernel", "b", 0, 30, "1", "7"));
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0].device, "1");
  EXPECT_DOUBLE_EQ(devices[0].busy_us, 30);
  EXPECT_DOUBLE_EQ(devices[1].busy_us, 10);
}

}  // namespace
}  // namespace opfuse::analyze
