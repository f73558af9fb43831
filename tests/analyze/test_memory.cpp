// The memory view on hand-written traces whose answers are worked out by hand: the peak of the
// allocator's total, the blocks live then charged to their op, module and part of the step, what
// opfuse's profiler says was held before, devices apart. tests/python/test_memory.py checks real
// profiles against torch's own memory timeline.
#include <gtest/gtest.h>

#include <string>

#include "opfuse/analyze.h"

namespace opfuse::analyze {
namespace {

std::string op(const std::string& cat, const std::string& name, double ts, double dur, const std::string& extra = "") {
  return R"({"ph":"X","cat":")" + cat + R"(","name":")" + name + R"(","pid":1,"tid":1,"ts":)" + std::to_string(ts) +
         R"(,"dur":)" + std::to_string(dur) + R"(,"args":{)" + extra + "}}";
}

std::string alloc(double ts, int64_t addr, int64_t bytes, int64_t total, int device_type = 0, int device_id = -1) {
  return R"({"ph":"i","cat":"cpu_instant_event","s":"t","name":"[memory]","pid":1,"tid":1,"ts":)" + std::to_string(ts) +
         R"(,"args":{"Total Reserved":0,"Total Allocated":)" + std::to_string(total) + R"(,"Bytes":)" +
         std::to_string(bytes) + R"(,"Addr":)" + std::to_string(addr) + R"(,"Device Type":)" +
         std::to_string(device_type) + R"(,"Device Id":)" + std::to_string(device_id) + "}}";
}

std::vector<MemoryTime> memory_of(const std::string& json) {
  const trace::Trace t = trace::parse_trace(json, "t.json");
  return memory_time(t, trace::build_links(t));
}

// One step: layer1's linear allocates 100 (kept) and 50 (freed at once), MulBackward0's mul
// (the backward of layer1's mul, by sequence number) 200, the optimizer 30; the peak is 330,
// after the optimizer's block. The allocator's count stood at 1000 from an earlier profile.
std::string one_step(const std::string& top_level = "") {
  return "{" + top_level + R"("traceEvents":[)" + op("user_annotation", "ProfilerStep#1", 0, 100) + "," +
         op("user_annotation", "layer1", 1, 30) + "," + op("cpu_op", "aten::linear", 2, 10) + "," +
         op("cpu_op", "aten::mul", 15, 5, R"("Sequence number":7,"Fwd thread id":0)") + "," +
         op("cpu_op", "MulBackward0", 40, 20, R"("Sequence number":7)") + "," + op("cpu_op", "aten::mul", 41, 10) + "," +
         op("cpu_op", "Optimizer.step#AdamW.step", 70, 20) + "," + op("cpu_op", "aten::add_", 71, 5) + "," +
         alloc(3, 0xA, 100, 1100) + "," + alloc(4, 0xB, 50, 1150) + "," + alloc(5, 0xB, -50, 1100) + "," +
         alloc(42, 0xC, 200, 1300) + "," + alloc(72, 0xD, 30, 1330) + "," + alloc(80, 0xC, -200, 1130) + "," +
         alloc(95, 0xD, -30, 1100) + "]}";
}

TEST(Memory, PeakAndWhoHoldsIt) {
  const auto memory = memory_of(one_step());
  ASSERT_EQ(memory.size(), 1u);
  const MemoryTime& d = memory[0];
  EXPECT_EQ(d.device, "cpu");
  EXPECT_EQ(d.allocations, 4);
  EXPECT_EQ(d.frees, 3);
  EXPECT_EQ(d.peak_bytes, 330);  // measured from the count before the first block (1000)
  EXPECT_DOUBLE_EQ(d.peak_at_us, 72);
  EXPECT_EQ(d.peak_step, "ProfilerStep#1");
  EXPECT_EQ(d.peak_op, "aten::add_");
  auto bytes_of = [](const std::vector<MemoryHolder>& rows, const std::string& name) -> int64_t {
    for (const auto& r : rows)
      if (r.name == name) return r.bytes;
    return -1;
  };
  EXPECT_EQ(bytes_of(d.by_op, "aten::linear"), 100);
  EXPECT_EQ(bytes_of(d.by_op, "aten::mul"), 200);  // the backward one: the forward's block was freed
  EXPECT_EQ(bytes_of(d.by_op, "aten::add_"), 30);
  EXPECT_EQ(d.by_op.front().name, "aten::mul");  // largest first
  EXPECT_EQ(bytes_of(d.by_module, "layer1"), 100);
  EXPECT_EQ(bytes_of(d.by_module, "layer1 (backward)"), 200);  // its forward op's module
  EXPECT_EQ(bytes_of(d.by_module, "(optimizer step)"), 30);
  EXPECT_EQ(bytes_of(d.by_phase, "forward"), 100);
  EXPECT_EQ(bytes_of(d.by_phase, "backward"), 200);
  EXPECT_EQ(bytes_of(d.by_phase, "optimizer step"), 30);
  EXPECT_EQ(bytes_of(d.by_phase, "before the profile (other)"), -1);  // nothing unaccounted for
  ASSERT_EQ(d.timeline.size(), 7u);
  EXPECT_EQ(d.timeline[4].second, 330);
}

TEST(Memory, WhatOpfuseSaysWasHeldBeforeIsAdded) {
  const auto memory = memory_of(one_step(R"("opfuse":{"memory_before":{"parameters":4000,"optimizer state":8000}},)"));
  ASSERT_EQ(memory.size(), 1u);
  EXPECT_EQ(memory[0].peak_bytes, 12330);
  EXPECT_EQ(memory[0].by_phase.front().name, "optimizer state");
  EXPECT_EQ(memory[0].by_phase.front().bytes, 8000);
  EXPECT_EQ(memory[0].by_phase[1].name, "parameters");
}

// torch reports the free of a block allocated before the profile (the last step's gradients) only
// when an earlier profile in the process saw a block at that address: such a free takes nothing
// off, whether reported or not, and the allocator's total that counted it down is not followed.
TEST(Memory, AFreeOfABlockFromBeforeTheProfileTakesNothingOff) {
  const std::string events = "[" + op("cpu_op", "aten::mm", 0, 10) + "," + alloc(1, 0xA, 100, 1100) + "," +
                             alloc(2, 0xF, -500, 600) + "," + alloc(3, 0xB, 50, 650) + "]";
  const auto memory = memory_of(R"({"opfuse":{"memory_before":{"parameters":4000}},"traceEvents":)" + events + "}");
  ASSERT_EQ(memory.size(), 1u);
  EXPECT_EQ(memory[0].peak_bytes, 4150);
  EXPECT_DOUBLE_EQ(memory[0].peak_at_us, 3);
  EXPECT_EQ(memory[0].frees, 1);
  EXPECT_EQ(memory_of(events)[0].peak_bytes, 150);  // torch's own trace: what the profile allocated
}

// A CUDA allocator's total counts everything on the device: taken as it is, and the blocks seen
// fall short of it by what was there before.
TEST(Memory, DevicesApartAndADeviceTotalAsItIs) {
  const std::string json = "[" + op("cpu_op", "aten::mm", 0, 10) + "," + alloc(1, 1, 64, 64) + "," +
                           alloc(2, 2, 512, 5512, 1, 0) + "," + alloc(3, 2, -512, 5000, 1, 0) + "]";
  const auto memory = memory_of(json);
  ASSERT_EQ(memory.size(), 2u);
  EXPECT_EQ(memory[0].device, "cuda:0");
  EXPECT_EQ(memory[0].peak_bytes, 5512);
  ASSERT_EQ(memory[0].by_phase.size(), 2u);
  EXPECT_EQ(memory[0].by_phase[0].name, "before the profile (other)");
  EXPECT_EQ(memory[0].by_phase[0].bytes, 5000);
  EXPECT_EQ(memory[1].device, "cpu");
  EXPECT_EQ(memory[1].peak_bytes, 64);
}

TEST(Memory, NoneRecordedNoView) {
  EXPECT_TRUE(memory_of("[" + op("cpu_op", "aten::mm", 0, 10) + "]").empty());
}

TEST(Memory, ALongProfileIsThinnedKeepingThePeak) {
  std::string json = "[" + op("cpu_op", "aten::mm", 0, 100000);
  int64_t total = 0;
  for (int i = 0; i < 5000; ++i) {
    const int64_t bytes = i == 3777 ? 1000000 : (i % 2 == 0 ? 8 : -8);
    total += bytes;
    json += "," + alloc(1 + i * 10, 100 + (i / 2) * 2 + (i == 3777), bytes, total);
  }
  const auto memory = memory_of(json + "]");
  ASSERT_EQ(memory.size(), 1u);
  EXPECT_LE(memory[0].timeline.size(), MemoryTime::kTimelinePoints);
  int64_t highest = 0;
  for (const auto& [us, bytes] : memory[0].timeline) highest = std::max(highest, bytes);
  EXPECT_EQ(highest, memory[0].peak_bytes);
}

}  // namespace
}  // namespace opfuse::analyze
