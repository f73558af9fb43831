// The one measurement routine behind tune, train --compare, bench-op and the Python face:
// variants interleaved in rotating order after a warm-up, paired rounds, a median and a bootstrap
// interval per variant and per ratio, the load other processes put on the machine meanwhile,
// and the environment the figures depend on (BLAS, threads, CPU path, LibTorch).
// No LibTorch types here: the reports read these structs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace opfuse::measure {

struct Interval {
  double lo = 0, hi = 0;
};

struct Options {
  int warmup = 2;      // untimed runs of each variant before the first round
  int rounds = 5;      // rounds always run
  int max_rounds = 0;  // up to this many while `settled` says no or the machine is busy (0: rounds)
  // Passes over the variants per round; a round's figure for a variant is the median of its calls.
  // In a virtual machine a single call now and then stalls for tens of milliseconds (the host,
  // not the code measured): with several calls such a stall does not become a round's figure.
  int calls = 1;
  double confidence = 0.95;
  std::function<void(int done, int total)> progress;  // rounds done of the current planned total
  // Ranks measuring together (torch.distributed): true only when every rank's `stop` is, so that
  // all run the same rounds. Unset: a lone process.
  std::function<bool(bool stop)> all_stop;
  // Processes whose CPU time is this measurement's own, not other load: the other ranks here.
  std::vector<int> siblings;
};

// One variant's times, one per round, in the unit its Run returns (ms per step).
struct Series {
  std::vector<double> ms;
  double median = 0, min = 0, max = 0;
  Interval ci;  // of the median
};

// Other processes' use of the machine while measuring.
struct Machine {
  int cores = 0;
  double others_share = 0;  // of all cores' time, taken by other processes
  double own_share = 0;     // this process's CPU time / (wall time × its threads)
  bool busy = false;        // others took a noticeable share: figures are noisier than they look
  std::string warning;      // set when busy
};

struct Measurement {
  std::vector<Series> variants;
  int rounds = 0;
  double confidence = 0.95;
  Machine machine;
};

// base's time over other's, per paired round: > 1 when `other` is faster. The estimate is the
// median of the paired ratios, the interval a percentile bootstrap of that median.
struct Ratio {
  double estimate = 1;
  Interval ci{1, 1};
};
Ratio ratio(const Measurement& m, size_t base, size_t other);

// Runs one timed unit of a variant and returns its time in ms.
using Run = std::function<double()>;

// A Run of `steps` calls of step (each returning its ms), timed per step: their mean.
Run per_step(std::function<double()> step, int steps);

// Warms each variant up, then runs options.rounds rounds, each running every variant
// options.calls times, the order rotating pass by pass. More rounds follow, up to options.max_rounds, while `settled`
// (given the measurement so far) returns false, and while the machine is busy until twice
// options.rounds. Throws std::invalid_argument for no variants or rounds < 1.
Measurement interleave(const std::vector<Run>& variants, const Options& options,
                       const std::function<bool(const Measurement&)>& settled = {});

// From now on, memory this process frees stays with it (tensors up to 32 MiB come from a heap
// that is never trimmed, larger ones from a cache by size of up to a quarter of the memory
// available), as interleave sets it up before measuring. Call it before profiling
// what will be measured, so a trace's times and the measurement share one memory regime.
void keep_freed_memory();

// How every face writes an interval and a gain: "[1.2, 3.4]" ("?" for an unbounded end) and
// "+3.1% [+1.0%, +5.2%]".
std::string format_interval(const Interval& interval, const char* spec);
std::string format_gain(double gain, const Interval& ci);

// A percentile-bootstrap interval of the median of xs (fixed seed: the same data give the same
// interval); unbounded for fewer than two values.
Interval bootstrap_median(const std::vector<double>& xs, double confidence);

// CPU time counters of this process and of the whole machine.
struct CpuSample {
  double wall_s = 0, own_cpu_s = 0, machine_busy_s = 0;
};
// `siblings`' CPU time counts as this process's own.
CpuSample sample_cpu(const std::vector<int>& siblings = {});
Machine machine_between(const CpuSample& from, const CpuSample& to, int threads);

// What the figures depend on.
struct Environment {
  std::string blas;            // the library serving sgemm_, e.g. "OpenBLAS 0.3.21 (…/libblas.so.3)"
  bool reference_blas = false;  // netlib's reference BLAS: matmuls ~40× slower than OpenBLAS
  int threads = 0;             // intra-op threads
  int cores = 0;
  std::string cpu_capability;  // the path opfuse's kernels take: scalar | avx2 | avx512
  std::string torch;           // LibTorch version
  std::vector<std::string> warnings;  // with the fix
};
// `processes` share the cores (the ranks on this machine): fewer threads than cores is warned of
// only when all of theirs are.
Environment environment(int processes = 1);

}  // namespace opfuse::measure
