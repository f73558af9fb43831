// The op index: names, classes, shapes and costs of a trace's ops, made once (op_index.h).
#include "analyze/op_index.h"

#include <algorithm>
#include <map>
#include <unordered_set>

#include "opfuse/stats.h"

namespace opfuse::analyze {
namespace {

using trace::Event;
using trace::Kind;
using trace::Links;
using trace::Trace;

const std::unordered_set<std::string>& elementwise_names() {
  static const std::unordered_set<std::string> names = [] {
    std::unordered_set<std::string> s;
    for (const char* n : {"add", "sub", "mul", "div", "neg", "exp", "log", "sigmoid", "tanh", "relu", "gelu", "silu",
                          "pow", "rsqrt", "sqrt", "reciprocal", "abs", "clamp", "clamp_min", "clamp_max", "where",
                          "masked_fill", "sin", "cos", "erf", "floor", "ceil", "sign", "hardtanh", "leaky_relu",
                          "threshold", "lt", "gt", "le", "ge", "eq", "ne", "maximum", "minimum", "addcmul", "addcdiv",
                          "lerp", "rsub", "square", "exp2", "log1p", "expm1", "softplus", "mish", "hardswish",
                          "hardsigmoid", "elu", "sigmoid_backward", "tanh_backward", "threshold_backward",
                          "gelu_backward", "silu_backward", "logical_and", "logical_or", "logical_not",
                          "bitwise_and", "fmod", "remainder", "trunc", "round", "frac"}) {
      s.insert(n);
      s.insert(std::string(n) + "_");
    }
    return s;
  }();
  return names;
}

// Matrix products, forward and backward. A fused op does their arithmetic too (attention's two
// products), or the chain keeps them (the projections of linear-silu-linear-mul), so their time
// stays in the fused op's estimate: bounding it by the slowest op alone counted a chain's second
// product as saved.
const std::unordered_set<std::string>& matrix_product_names() {
  static const std::unordered_set<std::string> names = {
      "mm",          "bmm",         "matmul",        "addmm",         "baddbmm",        "addbmm", "linear",
      "MmBackward0", "BmmBackward0", "AddmmBackward0", "BaddbmmBackward0", "AddbmmBackward0"};
  return names;
}

// What a matrix product does before its arithmetic: views, and the copies a 4-d matmul's
// expand and reshape make.
const std::unordered_set<std::string>& copy_or_view_names() {
  static const std::unordered_set<std::string> names = {
      "expand", "reshape", "_reshape_alias", "view",    "_unsafe_view", "as_strided", "clone",
      "contiguous", "copy_", "transpose",    "t",       "permute",      "resolve_conj", "resolve_neg"};
  return names;
}

}  // namespace

std::string normalise(const std::string& name) {
  for (std::string_view prefix : {"autograd::engine::evaluate_function: ", "aten::"})
    if (name.starts_with(prefix)) return normalise(name.substr(prefix.size()));
  static constexpr std::string_view node = "torch::autograd::CppNode<";
  if (name.starts_with(node) && name.back() == '>') {
    const size_t last = name.rfind("::");
    return "CppNode<" + name.substr(last + 2);
  }
  return name;
}

int64_t elements(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= std::max<int64_t>(d, 0);
  return n;
}

OpIndex::OpIndex(const Trace& t, const Links& m, Backend backend, double profiler_us_per_event)
    : trace(t), links(m), names_(t.strings.size()), shapes_by_dims_(t.strings.size(), -1) {
  std::vector<char> done(t.strings.size(), 0);
  name_of_op_.assign(t.events.size(), 0);
  for (size_t i = 0; i < t.events.size(); ++i) {
    if (m.kind[i] != Kind::op) continue;
    const uint32_t id = name_of_op_[i] = t.events[i].name;
    if (!done[id]) names_[id] = normalise(t.strings[id]), done[id] = 1;
  }
  elementwise_.assign(t.strings.size(), 0);
  matrix_product_.assign(t.strings.size(), 0);
  copy_or_view_.assign(t.strings.size(), 0);
  for (size_t i = 0; i < t.strings.size(); ++i) {
    elementwise_[i] = elementwise_names().count(names_[i]) > 0;
    matrix_product_[i] = matrix_product_names().count(names_[i]) > 0;
    copy_or_view_[i] = copy_or_view_names().count(names_[i]) > 0;
  }
  if (backend != Backend::cpu && !m.device_lanes.empty()) {
    // Device time counts for the op that launched it and all its ancestors.
    device_time_.assign(t.events.size(), 0);
    for (const auto& lane : m.device_lanes)
      for (int32_t k : lane)
        for (int32_t op = m.launcher[k]; op >= 0; op = m.op_parent[op]) device_time_[op] += t.events[k].dur;
  } else if (profiler_us_per_event > 0) {
    for (const trace::Allocation& a : t.memory) allocation_starts_.add(a.pid, a.tid, a.ts);
    for (size_t i = 0; i < t.events.size(); ++i)
      if (m.kind[i] == Kind::annotation) annotation_starts_.add(t.events[i].pid, t.events[i].tid, t.events[i].ts);
    allocation_starts_.sort();
    annotation_starts_.sort();
    profiled_cost_ = profiled_cost_inside(t, m, profiler_us_per_event, allocation_starts_);
    profiled_cost_each_ = profiler_us_per_event;
  }
}

void StartsByThread::sort() {
  for (auto& [thread, starts] : starts_) std::sort(starts.begin(), starts.end());
}

int64_t StartsByThread::within(const Event& e, double from, double to) const {
  const auto it = starts_.find({e.pid, e.tid});
  if (it == starts_.end() || to < from) return 0;
  return std::upper_bound(it->second.begin(), it->second.end(), to) - std::lower_bound(it->second.begin(), it->second.end(), from);
}

int64_t StartsByThread::between(const Event& e, double from, double to) const {
  const auto it = starts_.find({e.pid, e.tid});
  if (it == starts_.end() || to <= from) return 0;
  return std::lower_bound(it->second.begin(), it->second.end(), to) - std::upper_bound(it->second.begin(), it->second.end(), from);
}

double OpIndex::run_time(const std::vector<int32_t>& ops) const {
  double sum = 0;
  for (int32_t e : ops) sum += time(e);
  if (profiled_cost_.empty()) return sum;
  std::vector<int32_t> in_order(ops);
  std::sort(in_order.begin(), in_order.end(), [&](int32_t a, int32_t b) { return trace.events[a].ts < trace.events[b].ts; });
  for (size_t k = 1; k < in_order.size(); ++k) {
    const Event& before = trace.events[in_order[k - 1]];
    const Event& next = trace.events[in_order[k]];
    const double from = before.ts + before.dur, to = next.ts;
    if (to <= from || annotation_starts_.between(next, from, to) > 0) continue;
    const int64_t records = 1 + allocation_starts_.between(next, from, to);  // the next op's own, and what began between
    sum += std::max(0.0, to - from - profiled_cost_each_ * static_cast<double>(records));
  }
  return sum;
}

double OpIndex::time(int32_t e) const {
  if (!device_time_.empty()) return device_time_[e];
  const double dur = trace.events[e].dur;
  return profiled_cost_.empty() ? dur : std::max(0.0, dur - profiled_cost_[e]);
}

double OpIndex::recorded_time(int32_t e) const { return device_time_.empty() ? trace.events[e].dur : device_time_[e]; }

double OpIndex::host_time(int32_t e) const { return trace.events[e].dur; }

const OpShapes& OpIndex::shapes(int32_t e) {
  const Event& ev = trace.events[e];
  int32_t& head = shapes_by_dims_[ev.dims];
  for (int32_t k = head; k >= 0; k = shape_entries_[k].next)
    if (shape_entries_[k].types == ev.types) return shape_entries_[k].shapes;
  shape_entries_.push_back({ev.types, head, {}});
  head = static_cast<int32_t>(shape_entries_.size() - 1);
  const auto dims = parse_dims(trace.strings[ev.dims]);
  const std::vector<std::string_view> types = split_types(trace.strings[ev.types]);
  OpShapes& out = shape_entries_.back().shapes;
  for (size_t k = 0; k < dims.size(); ++k) {
    const Shape& s = dims[k];
    if (s.empty() || std::any_of(s.begin(), s.end(), [](int64_t d) { return d < 0; })) continue;
    out.shapes.push_back(&*distinct_shapes_.insert(s).first);
    out.bytes.push_back(elements(s) * dtype_bytes(k < types.size() ? types[k] : ""));
  }
  const bool one = !out.shapes.empty() &&
                   std::all_of(out.shapes.begin(), out.shapes.end(), [&](const Shape* x) { return x == out.shapes[0]; });
  out.single = one ? out.shapes[0] : nullptr;
  return out;
}

double profiler_cost(const Trace& t, const Links& m) {
  if (t.plain_step_us <= 0 || m.steps.empty()) return 0;
  std::vector<double> steps;
  for (int32_t i : m.steps) steps.push_back(t.events[i].dur);
  const double step = median(steps);
  const Event& first = t.events[m.steps.front()];
  const Event& last = t.events[m.steps.back()];
  auto within = [&](double ts) { return ts >= first.ts && ts <= last.ts + last.dur; };
  int64_t recorded = 0;
  for (size_t i = 0; i < t.events.size(); ++i)
    if ((m.kind[i] == Kind::op || m.kind[i] == Kind::annotation) && within(t.events[i].ts)) ++recorded;
  for (const trace::Allocation& a : t.memory) recorded += within(a.ts);
  const double per_step = static_cast<double>(recorded) / static_cast<double>(m.steps.size());
  return per_step > 0 && step > t.plain_step_us ? (step - t.plain_step_us) / per_step : 0;
}

std::vector<double> profiled_cost_inside(const Trace& t, const Links& m, double each, const StartsByThread& allocations) {
  std::vector<double> cost(t.events.size(), 0);
  for (size_t i = 0; i < t.events.size(); ++i) {
    if (m.kind[i] != Kind::op) continue;
    for (int32_t up = m.op_parent[i]; up >= 0; up = m.op_parent[up]) cost[up] += each;
    cost[i] += each * static_cast<double>(allocations.within(t.events[i], t.events[i].ts, t.events[i].ts + t.events[i].dur));
  }
  return cost;
}

std::vector<std::string_view> split_types(const std::string& types) {
  std::vector<std::string_view> out;
  for (size_t a = 0, b; a <= types.size(); a = b + 1) {
    b = std::min(types.find(';', a), types.size());
    out.push_back(std::string_view(types).substr(a, b - a));
  }
  return out;
}

int64_t dtype_bytes(std::string_view t) {
  for (std::string_view two : {"Half", "BFloat16", "c10::Half", "c10::BFloat16", "half", "bfloat16"})
    if (t == two) return 2;
  for (std::string_view eight : {"Double", "double", "Long", "long int", "int64_t", "ComplexFloat"})
    if (t == eight) return 8;
  for (std::string_view one : {"Bool", "bool", "Byte", "unsigned char", "Char", "signed char"})
    if (t == one) return 1;
  return 4;
}

std::vector<std::vector<int64_t>> parse_dims(const std::string& dims) {
  std::vector<std::vector<int64_t>> out;
  if (dims.empty()) return out;
  out.emplace_back();
  int64_t value = 0;
  bool in_number = false, unknown = false;
  auto flush = [&] {
    if (unknown) out.back().push_back(-1);
    else if (in_number) out.back().push_back(value);
    value = 0, in_number = false, unknown = false;
  };
  for (char c : dims) {
    if (c >= '0' && c <= '9') {
      value = value * 10 + (c - '0');
      in_number = true;
      if (value > (int64_t{1} << 50)) unknown = true;
    } else if (c == ',') {
      flush();
    } else if (c == ';') {
      flush();
      out.emplace_back();
    } else {
      unknown = true;  // "*" or a sign: not a dimension we can size
    }
  }
  flush();
  return out;
}

namespace {

// Whether strides walk these sizes densely, the dimensions `order` lists innermost last.
bool dense_in_order(const Shape& sizes, const Shape& strides, const Shape& order) {
  int64_t expected = 1;
  for (size_t k = order.size(); k-- > 0;) {
    const int64_t d = order[k];
    if (sizes[d] != 1 && strides[d] != expected) return false;
    if (sizes[d] < 0 || __builtin_mul_overflow(expected, sizes[d], &expected)) return false;  // unknown or absurd
  }
  return true;
}

}  // namespace

Layout4d layout_4d(const Shape& sizes, const Shape& strides) {
  if (sizes.size() != 4 || strides.size() != 4) return Layout4d::other;
  const bool nchw = dense_in_order(sizes, strides, {0, 1, 2, 3});
  const bool channels_last = dense_in_order(sizes, strides, {0, 2, 3, 1});
  if (nchw && channels_last) return Layout4d::either;
  return nchw ? Layout4d::nchw : channels_last ? Layout4d::channels_last : Layout4d::other;
}

Shape dense_order(const Shape& sizes, const Shape& strides) {
  if (sizes.size() < 2 || strides.size() != sizes.size()) return {};
  Shape order, ones;
  for (int64_t d = 0; d < static_cast<int64_t>(sizes.size()); ++d) (sizes[d] == 1 ? ones : order).push_back(d);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return strides[a] > strides[b]; });
  // A dimension of one fits anywhere: in the default order the others leave no telling it from a
  // permutation that moves it (NCHW against channels-last for [N, C, 1, 1]).
  if (!ones.empty() && std::is_sorted(order.begin(), order.end())) return {};
  for (int64_t d : ones) order.insert(std::find_if(order.begin(), order.end(), [d](int64_t o) { return o > d; }), d);
  return dense_in_order(sizes, strides, order) ? order : Shape{};
}

std::map<int64_t, int32_t> backward_ops_by_sequence(const trace::Trace& trace, const trace::Links& links) {
  std::map<int64_t, int32_t> nodes;
  for (size_t i = 0; i < links.forward.size(); ++i)
    if (links.forward[i] >= 0 && trace.events[i].sequence_nr >= 0)
      nodes.emplace(trace.events[i].sequence_nr, static_cast<int32_t>(i));
  return nodes;
}

}  // namespace opfuse::analyze
