// Trace → Links: op trees from nesting on each thread, device work linked to the host op that
// launched it, backward ops linked to their forward op, steps.
#include <algorithm>
#include <map>
#include <unordered_map>

#include "opfuse/trace.h"

namespace opfuse::trace {
namespace {

constexpr double kSlack = 0.01;    // µs: rounding in ts + dur must not break nesting
constexpr double kOverhang = 1.0;  // µs a child may run past its parent and still nest

bool is_backward_name(const std::string& name) {
  return name.starts_with("autograd::engine::evaluate_function") || name.find("Backward") != std::string::npos;
}

// What a name or category says, decided once per string rather than once per event.
enum NameFlag : uint8_t { step_name = 1, optimizer_name = 2, backward_name = 4, device_annotation = 8, engine_wrapper = 16 };

struct Classifier {
  const Trace& trace;
  std::vector<Kind> by_category;  // per string id; Kind::other for names that are no category
  std::vector<uint8_t> flags;     // per string id: NameFlag bits
  std::vector<uint32_t> node_of;  // per string id of "autograd::engine::evaluate_function: X": X's id, else 0
  std::vector<int64_t> device_pids;  // Ascend: the "Ascend Hardware" process holds device tasks,
  std::vector<int64_t> cann_pids;    // "CANN" the runtime calls that enqueue them
  std::vector<int64_t> summary_pids; // and "Overlap Analysis" the profiler's own summary of the device
  // Ascend writes torch ops as cpu_op and leaves its other processes' slices (HCCL, the summary
  // lanes, …) uncategorised: there an uncategorised slice is no op, as it is in the legacy profiler.
  bool uncategorised_ops = true;

  explicit Classifier(const Trace& t) : trace(t) {
    const std::pair<const char*, Kind> table[] = {
        {"cpu_op", Kind::op},          {"Operator", Kind::op},         {"operator", Kind::op},
        {"user_annotation", Kind::annotation},                         {"gpu_user_annotation", Kind::other},
        {"kernel", Kind::device},      {"Kernel", Kind::device},       {"gpu_memcpy", Kind::device},
        {"gpu_memset", Kind::device},  {"Memcpy", Kind::device},       {"Memset", Kind::device},
        {"cuda_runtime", Kind::runtime}, {"cuda_driver", Kind::runtime}, {"Runtime", Kind::runtime},
        // Meta's MTIA: Kineto files its on-device work as mtia_ccp_events, the host calls that
        // submit it as mtia_runtime, linked by correlation id as on a GPU.
        {"mtia_ccp_events", Kind::device}, {"mtia_runtime", Kind::runtime}};
    by_category.assign(t.strings.size(), Kind::other);
    flags.assign(t.strings.size(), 0);
    for (size_t i = 0; i < t.strings.size(); ++i) {
      const std::string& s = t.strings[i];
      for (const auto& [name, kind] : table)
        if (s == name) by_category[i] = kind;
      flags[i] = (s.starts_with("ProfilerStep#") ? step_name : 0) | (s.starts_with("Optimizer.") ? optimizer_name : 0) |
                 (is_backward_name(s) ? backward_name : 0) | (s == "gpu_user_annotation" ? device_annotation : 0) |
                 (s.starts_with("autograd::engine::evaluate_function") ? engine_wrapper : 0);
    }
    // The wrappers are few: look their nodes' names up in one pass over the strings.
    constexpr std::string_view kWrapper = "autograd::engine::evaluate_function: ";
    std::unordered_map<std::string_view, std::vector<uint32_t>> wrappers_of;  // node name → wrapper ids
    for (size_t i = 0; i < t.strings.size(); ++i)
      if (flags[i] & engine_wrapper && t.strings[i].starts_with(kWrapper))
        wrappers_of[std::string_view(t.strings[i]).substr(kWrapper.size())].push_back(static_cast<uint32_t>(i));
    node_of.assign(t.strings.size(), 0);
    if (!wrappers_of.empty())
      for (size_t i = 0; i < t.strings.size(); ++i)
        if (const auto it = wrappers_of.find(t.strings[i]); it != wrappers_of.end())
          for (uint32_t w : it->second) node_of[w] = static_cast<uint32_t>(i);
    for (const auto& [pid, name] : t.process_names) {
      if (name == "Ascend Hardware") device_pids.push_back(pid);
      if (name == "CANN") cann_pids.push_back(pid);
      if (name == "Overlap Analysis") summary_pids.push_back(pid);
    }
    uncategorised_ops = t.dialect != Dialect::ascend;
  }

  static bool among(const std::vector<int64_t>& pids, int64_t pid) {
    return !pids.empty() && std::find(pids.begin(), pids.end(), pid) != pids.end();
  }

  Kind operator()(const Event& e) const {
    if (e.phase == 's' || e.phase == 'f' || e.phase == 't') return Kind::flow;
    if (e.phase != 'X') return Kind::other;
    // Kineto copies ProfilerStep#N onto the GPU's lanes as a gpu_user_annotation: not a second step.
    if (flags[e.category] & device_annotation) return Kind::other;
    if (flags[e.name] & step_name) return Kind::step;
    if (flags[e.name] & optimizer_name) return Kind::op;  // record_function scopes in Kineto, ops in Ascend
    if (among(device_pids, e.pid)) return Kind::device;
    if (among(cann_pids, e.pid)) return Kind::runtime;
    if (among(summary_pids, e.pid)) return Kind::summary;
    if (e.category == 0) return uncategorised_ops ? Kind::op : Kind::other;  // the legacy profiler writes no categories
    return by_category[e.category];
  }
};

// int64 id → event index, open addressing: built and probed once per event, where
// std::unordered_map's node per entry cost more than the rest of the model.
class IdIndex {
 public:
  explicit IdIndex(size_t expected) {
    while ((size_t{1} << bits_) < 2 * expected) ++bits_;
    slots_.assign(size_t{1} << bits_, {kEmpty, -1});
  }
  // Keeps the first index stored for `id`, as std::unordered_map::emplace does.
  void emplace(int64_t id, int32_t index) {
    Slot& s = slot(id);
    if (s.id == kEmpty) s = {id, index};
  }
  void assign(int64_t id, int32_t index) { slot(id) = {id, index}; }
  int32_t find(int64_t id) const {
    const Slot& s = const_cast<IdIndex*>(this)->slot(id);
    return s.id == kEmpty ? -1 : s.index;
  }

 private:
  static constexpr int64_t kEmpty = INT64_MIN;  // ids stored here are ≥ 0
  struct Slot {
    int64_t id;
    int32_t index;
  };
  Slot& slot(int64_t id) {
    const size_t mask = slots_.size() - 1;
    size_t i = static_cast<size_t>(static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull >> (64 - bits_));
    while (slots_[i].id != kEmpty && slots_[i].id != id) i = (i + 1) & mask;
    return slots_[i];
  }
  int bits_ = 4;
  std::vector<Slot> slots_;
};

using Lane = std::vector<int32_t>;
using LanesByThread = std::map<std::pair<int64_t, int64_t>, Lane>;  // by (pid, tid)

// A thread's slices as they are filed, in file order. While they come in order (the usual
// case) each is nested as it arrives, so the events are read once; a lane found out of order
// is sorted and nested again at the end.
struct LaneBuild {
  Lane all, kept, stack;  // every slice; those nested; the open ones
  bool in_order = true;
  int64_t overlapping = 0;
};

struct Builder {
  const Trace& trace;
  const Classifier& classify;
  Links& m;

  double end(int32_t i) const { return trace.events[i].ts + trace.events[i].dur; }

  bool wrapper(int32_t i) const { return classify.flags[trace.events[i].name] & engine_wrapper; }

  // Parents first: by start, then longest. At 1 µs resolution a parent and its child often tie on
  // both; then the one recorded first holds the other (External id, where the trace has it), and
  // the autograd engine's evaluate_function holds its node. Only ties on all of these keep file
  // order, so a trace nests the same whatever order it lists its events in.
  bool before(int32_t a, int32_t b) const {
    const Event &x = trace.events[a], &y = trace.events[b];
    if (x.ts != y.ts) return x.ts < y.ts;
    if (x.dur != y.dur) return x.dur > y.dur;
    const int64_t xid = x.external_id < 0 ? INT64_MAX : x.external_id, yid = y.external_id < 0 ? INT64_MAX : y.external_id;
    if (xid != yid) return xid < yid;
    return wrapper(a) && !wrapper(b);
  }

  // Whether the open slice p still holds slice i, which starts at or after p. At whole µs (the
  // legacy profiler) a short child can start on its parent's end: a zero-length slice there
  // belongs to the slice that ends there (two zero-length slices at one µs are siblings). And the
  // autograd engine's "evaluate_function: X" always holds its node X, which the legacy profiler
  // may put up to a µs past the wrapper's end.
  bool holds(int32_t p, int32_t i) const {
    const double ts = trace.events[i].ts;
    if (end(p) > ts + kSlack) return true;
    if (classify.node_of[trace.events[p].name] == trace.events[i].name && trace.events[i].name != 0)
      return ts <= end(p) + kOverhang + kSlack;
    if (trace.events[i].dur > kSlack || end(p) < ts - kSlack) return false;
    return trace.events[p].dur > kSlack;
  }

  // Classifies every event, files each slice into its thread's (or stream's) lane and nests the
  // host slices, in one pass over the events.
  void build_lanes(LanesByThread& host, LanesByThread& device) {
    std::map<std::pair<int64_t, int64_t>, LaneBuild> host_build, device_build;
    std::pair<int64_t, int64_t> last_key{0, 0};
    LaneBuild* last = nullptr;  // events come in runs from one thread: look its lane up once per run
    bool last_device = false;
    for (int32_t i = 0; i < static_cast<int32_t>(trace.events.size()); ++i) {
      const Event& e = trace.events[i];
      const Kind k = m.kind[i] = classify(e);
      if (k == Kind::flow || e.phase != 'X') continue;
      const std::pair<int64_t, int64_t> key{e.pid, e.tid};
      const bool on_device = k == Kind::device;
      if (last == nullptr || key != last_key || on_device != last_device)
        last = &(on_device ? device_build : host_build)[key], last_key = key, last_device = on_device;
      LaneBuild& lane = *last;
      if (lane.in_order && !lane.all.empty() && before(i, lane.all.back())) lane.in_order = false;
      lane.all.push_back(i);
      if (!on_device && lane.in_order) nest(lane, i);
    }
    for (auto& [key, lane] : host_build) {
      if (!lane.in_order) renest(lane);
      m.overlapping += lane.overlapping;
      host[key] = std::move(lane.kept);
    }
    for (auto& [key, lane] : device_build) {
      if (!lane.in_order) std::stable_sort(lane.all.begin(), lane.all.end(), [&](int32_t a, int32_t b) { return before(a, b); });
      device[key] = std::move(lane.all);
    }
  }

  // A slice that starts inside another but ends after it is not nested: it is counted and
  // left out of the tree, rather than guessed into it.
  void nest(LaneBuild& lane, int32_t i) {
    Lane& stack = lane.stack;
    const double i_end = end(i);
    while (!stack.empty() && !holds(stack.back(), i)) stack.pop_back();
    // Profilers round: a slice that runs a hair past its parent still belongs to it. A step or
    // annotation crossed by an op is closed early rather than cutting the op out; so is a Python
    // frame (with_stack) crossed by an op, step or scope (record_function opens its scope inside
    // its __enter__ frame and outlives it).
    while (!stack.empty() && i_end > end(stack.back()) + kOverhang &&
           (m.kind[stack.back()] == Kind::step || m.kind[stack.back()] == Kind::annotation ||
            (m.kind[stack.back()] == Kind::other && m.kind[i] != Kind::other)))
      stack.pop_back();
    if (!stack.empty() && i_end > end(stack.back()) + kOverhang) {
      ++lane.overlapping;
      m.kind[i] = Kind::other;
      return;
    }
    const int32_t p = stack.empty() ? -1 : stack.back();
    m.parent[i] = p;
    if (p >= 0) {
      m.op_parent[i] = m.kind[p] == Kind::op ? p : m.op_parent[p];
      m.annotation[i] = m.kind[p] == Kind::annotation ? p : m.annotation[p];
    }
    stack.push_back(i);
    lane.kept.push_back(i);
  }

  // An out-of-order lane: undo what nesting it as it came did, sort it, nest it again.
  void renest(LaneBuild& lane) {
    for (int32_t i : lane.all) {
      m.kind[i] = classify(trace.events[i]);
      m.parent[i] = m.op_parent[i] = m.annotation[i] = -1;
    }
    lane.kept.clear(), lane.stack.clear(), lane.overlapping = 0;
    std::stable_sort(lane.all.begin(), lane.all.end(), [&](int32_t a, int32_t b) { return before(a, b); });
    for (int32_t i : lane.all) nest(lane, i);
  }

  // The innermost slice of a sorted, nested lane that contains ts. `starts` holds the lane's
  // start times, so the search reads one compact array rather than scattered events.
  int32_t slice_at(const Lane& lane, const std::vector<double>& starts, double ts) const {
    const auto it = std::upper_bound(starts.begin(), starts.end(), ts + kSlack);
    if (it == starts.begin()) return -1;
    for (int32_t i = lane[it - starts.begin() - 1]; i >= 0; i = m.parent[i])
      if (end(i) + kSlack >= ts) return i;
    return -1;
  }

  // slice_at for many times at once: `at` holds (ts, slot) pairs, and out[slot] gets the slice.
  // The times are sorted and met in one walk along the lane, instead of one search each.
  void slices_at(const Lane& lane, std::vector<std::pair<double, int32_t>>& at, std::vector<int32_t>& out) const {
    std::sort(at.begin(), at.end());
    size_t k = 0;
    for (const auto& [ts, slot] : at) {
      while (k < lane.size() && trace.events[lane[k]].ts <= ts + kSlack) ++k;
      int32_t found = -1;
      for (int32_t i = k == 0 ? -1 : lane[k - 1]; i >= 0 && found < 0; i = m.parent[i])
        if (end(i) + kSlack >= ts) found = i;
      out[slot] = found;
    }
  }

  std::vector<double> starts_of(const Lane& lane) const {
    std::vector<double> starts(lane.size());
    for (size_t k = 0; k < lane.size(); ++k) starts[k] = trace.events[lane[k]].ts;
    return starts;
  }
};

}  // namespace

Links build_links(const Trace& trace) {
  const size_t n = trace.events.size();
  Links m;
  m.kind.resize(n);
  m.parent.assign(n, -1), m.op_parent.assign(n, -1), m.annotation.assign(n, -1);
  m.launcher.assign(n, -1), m.forward.assign(n, -1);
  const Classifier classify(trace);
  Builder b{trace, classify, m};
  LanesByThread host, device;
  b.build_lanes(host, device);
  for (auto& [key, lane] : device) m.device_lanes.push_back(std::move(lane));
  for (auto it = host.begin(); it != host.end();) {  // summary lanes are no host threads
    if (!Classifier::among(classify.summary_pids, it->first.first)) {
      ++it;
      continue;
    }
    m.summary_lanes.push_back(std::move(it->second));
    it = host.erase(it);
  }

  // Op children, grouped by parent in time order; and each thread's top-level ops.
  std::vector<int32_t> count(n + 1, 0);
  for (auto& [key, lane] : host) {
    Lane top;
    for (int32_t i : lane) {
      if (m.kind[i] == Kind::step) m.steps.push_back(i);
      if (m.kind[i] != Kind::op) continue;
      if (m.op_parent[i] < 0) top.push_back(i);
      else ++count[m.op_parent[i] + 1];
    }
    if (!top.empty()) m.threads.push_back(std::move(top));
  }
  m.child_begin.assign(n + 1, 0);
  for (size_t i = 0; i < n; ++i) m.child_begin[i + 1] = m.child_begin[i] + count[i + 1];
  m.children.resize(m.child_begin[n]);
  std::vector<int32_t> fill(m.child_begin.begin(), m.child_begin.end() - 1);
  for (auto& [key, lane] : host)
    for (int32_t i : lane)
      if (m.kind[i] == Kind::op && m.op_parent[i] >= 0) m.children[fill[m.op_parent[i]]++] = i;
  std::sort(m.steps.begin(), m.steps.end(), [&](int32_t a, int32_t c) { return trace.events[a].ts < trace.events[c].ts; });

  // Launches: a kernel's correlation names the runtime call (Kineto), or its external id the op
  // (1.8 era); Ascend links op → task with torch_to_npu flows, and forward → backward by fwdbwd.
  if (!m.device_lanes.empty()) {
    // A runtime call that overhangs its op is left out of the op tree but still launched its
    // kernel: it is found by what it is, not by where it nests.
    auto is_runtime = [&](size_t i) {
      return m.kind[i] == Kind::runtime || (m.kind[i] == Kind::other && classify(trace.events[i]) == Kind::runtime);
    };
    size_t runtimes = 0, ops = 0;
    for (size_t i = 0; i < n; ++i) runtimes += is_runtime(i), ops += m.kind[i] == Kind::op;
    IdIndex runtime_by_correlation(runtimes), op_by_external_id(ops);
    for (size_t i = 0; i < n; ++i) {
      const Event& e = trace.events[i];
      if (e.correlation >= 0 && is_runtime(i)) runtime_by_correlation.assign(e.correlation, static_cast<int32_t>(i));
      if (m.kind[i] == Kind::op && e.external_id >= 0) op_by_external_id.emplace(e.external_id, static_cast<int32_t>(i));
    }
    m.launch_calls.reserve(m.device_lanes.size());
    for (const Lane& lane : m.device_lanes) {
      Lane& calls = m.launch_calls.emplace_back(lane.size(), -1);
      for (size_t k = 0; k < lane.size(); ++k) {
        const int32_t i = lane[k];
        const Event& e = trace.events[i];
        const int32_t runtime = calls[k] = e.correlation >= 0 ? runtime_by_correlation.find(e.correlation) : -1;
        if (runtime >= 0) m.launcher[i] = m.op_parent[runtime];
        else if (e.external_id >= 0) m.launcher[i] = op_by_external_id.find(e.external_id);
      }
    }
  }

  struct FlowEnds {
    int32_t from = -1, to = -1;
  };
  // Ascend links a torch op to its device task (torch_to_npu) and a CANN API call to its task
  // (async_acl_npu, HostToDevice); with its task queue on (the default), an op's Enqueue to the
  // Dequeue on the queue thread that runs its aclnn* call (enqueue_to_dequeue), and torch_to_npu
  // then starts at that call. Each kind numbers its flows apart.
  enum FlowKind { torch_to_task, api_to_task, task_queue, fwdbwd, no_flow };
  auto flow_kind = [&](const Event& e) {
    const std::string &cat = trace.strings[e.category], &name = trace.strings[e.name];
    if (cat == "async_npu" || name == "torch_to_npu") return torch_to_task;
    if (cat == "async_acl_npu" || cat == "HostToDevice" || name.starts_with("HostToDevice")) return api_to_task;
    if (cat == "async_task_queue" || name == "enqueue_to_dequeue") return task_queue;
    return cat == "fwdbwd" ? fwdbwd : no_flow;
  };
  std::unordered_map<int64_t, FlowEnds> flows[no_flow];
  for (size_t i = 0; i < n; ++i) {
    const Event& e = trace.events[i];
    if (m.kind[i] != Kind::flow || e.flow_id == -1) continue;
    const FlowKind k = flow_kind(e);
    if (k == no_flow) continue;
    auto& ends = flows[k][e.flow_id];
    (e.phase == 's' ? ends.from : ends.to) = static_cast<int32_t>(i);
  }
  const auto& fwdbwd_flows = flows[fwdbwd];
  std::map<std::pair<int64_t, int64_t>, const Lane*> device_by_thread;
  for (const Lane& lane : m.device_lanes) device_by_thread[{trace.events[lane[0]].pid, trace.events[lane[0]].tid}] = &lane;
  std::map<const Lane*, std::vector<double>> starts;  // of the lanes flows land on
  auto slice_at = [&](const Lane& lane, double ts) {
    auto it = starts.find(&lane);
    if (it == starts.end()) it = starts.emplace(&lane, b.starts_of(lane)).first;
    return b.slice_at(lane, it->second, ts);
  };
  auto op_of = [&](int32_t slice) { return slice < 0 || m.kind[slice] == Kind::op ? slice : m.op_parent[slice]; };
  // A CANN API call has no op around it on its own lane: its op runs at that time on the thread
  // of the same id (the call's "Thread Id") in the process that holds ops.
  std::map<int64_t, const Lane*> op_thread_by_tid;
  auto holds_ops = [&](const Lane& lane) { return std::any_of(lane.begin(), lane.end(), [&](int32_t i) { return m.kind[i] == Kind::op; }); };
  if (!classify.cann_pids.empty())
    for (const auto& [key, lane] : host)
      if (!Classifier::among(classify.cann_pids, key.first) && holds_ops(lane)) op_thread_by_tid.emplace(key.second, &lane);
  auto host_slice_at = [&](const Event& e) {
    const auto it = host.find({e.pid, e.tid});
    return it == host.end() ? -1 : slice_at(it->second, e.ts);
  };
  // The slice a flow starts in: a CANN API call's is the slice of its thread in the process that
  // holds ops, at that time (the call itself is no op).
  auto slice_of_flow_end = [&](int32_t end_index) -> int32_t {
    const Event& e = trace.events[end_index];
    const int32_t slice = host_slice_at(e);
    if (op_of(slice) >= 0 || !Classifier::among(classify.cann_pids, e.pid)) return slice;
    const auto thread = op_thread_by_tid.find(e.tid);
    return thread == op_thread_by_tid.end() ? -1 : slice_at(*thread->second, e.ts);
  };
  // The task queue: each Dequeue slice → the op whose Enqueue it ran.
  std::unordered_map<int32_t, int32_t> queued_op;
  for (const auto& [id, ends] : flows[task_queue]) {
    if (ends.from < 0 || ends.to < 0) continue;
    const int32_t op = op_of(host_slice_at(trace.events[ends.from])), dequeue = host_slice_at(trace.events[ends.to]);
    if (op >= 0 && dequeue >= 0) queued_op.emplace(dequeue, op);
  }
  if (!queued_op.empty()) m.queued_call.assign(n, -1);
  // API flows first: a torch_to_npu flow, where there is one, names the op directly. A flow that
  // starts under a Dequeue was queued by the Enqueue's op: that op launched the task, and the
  // aclnn* call the queue thread ran for it is kept beside it.
  for (const FlowKind k : {api_to_task, torch_to_task})
    for (const auto& [id, ends] : flows[k]) {
      if (ends.from < 0 || ends.to < 0) continue;
      const Event& f = trace.events[ends.to];
      const auto lane = device_by_thread.find({f.pid, f.tid});
      if (lane == device_by_thread.end()) continue;
      const int32_t task = slice_at(*lane->second, f.ts);
      const int32_t slice = task >= 0 ? slice_of_flow_end(ends.from) : -1;
      int32_t op = op_of(slice);
      if (!queued_op.empty())
        for (int32_t x = slice; x >= 0; x = m.parent[x])
          if (const auto q = queued_op.find(x); q != queued_op.end()) {
            m.queued_call[task] = op;
            op = q->second;
            break;
          }
      if (op >= 0) m.launcher[task] = op;
    }
  // Forward → backward: both ends of each flow, found thread by thread in one walk each.
  std::vector<int32_t> flow_ends;  // from, to of each complete flow
  for (const auto& [id, ends] : fwdbwd_flows)
    if (ends.from >= 0 && ends.to >= 0) flow_ends.push_back(ends.from), flow_ends.push_back(ends.to);
  std::map<const Lane*, std::vector<std::pair<double, int32_t>>> ends_by_lane;
  for (size_t k = 0; k < flow_ends.size(); ++k) {
    const Event& e = trace.events[flow_ends[k]];
    const auto it = host.find({e.pid, e.tid});
    if (it != host.end()) ends_by_lane[&it->second].emplace_back(e.ts, static_cast<int32_t>(k));
  }
  std::vector<int32_t> slice(flow_ends.size(), -1);
  for (auto& [lane, at] : ends_by_lane) b.slices_at(*lane, at, slice);
  for (size_t k = 0; k < flow_ends.size(); k += 2) {
    const int32_t fwd = op_of(slice[k]), bwd = op_of(slice[k + 1]);
    if (fwd >= 0 && bwd >= 0) m.forward[bwd] = fwd;
  }
  if (fwdbwd_flows.empty()) {  // older traces: match Sequence numbers instead, in time order
    std::vector<std::pair<double, int32_t>> ops;
    size_t lanes_with_ops = 0;
    for (const auto& [key, lane] : host) {
      const size_t before = ops.size();
      for (int32_t i : lane)
        if (m.kind[i] == Kind::op && trace.events[i].sequence_nr >= 0) ops.emplace_back(trace.events[i].ts, i);
      lanes_with_ops += ops.size() > before;
    }
    if (lanes_with_ops > 1) std::sort(ops.begin(), ops.end());  // one lane is in time order already
    IdIndex forward_by_sequence(ops.size());
    for (const auto& [ts, i] : ops) {
      const int64_t seq = trace.events[i].sequence_nr;
      if (!(classify.flags[trace.events[i].name] & backward_name)) forward_by_sequence.emplace(seq, i);
      else m.forward[i] = forward_by_sequence.find(seq);
    }
  }
  return m;
}

}  // namespace opfuse::trace
