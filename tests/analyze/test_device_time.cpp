// Device time on hand-written GPU traces whose answers are worked out by hand: the union over
// streams (not their sum), the breakdown by kind of work, HTA's last-step filter, launch
// statistics, and the 1.8-era layout. The samples are checked against an independent script in
// check_device_time.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "opfuse/analyze.h"

namespace opfuse::analyze {
namespace {

std::vector<DeviceTime> device_time_of(const std::string& events) {
  const trace::Trace t = trace::parse_trace("[" + events + "]", "t.json");
  return device_time(t, trace::build_links(t));
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

// No markers: three steps of `aten::mul` (launching a 30 µs kernel) and an optimizer step, 100 µs
// apart, inferred from the repeating ops; HTA's filter then applies at the inferred steps' starts,
// and the figures are per step of the two before the last.
TEST(DeviceTime, InferredStepsFilterLikeMarkers) {
  std::string events;
  for (int j = 0; j < 3; ++j) {
    const double base = 100.0 * j;
    if (j > 0) events += ",";
    events += slice("cpu_op", "aten::mul", base, 20, "1", "1") + "," +
              slice("cuda_runtime", "cudaLaunchKernel", base + 5, 5, "1", "1", j + 1) + "," +
              slice("cpu_op", "Optimizer.step#SGD.step", base + 50, 10, "1", "1") + "," +
              slice("kernel", "k", base + 10, 30, "0", "7", j + 1);
  }
  const trace::Trace t = trace::parse_trace("[" + events + "]", "t.json");
  const Summary s = analyze(t, "t.json", {}, Options{}).trace;
  EXPECT_EQ(s.steps_from, "repeated pattern");
  EXPECT_EQ(s.steps, 3);
  ASSERT_EQ(s.devices.size(), 1u);
  const DeviceTime& d = s.devices[0];
  EXPECT_EQ(d.steps, 2);
  EXPECT_EQ(d.events, 2);
  EXPECT_EQ(d.left_out, 1);  // launched at 205, after the last step began
  EXPECT_DOUBLE_EQ(d.window_us, 130);  // 10 .. 140
  EXPECT_DOUBLE_EQ(d.busy_us, 60);
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

std::string process(const std::string& pid, const std::string& name) {
  return R"({"ph":"M","name":"process_name","pid":)" + pid + R"(,"tid":0,"args":{"name":")" + name + R"("}})";
}

std::string flow(char phase, const std::string& cat, const std::string& name, int id, const std::string& pid,
                 const std::string& tid, double ts) {
  return std::string(R"({"ph":")") + phase + R"(","bp":"e","cat":")" + cat + R"(","name":")" + name + R"(","id":)" +
         std::to_string(id) + R"(,"pid":)" + pid + R"(,"tid":)" + tid + R"(,"ts":)" + std::to_string(ts) + "}";
}

// Meta's MTIA: on-device work as mtia_ccp_events, submitted by mtia_runtime calls with the same
// correlation id, as kernels are by cudaLaunchKernel.
TEST(DeviceTime, ReadsMtiaCcpEventsAsADevice) {
  const std::string json = "[" + slice("cpu_op", "aten::mul", 0, 20, "1", "1") + "," +
                           slice("mtia_runtime", "runFunction - job_prep_and_submit_for_execution", 2, 6, "1", "1", 11) +
                           "," + slice("mtia_ccp_events", "mul_kernel", 10, 5, "0", "2", 11) + "," +
                           slice("mtia_ccp_events", "mul_kernel", 16, 4, "0", "3") + "]";
  const trace::Trace t = trace::parse_trace(json, "t.json");
  EXPECT_EQ(detect_backend(t), Backend::mtia);
  const auto devices = device_time(t, trace::build_links(t));
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(devices[0].device, "0");
  EXPECT_EQ(devices[0].events, 2);
  EXPECT_DOUBLE_EQ(devices[0].busy_us, 9);
  EXPECT_DOUBLE_EQ(devices[0].window_us, 10);
  EXPECT_EQ(devices[0].streams.size(), 2u);
  EXPECT_EQ(devices[0].launch.launched, 1);
  EXPECT_DOUBLE_EQ(devices[0].launch.delay_median_us, 8);
  Options o;
  o.backend = Backend::mtia;
  const Analysis a = analyze(t, "t.json", {}, o);
  ASSERT_EQ(a.ops.size(), 1u);  // the runtime call and the device events are no ops
  EXPECT_DOUBLE_EQ(a.ops[0].device_us, 5);
}

// An Ascend trace_view.json as the profiler writes it with communication: torch ops (cpu_op), CANN
// API calls and the other processes' slices uncategorised, the Overlap Analysis summary lanes.
// aten::mul's task is linked by torch_to_npu; aten::add's only by async_acl_npu from its API call,
// which runs on the op's thread id in the CANN process.
std::string ascend_trace() {
  return "[" + process("1", "Python") + "," + process("2", "CANN") + "," + process("3", "Ascend Hardware") + "," +
         process("4", "Overlap Analysis") + "," + process("5", "HCCL") + "," +
         slice("cpu_op", "aten::mul", 0, 10, "1", "7") + "," + slice("cpu_op", "aten::add", 20, 10, "1", "7") + "," +
         R"({"ph":"X","name":"AscendCL@aclnnMul","pid":2,"tid":7,"ts":2,"dur":5},)"
         R"({"ph":"X","name":"AscendCL@aclnnAdd","pid":2,"tid":7,"ts":22,"dur":5},)"
         R"({"ph":"X","name":"aclnnMul_MulAiCore_Mul","pid":3,"tid":3,"ts":30,"dur":8},)"
         R"({"ph":"X","name":"aclnnAdd_AddAiCore_Add","pid":3,"tid":3,"ts":40,"dur":4},)"
         R"({"ph":"X","name":"hcom_allReduce__1_0_1","pid":3,"tid":5,"ts":50,"dur":10},)"
         R"({"ph":"X","name":"hcom_allReduce__1_0_1","pid":5,"tid":0,"ts":50,"dur":10},)"
         R"({"ph":"X","name":"Computing","pid":4,"tid":0,"ts":30,"dur":14},)"
         R"({"ph":"X","name":"Free","pid":4,"tid":3,"ts":44,"dur":6},)"
         R"({"ph":"X","name":"Communication","pid":4,"tid":1,"ts":50,"dur":10},)"
         R"j({"ph":"X","name":"Communication(Not Overlapped)","pid":4,"tid":2,"ts":50,"dur":10},)j" +
         flow('s', "async_npu", "torch_to_npu", 1, "1", "7", 0) + "," + flow('f', "async_npu", "torch_to_npu", 1, "3", "3", 30) +
         "," + flow('s', "async_acl_npu", "async_acl_npu", 1, "2", "7", 22) + "," +
         flow('f', "async_acl_npu", "async_acl_npu", 1, "3", "3", 40) + "]";
}

TEST(DeviceTime, AscendSummaryLanesAreNoOps) {
  const trace::Trace t = trace::parse_trace(ascend_trace(), "t.json");
  ASSERT_EQ(t.dialect, trace::Dialect::ascend);
  Options o;
  o.backend = detect_backend(t);
  const Analysis a = analyze(t, "t.json", {}, o);
  ASSERT_EQ(a.ops.size(), 2u);  // not Computing, Free, the HCCL lane or the API calls
  for (const OpStat& op : a.ops) EXPECT_DOUBLE_EQ(op.device_us, op.name == "aten::mul" ? 8 : 4) << op.name;
  ASSERT_EQ(a.trace.devices.size(), 1u);
  const DeviceTime& d = a.trace.devices[0];
  EXPECT_EQ(d.device, "3");
  EXPECT_DOUBLE_EQ(d.window_us, 30);  // 30 .. 60
  EXPECT_DOUBLE_EQ(d.busy_us, 22);
  EXPECT_DOUBLE_EQ(d.compute_us, 12);
  EXPECT_DOUBLE_EQ(d.communication_us, 10);  // the HCCL task, by its collective's name
  ASSERT_EQ(d.overlap_analysis.size(), 4u);
  EXPECT_DOUBLE_EQ(d.overlap_span_us, 30);
  for (const OverlapLane& l : d.overlap_analysis) {
    EXPECT_EQ(l.slices, 1) << l.name;
    EXPECT_DOUBLE_EQ(l.total_us, l.name == "Computing" ? 14 : l.name == "Free" ? 6 : 10) << l.name;
  }
}

// Ascend with its task queue on, as tests/data/traces/make_ascend_task_queue.py writes it (the
// layout of torch_npu's trace_view.json): device time reaches the aten:: op that queued the work
// (op → Enqueue → Dequeue → aclnn* → torch_to_npu → task), and the aclnn* call keeps its row.
struct AscendTaskQueue : ::testing::Test {
  trace::Trace t = trace::read_trace(OPFUSE_TEST_DATA "/traces/ascend_task_queue.json");
  trace::Links m = trace::build_links(t);
  bool starts_with(int32_t i, const char* prefix) const { return t.strings[t.events[i].name].rfind(prefix, 0) == 0; }
};

TEST_F(AscendTaskQueue, EveryOpThatQueuedWorkGetsItsDeviceTime) {
  std::vector<double> device(t.events.size(), 0);
  double tasks = 0, linked = 0;
  for (const auto& lane : m.device_lanes)
    for (int32_t k : lane) {
      tasks += t.events[k].dur;
      if (m.launcher[k] >= 0) device[m.launcher[k]] += t.events[k].dur, linked += t.events[k].dur;
      if (m.launcher[k] >= 0) EXPECT_TRUE(starts_with(m.launcher[k], "aten::")) << t.strings[t.events[m.launcher[k]].name];
    }
  int64_t queued = 0, reached = 0;
  for (size_t i = 0; i < t.events.size(); ++i)
    if (t.strings[t.events[i].name] == "Enqueue") {
      const int32_t op = m.op_parent[i];
      ASSERT_GE(op, 0);
      ++queued, reached += device[op] > 0;
    }
  EXPECT_GT(queued, 400);
  EXPECT_EQ(reached, queued);  // the target is ≥ 90 %: each has a torch_to_npu or HostToDevice flow
  // All but the one task no flow reaches (1 µs of the device's time).
  EXPECT_NEAR(linked, tasks - 1.0, 1e-6);
  EXPECT_GE(linked / tasks, 0.99);
}

TEST_F(AscendTaskQueue, TheOpTableSplitsNothingAndKeepsTheAclnnRows) {
  Options o;
  o.backend = detect_backend(t);
  ASSERT_EQ(o.backend, Backend::npu);
  const Analysis a = analyze(t, "t.json", default_rules(), o);
  double aten = 0, tasks = 0;
  const OpStat *mul = nullptr, *aclnn_mul = nullptr;
  for (const OpStat& op : a.ops) {
    if (op.name.rfind("aten::", 0) == 0) aten += op.device_us;
    if (op.name == "aten::mul") mul = &op;
    if (op.name == "aclnnMul") aclnn_mul = &op;
  }
  for (const auto& lane : m.device_lanes)
    for (int32_t k : lane) tasks += t.events[k].dur;
  EXPECT_NEAR(aten, tasks, 0.01 * tasks);  // one stream, no overlap: its busy time is this sum
  ASSERT_NE(mul, nullptr);
  ASSERT_NE(aclnn_mul, nullptr);
  EXPECT_GT(mul->device_us, 0);
  EXPECT_DOUBLE_EQ(mul->device_us, aclnn_mul->device_us);  // every aclnnMul ran an aten::mul
  const auto adam = std::find_if(a.findings.begin(), a.findings.end(), [](const Finding& f) { return f.rule == "fused_adam"; });
  ASSERT_NE(adam, a.findings.end());
  EXPECT_EQ(adam->occurrences, 3);
  EXPECT_NEAR(adam->device_us, 3 * 6 * 8 * 2.5, 1e-6);  // 3 steps × 6 parameters × 8 ops × 2.5 µs
  EXPECT_GT(adam->host_us, adam->device_us);  // the step is host-bound: each op waits on its enqueue
  EXPECT_DOUBLE_EQ(adam->time_us, adam->device_us);  // the saving's basis on a device
  EXPECT_GT(adam->est_saving_us, 0);
  const auto silu = std::find_if(a.findings.begin(), a.findings.end(), [](const Finding& f) { return f.rule == "silu"; });
  ASSERT_NE(silu, a.findings.end());
  EXPECT_EQ(silu->replacement, "torch_npu.npu_silu");
  EXPECT_NEAR(silu->device_us, 3 * 12 * (9.0 + 11.0), 1e-6);
}

// The same chain written by hand, with the torch_to_npu flow on the Dequeue itself, a task whose
// Enqueue lost its flow (it stays with the aclnn* call), and a CANN API call's HostToDevice flow.
TEST(DeviceTime, AscendTaskQueueByHand) {
  const std::string q = "9";  // the task-queue thread
  const std::string json =
      "[" + process("1", "Python") + "," + process("2", "CANN") + "," + process("3", "Ascend Hardware") + "," +
      slice("cpu_op", "aten::mul", 0, 10, "1", "7") + "," + slice("enqueue", "Enqueue", 4, 2, "1", "7") + "," +
      slice("cpu_op", "aten::add", 20, 10, "1", "7") + "," + slice("enqueue", "Enqueue", 24, 2, "1", "7") + "," +
      slice("cpu_op", "aten::div", 40, 10, "1", "7") + "," + slice("enqueue", "Enqueue", 44, 2, "1", "7") + "," +
      slice("dequeue", "Dequeue@aclnnMul", 30, 10, "1", q) + "," + slice("cpu_op", "aclnnMul", 32, 6, "1", q) + "," +
      slice("dequeue", "Dequeue@aclnnAdd", 50, 10, "1", q) + "," + slice("cpu_op", "aclnnAdd", 52, 6, "1", q) + "," +
      slice("dequeue", "Dequeue@aclnnDiv", 70, 10, "1", q) + "," + slice("cpu_op", "aclnnDiv", 72, 6, "1", q) + "," +
      R"({"ph":"X","name":"AscendCL@aclnnDiv","pid":2,"tid":9,"ts":73,"dur":4},)" +
      slice("", "mul_task", 100, 8, "3", "2") + "," + slice("", "add_task", 110, 4, "3", "2") + "," +
      slice("", "div_task", 120, 2, "3", "2") + "," +
      flow('s', "async_task_queue", "enqueue_to_dequeue", 1, "1", "7", 4) + "," +
      flow('f', "async_task_queue", "enqueue_to_dequeue", 1, "1", q, 30) + "," +
      flow('f', "async_task_queue", "enqueue_to_dequeue", 2, "1", q, 50) + "," +  // its start was lost
      flow('s', "async_task_queue", "enqueue_to_dequeue", 3, "1", "7", 44) + "," +
      flow('f', "async_task_queue", "enqueue_to_dequeue", 3, "1", q, 70) + "," +
      flow('s', "async_npu", "torch_to_npu", 1, "1", q, 30) + "," + flow('f', "async_npu", "torch_to_npu", 1, "3", "2", 100) +
      "," + flow('s', "async_npu", "torch_to_npu", 2, "1", q, 52) + "," +
      flow('f', "async_npu", "torch_to_npu", 2, "3", "2", 110) + "," +
      flow('s', "HostToDevice", "HostToDevice1", 1, "2", q, 73) + "," +
      flow('f', "HostToDevice", "HostToDevice1", 1, "3", "2", 120) + "]";
  const trace::Trace t = trace::parse_trace(json, "t.json");
  const trace::Links m = trace::build_links(t);
  auto name = [&](int32_t i) { return i < 0 ? std::string("-") : t.strings[t.events[i].name]; };
  ASSERT_EQ(m.device_lanes.size(), 1u);
  const auto& tasks = m.device_lanes[0];
  ASSERT_EQ(tasks.size(), 3u);
  EXPECT_EQ(name(m.launcher[tasks[0]]), "aten::mul");
  EXPECT_EQ(name(m.queued_call[tasks[0]]), "-");  // the flow starts on the Dequeue, before the call
  EXPECT_EQ(name(m.launcher[tasks[1]]), "aclnnAdd");  // no Enqueue to follow back
  EXPECT_EQ(name(m.queued_call[tasks[1]]), "-");
  EXPECT_EQ(name(m.launcher[tasks[2]]), "aten::div");
  EXPECT_EQ(name(m.queued_call[tasks[2]]), "aclnnDiv");
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
