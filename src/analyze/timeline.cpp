// One step as a timeline, the view people read traces in (Perfetto, chrome://tracing): host
// threads and device streams as lanes, nested slices as rows below their parent.
//
// The step shown is the one of median duration, a typical step: the first is often warm-up. Device work belongs to the step whose host code launched it, since kernels
// run after their launch and may spill past the step's host end.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "opfuse/analyze.h"

namespace opfuse::analyze {
namespace {

using trace::Event;
using trace::Kind;
using trace::Links;
using trace::Trace;

constexpr double kSlack = 0.01;  // µs: rounding must not push a slice onto a row of its own

struct Window {
  double begin = 0, end = 0;
  std::string step;
};

// The last step is left out when there are others: it is usually cut short (HTA's convention).
Window median_step(const Trace& t, const Links& m) {
  std::vector<int32_t> by_length(m.steps.begin(), m.steps.end() - (m.steps.size() > 1 ? 1 : 0));
  std::stable_sort(by_length.begin(), by_length.end(), [&](int32_t a, int32_t b) { return t.events[a].dur < t.events[b].dur; });
  const Event& s = t.events[by_length[(by_length.size() - 1) / 2]];
  return {s.ts, s.ts + s.dur, t.strings[s.name]};
}

Window whole_trace(const Trace& t) {
  Window w{0, 0, ""};
  bool any = false;
  for (const Event& e : t.events) {
    if (e.phase != 'X') continue;
    w.begin = any ? std::min(w.begin, e.ts) : e.ts;
    w.end = any ? std::max(w.end, e.ts + e.dur) : e.ts + e.dur;
    any = true;
  }
  return w;
}

bool overlaps(const Event& e, const Window& w) { return e.ts < w.end && e.ts + e.dur > w.begin; }
bool starts_in(const Event& e, const Window& w) { return e.ts >= w.begin && e.ts < w.end; }

// "python 4242" for a pid or tid the trace names, else "thread 4242"; string ids ("stream 7") as written.
std::string id_text(const Trace& t, const std::unordered_map<int64_t, std::string>& names, int64_t id, const char* what) {
  const auto it = names.find(id);
  if (it != names.end() && !it->second.empty()) return it->second;
  if (id < 0 && static_cast<size_t>(-1 - id) < t.strings.size()) return t.strings[static_cast<size_t>(-1 - id)];
  return fmt::format("{} {}", what, id);
}

std::string lane_name(const Trace& t, int64_t pid, int64_t tid, bool device) {
  return id_text(t, t.process_names, pid, device ? "device" : "process") + " / " +
         id_text(t, t.thread_names, tid, device ? "stream" : "thread");
}

// The slices enclosing a host slice on its thread: its row below the lane's top.
int32_t depth(const Links& m, int32_t i) {
  int32_t d = 0;
  for (int32_t p = m.parent[i]; p >= 0; p = m.parent[p]) ++d;
  return d;
}

// What a slice is shown as part of: device work is its launching op's; a host slice is its own
// or its nearest enclosing op's (the aten::empty inside a matched sigmoid belongs to the chain).
int32_t owner(const Links& m, int32_t i) { return m.kind[i] == Kind::device ? m.launcher[i] : i; }

int32_t finding_of(const Links& m, const std::vector<int32_t>& marks, int32_t i) {
  if (marks.empty()) return -1;
  for (int32_t x = owner(m, i); x >= 0; x = m.op_parent[x])
    if (marks[x] >= 0) return marks[x];
  return -1;
}

// "Module Hierarchy" of the slice or an enclosing op, else the enclosing module scope. A string id, or 0.
uint32_t module_of(const Trace& t, const Links& m, int32_t i) {
  const int32_t x = owner(m, i);
  if (x < 0) return 0;
  for (int32_t y = x; y >= 0; y = m.op_parent[y])
    if (t.events[y].module != 0) return t.events[y].module;
  return m.annotation[x] >= 0 ? t.events[m.annotation[x]].name : 0;
}

struct Builder {
  const Trace& t;
  const Links& m;
  const std::vector<int32_t>& marks;
  Timeline out;
  std::vector<int32_t> events;       // per slice in out.slices: its event
  std::map<uint32_t, int32_t> names;  // trace string id → index in out.names

  int32_t name_index(uint32_t id) {
    const auto [it, fresh] = names.try_emplace(id, static_cast<int32_t>(out.names.size()));
    if (fresh) out.names.push_back(t.strings[id]);
    return it->second;
  }

  void add(int32_t lane, int32_t row, int32_t i) {
    const Event& e = t.events[i];
    TimelineSlice s;
    s.lane = lane, s.row = row;
    s.start_us = e.ts, s.dur_us = e.dur;  // made relative to the window at the end
    s.name = name_index(e.name);
    const uint32_t module = module_of(t, m, i);
    s.module = module == 0 ? -1 : name_index(module);
    s.finding = finding_of(m, marks, i);
    out.slices.push_back(s);
    events.push_back(i);
    out.lanes[lane].rows = std::max(out.lanes[lane].rows, row + 1);
  }

  // Host slices overlapping the window, thread by thread; Kineto's copies of the step markers
  // on the device lanes (gpu_user_annotation) are left out: they repeat the host's.
  void add_host(const Window& w) {
    std::map<std::pair<int64_t, int64_t>, std::vector<int32_t>> threads;
    for (int32_t i = 0; i < static_cast<int32_t>(t.events.size()); ++i) {
      const Event& e = t.events[i];
      if (e.phase != 'X' || m.kind[i] == Kind::device || m.kind[i] == Kind::flow || !overlaps(e, w)) continue;
      if (t.strings[e.category] == "gpu_user_annotation") continue;
      threads[{e.pid, e.tid}].push_back(i);
    }
    for (const auto& [key, slices] : threads) {
      const int32_t lane = static_cast<int32_t>(out.lanes.size());
      out.lanes.push_back({lane_name(t, key.first, key.second, false), false, 1});
      for (int32_t i : slices) add(lane, depth(m, i), i);
    }
  }

  // Device work launched in the window (or, with no launch known, running in it), each stream
  // packed into rows so that slices which overlap on one stream stay readable.
  void add_device(Window& w) {
    const Window host = w;
    for (size_t l = 0; l < m.device_lanes.size(); ++l) {
      const auto& lane_events = m.device_lanes[l];
      std::vector<int32_t> kept;
      for (size_t k = 0; k < lane_events.size(); ++k) {
        const int32_t i = lane_events[k];
        const int32_t call = m.launch_calls.empty() ? -1 : m.launch_calls[l][k];
        const int32_t anchor = call >= 0 ? call : m.launcher[i];
        if (anchor >= 0 ? starts_in(t.events[anchor], host) : overlaps(t.events[i], host)) kept.push_back(i);
      }
      if (kept.empty()) continue;
      const Event& first = t.events[kept.front()];
      const int32_t lane = static_cast<int32_t>(out.lanes.size());
      out.lanes.push_back({lane_name(t, first.pid, first.tid, true), true, 1});
      std::vector<double> row_end;
      for (int32_t i : kept) {  // device lanes are in start order
        const Event& e = t.events[i];
        size_t row = 0;
        while (row < row_end.size() && row_end[row] > e.ts + kSlack) ++row;
        if (row == row_end.size()) row_end.push_back(0);
        row_end[row] = e.ts + e.dur;
        add(lane, static_cast<int32_t>(row), i);
        w.begin = std::min(w.begin, e.ts);
        w.end = std::max(w.end, e.ts + e.dur);
      }
    }
  }

  // Over the cap, the slices that show least go: finding slices stay, then shallow before deep,
  // long before short.
  void cap() {
    if (out.slices.size() <= Timeline::kMaxSlices) return;
    std::vector<size_t> order(out.slices.size());
    std::iota(order.begin(), order.end(), size_t{0});
    auto shows_more = [&](size_t a, size_t b) {
      const TimelineSlice &x = out.slices[a], &y = out.slices[b];
      if ((x.finding >= 0) != (y.finding >= 0)) return x.finding >= 0;
      if (x.row != y.row) return x.row < y.row;
      return x.dur_us > y.dur_us;
    };
    std::nth_element(order.begin(), order.begin() + Timeline::kMaxSlices, order.end(), shows_more);
    order.resize(Timeline::kMaxSlices);
    std::sort(order.begin(), order.end());  // back in lane and time order
    std::vector<TimelineSlice> kept;
    kept.reserve(order.size());
    for (size_t k : order) kept.push_back(out.slices[k]);
    out.left_out = static_cast<int64_t>(out.slices.size() - kept.size());
    out.slices = std::move(kept);
  }
};

}  // namespace

Timeline step_timeline(const Trace& t, const Links& m, const std::vector<int32_t>& finding_of_event) {
  Builder b{t, m, finding_of_event, {}, {}, {}};
  Window w = m.steps.empty() ? whole_trace(t) : median_step(t, m);
  b.out.step = w.step;
  b.out.steps = static_cast<int64_t>(m.steps.size());
  b.add_host(w);
  b.add_device(w);
  b.out.begin_us = w.begin;
  b.out.dur_us = w.end - w.begin;
  for (TimelineSlice& s : b.out.slices) s.start_us -= w.begin;
  b.cap();
  return std::move(b.out);
}

}  // namespace opfuse::analyze
