// Trace → MemoryTime per device: the allocator's peak, when it came, and the blocks that hold it
// then, each charged to the op (and its module and phase) that allocated it. Blocks are followed
// by address from their allocation to their free; a block freed in the profile but allocated
// before it is one the allocator's total still counted, so the total less the blocks seen is
// what "before the profile" holds.
#include <algorithm>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "opfuse/analyze.h"

namespace opfuse::analyze {
namespace {

using trace::Allocation;
using trace::Kind;
using trace::Links;
using trace::Trace;

// c10::DeviceType's numbers for the devices a profile meets.
std::string device_name(int64_t type, int64_t id) {
  switch (type) {
    case 0: return "cpu";
    case 1: return id >= 0 ? fmt::format("cuda:{}", id) : "cuda";
    case 20: return id >= 0 ? fmt::format("npu:{}", id) : "npu";  // PrivateUse1, as torch_npu registers
    default: return fmt::format("type {}:{}", type, id);
  }
}

// The innermost op or scope around a time on a thread: each thread's nested slices in start
// order, searched as the model nests them.
class SliceFinder {
 public:
  SliceFinder(const Trace& t, const Links& m) : t_(t), m_(m) {
    for (size_t i = 0; i < t.events.size(); ++i) {
      const Kind k = m.kind[i];
      if (k == Kind::op || k == Kind::annotation || k == Kind::step)
        lanes_[{t.events[i].pid, t.events[i].tid}].push_back(static_cast<int32_t>(i));
    }
    for (auto& [key, lane] : lanes_)
      std::stable_sort(lane.begin(), lane.end(), [&](int32_t a, int32_t b) {
        const auto &x = t.events[a], &y = t.events[b];
        return x.ts != y.ts ? x.ts < y.ts : x.dur > y.dur;
      });
  }

  int32_t at(int64_t pid, int64_t tid, double ts) const {
    const auto it = lanes_.find({pid, tid});
    if (it == lanes_.end()) return -1;
    const auto& lane = it->second;
    auto after = std::upper_bound(lane.begin(), lane.end(), ts, [&](double v, int32_t i) { return v < t_.events[i].ts; });
    if (after == lane.begin()) return -1;
    for (int32_t i = *(after - 1); i >= 0; i = m_.parent[i])
      if (t_.events[i].ts + t_.events[i].dur >= ts) return i;
    return -1;
  }

 private:
  const Trace& t_;
  const Links& m_;
  std::map<std::pair<int64_t, int64_t>, std::vector<int32_t>> lanes_;
};

// Who a block is charged to: its allocating op's name, module and phase.
struct Owner {
  uint32_t op = 0, module = 0;  // string ids; 0: none
  uint8_t phase = 0;            // a Phase, an index into kPhases
  bool backward = false;        // module is that of the forward op a backward op differentiates
};
enum Phase : uint8_t { outside_ops, forward_pass, backward_pass, optimizer_step, before_profile };
constexpr const char* kPhases[] = {"outside ops", "forward", "backward", "optimizer step", "before the profile (other)"};

bool is_scope_of_step(const std::string& name) {
  return name.compare(0, 10, "Optimizer.") == 0 || name.compare(0, 13, "ProfilerStep#") == 0;
}

class Charger {
 public:
  Charger(const Trace& t, const Links& m) : t_(t), m_(m), slices_(t, m) {}

  Owner of(const Allocation& a) const {
    const int32_t slice = slices_.at(a.pid, a.tid, a.ts);
    Owner o;
    const int32_t op = slice >= 0 && m_.kind[slice] == Kind::op ? slice : slice >= 0 ? m_.op_parent[slice] : -1;
    if (op < 0) {
      if (slice >= 0 && m_.kind[slice] == Kind::annotation) o.module = t_.events[slice].name;
      return o;
    }
    o.op = t_.events[charged_op(op)].name;
    o.phase = forward_pass;
    int32_t forward = -1;  // a backward op's forward op, whose module it is charged to
    for (int32_t x = op; x >= 0; x = m_.op_parent[x]) {
      const std::string& name = t_.strings[t_.events[x].name];
      if (o.module == 0 && t_.events[x].module != 0 && !is_scope_of_step(t_.strings[t_.events[x].module]))
        o.module = t_.events[x].module;
      if (forward < 0) forward = m_.forward[x];
      if (name.compare(0, 10, "Optimizer.") == 0) o.phase = optimizer_step;
      else if (o.phase == forward_pass && (m_.forward[x] >= 0 || name.find("Backward") != std::string::npos ||
                                name.compare(0, 10, "autograd::") == 0))
        o.phase = backward_pass;
    }
    if (o.module == 0) o.module = scope_of(op);
    if (o.module == 0 && o.phase == backward_pass && forward >= 0) {
      o.module = t_.events[forward].module != 0 ? t_.events[forward].module : scope_of(forward);
      o.backward = o.module != 0;
    }
    return o;
  }

  // The op a block is charged to: the innermost one that is more than an allocation (a
  // convolution's output is made by the aten::empty inside it).
  int32_t charged_op(int32_t op) const {
    static const std::unordered_set<std::string> makers = {
        "aten::empty",     "aten::empty_strided", "aten::empty_like", "aten::new_empty", "aten::new_empty_strided",
        "aten::zeros",     "aten::zeros_like",    "aten::resize_",    "aten::new_zeros", "aten::empty_permuted"};
    while (m_.op_parent[op] >= 0 && makers.count(t_.strings[t_.events[op].name]) > 0) op = m_.op_parent[op];
    return op;
  }

  // The innermost module scope around an op (not the step's own scopes), or 0.
  uint32_t scope_of(int32_t op) const {
    for (int32_t a = m_.annotation[op]; a >= 0; a = m_.annotation[a])
      if (!is_scope_of_step(t_.strings[t_.events[a].name])) return t_.events[a].name;
    return 0;
  }

  std::string step_at(double ts) const {
    for (int32_t s : m_.steps)
      if (t_.events[s].ts <= ts && ts <= t_.events[s].ts + t_.events[s].dur) return t_.strings[t_.events[s].name];
    return "";
  }

 private:
  const Trace& t_;
  const Links& m_;
  SliceFinder slices_;
};

std::vector<MemoryHolder> largest_first(std::map<std::string, MemoryHolder> rows) {
  std::vector<MemoryHolder> out;
  for (auto& [name, row] : rows)
    if (row.bytes > 0) out.push_back(std::move(row));
  std::stable_sort(out.begin(), out.end(), [](const MemoryHolder& a, const MemoryHolder& b) { return a.bytes > b.bytes; });
  return out;
}

// The highest point of each of `points` equal spans of time.
std::vector<std::pair<double, int64_t>> thin(const std::vector<std::pair<double, int64_t>>& all, size_t points) {
  if (all.size() <= points) return all;
  const double first = all.front().first, span = std::max(1e-9, all.back().first - first);
  std::vector<std::pair<double, int64_t>> out;
  size_t bucket = SIZE_MAX;
  for (const auto& p : all) {
    const auto b = std::min(points - 1, static_cast<size_t>((p.first - first) / span * static_cast<double>(points)));
    if (b != bucket) out.push_back(p), bucket = b;
    else if (p.second > out.back().second) out.back() = p;
  }
  return out;
}

MemoryTime one_device(const Trace& t, const Charger& charge, std::vector<const Allocation*>& events) {
  std::stable_sort(events.begin(), events.end(), [](const Allocation* a, const Allocation* b) { return a->ts < b->ts; });
  MemoryTime d;
  d.device = device_name(events.front()->device_type, events.front()->device_id);
  // The peak: the largest total a device's allocator reported (or, where it reports none, the
  // running sum of the blocks seen). The CPU allocator counts only what was asked of it while a profile ran, so on the CPU the
  // total is the blocks the profile allocated, plus what opfuse's profiler says the model held as
  // the profile began (parameters, optimizer state, …). A block allocated before the profile and
  // freed in it is left out: torch reports such a free only when an earlier profile in the process
  // saw a block at that address (its table of sizes keeps them), so whether the total dropped
  // would depend on the process's history (a 3-step MLP profile's peak came out 0, 1 or 2 weight
  // matrices short of torch's timeline).
  const bool on_cpu = d.device == "cpu", before_known = on_cpu && !t.memory_before.empty();
  int64_t running = 0;
  for (const auto& [what, bytes] : t.memory_before) running += on_cpu ? bytes : 0;
  std::unordered_set<int64_t> allocated;
  size_t peak = 0;
  std::vector<std::pair<double, int64_t>> curve;
  curve.reserve(events.size());
  for (size_t k = 0; k < events.size(); ++k) {
    const Allocation& a = *events[k];
    (a.bytes >= 0 ? d.allocations : d.frees) += 1;
    if (a.bytes >= 0) allocated.insert(a.addr);
    if (a.bytes >= 0 || !on_cpu || allocated.erase(a.addr) > 0) running += a.bytes;
    const int64_t total = on_cpu || a.total_allocated < 0 ? running : a.total_allocated;
    curve.emplace_back(a.ts, total);
    if (total > curve[peak].second) peak = k;
  }
  d.peak_bytes = curve[peak].second;
  d.peak_at_us = curve[peak].first;
  d.timeline = thin(curve, MemoryTime::kTimelinePoints);
  // The blocks live just after the peak's event, and who allocated them.
  std::unordered_map<int64_t, const Allocation*> live;
  for (size_t k = 0; k <= peak; ++k) {
    const Allocation* a = events[k];
    if (a->bytes > 0) live[a->addr] = a;
    else live.erase(a->addr);
  }
  std::map<std::string, MemoryHolder> by_module, by_op, by_phase;
  auto add = [](std::map<std::string, MemoryHolder>& rows, const std::string& name, int64_t bytes) {
    MemoryHolder& row = rows[name];
    row.name = name, row.bytes += bytes, row.blocks += 1;
  };
  int64_t seen = 0;
  for (const auto& [addr, a] : live) {
    const Owner o = charge.of(*a);
    seen += a->bytes;
    add(by_phase, kPhases[o.phase], a->bytes);
    add(by_op, o.op != 0 ? t.strings[o.op] : "(no op)", a->bytes);
    const std::string module = o.module != 0 ? t.strings[o.module] + (o.backward ? " (backward)" : "")
                               : o.phase == optimizer_step ? "(optimizer step)"
                                               : "(no module)";
    add(by_module, module, a->bytes);
  }
  if (before_known)
    for (const auto& [what, bytes] : t.memory_before) {
      by_phase[what] = {what, bytes, 0};
      seen += bytes;
    }
  if (d.peak_bytes > seen) by_phase[kPhases[before_profile]] = {kPhases[before_profile], d.peak_bytes - seen, 0};
  d.by_module = largest_first(std::move(by_module));
  d.by_op = largest_first(std::move(by_op));
  d.by_phase = largest_first(std::move(by_phase));
  const Owner at_peak = charge.of(*events[peak]);
  d.peak_op = at_peak.op != 0 ? t.strings[at_peak.op] : "";
  d.peak_step = charge.step_at(d.peak_at_us);
  return d;
}

}  // namespace

std::vector<MemoryTime> memory_time(const Trace& t, const Links& m) {
  if (t.memory.empty()) return {};
  std::map<std::pair<int64_t, int64_t>, std::vector<const Allocation*>> by_device;
  for (const Allocation& a : t.memory) by_device[{a.device_type, a.device_id}].push_back(&a);
  const Charger charge(t, m);
  std::vector<MemoryTime> out;
  for (auto& [device, events] : by_device) out.push_back(one_device(t, charge, events));
  std::stable_sort(out.begin(), out.end(), [](const MemoryTime& a, const MemoryTime& b) { return a.peak_bytes > b.peak_bytes; });
  return out;
}

int64_t cpu_peak_bytes(const std::vector<MemoryTime>& memory) {
  for (const auto& d : memory)
    if (d.device == "cpu") return d.peak_bytes;
  return -1;
}

}  // namespace opfuse::analyze
