// Trace → DeviceTime per device: the temporal breakdown (compute / communication / memcpy+memset
// / idle as shares of the kernel window), busy time per stream and kernel launch statistics, in
// HolisticTraceAnalysis' get_temporal_breakdown convention (see DeviceTime in analyze.h).
// Checked against tests/analyze/hta_breakdown_reference.py, written from the raw events alone.
#include <algorithm>
#include <map>
#include <string_view>

#include "opfuse/analyze.h"
#include "opfuse/stats.h"

namespace opfuse::analyze {
namespace {

using trace::Event;
using trace::Model;
using trace::Trace;

enum class Work : uint8_t { compute, communication, memory };

struct Interval {
  double start, end;
  Work work;
};

// What each string says as a device event's category or name, decided once per string.
struct WorkOf {
  std::vector<uint8_t> memory_category, communication_name;

  explicit WorkOf(const Trace& t) : memory_category(t.strings.size()), communication_name(t.strings.size()) {
    for (size_t i = 0; i < t.strings.size(); ++i) {
      const std::string& s = t.strings[i];
      memory_category[i] = s == "gpu_memcpy" || s == "gpu_memset" || s == "Memcpy" || s == "Memset";
      // HTA's test: collective kernels are NCCL's (ncclKernel_…, ncclDevKernel_…) or Gloo's.
      communication_name[i] = s.compare(0, 4, "nccl") == 0 || s.find("gloo:") != std::string::npos;
    }
  }
  Work operator()(const Event& e) const {
    if (memory_category[e.category]) return Work::memory;
    return communication_name[e.name] ? Work::communication : Work::compute;
  }
};

// The length covered by the intervals [begin, end), sorted by start, that `keep` accepts.
template <typename Keep>
double union_us(const Interval* begin, const Interval* end, Keep keep) {
  double total = 0, reach = -1e300;
  for (const Interval* it = begin; it != end; ++it) {
    const Interval& iv = *it;
    if (!keep(iv)) continue;
    if (iv.start >= reach) total += iv.end - iv.start, reach = iv.end;
    else if (iv.end > reach) total += iv.end - reach, reach = iv.end;
  }
  return total;
}

bool any(const Interval&) { return true; }

// Linear interpolation between closest ranks, as numpy's default.
double quantile(std::vector<double> xs, double q) {
  if (xs.empty()) return 0;
  std::sort(xs.begin(), xs.end());
  const double pos = q * static_cast<double>(xs.size() - 1);
  const size_t lo = static_cast<size_t>(pos), hi = std::min(lo + 1, xs.size() - 1);
  return xs[lo] + (xs[hi] - xs[lo]) * (pos - static_cast<double>(lo));
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

  StepFilter(const Trace& t, const Model& m) {
    steps = static_cast<int64_t>(m.steps.size());
    if (steps < 2) return;
    active = true;
    last_start = t.events[m.steps.back()].ts;  // steps are in time order
    steps = std::count_if(m.steps.begin(), m.steps.end(), [&](int32_t s) { return t.events[s].ts < last_start; });
  }

  // A device event with a correlation id is launched by the runtime call with that id (absent:
  // not kept, as HTA's join drops it); one without (Ascend tasks) by the op it was linked to.
  bool keeps(const Trace& t, const Model& m, int32_t event, int32_t launch_call) const {
    if (!active) return true;
    const int32_t by = t.events[event].correlation >= 0 ? launch_call : m.launcher[event];
    return by >= 0 && t.events[by].ts < last_start;
  }
};

struct DeviceBuild {
  DeviceTime time;
  std::vector<Interval> kept;
  std::vector<double> delays;
  double kernel_us = 0, small_kernel_us = 0;
};

// Files one stream's kept events into its device's figures.
void add_stream(const Trace& t, const Model& m, const WorkOf& work_of, const StepFilter& filter, size_t lane_index,
                DeviceBuild& d) {
  const auto& lane = m.device_lanes[lane_index];
  const auto& calls = m.launch_calls[lane_index];
  StreamTime stream{id_text(t, t.events[lane[0]].tid)};
  const size_t first = d.kept.size();
  for (size_t k = 0; k < lane.size(); ++k) {
    const Event& e = t.events[lane[k]];
    if (!filter.keeps(t, m, lane[k], calls[k])) {
      ++d.time.left_out;
      continue;
    }
    const Work w = work_of(e);
    d.kept.push_back({e.ts, e.ts + e.dur, w});
    if (w == Work::memory) continue;
    LaunchStats& l = d.time.launch;
    ++l.kernels;
    d.kernel_us += e.dur;
    if (e.dur < LaunchStats::kSmallKernelUs) d.small_kernel_us += e.dur;
    if (calls[k] < 0) continue;
    const Event& call = t.events[calls[k]];
    ++l.launched;
    d.delays.push_back(e.ts - call.ts);
    l.shorter_than_launch += e.dur < call.dur;
  }
  stream.events = static_cast<int64_t>(d.kept.size() - first);
  // A lane is in start order already, so its slice of `kept` is too.
  stream.busy_us = union_us(d.kept.data() + first, d.kept.data() + d.kept.size(), any);
  if (stream.events > 0) d.time.streams.push_back(std::move(stream));
}

void finish(DeviceBuild& d) {
  DeviceTime& time = d.time;
  std::sort(d.kept.begin(), d.kept.end(), [](const Interval& a, const Interval& b) { return a.start < b.start; });
  time.events = static_cast<int64_t>(d.kept.size());
  if (d.kept.empty()) return;
  double end = d.kept.front().end;
  for (const Interval& iv : d.kept) end = std::max(end, iv.end);
  time.window_us = end - d.kept.front().start;
  const Interval *begin = d.kept.data(), *end_of = begin + d.kept.size();
  auto of = [](Work w) { return [w](const Interval& iv) { return iv.work == w; }; };
  time.busy_us = union_us(begin, end_of, any);
  time.idle_us = time.window_us - time.busy_us;
  time.compute_us = union_us(begin, end_of, of(Work::compute));
  time.communication_us = union_us(begin, end_of, of(Work::communication));
  time.memory_us = union_us(begin, end_of, of(Work::memory));
  time.launch.delay_median_us = median(d.delays);
  time.launch.delay_p90_us = quantile(std::move(d.delays), 0.9);
  if (d.kernel_us > 0) time.launch.small_kernel_time_pct = 100 * d.small_kernel_us / d.kernel_us;
  std::sort(time.streams.begin(), time.streams.end(),
            [](const StreamTime& a, const StreamTime& b) { return a.busy_us > b.busy_us; });
}

}  // namespace

std::vector<DeviceTime> device_time(const Trace& t, const Model& m) {
  if (m.device_lanes.empty()) return {};
  const WorkOf work_of(t);
  const StepFilter filter(t, m);
  std::map<int64_t, DeviceBuild> by_pid;  // a device's streams are lanes of one pid
  for (size_t l = 0; l < m.device_lanes.size(); ++l) {
    const int64_t pid = t.events[m.device_lanes[l][0]].pid;
    DeviceBuild& d = by_pid[pid];
    d.time.device = id_text(t, pid);
    d.time.steps = filter.steps;
    add_stream(t, m, work_of, filter, l, d);
  }
  std::vector<DeviceTime> out;
  for (auto& [pid, d] : by_pid) {
    finish(d);
    out.push_back(std::move(d.time));
  }
  std::stable_sort(out.begin(), out.end(), [](const DeviceTime& a, const DeviceTime& b) { return a.busy_us > b.busy_us; });
  return out;
}

}  // namespace opfuse::analyze
