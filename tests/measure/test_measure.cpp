// The measurement routine: rotation, paired ratios, intervals, extension, a busy machine noticed.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <random>
#include <thread>

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include "opfuse/measure.h"

extern char** environ;

namespace opfuse::measure {
namespace {

// A run that busy-waits `ms` (a sleep would leave the core to others and hide them).
double spin(double ms) {
  const auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  while ((elapsed = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count()) < ms) {
  }
  return elapsed;
}

TEST(Bootstrap, IntervalHoldsTheMedianAndIsReproducible) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<double> noise(10, 1);
  std::vector<double> xs(25);
  for (double& x : xs) x = noise(rng);
  const Interval a = bootstrap_median(xs, 0.95), b = bootstrap_median(xs, 0.95);
  std::vector<double> sorted = xs;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_LE(a.lo, sorted[12]);
  EXPECT_GE(a.hi, sorted[12]);
  EXPECT_GE(a.lo, sorted.front());
  EXPECT_LE(a.hi, sorted.back());
  EXPECT_EQ(a.lo, b.lo);
  EXPECT_EQ(a.hi, b.hi);
  // Wider confidence, wider interval.
  const Interval wide = bootstrap_median(xs, 0.99);
  EXPECT_LE(wide.lo, a.lo);
  EXPECT_GE(wide.hi, a.hi);
}

TEST(Bootstrap, OneValueSaysNothingAboutTheSpread) {
  const Interval i = bootstrap_median({3.0}, 0.95);
  EXPECT_TRUE(std::isinf(i.lo) && i.lo < 0);
  EXPECT_TRUE(std::isinf(i.hi) && i.hi > 0);
}

TEST(Ratio, PairsRoundsSoADriftCancels) {
  // Both variants slow down 3× over the run; the faster is always 1.25× faster in its round.
  Measurement m;
  m.variants.resize(2);
  for (int r = 0; r < 12; ++r) {
    const double base = 10 * (1 + 0.2 * r);
    m.variants[0].ms.push_back(base);
    m.variants[1].ms.push_back(base / 1.25);
  }
  const Ratio r = ratio(m, 0, 1);
  EXPECT_DOUBLE_EQ(r.estimate, 1.25);
  EXPECT_DOUBLE_EQ(r.ci.lo, 1.25);
  EXPECT_DOUBLE_EQ(r.ci.hi, 1.25);
  EXPECT_DOUBLE_EQ(ratio(m, 1, 0).estimate, 0.8);
}

TEST(Interleave, RotatesTheOrderAndSummarisesEachVariant) {
  std::vector<int> order;
  std::vector<measure::Run> runs;
  for (int v = 0; v < 3; ++v)
    runs.push_back([&order, v] {
      order.push_back(v);
      return 1.0 + v;
    });
  Options o;
  o.warmup = 1;
  o.rounds = 3;
  const Measurement m = interleave(runs, o);
  ASSERT_EQ(m.rounds, 3);
  ASSERT_EQ(m.variants.size(), 3u);
  for (int v = 0; v < 3; ++v) {
    EXPECT_EQ(m.variants[v].ms.size(), 3u);
    EXPECT_DOUBLE_EQ(m.variants[v].median, 1.0 + v);
  }
  // Warm-up (each once), one more pass after the memory is touched, then rounds 0, 1, 2 rotating.
  const std::vector<int> timed(order.end() - 9, order.end());
  EXPECT_EQ(timed, (std::vector<int>{0, 1, 2, 1, 2, 0, 2, 0, 1}));
  EXPECT_EQ(order.size(), 3u + 3u + 9u);
}

TEST(Interleave, ARoundsFigureIsTheMedianOfItsCalls) {
  int call = 0;
  // Every fifth call stalls; with five calls per round no round reports a stall.
  const measure::Run stalling = [&call] { return ++call % 5 == 0 ? 100.0 : 1.0; };
  Options o;
  o.warmup = 0;
  o.rounds = 4;
  o.calls = 5;
  const Measurement m = interleave({stalling}, o);
  for (double ms : m.variants[0].ms) EXPECT_DOUBLE_EQ(ms, 1.0);
}

TEST(Interleave, MoreRoundsUntilSettledUpToTheCap) {
  Options o;
  o.warmup = 0;
  o.rounds = 2;
  o.max_rounds = 6;
  const std::vector<measure::Run> runs{[] { return 1.0; }, [] { return 2.0; }};
  int asked = 0;
  EXPECT_EQ(interleave(runs, o, [&asked](const Measurement& m) { return ++asked, m.rounds >= 4; }).rounds, 4);
  EXPECT_EQ(asked, 3);
  EXPECT_EQ(interleave(runs, o, [](const Measurement&) { return false; }).rounds, 6);
  EXPECT_EQ(interleave(runs, o, [](const Measurement&) { return true; }).rounds, 2);
}

TEST(Interleave, RefusesNothingToMeasure) {
  EXPECT_THROW(interleave({}, Options{}), std::invalid_argument);
  Options o;
  o.rounds = 0;
  EXPECT_THROW(interleave({[] { return 1.0; }}, o), std::invalid_argument);
}

TEST(Machine, OthersAreBusyTimeMinusOurOwn) {
  const CpuSample from{100, 10, 50}, to{102, 13, 55};  // 2 s; we used 3 s of CPU, the machine 5 s
  const Machine m = machine_between(from, to, 2);
  const double cores = std::max(1u, std::thread::hardware_concurrency());
  const double rounding = cores / static_cast<double>(sysconf(_SC_CLK_TCK));  // a tick per core
  EXPECT_NEAR(m.others_share, (2.0 - rounding) / (2 * cores), 1e-12);
  EXPECT_NEAR(m.own_share, 3.0 / 4, 1e-12);
}

// A real process spinning beside the measurement: noticed, said, and the rounds extended.
TEST(Machine, ABusyLoopBesideTheMeasurementIsNoticed) {
  pid_t child = 0;
  const char* argv[] = {"/bin/sh", "-c", "while :; do :; done", nullptr};
  ASSERT_EQ(posix_spawn(&child, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ), 0);
  Options o;
  o.warmup = 0;
  o.rounds = 3;
  o.max_rounds = 10;
  const Measurement m = interleave({[] { return spin(40); }, [] { return spin(40); }}, o);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_TRUE(m.machine.busy) << m.machine.others_share;
  EXPECT_GT(m.machine.others_share, 0.2);
  EXPECT_NE(m.machine.warning.find("other processes"), std::string::npos);
  EXPECT_EQ(m.rounds, 6);  // twice the rounds asked for, within the cap
}

// The other ranks of a job on this machine spin as hard, but are the job's own time, not load:
// the same interval read with and without the sibling differs by its share (whatever else runs).
TEST(Machine, SiblingRanksAreNotOtherLoad) {
  pid_t child = 0;
  const char* argv[] = {"/bin/sh", "-c", "while :; do :; done", nullptr};
  ASSERT_EQ(posix_spawn(&child, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ), 0);
  const std::vector<int> siblings = {child};
  const CpuSample from_with = sample_cpu(siblings), from_without = sample_cpu();
  spin(400);
  const CpuSample to_with = sample_cpu(siblings), to_without = sample_cpu();
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  const Machine with = machine_between(from_with, to_with, 2), without = machine_between(from_without, to_without, 1);
  // Under a loaded machine (ctest -j2) the sibling may get little of the 400 ms, so the check is
  // that what it got moved from "others" to "own", not how much it got.
  const double sibling_s = (to_with.own_cpu_s - from_with.own_cpu_s) - (to_without.own_cpu_s - from_without.own_cpu_s);
  EXPECT_GT(sibling_s, 0.01);
  EXPECT_LE(with.others_share, without.others_share + 1e-9) << with.others_share << " " << without.others_share;
  if (without.others_share > 0 && without.others_share < 1) {
    EXPECT_LT(with.others_share, without.others_share);
  }
}

TEST(Interleave, RanksStopInTheSameRound) {
  Options o;
  o.warmup = 0;
  o.rounds = 2;
  o.max_rounds = 6;
  int asked = 0;
  o.all_stop = [&asked](bool mine) { return ++asked >= 3 && mine; };  // another rank wants 2 more rounds
  EXPECT_EQ(interleave({[] { return 1.0; }}, o, [](const Measurement&) { return true; }).rounds, 4);
}

// Large tensors go back to a cache by size once measuring starts: the next one of that size is
// the same, already touched, memory; a memory profiler still sees every allocation and free.
class HeldBytes : public c10::MemoryReportingInfoBase {
 public:
  void reportMemoryUsage(void*, int64_t bytes, size_t, size_t, c10::Device) override { held += bytes; }
  bool memoryProfilingEnabled() const override { return true; }
  int64_t held = 0;
};

TEST(KeepFreedMemory, ALargeTensorsMemoryIsReusedAndStillReported) {
  opfuse::measure::keep_freed_memory();
  const int64_t n = (48 << 20) / sizeof(float);  // above glibc's largest mmap threshold
  const void* first = nullptr;
  {
    at::Tensor t = at::empty({n});
    first = t.data_ptr();
    t.fill_(1);
  }
  const void* second = at::empty({n}).data_ptr();
  EXPECT_EQ(first, second);
  at::Tensor small = at::empty({1024});  // below it: the heap, as before
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data_ptr()) % 64, 0u);
  auto held = std::make_shared<HeldBytes>();
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, held);
    at::Tensor t = at::empty({n});
    EXPECT_EQ(held->held, n * int64_t(sizeof(float)));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64, 0u);
  }
  EXPECT_EQ(held->held, 0);
}

// oneDNN's convolutions take scratch space with raw_allocate and free it by pointer alone.
TEST(KeepFreedMemory, RawBlocksOfEitherSizeAreFreedByPointer) {
  opfuse::measure::keep_freed_memory();
  c10::Allocator* cpu = c10::GetCPUAllocator();
  for (size_t bytes : {size_t{4096}, size_t{48} << 20}) {
    void* block = cpu->raw_allocate(bytes);
    ASSERT_NE(block, nullptr);
    static_cast<char*>(block)[bytes - 1] = 1;
    cpu->raw_deallocate(block);
  }
  const at::Tensor x = at::randn({1, 64, 256, 256});
  const at::Tensor w = at::randn({64, 64, 3, 3});
  EXPECT_TRUE(at::conv2d(x, w).allclose(at::conv2d(x.to(at::kDouble), w.to(at::kDouble)).to(at::kFloat),
                                        1e-3, 1e-3));
}

TEST(Environment, NamesTheBlasThreadsAndPath) {
  const Environment e = environment();
  EXPECT_FALSE(e.blas.empty());
  EXPECT_GE(e.threads, 1);
  EXPECT_GE(e.cores, 1);
  EXPECT_FALSE(e.cpu_capability.empty());
  EXPECT_FALSE(e.torch.empty());
  EXPECT_EQ(e.reference_blas, e.blas.find("reference") != std::string::npos);
}

}  // namespace
}  // namespace opfuse::measure
