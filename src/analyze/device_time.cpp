// Trace → DeviceTime per device: the temporal breakdown (compute / communication / memcpy+memset
// / idle as shares of the kernel window), busy time per stream and kernel launch statistics, in
// HolisticTraceAnalysis' get_temporal_breakdown convention (see DeviceTime in analyze.h).
// Checked against tests/analyze/hta_breakdown_reference.py, written from the raw events alone.
#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <queue>
#include <string_view>

#include "opfuse/analyze.h"

namespace opfuse::analyze {
namespace {

using trace::Event;
using trace::Links;
using trace::Trace;

enum class Work : uint8_t { compute, communication, memory };

// What each string says as a device event's category or name, decided once per string.
struct WorkOf {
  std::vector<uint8_t> memory_category, communication_name;

  explicit WorkOf(const Trace& t) : memory_category(t.strings.size()), communication_name(t.strings.size()) {
    for (size_t i = 0; i < t.strings.size(); ++i) {
      const std::string& s = t.strings[i];
      memory_category[i] = s == "gpu_memcpy" || s == "gpu_memset" || s == "Memcpy" || s == "Memset";
      // HTA's test: collective kernels are NCCL's (ncclKernel_…, ncclDevKernel_…) or Gloo's; and
      // Ascend's HCCL tasks are named after their collective (hcom_allReduce_…).
      communication_name[i] = s.compare(0, 4, "nccl") == 0 || s.find("gloo:") != std::string::npos ||
                              s.compare(0, 5, "hcom_") == 0;
    }
  }
  Work operator()(const Event& e) const {
    if (memory_category[e.category]) return Work::memory;
    return communication_name[e.name] ? Work::communication : Work::compute;
  }
};

// The length covered by intervals met in start order: each adds what lies past the reach so far.
struct Union {
  double total = 0, reach = -std::numeric_limits<double>::infinity();
  void add(double start, double end) {
    if (end <= reach) return;
    total += end - std::max(start, reach);
    reach = end;
  }
};

// Linear interpolation between closest ranks, as numpy's default. Two order statistics, found
// by selection rather than a sort: a trace has hundreds of thousands of kernels.
double quantile(std::vector<double>& xs, double q) {
  if (xs.empty()) return 0;
  const double pos = q * static_cast<double>(xs.size() - 1);
  const auto lo = static_cast<std::ptrdiff_t>(pos);
  std::nth_element(xs.begin(), xs.begin() + lo, xs.end());
  const double below = xs[lo];
  const bool last = lo + 1 == static_cast<std::ptrdiff_t>(xs.size());
  const double above = last ? below : *std::min_element(xs.begin() + lo + 1, xs.end());
  return below + (above - below) * (pos - static_cast<double>(lo));
}

// "7" for tid 7, "7" for tid "stream 7" (the 1.8-era layout), the string otherwise.
std::string id_text(const Trace& t, int64_t id) {
  if (id >= 0) return std::to_string(id);
  std::string_view s = t.strings[-1 - id];
  if (s.compare(0, 7, "stream ") == 0) s.remove_prefix(7);
  return std::string(s);
}

// Which device events count. HTA filters only when there are two or more steps; a single step
// is taken whole.
struct StepFilter {
  bool active = false;
  double last_start = 0;
  int64_t steps = 0;  // steps in the window

  StepFilter(const Trace& t, const Links& m, std::vector<double> starts) {
    if (starts.empty())
      for (int32_t s : m.steps) starts.push_back(t.events[s].ts);  // in time order
    steps = static_cast<int64_t>(starts.size());
    if (steps < 2) return;
    active = true;
    last_start = starts.back();
    steps = std::count_if(starts.begin(), starts.end(), [&](double s) { return s < last_start; });
  }

  // A device event with a correlation id is launched by the runtime call with that id (absent:
  // not kept, as HTA's join drops it); one without (Ascend tasks) by the op it was linked to.
  bool keeps(const Trace& t, const Links& m, int32_t event, int32_t launch_call) const {
    if (!active) return true;
    const int32_t by = t.events[event].correlation >= 0 ? launch_call : m.launcher[event];
    return by >= 0 && t.events[by].ts < last_start;
  }
};

// One device's streams walked together in start order (a k-way merge: a device has a few
// streams, each already sorted), so the unions need no copy of the intervals.
struct DeviceWalk {
  const Trace& t;
  const Links& m;
  const WorkOf& work_of;
  const StepFilter& filter;
  DeviceTime time;
  Union busy, by_work[3];
  std::vector<Union> by_stream;
  std::vector<double> delays;
  double first_start = 0, last_end = 0, kernel_us = 0, small_kernel_us = 0;

  void run(const std::vector<size_t>& lanes) {
    by_stream.resize(lanes.size());
    std::vector<int64_t> kept(lanes.size(), 0);
    using Next = std::pair<double, size_t>;  // (start, which of `lanes`)
    std::priority_queue<Next, std::vector<Next>, std::greater<Next>> next;
    std::vector<size_t> at(lanes.size(), 0);
    for (size_t s = 0; s < lanes.size(); ++s) next.emplace(t.events[m.device_lanes[lanes[s]][0]].ts, s);
    while (!next.empty()) {
      const size_t s = next.top().second;
      next.pop();
      const auto& lane = m.device_lanes[lanes[s]];
      const auto& calls = m.launch_calls[lanes[s]];
      const size_t k = at[s]++;
      if (at[s] < lane.size()) next.emplace(t.events[lane[at[s]]].ts, s);
      prefetch(lane, calls, k + 16);
      if (!filter.keeps(t, m, lane[k], calls[k])) {
        ++time.left_out;
        continue;
      }
      ++kept[s];
      add(t.events[lane[k]], calls[k], m.launcher[lane[k]] >= 0, by_stream[s]);
    }
    for (size_t s = 0; s < lanes.size(); ++s)
      if (kept[s] > 0)
        time.streams.push_back({id_text(t, t.events[m.device_lanes[lanes[s]][0]].tid), kept[s], by_stream[s].total});
    finish();
  }

  // A lane's events and their launch calls lie scattered through the file-order event array;
  // waiting on those two cache misses per event was most of this analysis' time.
  void prefetch(const std::vector<int32_t>& lane, const std::vector<int32_t>& calls, size_t k) const {
    if (k >= lane.size()) return;
    __builtin_prefetch(&t.events[lane[k]]);
    if (calls[k] >= 0) __builtin_prefetch(&t.events[calls[k]]);
  }

  void add(const Event& e, int32_t call, bool op_known, Union& stream) {
    const double end = e.ts + e.dur;
    time.summed_us += e.dur;
    if (op_known) time.op_linked_us += e.dur;
    if (time.events++ == 0) first_start = e.ts, last_end = end;
    last_end = std::max(last_end, end);
    const Work w = work_of(e);
    busy.add(e.ts, end);
    by_work[static_cast<int>(w)].add(e.ts, end);
    stream.add(e.ts, end);
    if (w == Work::memory) return;
    LaunchStats& l = time.launch;
    ++l.kernels;
    kernel_us += e.dur;
    if (e.dur < LaunchStats::kSmallKernelUs) small_kernel_us += e.dur;
    if (call < 0) return;
    const Event& launch = t.events[call];
    ++l.launched;
    delays.push_back(e.ts - launch.ts);
    l.shorter_than_launch += e.dur < launch.dur;
  }

  void finish() {
    if (time.events == 0) return;
    time.window_us = last_end - first_start;
    time.busy_us = busy.total;
    time.idle_us = time.window_us - time.busy_us;
    time.compute_us = by_work[static_cast<int>(Work::compute)].total;
    time.communication_us = by_work[static_cast<int>(Work::communication)].total;
    time.memory_us = by_work[static_cast<int>(Work::memory)].total;
    time.launch.delay_median_us = quantile(delays, 0.5);
    time.launch.delay_p90_us = quantile(delays, 0.9);
    if (kernel_us > 0) time.launch.small_kernel_time_pct = 100 * small_kernel_us / kernel_us;
    std::sort(time.streams.begin(), time.streams.end(),
              [](const StreamTime& a, const StreamTime& b) { return a.busy_us > b.busy_us; });
  }
};

// The summary lanes' time by slice name, in the order the names first appear.
void add_overlap_analysis(const Trace& t, const Links& m, DeviceTime& d) {
  std::vector<uint32_t> names;  // a handful: a linear search is enough
  double first = std::numeric_limits<double>::infinity(), last = -first;
  for (const auto& lane : m.summary_lanes)
    for (int32_t i : lane) {
      const Event& e = t.events[i];
      if (m.kind[i] != trace::Kind::summary) continue;  // overlapping slices are left out
      const size_t at = std::find(names.begin(), names.end(), e.name) - names.begin();
      if (at == names.size()) names.push_back(e.name), d.overlap_analysis.push_back({t.strings[e.name]});
      d.overlap_analysis[at].slices += 1;
      d.overlap_analysis[at].total_us += e.dur;
      first = std::min(first, e.ts);
      last = std::max(last, e.ts + e.dur);
    }
  if (!names.empty()) d.overlap_span_us = last - first;
}

}  // namespace

std::vector<DeviceTime> device_time(const Trace& t, const Links& m, const std::vector<double>& inferred_step_starts) {
  if (m.device_lanes.empty()) return {};  // a CPU trace: not even a pass over its strings
  const WorkOf work_of(t);
  const StepFilter filter(t, m, inferred_step_starts);
  std::map<int64_t, std::vector<size_t>> lanes_by_pid;  // a device's streams are lanes of one pid
  for (size_t l = 0; l < m.device_lanes.size(); ++l) lanes_by_pid[t.events[m.device_lanes[l][0]].pid].push_back(l);
  std::vector<DeviceTime> out;
  for (const auto& [pid, lanes] : lanes_by_pid) {
    DeviceWalk walk{t, m, work_of, filter, {}, {}, {}, {}, {}};
    walk.time.device = id_text(t, pid);
    walk.time.steps = filter.steps;
    walk.run(lanes);
    out.push_back(std::move(walk.time));
  }
  std::stable_sort(out.begin(), out.end(), [](const DeviceTime& a, const DeviceTime& b) { return a.busy_us > b.busy_us; });
  if (!m.summary_lanes.empty()) add_overlap_analysis(t, m, out.front());
  return out;
}

}  // namespace opfuse::analyze
