// Trace → Analysis: the summary and op table here; findings in findings.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <map>
#include <optional>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include "analyze/findings.h"
#include "analyze/op_index.h"
#include "analyze/repeated_steps.h"
#include "opfuse/stats.h"

namespace opfuse::analyze {
namespace {

using trace::Kind;
using trace::Links;
using trace::Trace;

// The steps the user says the trace holds stand in for markers it lacks; markers that disagree
// mean the wrong trace or the wrong count, and say so.
void take_given_steps(Summary& s, int64_t given) {
  if (given <= 0) return;
  if (s.steps > 0 && s.steps != given)
    throw std::invalid_argument(fmt::format("{}: the trace marks {} steps (ProfilerStep#), not the {} given with --steps",
                                            s.path, s.steps, given));
  if (s.steps > 0) return;
  s.steps = given;
  s.step_us = s.duration_us / static_cast<double>(given);
  s.steps_from = "given";
}

// With neither markers nor a count, the steps a training loop's repeating ops show; their starts
// (for the device figures per step).
std::vector<double> take_repeated_steps(Summary& s, const Trace& t, const Links& m) {
  if (s.steps > 0) return {};
  RepeatedSteps r = repeated_steps(t, m);
  if (r.steps == 0) return {};
  s.steps = r.steps;
  s.step_us = r.step_us;
  s.steps_from = "repeated pattern";
  return std::move(r.starts);
}

Summary summarise(const Trace& t, const Links& m, const std::string& path, Backend backend, int64_t given_steps,
                  double profiler_us_per_event) {
  Summary s;
  s.path = path;
  s.dialect = trace::dialect_name(t.dialect);
  s.backend = backend;
  s.events = static_cast<int64_t>(t.events.size());
  s.skipped = t.skipped;
  s.overlapping = m.overlapping;
  s.warnings = t.warnings;
  double first = 0, last = 0;
  bool any = false;
  for (const auto& e : t.events) {
    if (e.phase != 'X') continue;
    first = any ? std::min(first, e.ts) : e.ts;
    last = any ? std::max(last, e.ts + e.dur) : e.ts + e.dur;
    any = true;
  }
  s.duration_us = last - first;
  std::vector<double> steps;
  for (int32_t i : m.steps) steps.push_back(t.events[i].dur);
  s.steps = static_cast<int64_t>(steps.size());
  s.step_us = median(steps);
  if (s.steps > 0) s.steps_from = "ProfilerStep";
  s.plain_step_us = s.steps > 0 ? t.plain_step_us : 0;
  s.profiler_us_per_event = profiler_us_per_event;
  take_given_steps(s, given_steps);
  const std::vector<double> inferred_starts = take_repeated_steps(s, t, m);
  s.has_device = !m.device_lanes.empty();
  s.rank = t.rank;
  s.devices = device_time(t, m, inferred_starts);
  return s;
}

// op_work per event, worked out once per (name, shapes, types, output): a trace repeats a few
// hundred.
struct OpWork {
  struct Key {
    uint32_t name, dims, types, output;
    bool operator==(const Key& o) const { return name == o.name && dims == o.dims && types == o.types && output == o.output; }
  };
  struct Hash {
    size_t operator()(const Key& k) const {
      return static_cast<size_t>(((uint64_t{k.name} * 0x9E3779B97F4A7C15ull) ^ (uint64_t{k.dims} << 21) ^ k.types ^
                                  (uint64_t{k.output} << 42)) *
                                 0xBF58476D1CE4E5B9ull);
    }
  };
  const Trace& t;
  const Links& links;
  std::unordered_map<Key, Work, Hash> known;
  std::optional<std::map<int64_t, int32_t>> nodes;  // the backward ops by sequence number, made at the first convolution

  Work of(int32_t i) {
    const trace::Event& e = t.events[i];
    if (e.dims == 0) return {};
    const uint32_t output = convolution_forward(t.strings[e.name]) ? output_dims(i) : 0;
    const auto [it, fresh] = known.try_emplace(Key{e.name, e.dims, e.types, output});
    if (fresh) {
      const std::vector<Shape> y = output == 0 ? std::vector<Shape>{} : parse_dims(t.strings[output]);
      it->second = op_work(t.strings[e.name], parse_dims(t.strings[e.dims]), split_types(t.strings[e.types]),
                           y.empty() ? nullptr : &y[0]);
    }
    return it->second;
  }

  // A convolution's output size: the gradient its backward received (convolution_backward's first
  // input), the backward found by the sequence number of the convolution or of the op it runs inside
  // (mkldnn_convolution inside convolution); the dims' string id, or 0.
  uint32_t output_dims(int32_t i) {
    if (!nodes) nodes = backward_ops_by_sequence(t, links);
    for (int32_t e = i; e >= 0; e = links.op_parent[e]) {
      if (t.events[e].sequence_nr < 0) continue;
      const auto node = nodes->find(t.events[e].sequence_nr);
      return node == nodes->end() ? 0 : backward_dims(node->second, 0);
    }
    return 0;
  }

  // The dims of the convolution_backward op at or below an autograd node (evaluate_function,
  // then ConvolutionBackward0, then the op, in a Kineto trace), or 0.
  uint32_t backward_dims(int32_t e, int depth) const {
    if (t.events[e].dims != 0 && t.strings[t.events[e].name].ends_with("convolution_backward")) return t.events[e].dims;
    for (size_t k = 0; depth < 2 && k < links.child_count(e); ++k)
      if (const uint32_t dims = backward_dims(links.children_of(e)[k], depth + 1); dims != 0) return dims;
    return 0;
  }
};

// Per op name: count, inclusive and self time, the device time of what it launched, its work.
std::vector<OpStat> op_table(const Trace& t, const Links& m) {
  OpWork work{t, m, {}, {}};
  const size_t n = t.events.size();
  std::vector<double> self(n), device(m.device_lanes.empty() ? 0 : n, 0);
  for (size_t i = 0; i < n; ++i) self[i] = t.events[i].dur;
  for (size_t i = 0; i < n; ++i)
    if (m.parent[i] >= 0 && m.kind[i] != Kind::device) self[m.parent[i]] -= t.events[i].dur;
  // A task queued on Ascend counts for the op that queued it and for the aclnn* call that ran it.
  for (const auto& lane : m.device_lanes)
    for (int32_t k : lane) {
      if (m.launcher[k] >= 0) device[m.launcher[k]] += t.events[k].dur;
      if (!m.queued_call.empty() && m.queued_call[k] >= 0) device[m.queued_call[k]] += t.events[k].dur;
    }
  std::vector<int32_t> row(t.strings.size(), -1);  // per name id
  std::vector<OpStat> ops;
  for (size_t i = 0; i < n; ++i) {
    if (m.kind[i] != Kind::op) continue;
    int32_t& r = row[t.events[i].name];
    if (r < 0) r = static_cast<int32_t>(ops.size()), ops.push_back({t.strings[t.events[i].name]});
    OpStat& s = ops[r];
    s.count += 1;
    s.total_us += t.events[i].dur;
    s.self_us += std::max(0.0, self[i]);
    if (!device.empty()) s.device_us += device[i];
    if (const Work w = work.of(static_cast<int32_t>(i)); w.flops > 0 || w.bytes > 0) {
      s.flops += w.flops, s.bytes += w.bytes;
      s.work_us += device.empty() ? t.events[i].dur : device[i];
    }
  }
  // Equal self times by name, so the table does not follow the order the file lists ops in.
  std::sort(ops.begin(), ops.end(), [](const OpStat& a, const OpStat& b) {
    return a.self_us != b.self_us ? a.self_us > b.self_us : a.name < b.name;
  });
  return ops;
}

}  // namespace

Backend detect_backend(const Trace& trace) {
  if (trace.dialect == trace::Dialect::ascend) return Backend::npu;
  std::vector<uint32_t> gpu;
  uint32_t mtia = 0;  // the string id of "mtia_ccp_events", 0 when the trace has none
  for (size_t i = 0; i < trace.strings.size(); ++i) {
    for (const char* c : {"kernel", "Kernel", "gpu_memcpy", "Memcpy"})
      if (trace.strings[i] == c) gpu.push_back(static_cast<uint32_t>(i));
    if (trace.strings[i] == "mtia_ccp_events") mtia = static_cast<uint32_t>(i);
  }
  if (gpu.empty() && mtia == 0) return Backend::cpu;  // no pass over the events for a CPU trace
  for (const auto& e : trace.events) {
    if (mtia != 0 && e.category == mtia) return Backend::mtia;
    if (std::find(gpu.begin(), gpu.end(), e.category) != gpu.end()) return Backend::cuda;
  }
  return Backend::cpu;
}

Analysis analyze(const Trace& trace, const std::string& path, const std::vector<Rule>& rules, const Options& options) {
  const Links links = trace::build_links(trace);
  const double profiler_us = profiler_cost(trace, links);  // one pass, for the summary and the savings
  Analysis a;
  // The op table and summary on a second core while the findings (which may time ops) run here.
  std::exception_ptr failed;
  std::thread tables([&] {
    try {
      a.trace = summarise(trace, links, path, options.backend, options.steps, profiler_us);
      a.ops = op_table(trace, links);
      a.modules = module_time(trace, links);
      a.kernels = kernel_table(trace, links);
      a.memory = memory_time(trace, links);
      a.roofline = options.roofline;
    } catch (...) {
      failed = std::current_exception();
    }
  });
  std::vector<int32_t> finding_of_event;
  try {
    a.findings = find_fusions(trace, links, rules, options, profiler_us, &finding_of_event);
    if (options.timeline) a.timeline = step_timeline(trace, links, finding_of_event);
    a.critical_path = critical_path(trace, links);
    what_if(trace, links, a.critical_path, finding_of_event, a.findings);
    a.critical_path.on_path = {};
  } catch (...) {
    tables.join();
    throw;
  }
  tables.join();
  if (failed) std::rethrow_exception(failed);
  return a;
}

Analysis analyze_file(const std::string& path, const std::vector<Rule>& rules, const FileOptions& o) {
  const Trace t = trace::read_trace(path);
  if (t.dialect == trace::Dialect::unknown)
    throw std::invalid_argument(fmt::format(
        "{}: not a trace opfuse recognises (no cpu_op, Operator, kernel, CANN or legacy-profiler events) at byte 0", path));
  Options options;
  options.timeline = o.timeline;
  options.steps = o.steps;
  options.backend = o.backend == "auto" ? detect_backend(t) : parse_backend(o.backend);
  std::string warning;
  // Timing an opfuse op, or this machine's peaks, says something only of a CPU trace taken on
  // a CPU like this one.
  if (options.backend == Backend::cpu) {
    const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    options.measure = o.measure;
    options.roofline = cached_roofline(threads);
    if (o.measure_roofline && !options.roofline.known()) options.roofline = o.measure_roofline(threads);
  } else if (o.measure) {
    warning = fmt::format("{}: opfuse ops are timed on CPU traces only; this one is {}, so bandwidth estimates are used",
                          path, backend_name(options.backend));
  }
  Analysis a = analyze(t, path, rules, options);
  if (!warning.empty()) a.trace.warnings.push_back(warning);
  return a;
}

}  // namespace opfuse::analyze
