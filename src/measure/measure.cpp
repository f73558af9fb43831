// Interleaved paired rounds, bootstrap intervals, and other processes' load while measuring.
#include "opfuse/measure.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <iterator>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "block_cache.h"
#include "opfuse/stats.h"

namespace opfuse::measure {
namespace {

// Others using a tenth of the machine (a busy loop on one of two cores is half) already shows as
// a wider spread between rounds on two cores.
constexpr double kBusyShare = 0.10;
constexpr int kResamples = 2000;

double quantile_of_sorted(const std::vector<double>& sorted, double q) {
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t i = static_cast<size_t>(pos);
  const double frac = pos - static_cast<double>(i);
  return i + 1 < sorted.size() ? sorted[i] * (1 - frac) + sorted[i + 1] * frac : sorted[i];
}

Series summarise(const std::vector<double>& ms, double confidence) {
  Series s;
  s.ms = ms;
  s.median = median(ms);
  const auto [lo, hi] = std::minmax_element(ms.begin(), ms.end());
  s.min = *lo;
  s.max = *hi;
  s.ci = bootstrap_median(ms, confidence);
  return s;
}

// Busy time of all cores from /proc/stat's first line (user nice system idle iowait irq softirq
// steal, in clock ticks); −1 where it cannot be read.
double machine_busy_seconds() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  if (!(in >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal) || cpu != "cpu") return -1;
  return (user + nice + system + irq + softirq + steal) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// User and system time of a process from /proc/PID/stat (fields 14 and 15, after the command
// name in parentheses, which may hold spaces); 0 once it has gone.
double process_cpu_seconds(int pid) {
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  const std::string line((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t name_end = line.rfind(')');
  if (name_end == std::string::npos) return 0;
  std::istringstream fields(line.substr(name_end + 1));
  std::string skip;
  double utime = 0, stime = 0;
  for (int i = 3; i < 14; ++i) fields >> skip;
  if (!(fields >> utime >> stime)) return 0;
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

int core_count() { return std::max(1u, std::thread::hardware_concurrency()); }

double resident_bytes() {
  std::ifstream in("/proc/self/statm");
  double pages = 0, resident = 0;
  in >> pages >> resident;
  return resident * static_cast<double>(sysconf(_SC_PAGESIZE));
}

// Memory the kernel could still hand out (MemAvailable), or 0 where it cannot be read.
double available_bytes() {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("MemAvailable:", 0) == 0) return std::strtod(line.c_str() + 13, nullptr) * 1024;  // kB
  return 0;
}

// In pieces below the mmap threshold, so they come from (and go back to) the heap; never more
// than a quarter of the memory still available, so touching it cannot push anything out.
void prefault(double bytes) {
  constexpr size_t kPiece = 16 << 20;
  std::vector<void*> pieces;
  const double limit = std::min({bytes, 4e9, available_bytes() / 4});
  for (double done = 0; done < limit; done += kPiece) {
    void* p = std::malloc(kPiece);
    if (p == nullptr) break;
    // A plain memset before free is a dead store the compiler may drop.
    volatile char* bytes_of = static_cast<volatile char*>(p);
    for (size_t i = 0; i < kPiece; i += 4096) bytes_of[i] = 0;
    pieces.push_back(p);
  }
  for (void* p : pieces) std::free(p);
}

}  // namespace

// Memory freed between rounds stays with the process: tensors up to 32 MiB come from the heap,
// which is never trimmed, larger ones from a cache of blocks by size. Otherwise every round maps
// and faults fresh pages, and in a virtual machine that reports free pages to its host a fault
// can stall for tens of milliseconds: a 3 ms op measured 3 or 40 ms at random. (interleave then
// touches and frees as much again as the warm-up needed, so rounds that fragment the heap find
// pages already there.)
void keep_freed_memory() {
  static const bool once = [] {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
    keep_large_blocks(static_cast<size_t>(std::min(4e9, available_bytes() / 4)));
    return true;
  }();
  (void)once;
}

Interval bootstrap_median(const std::vector<double>& xs, double confidence) {
  // One value says nothing about the spread.
  if (xs.size() < 2) return {-std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity()};
  std::mt19937_64 rng(0x5eed);
  std::uniform_int_distribution<size_t> pick(0, xs.size() - 1);
  std::vector<double> medians, resample(xs.size());
  medians.reserve(kResamples);
  for (int b = 0; b < kResamples; ++b) {
    for (double& x : resample) x = xs[pick(rng)];
    medians.push_back(median(resample));
  }
  std::sort(medians.begin(), medians.end());
  const double tail = (1 - confidence) / 2;
  return {quantile_of_sorted(medians, tail), quantile_of_sorted(medians, 1 - tail)};
}

Run per_step(std::function<double()> step, int steps) {
  return [step = std::move(step), steps] {
    double ms = 0;
    for (int i = 0; i < steps; ++i) ms += step();
    return ms / steps;
  };
}

Ratio ratio(const Measurement& m, size_t base, size_t other) {
  const auto& a = m.variants.at(base).ms;
  const auto& b = m.variants.at(other).ms;
  std::vector<double> paired;
  for (size_t r = 0; r < std::min(a.size(), b.size()); ++r) paired.push_back(a[r] / b[r]);
  if (paired.empty()) return {};
  const Interval ci = bootstrap_median(paired, m.confidence);
  return {median(paired), {std::max(0.0, ci.lo), ci.hi}};
}

CpuSample sample_cpu(const std::vector<int>& siblings) {
  CpuSample s;
  s.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  s.own_cpu_s = u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
  for (int pid : siblings) s.own_cpu_s += process_cpu_seconds(pid);
  s.machine_busy_s = machine_busy_seconds();
  return s;
}

Machine machine_between(const CpuSample& from, const CpuSample& to, int threads) {
  Machine m;
  m.cores = core_count();
  const double wall = to.wall_s - from.wall_s;
  if (wall <= 0) return m;
  const double own = to.own_cpu_s - from.own_cpu_s;
  m.own_share = own / (wall * std::max(1, threads));
  if (from.machine_busy_s < 0 || to.machine_busy_s < 0) return m;
  // /proc/stat counts each core in clock ticks: up to a tick per core of it is rounding, which
  // over a short measurement would read as someone else's load.
  const double tick = 1.0 / static_cast<double>(sysconf(_SC_CLK_TCK));
  const double others = std::max(0.0, to.machine_busy_s - from.machine_busy_s - own - tick * m.cores);
  m.others_share = std::min(1.0, others / (wall * m.cores));
  m.busy = m.others_share >= kBusyShare;
  if (m.busy)
    m.warning = fmt::format(
        "other processes used {:.0f}% of the {} cores while measuring: rounds were extended and the "
        "intervals are wider; quote figures from a quiet machine",
        100 * m.others_share, m.cores);
  return m;
}

Measurement interleave(const std::vector<Run>& variants, const Options& o,
                       const std::function<bool(const Measurement&)>& settled) {
  if (variants.empty()) throw std::invalid_argument("nothing to measure");
  if (o.rounds < 1) throw std::invalid_argument("--rounds must be at least 1");
  if (o.warmup < 0) throw std::invalid_argument("--warmup must not be negative");
  if (!(o.confidence > 0 && o.confidence < 1)) throw std::invalid_argument("the confidence must be in (0, 1)");
  const size_t n = variants.size();
  const int cap = std::max(o.rounds, o.max_rounds);
  const int busy_rounds = std::min(cap, 2 * o.rounds);
  const int threads = at::get_num_threads();
  keep_freed_memory();
  const double resident = resident_bytes();
  for (const Run& run : variants)
    for (int i = 0; i < o.warmup; ++i) run();
  prefault(std::max(1024.0 * (1 << 20), 2 * (resident_bytes() - resident)));
  // Touching that memory took a while, long enough for idle worker threads to sleep: the first
  // run after it paid for waking them (2–3× its time here).
  if (o.warmup > 0)
    for (const Run& run : variants) run();

  std::vector<std::vector<double>> ms(n);
  Measurement m;
  m.confidence = o.confidence;
  const CpuSample start = sample_cpu(o.siblings);
  const int group_threads = threads * (1 + static_cast<int>(o.siblings.size()));
  int planned = o.rounds;  // what progress shows: the rounds asked for, then the cap
  const int passes = std::max(1, o.calls);
  for (int r = 0;;) {
    std::vector<std::vector<double>> calls(n);
    for (int p = 0; p < passes; ++p)
      for (size_t k = 0; k < n; ++k) {
        const size_t v = (k + r * passes + p) % n;
        calls[v].push_back(variants[v]());
      }
    for (size_t v = 0; v < n; ++v) ms[v].push_back(median(calls[v]));
    if (o.progress) o.progress(r + 1, planned);
    if (++r < o.rounds) continue;
    m.variants.clear();
    for (const auto& series : ms) m.variants.push_back(summarise(series, o.confidence));
    m.rounds = r;
    m.machine = machine_between(start, sample_cpu(o.siblings), group_threads);
    if (r >= cap) break;
    bool stop = !(m.machine.busy && r < busy_rounds) && (!settled || settled(m));
    if (o.all_stop) stop = o.all_stop(stop);
    if (stop) break;
    planned = cap;
  }
  return m;
}

std::string format_interval(const measure::Interval& i, const char* spec) {
  auto bound = [spec](double x) { return std::isfinite(x) ? fmt::format(fmt::runtime(spec), x) : std::string("?"); };
  return fmt::format("[{}, {}]", bound(i.lo), bound(i.hi));
}

std::string format_gain(double gain, const measure::Interval& ci) {
  return fmt::format("{:+.1f}% {}", 100 * gain, format_interval({100 * ci.lo, 100 * ci.hi}, "{:+.1f}%"));
}

}  // namespace opfuse::measure
