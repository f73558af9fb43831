// Rule matches and mined chains → Findings, each with its time, estimated saving and locations.
//
// Sequences are what a fusion can replace: each thread's top-level ops (nested ops dropped, as
// the Ascend advisor does) and, separately, the op children of every op, so a chain wrapped in
// a parent (SwishImplementation → sigmoid, mul) is found too. Earlier rules claim ops first.
#include "analyze/findings.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <deque>
#include <map>
#include <set>
#include <unordered_set>

#include "opfuse/stats.h"

namespace opfuse::analyze {
namespace {

using trace::Event;
using trace::Kind;
using trace::Links;
using trace::Trace;

using Shape = std::vector<int64_t>;

bool starts_with(const std::string& s, std::string_view prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

// "aten::mul" → "mul"; "autograd::engine::evaluate_function: MulBackward0" → "MulBackward0";
// a C++ autograd function's node "torch::autograd::CppNode<opfuse::(anonymous namespace)::SiluFunction>"
// → "CppNode<SiluFunction>", as a pattern can name it.
std::string normalise(const std::string& name) {
  for (std::string_view prefix : {"autograd::engine::evaluate_function: ", "aten::"})
    if (starts_with(name, prefix)) return normalise(name.substr(prefix.size()));
  static constexpr std::string_view node = "torch::autograd::CppNode<";
  if (starts_with(name, node) && name.back() == '>') {
    const size_t last = name.rfind("::");
    return "CppNode<" + name.substr(last + 2);
  }
  return name;
}

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

// An op's tensor inputs (scalars and unknown entries dropped). Shapes are interned: equal
// shapes are one object, so comparing them is comparing pointers.
struct OpShapes {
  std::vector<const Shape*> shapes;
  std::vector<int64_t> bytes;
  const Shape* single = nullptr;  // the shape every input has, if there is one
};

int64_t elements(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= std::max<int64_t>(d, 0);
  return n;
}

// The innermost call-stack frame outside torch itself: where the user's code called in.
std::string user_frame(const std::string& stack) {
  std::string first;
  for (size_t a = 0; a < stack.size();) {
    size_t b = stack.find(';', a);
    if (b == std::string::npos) b = stack.size();
    size_t x = a, y = b;
    while (x < y && std::isspace(static_cast<unsigned char>(stack[x]))) ++x;
    while (y > x && std::isspace(static_cast<unsigned char>(stack[y - 1]))) --y;
    const std::string frame = stack.substr(x, y - x);
    if (first.empty()) first = frame;
    const bool in_torch = starts_with(frame, "torch/") || frame.find("/torch/") != std::string::npos;
    if (!frame.empty() && !in_torch && !starts_with(frame, "<built-in")) return frame;
    a = b + 1;
  }
  return first;
}

// One occurrence of a rule pattern or a mined chain.
struct Match {
  std::string key;  // the rule's name, or the mined chain's names
  const Rule* rule = nullptr;
  const RulePattern* pattern = nullptr;
  std::vector<int32_t> ops;
  int32_t parent = -1;  // set when the match is every child of this op
  // Shapes unknown: each rule pattern it may be by its shapes, `rule` the first.
  std::vector<std::pair<const Rule*, const RulePattern*>> readings;
};

struct Finder {
  const Trace& t;
  const Links& m;
  const Options& o;
  std::vector<std::string> names;      // per string id, normalised (op names only)
  std::vector<uint32_t> name_of_op;    // per event: its name's id if it is an op, else 0; compact,
                                       // so walking sequences does not pull in whole events
  // OpShapes by (dims, types) string ids: per dims id a short chain of entries, one per types id.
  struct ShapeEntry {
    uint32_t types;
    int32_t next;
    OpShapes shapes;
  };
  std::vector<int32_t> shapes_by_dims;  // per string id: its first entry, or -1
  std::deque<ShapeEntry> shape_entries; // a deque: references into it stay valid
  std::set<Shape> distinct_shapes;      // what OpShapes point into
  std::vector<std::vector<char>> can_start;  // per rule pattern, per string id: may a match start here
  std::vector<std::vector<int16_t>> name_of; // per rule pattern, per string id: its index in the pattern's names
  std::vector<std::pair<const Rule*, const RulePattern*>> flat;  // every rule pattern, in rule order
  size_t words = 0;                          // 64-bit words in a set of patterns
  std::vector<uint64_t> starters;            // per string id: the patterns that may start there
  std::vector<uint64_t> candidates;          // scratch: the patterns that may start in a sequence
  std::vector<char> elementwise;             // per string id: an elementwise op name
  std::vector<char> matrix_product;          // per string id: a matrix product's name
  std::vector<char> copy_or_view;            // per string id: a view or copy a product makes first
  std::vector<uint32_t> ids;                 // scratch: a sequence's name ids
  std::vector<double> device_time;     // per event on device backends: what it launched took
  std::vector<double> profiled_cost;   // per event, when the trace shows it: the profiler's cost inside
  std::vector<char> claimed;
  std::map<std::pair<std::string, std::string>, double> measured;

  Finder(const Trace& trace, const Links& model, const Options& options, double profiler_us_per_event)
      : t(trace), m(model), o(options), names(trace.strings.size()), shapes_by_dims(trace.strings.size(), -1),
        claimed(trace.events.size(), 0) {
    std::vector<char> done(t.strings.size(), 0);
    name_of_op.assign(t.events.size(), 0);
    for (size_t i = 0; i < t.events.size(); ++i) {
      if (m.kind[i] != Kind::op) continue;
      const uint32_t id = name_of_op[i] = t.events[i].name;
      if (!done[id]) names[id] = normalise(t.strings[id]), done[id] = 1;
    }
    elementwise.assign(t.strings.size(), 0);
    matrix_product.assign(t.strings.size(), 0);
    copy_or_view.assign(t.strings.size(), 0);
    for (size_t i = 0; i < t.strings.size(); ++i) {
      elementwise[i] = elementwise_names().count(names[i]) > 0;
      matrix_product[i] = matrix_product_names().count(names[i]) > 0;
      copy_or_view[i] = copy_or_view_names().count(names[i]) > 0;
    }
    if (o.backend != Backend::cpu && !m.device_lanes.empty()) {
      // Device time counts for the op that launched it and all its ancestors.
      device_time.assign(t.events.size(), 0);
      for (const auto& lane : m.device_lanes)
        for (int32_t k : lane)
          for (int32_t op = m.launcher[k]; op >= 0; op = m.op_parent[op]) device_time[op] += t.events[k].dur;
    } else if (profiler_us_per_event > 0) {
      profiled_cost = profiled_cost_inside(t, m, profiler_us_per_event);
    }
  }

  const std::string& name(int32_t e) const { return names[name_of_op[e]]; }
  // An op's cost: its host time less what profiling the ops inside it took, or on device
  // backends the device time of what it launched.
  double time(int32_t e) const {
    if (!device_time.empty()) return device_time[e];
    return profiled_cost.empty() ? t.events[e].dur : std::max(0.0, t.events[e].dur - profiled_cost[e]);
  }
  double recorded_time(int32_t e) const { return device_time.empty() ? t.events[e].dur : device_time[e]; }

  const OpShapes& op_shapes(int32_t e) {
    const Event& ev = t.events[e];
    int32_t& head = shapes_by_dims[ev.dims];
    for (int32_t k = head; k >= 0; k = shape_entries[k].next)
      if (shape_entries[k].types == ev.types) return shape_entries[k].shapes;
    shape_entries.push_back({ev.types, head, {}});
    head = static_cast<int32_t>(shape_entries.size() - 1);
    const auto dims = parse_dims(t.strings[ev.dims]);
    const std::vector<std::string_view> types = split_types(t.strings[ev.types]);
    OpShapes& out = shape_entries.back().shapes;
    for (size_t k = 0; k < dims.size(); ++k) {
      const Shape& s = dims[k];
      if (s.empty() || std::any_of(s.begin(), s.end(), [](int64_t d) { return d < 0; })) continue;
      out.shapes.push_back(&*distinct_shapes.insert(s).first);
      out.bytes.push_back(elements(s) * dtype_bytes(k < types.size() ? types[k] : ""));
    }
    const bool one = !out.shapes.empty() &&
                     std::all_of(out.shapes.begin(), out.shapes.end(), [&](const Shape* x) { return x == out.shapes[0]; });
    out.single = one ? out.shapes[0] : nullptr;
    return out;
  }

  enum class Verdict { no, yes, unknown };

  // Whether the ops' tensor inputs have the shapes a rule asks for; unknown where an op recorded
  // none (the legacy profiler records no shapes), so that sigmoid-mul is never called silu or an
  // SE gate on a guess.
  Verdict shapes_ok(const std::vector<int32_t>& ops, Shapes want) {
    if (want == Shapes::any) return Verdict::yes;
    const Shape* first = nullptr;
    bool all_same = true;
    for (int32_t e : ops) {
      const OpShapes& known = op_shapes(e);
      if (known.shapes.empty()) return Verdict::unknown;
      for (const Shape* s : known.shapes) {
        if (first == nullptr) first = s;
        else if (s != first) all_same = false;
      }
    }
    return (want == Shapes::same) == all_same ? Verdict::yes : Verdict::no;
  }

  // --- rule matching -----------------------------------------------------------------------

  void match_sequence(const int32_t* seq, size_t n, int32_t parent, std::vector<Match>& out) {
    // Only the patterns that can start at some op of the sequence are tried, still in rule
    // order; most sequences (conv2d → convolution → …) have none.
    ids.resize(n);  // in sequence order, so the scans below stay in cache
    candidates.assign(words, 0);
    for (size_t i = 0; i < n; ++i) {
      ids[i] = name_of_op[seq[i]];
      const uint64_t* bits = &starters[size_t{ids[i]} * words];
      for (size_t w = 0; w < words; ++w) candidates[w] |= bits[w];
    }
    for (size_t w = 0; w < words; ++w)
      for (uint64_t bits = candidates[w]; bits != 0; bits &= bits - 1) {
        const size_t k = w * 64 + static_cast<size_t>(__builtin_ctzll(bits));
        const Rule& rule = *flat[k].first;
        const RulePattern& rp = *flat[k].second;
        const std::vector<char>& starts = can_start[k];
        const std::vector<int16_t>& pattern_names = name_of[k];
        for (size_t i = 0; i < n;) {
          const bool try_here = starts[ids[i]] && !claimed[seq[i]];
          const size_t len = try_here ? rp.pattern->match(ids.data(), n, i, pattern_names) : 0;
          if (len > 0) {
            std::vector<int32_t> ops(seq + i, seq + i + len);
            const Verdict v = acceptable(rule, rp, ops);
            if (v != Verdict::no) {
              for (int32_t e : ops) claimed[e] = 1;
              Match mt{rule.name, &rule, &rp, std::move(ops), -1, {}};
              if (v == Verdict::unknown) readings_of(k, i, len, mt);
              if (parent >= 0 && len == n) mt.parent = parent;
              out.push_back(std::move(mt));
              i += len;
              continue;
            }
          }
          ++i;
        }
      }
  }

  // A match whose shapes are unknown names every rule that could claim the same ops by their
  // shapes (se_gate or silu for sigmoid-mul), in rule order, and no replacement of its own.
  void readings_of(size_t k, size_t i, size_t len, Match& mt) {
    mt.readings.push_back(flat[k]);
    auto named = [&](const Rule* r) {
      return std::any_of(mt.readings.begin(), mt.readings.end(), [&](const auto& x) { return x.first == r; });
    };
    for (size_t j = k + 1; j < flat.size(); ++j) {
      if (flat[j].second->shapes == Shapes::any || named(flat[j].first)) continue;
      if (!can_start[j][ids[i]] || flat[j].second->pattern->match(ids.data(), ids.size(), i, name_of[j]) != len) continue;
      mt.readings.push_back(flat[j]);
    }
    mt.key.clear();
    for (const auto& x : mt.readings) mt.key += (mt.key.empty() ? "" : " or ") + x.first->name;
    mt.key += " (shape unknown)";
  }

  // Which op names each pattern can begin with, decided once per name rather than per op.
  void prepare(const std::vector<Rule>& rules) {
    for (const Rule& rule : rules)
      for (const RulePattern& rp : rule.patterns) {
        std::vector<char> starts(t.strings.size(), 0);
        std::vector<int16_t> index(t.strings.size(), -1);
        const std::vector<std::string>& mentioned = rp.pattern->names();
        for (size_t i = 0; i < t.strings.size(); ++i) {
          if (names[i].empty()) continue;
          starts[i] = rp.pattern->can_start(names[i]);
          const auto it = std::find(mentioned.begin(), mentioned.end(), names[i]);
          if (it != mentioned.end()) index[i] = static_cast<int16_t>(it - mentioned.begin());
        }
        can_start.push_back(std::move(starts));
        name_of.push_back(std::move(index));
      }
    for (const Rule& rule : rules)
      for (const RulePattern& rp : rule.patterns) flat.emplace_back(&rule, &rp);
    words = (flat.size() + 63) / 64;
    starters.assign(t.strings.size() * words, 0);
    for (size_t k = 0; k < flat.size(); ++k)
      for (size_t i = 0; i < t.strings.size(); ++i)
        if (can_start[k][i]) starters[i * words + k / 64] |= uint64_t{1} << (k % 64);
  }

  Verdict acceptable(const Rule& rule, const RulePattern& rp, const std::vector<int32_t>& ops) {
    if (std::any_of(ops.begin(), ops.end(), [&](int32_t e) { return claimed[e]; })) return Verdict::no;
    // Inside an op a fusion already took (SwishImplementation, claimed with its BatchNorm).
    for (int32_t x = m.op_parent[ops[0]]; x >= 0; x = m.op_parent[x])
      if (claimed[x]) return Verdict::no;
    if (rule.min_children > 0 && (ops.size() != 1 || m.child_count(ops[0]) < static_cast<size_t>(rule.min_children)))
      return Verdict::no;
    return shapes_ok(ops, rp.shapes);
  }

  // f(ops, count, parent): each thread's top-level ops (parent −1), then each op's children.
  template <class F>
  void for_each_sequence(F&& f) {
    for (const auto& thread : m.threads) f(thread.data(), thread.size(), -1);
    for (int32_t e = 0; e < static_cast<int32_t>(t.events.size()); ++e)
      if (m.kind[e] == Kind::op && m.child_count(e) > 0) f(m.children_of(e), m.child_count(e), e);
  }

  // --- mining ------------------------------------------------------------------------------

  // Runs of consecutive unclaimed elementwise ops whose tensor inputs all have one shape.
  void mine_sequence(const int32_t* seq, size_t n, std::vector<Match>& out) {
    size_t i = 0;
    while (i < n) {
      const Shape* shape = run_shape(seq[i]);
      if (shape == nullptr) {
        ++i;
        continue;
      }
      size_t j = i + 1;
      while (j < n && j - i < 8) {
        const Shape* next = run_shape(seq[j]);
        if (next == nullptr || next != shape) break;
        ++j;
      }
      if (j - i >= 2) {
        Match mt;
        mt.ops.assign(seq + i, seq + j);
        for (int32_t e : mt.ops) mt.key += (mt.key.empty() ? "" : "-") + name(e);
        out.push_back(std::move(mt));
      }
      i = j;
    }
  }

  // What to do about a mined chain: which kernel would replace it, over what. Its ops share one
  // input shape (that is how they were mined), so one elementwise pass over it does their work.
  std::string chain_advice(const Match& mt) {
    const Event& first = t.events[mt.ops[0]];
    const std::string& types = t.strings[first.types];
    const std::string dtype = types.substr(0, types.find(';'));
    const Shape* shape = op_shapes(mt.ops[0]).single;
    return fmt::format("elementwise kernel over [{}]{}, its {} ops in one pass (no rule names one yet: write it, "
                       "or name an existing op in a rule of your own, --rules FILE)",
                       shape ? fmt::format("{}", fmt::join(*shape, ", ")) : "?", dtype.empty() ? "" : " " + dtype,
                       mt.ops.size());
  }

  // The single shape of an unclaimed elementwise op's tensor inputs, or null.
  const Shape* run_shape(int32_t e) {
    if (!elementwise[name_of_op[e]]) return nullptr;
    for (int32_t x = e; x >= 0; x = m.op_parent[x])  // inside a match (an optimizer step) is taken
      if (claimed[x]) return nullptr;
    return op_shapes(e).single;
  }

  // --- cost --------------------------------------------------------------------------------

  // A cost summed over what a match replaces: the wrapper op goes away with its chain.
  template <class Cost>
  double over_match(const Match& mt, Cost cost) const {
    if (mt.parent >= 0) return cost(mt.parent);
    double sum = 0;
    for (int32_t e : mt.ops) sum += cost(e);
    return sum;
  }
  // What the fusion can save from: an optimizer step's per-parameter ops, not the step itself,
  // whose own code (its loop over the groups, Python's) the fused optimizer runs too. On the
  // Llama-style model SGD's step took 1.1 ms as profiled, its 63 ops 0.7.
  double match_time(const Match& mt) const {
    if (mt.rule != nullptr && mt.rule->kind == "optimizer" && mt.parent < 0 && mt.ops.size() == 1 &&
        m.child_count(mt.ops[0]) > 0) {
      double sum = 0;
      for (size_t k = 0; k < m.child_count(mt.ops[0]); ++k) sum += time(m.children_of(mt.ops[0])[k]);
      return sum;
    }
    return over_match(mt, [&](int32_t e) { return time(e); });
  }
  double match_recorded_time(const Match& mt) const { return over_match(mt, [&](int32_t e) { return recorded_time(e); }); }
  double match_host_time(const Match& mt) const { return over_match(mt, [&](int32_t e) { return t.events[e].dur; }); }
  double match_device_time(const Match& mt) const {
    return device_time.empty() ? 0 : over_match(mt, [&](int32_t e) { return device_time[e]; });
  }

  // The ops that vanish with the fusion: the chain, its wrapper op, an optimizer step's children.
  int64_t covered_ops(const Match& mt) const {
    int64_t n = static_cast<int64_t>(mt.ops.size()) + (mt.parent >= 0 ? 1 : 0);
    if (mt.rule != nullptr && mt.rule->min_children > 0) n += static_cast<int64_t>(m.child_count(mt.ops[0]));
    return n;
  }

  // What the fused op would take: the opfuse op's time when the rule names one and we may time
  // it, else the chain's matrix products as they ran plus its other ops' bytes at the bandwidth
  // they achieved.
  double fused_time(const Match& mt, std::string& how) {
    const std::vector<int32_t>& ops = bytes_ops(mt);
    if (const double us = measured_time(mt, ops); us >= 0) {
      how = "measured opfuse::" + mt.pattern->measure;
      return us;
    }
    double kept = 0, whole = 0;
    bool products = false;
    for (int32_t e : ops)
      if (matrix_product[name_of_op[e]]) kept += product_time(e), whole += time(e), products = true;
    if (!products) return others_fused_time(mt, ops, false, 0, how);
    const double others = others_fused_time(mt, ops, true, whole, how);
    how = how.empty() ? "matrix products" : how + " + matrix products";
    return kept + others;
  }

  // The rule's opfuse op timed at the input shapes of the chain's ops, or −1.
  double measured_time(const Match& mt, const std::vector<int32_t>& ops) {
    if (mt.pattern == nullptr || mt.pattern->measure.empty() || !o.measure) return -1;
    std::vector<const Shape*> distinct;
    for (int32_t e : ops) add_shapes(e, distinct);
    return distinct.empty() ? -1 : measure(mt.pattern->measure, distinct);
  }

  // An op's input shapes; for an autograd node, which records none, those of the ops it ran
  // (NativeBatchNormBackward0's native_batch_norm_backward).
  void add_shapes(int32_t e, std::vector<const Shape*>& distinct, int depth = 0) {
    const std::vector<const Shape*>& own = op_shapes(e).shapes;
    for (const Shape* shape : own)
      if (std::find(distinct.begin(), distinct.end(), shape) == distinct.end()) distinct.push_back(shape);
    if (!own.empty() || depth == 2) return;
    for (size_t k = 0; k < m.child_count(e); ++k) add_shapes(m.children_of(e)[k], distinct, depth + 1);
  }

  // A matrix product's time less the copies and views it made first (a 4-d matmul's expand and
  // reshape): the fused op does the arithmetic, not the copies.
  double product_time(int32_t e) const {
    double t = time(e);
    for (size_t k = 0; k < m.child_count(e); ++k) {
      const int32_t c = m.children_of(e)[k];
      if (copy_or_view[name_of_op[c]]) t -= time(c);
    }
    return std::max(0.0, t);
  }

  // The fused op's time for the chain's ops other than its matrix products (if it has any, they
  // took `products_time` in all), estimated from their bytes; 0 (and `how` empty) when there are none.
  double others_fused_time(const Match& mt, const std::vector<int32_t>& ops, bool products, double products_time,
                           std::string& how) {
    std::vector<const Shape*> distinct;
    std::vector<int64_t> distinct_bytes;
    double chain_bytes = 0, chain_time = 0, slowest = 0;
    size_t others = 0;
    for (int32_t e : ops) {
      if (matrix_product[name_of_op[e]]) continue;
      ++others;
      const OpShapes& s = op_shapes(e);
      int64_t biggest = 0;
      for (size_t k = 0; k < s.shapes.size(); ++k) {
        chain_bytes += static_cast<double>(s.bytes[k]);
        biggest = std::max(biggest, s.bytes[k]);
        if (std::find(distinct.begin(), distinct.end(), s.shapes[k]) == distinct.end()) {
          distinct.push_back(s.shapes[k]);
          distinct_bytes.push_back(s.bytes[k]);
        }
      }
      chain_bytes += static_cast<double>(biggest);  // its output
      chain_time += time(e);
      slowest = std::max(slowest, time(e));
    }
    if (products && others == 0) return 0;
    if (chain_bytes == 0 || chain_time <= 0) {  // no shapes recorded: assume launch-bound ops
      how = "op count";
      const size_t n = products ? others : mt.ops.size();
      return std::max(0.0, match_time(mt) - products_time) / static_cast<double>(std::max<size_t>(1, n));
    }
    double unit = 0, largest = 0;
    for (int64_t b : distinct_bytes) unit += static_cast<double>(b), largest = std::max(largest, static_cast<double>(b));
    if (mt.rule != nullptr && mt.rule->kind == "optimizer") unit = parameter_bytes(ops);
    const int passes = mt.pattern == nullptr ? 0 : mt.pattern->passes;
    const double fused_bytes = passes > 0 ? passes * unit : unit + largest;
    // The fused op still does all of the chain's arithmetic, so it takes at least as long as the
    // slowest op: that bounds chains of compute-bound ops (sigmoid on a CPU) or of ops that take
    // a launch each whatever their size.
    const double streaming = fused_bytes / (chain_bytes / chain_time);
    how = streaming >= slowest ? "bandwidth" : "slowest op";
    return std::max(streaming, slowest);
  }

  // A single-op match (an optimizer step) moves the bytes of its children.
  const std::vector<int32_t>& bytes_ops(const Match& mt) {
    static thread_local std::vector<int32_t> kids;
    if (mt.ops.size() == 1 && m.child_count(mt.ops[0]) > 0) {
      kids.assign(m.children_of(mt.ops[0]), m.children_of(mt.ops[0]) + m.child_count(mt.ops[0]));
      return kids;
    }
    return mt.ops;
  }

  // Per-parameter ops repeat once per parameter; the first op's first input is the parameter.
  double parameter_bytes(const std::vector<int32_t>& ops) {
    double sum = 0;
    for (int32_t e : ops)
      if (t.events[e].name == t.events[ops[0]].name && !op_shapes(e).bytes.empty())
        sum += static_cast<double>(op_shapes(e).bytes[0]);
    return sum;
  }

  double measure(const std::string& op, std::vector<const Shape*> shapes) {
    std::sort(shapes.begin(), shapes.end(), [](const Shape* a, const Shape* b) { return elements(*a) > elements(*b); });
    std::string dims;
    for (const Shape* s : shapes) dims += (dims.empty() ? "" : ";") + fmt::format("{}", fmt::join(*s, ","));
    auto [it, fresh] = measured.try_emplace({op, dims}, -1.0);
    if (fresh) it->second = o.measure(op, dims);
    return it->second;
  }

  // --- locations ---------------------------------------------------------------------------

  // Module Hierarchy, else the enclosing module annotation, else the innermost call-stack frames;
  // backward ops borrow the place of the forward op they differentiate. As an id in `places`:
  // thousands of matches share a few places, so each string is made once.
  uint32_t location(int32_t e, bool follow_forward = true) {
    for (int32_t x = e; x >= 0; x = m.op_parent[x])
      if (t.events[x].module != 0) return place(t.events[x].module, as_is);
    if (m.annotation[e] >= 0) return place(t.events[m.annotation[e]].name, as_is);
    for (int32_t x = e; x >= 0; x = m.op_parent[x])
      if (t.events[x].stack != 0) return place(t.events[x].stack, frame);
    if (follow_forward)
      for (int32_t x = e; x >= 0; x = m.op_parent[x])
        if (m.forward[x] >= 0) {
          const uint32_t where = location(m.forward[x], false);
          if (backward.size() <= where) backward.resize(where + 1, -1);
          if (backward[where] < 0) {
            const std::string& w = places[where];
            backward[where] = static_cast<int32_t>(places.intern(w == "(top level)" ? "backward" : w + " (backward)"));
          }
          return static_cast<uint32_t>(backward[where]);
        }
    return places.intern("(top level)");
  }

  trace::Strings places;                    // the locations matches are at
  std::vector<int32_t> as_is, frame;        // per trace string id: its place as it is / as a call stack
  std::vector<int32_t> backward;            // per place: the place of its backward ops

  uint32_t place(uint32_t string_id, std::vector<int32_t>& cache) {
    if (cache.empty()) cache.assign(t.strings.size(), -1);
    int32_t& p = cache[string_id];
    if (p < 0) {
      const std::string& s = t.strings[string_id];
      p = static_cast<int32_t>(places.intern(&cache == &frame ? user_frame(s) : s));
    }
    return static_cast<uint32_t>(p);
  }
};

std::string join(const std::vector<std::string>& parts, const char* separator) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : separator) + p;
  return out;
}

// A new finding's rule, kind and replacement, from its first match.
void describe(Finding& f, const Match& mt, Backend backend) {
  if (!mt.readings.empty()) {
    f.rule = mt.key;
    f.kind = mt.rule->kind;
    f.shape_unknown = true;
    std::vector<std::string> each;
    for (const auto& [rule, rp] : mt.readings) {
      const auto it = rule->replacement.find(backend);
      each.push_back(fmt::format("{} where {}", it == rule->replacement.end() ? rule->name : it->second,
                                 rp->shapes == Shapes::same ? "the inputs have one shape" : "an input broadcasts"));
    }
    f.replacement = "shape unknown: " + join(each, "; ");
  } else if (mt.rule != nullptr) {
    f.rule = mt.rule->name;
    f.kind = mt.rule->kind;
    const auto r = mt.rule->replacement.find(backend);
    f.replacement = r == mt.rule->replacement.end() ? "" : r->second;
  } else {
    f.rule = "unnamed chain";
    f.kind = "mined";
    f.mined = true;
    f.pattern = mt.key;
  }
}

// "_blocks.2" before "_blocks.10": digits compare as numbers.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) && std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t ei = i, ej = j;
      while (ei < a.size() && std::isdigit(static_cast<unsigned char>(a[ei]))) ++ei;
      while (ej < b.size() && std::isdigit(static_cast<unsigned char>(b[ej]))) ++ej;
      if (ei - i != ej - j) return ei - i < ej - j;
      if (const int c = a.compare(i, ei - i, b, j, ej - j); c != 0) return c < 0;
      i = ei, j = ej;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i, ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

// Each match's events marked with its finding's final index (findings dropped: −1).
void mark_matches(const std::vector<const std::vector<Match>*>& lists, const std::map<std::string, int32_t>& index,
                  std::vector<int32_t>& finding_of_event) {
  for (const auto* list : lists)
    for (const Match& mt : *list) {
      const auto it = index.find(mt.key);
      if (it == index.end()) continue;
      for (int32_t e : mt.ops) finding_of_event[e] = it->second;
      if (mt.parent >= 0) finding_of_event[mt.parent] = it->second;
    }
}

}  // namespace

std::vector<Finding> find_fusions(const Trace& trace, const Links& model, const std::vector<Rule>& rules,
                                  const Options& options, double profiler_us_per_event,
                                  std::vector<int32_t>* finding_of_event) {
  Finder finder(trace, model, options, profiler_us_per_event);
  finder.prepare(rules);
  std::vector<Match> matches, mined;
  finder.for_each_sequence([&](const int32_t* seq, size_t n, int32_t parent) {
    finder.match_sequence(seq, n, parent, matches);
  });
  finder.for_each_sequence([&](const int32_t* seq, size_t n, int32_t) { finder.mine_sequence(seq, n, mined); });

  struct Tally {
    Finding f;
    std::map<uint32_t, Location> where;             // by place: count and saving (`where` filled last)
    std::vector<std::string> patterns, estimates;   // distinct, in order seen
  };
  std::map<std::string, Tally> by_key;
  auto add_once = [](std::vector<std::string>& list, const std::string& s) {
    if (std::find(list.begin(), list.end(), s) == list.end()) list.push_back(s);
  };
  for (auto* list : {&matches, &mined})
    for (const Match& mt : *list) {
      auto [it, fresh] = by_key.try_emplace(mt.key);
      Tally& tally = it->second;
      Finding& f = tally.f;
      if (fresh) describe(f, mt, options.backend);
      if (fresh && f.mined) f.replacement = finder.chain_advice(mt);
      std::string how;
      const double t = finder.match_time(mt);
      const double fused = finder.fused_time(mt, how);
      const int64_t ops = finder.covered_ops(mt);
      f.occurrences += 1;
      f.ops += ops;
      f.time_us += finder.match_recorded_time(mt);
      f.host_us += finder.match_host_time(mt);
      f.device_us += finder.match_device_time(mt);
      const double saving = std::max(0.0, t - fused);
      f.est_saving_us += saving;
      if (mt.pattern != nullptr) add_once(tally.patterns, mt.pattern->pattern->text());
      add_once(tally.estimates, how);
      Location& here = tally.where[finder.location(mt.ops[0])];
      here.count += 1;
      here.ops += ops;
      here.est_saving_us += saving;
    }
  std::vector<Finding> out;
  std::vector<std::string> keys;  // per finding in `out`, before sorting
  for (auto& [key, tally] : by_key) {
    Finding& f = tally.f;
    if (f.mined && f.occurrences < options.min_chain_occurrences) continue;
    if (!f.mined) f.pattern = join(tally.patterns, " | ");
    f.estimate = join(tally.estimates, ", ") + (finder.profiled_cost.empty() ? "" : ", less profiling's cost");
    for (auto& [loc, here] : tally.where) {
      here.where = finder.places[loc];
      f.locations.push_back(std::move(here));
    }
    std::stable_sort(f.locations.begin(), f.locations.end(),
                     [](const Location& a, const Location& b) {
                       return a.count != b.count ? a.count > b.count : natural_less(a.where, b.where);
                     });
    out.push_back(std::move(f));
    keys.push_back(key);
  }
  std::vector<size_t> order(out.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return out[a].est_saving_us > out[b].est_saving_us; });
  std::vector<Finding> sorted;
  std::map<std::string, int32_t> index;  // key → place in `sorted`
  for (size_t i : order) {
    index[keys[i]] = static_cast<int32_t>(sorted.size());
    sorted.push_back(std::move(out[i]));
  }
  if (finding_of_event != nullptr) {
    finding_of_event->assign(trace.events.size(), -1);
    mark_matches({&matches, &mined}, index, *finding_of_event);
  }
  return sorted;
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

std::vector<double> profiled_cost_inside(const Trace& t, const Links& m, double each) {
  std::vector<double> cost(t.events.size(), 0);
  for (size_t i = 0; i < t.events.size(); ++i)
    if (m.kind[i] == Kind::op)
      for (int32_t up = m.op_parent[i]; up >= 0; up = m.op_parent[up]) cost[up] += each;
  std::map<std::pair<int64_t, int64_t>, std::vector<double>> allocations;  // by process and thread
  for (const trace::Allocation& a : t.memory) allocations[{a.pid, a.tid}].push_back(a.ts);
  for (auto& [thread, times] : allocations) std::sort(times.begin(), times.end());
  for (size_t i = 0; i < t.events.size(); ++i) {
    if (m.kind[i] != Kind::op) continue;
    const Event& e = t.events[i];
    const auto it = allocations.find({e.pid, e.tid});
    if (it == allocations.end()) continue;
    const std::vector<double>& times = it->second;
    const auto from = std::lower_bound(times.begin(), times.end(), e.ts);
    cost[i] += each * static_cast<double>(std::upper_bound(from, times.end(), e.ts + e.dur) - from);
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

}  // namespace opfuse::analyze
