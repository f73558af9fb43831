// The critical path through a trace and what each finding would take off it, in the manner of
// HolisticTraceAnalysis' lightweight critical path, with the dependencies a trace states or
// implies. Walked back from the last thing to end:
// - on a host thread, top-level op by top-level op; where the thread idled, it waited on what
//   ended last in the gap on another thread or device stream (a join, a synchronize);
// - on a device stream, event by event; an event waited for its launch when the launch returned
//   after the stream's previous event had ended (then the host before the launch is the path),
//   else for that previous event.
// On a CPU trace with one busy thread the path is that thread; on a device trace it alternates
// between the host that launches and the streams that run.
#include <algorithm>
#include <map>

#include "opfuse/analyze.h"

namespace opfuse::analyze {
namespace {

using trace::Links;
using trace::Trace;

constexpr double kEps = 0.5;       // µs: ends and starts this close count as one moment
constexpr double kMinWait = 10.0;  // µs: a shorter gap is the thread's own overhead between ops, not a wait

struct Lane {
  const std::vector<int32_t>* events;  // in time order, not overlapping
  std::vector<double> starts, ends;    // ends kept non-decreasing (a running maximum)
  bool device = false;
};

class Walk {
 public:
  Walk(const Trace& t, const Links& m) : t_(t), m_(m), on_path_(t.events.size(), 0) {
    for (const auto& ops : m.threads) add_lane(ops, false);
    for (const auto& lane : m.device_lanes) add_lane(lane, true);
    for (size_t l = 0; l < lanes_.size(); ++l)
      if (!lanes_[l].device) thread_of_[key(lanes_[l].events->front())] = l;
    // A synchronize call (cudaDeviceSynchronize, cudaStreamSynchronize, aclrtSynchronizeStream …)
    // inside a top-level op: while it lasts, the host waits on the device.
    if (!m.device_lanes.empty())
      for (size_t i = 0; i < t.events.size(); ++i) {
        if (t.events[i].phase != 'X' || t.events[i].dur < kMinWait || m.kind[i] == trace::Kind::device) continue;
        if (t.strings[t.events[i].name].find("Synchronize") == std::string::npos) continue;
        int32_t top = m.op_parent[i];
        if (top < 0) continue;
        while (m.op_parent[top] >= 0) top = m.op_parent[top];
        sync_in_[top] = static_cast<int32_t>(i);
      }
  }

  CriticalPath run() {
    CriticalPath p;
    size_t lane = 0;
    double t = -1, first = 0;
    bool any = false;
    for (size_t l = 0; l < lanes_.size(); ++l) {
      if (lanes_[l].ends.empty()) continue;
      if (lanes_[l].ends.back() > t) t = lanes_[l].ends.back(), lane = l;
      first = any ? std::min(first, lanes_[l].starts.front()) : lanes_[l].starts.front();
      any = true;
    }
    if (!any) return p;
    p.length_us = t - first;
    for (size_t guard = 0; t > first + kEps && guard < 4 * t_.events.size() + 16; ++guard) {
      const Lane& L = lanes_[lane];
      const auto at = std::lower_bound(L.starts.begin(), L.starts.end(), t - kEps) - L.starts.begin();
      if (at == 0) {  // nothing earlier here: what ran at t elsewhere (what started this), else what ended last
        if (!jump_to_running(lane, t) && !jump_to_latest(lane, t, p, first)) break;
        continue;
      }
      const int32_t e = (*L.events)[at - 1];
      const double start = t_.events[e].ts, end = t_.events[e].ts + t_.events[e].dur;
      if (end < t - kEps) {  // the lane idled before t: a long gap is a wait on another
        if (t - end < kMinWait || !jump_to_latest(lane, t, p, end)) p.idle_us += t - end, t = end;
        continue;
      }
      if (!L.device && waited_on_device(e, lane, t, p)) continue;
      const double span = t - start;
      on_path_[e] += span;
      (L.device ? p.device_us : p.host_us) += span;
      t = start;
      if (L.device) follow_launch(lane, static_cast<size_t>(at - 1), t, p);
    }
    p.on_path = std::move(on_path_);
    return p;
  }

 private:
  std::pair<int64_t, int64_t> key(int32_t e) const { return {t_.events[e].pid, t_.events[e].tid}; }

  void add_lane(const std::vector<int32_t>& events, bool device) {
    if (events.empty()) return;
    Lane l{&events, {}, {}, device};
    double reach = -1e300;
    for (int32_t e : events) {
      l.starts.push_back(t_.events[e].ts);
      reach = std::max(reach, t_.events[e].ts + t_.events[e].dur);
      l.ends.push_back(reach);
    }
    lanes_.push_back(std::move(l));
  }

  // Where the walk resumes after a wait at t: the lane (other than `lane`) whose events end latest
  // at or before t, after `not_before`, and that end; lanes_.size() when none.
  std::pair<size_t, double> latest_end(size_t lane, double t, double not_before) const {
    std::pair<size_t, double> best{lanes_.size(), not_before};
    for (size_t l = 0; l < lanes_.size(); ++l) {
      if (l == lane) continue;
      const auto& ends = lanes_[l].ends;
      const auto it = std::upper_bound(ends.begin(), ends.end(), t + kEps);
      if (it != ends.begin() && *(it - 1) > best.second) best = {l, *(it - 1)};
    }
    return best;
  }

  // Moves the walk to what it waited on at t (latest_end), the time between counted as a gap.
  bool jump_to_latest(size_t& lane, double& t, CriticalPath& p, double not_before) {
    const auto [next, end] = latest_end(lane, t, not_before);
    if (next == lanes_.size()) return false;
    p.idle_us += std::max(0.0, t - end);  // a wait the trace shows no work in
    lane = next, t = end;
    return true;
  }

  // A host op that synchronized before t: its part after the synchronize is on the path, and
  // before that the device event that ended last inside the wait.
  bool waited_on_device(int32_t op, size_t& lane, double& t, CriticalPath& p) {
    const auto sync = sync_in_.find(op);
    if (sync == sync_in_.end()) return false;
    const trace::Event& s = t_.events[sync->second];
    const double sync_end = s.ts + s.dur;
    if (sync_end > t + kEps) return false;  // the walk is already before its end
    const auto [device, device_end] = latest_end(lane, sync_end, s.ts);
    if (device == lanes_.size() || !lanes_[device].device) return false;
    on_path_[op] += t - sync_end;
    p.host_us += t - sync_end;
    p.idle_us += sync_end - device_end;
    lane = device, t = device_end;
    return true;
  }

  // Moves to a lane with an event running at t (the walk reached the start of its lane); false if none.
  bool jump_to_running(size_t& lane, double t) {
    for (size_t l = 0; l < lanes_.size(); ++l) {
      if (l == lane) continue;
      const Lane& L = lanes_[l];
      const auto at = std::lower_bound(L.starts.begin(), L.starts.end(), t - kEps) - L.starts.begin();
      if (at == 0) continue;
      const int32_t e = (*L.events)[at - 1];
      if (t_.events[e].ts + t_.events[e].dur >= t - kEps) {
        lane = l;
        return true;
      }
    }
    return false;
  }

  // A device event at index k of its stream has just been walked: did it wait for its launch?
  void follow_launch(size_t& lane, size_t k, double& t, CriticalPath& p) {
    const Lane& L = lanes_[lane];
    const int32_t e = (*L.events)[k];
    const size_t device_lane = lane - m_.threads.size();
    int32_t launch = m_.launch_calls.empty() ? -1 : m_.launch_calls[device_lane][k];
    if (launch < 0) launch = m_.launcher[e];
    if (launch < 0) return;
    const double launched = t_.events[launch].ts + t_.events[launch].dur;
    const double free = k > 0 ? L.ends[k - 1] : -1e300;
    if (launched <= free + kEps) return;  // the stream was the wait: stay on it
    const auto thread = thread_of_.find(key(launch));
    if (thread == thread_of_.end()) return;
    lane = thread->second;
    p.idle_us += std::max(0.0, t - launched);  // from the launch's return to the event's start
    t = std::min(t, launched);
  }

  const Trace& t_;
  const Links& m_;
  std::vector<Lane> lanes_;  // host threads first (as m.threads), then device streams (as m.device_lanes)
  std::map<std::pair<int64_t, int64_t>, size_t> thread_of_;
  std::map<int32_t, int32_t> sync_in_;  // top-level host op → the synchronize call in it
  std::vector<double> on_path_;
};

}  // namespace

CriticalPath critical_path(const Trace& t, const Links& m) { return Walk(t, m).run(); }

void what_if(const Trace& t, const Links& m, const CriticalPath& path, const std::vector<int32_t>& finding_of_event,
             std::vector<Finding>& findings) {
  if (path.on_path.empty() || findings.empty()) return;
  std::vector<double> whole(findings.size(), 0), on(findings.size(), 0);
  // Host: a matched op's share of the path is its top-level op's.
  for (size_t i = 0; i < t.events.size(); ++i) {
    const int32_t f = finding_of_event[i];
    if (f < 0 || m.kind[i] != trace::Kind::op) continue;
    int32_t top = static_cast<int32_t>(i);
    while (m.op_parent[top] >= 0) top = m.op_parent[top];
    const double dur = t.events[i].dur, top_dur = t.events[top].dur;
    whole[f] += dur;
    if (top_dur > 0) on[f] += dur * std::min(1.0, path.on_path[top] / top_dur);
  }
  // Device: a kernel counts for the finding whose matched op (or an op around it) launched it.
  for (const auto& lane : m.device_lanes)
    for (int32_t k : lane) {
      int32_t f = -1;
      for (int32_t op = m.launcher[k]; op >= 0 && f < 0; op = m.op_parent[op]) f = finding_of_event[op];
      if (f < 0) continue;
      whole[f] += t.events[k].dur;
      on[f] += path.on_path[k];
    }
  for (size_t f = 0; f < findings.size(); ++f) {
    findings[f].critical_share = whole[f] > 0 ? std::min(1.0, on[f] / whole[f]) : 0;
    findings[f].saving_on_path_us = findings[f].est_saving_us * findings[f].critical_share;
  }
}

}  // namespace opfuse::analyze
