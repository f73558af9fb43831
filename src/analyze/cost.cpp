// The cost model (cost.h).
#include "analyze/cost.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace opfuse::analyze {
namespace {

// The timer's suffix for an order: none for torch's default.
std::string order_suffix(const Shape& order) {
  for (size_t d = 0; d < order.size(); ++d)
    if (order[d] != static_cast<int64_t>(d)) return fmt::format("+order={}", fmt::join(order, ","));
  return "";
}

}  // namespace

// A cost summed over what a match replaces: the wrapper op goes away with its chain.
template <class Cost>
double CostModel::over_match(const Match& mt, Cost cost) const {
  if (mt.parent >= 0) return cost(mt.parent);
  double sum = 0;
  for (int32_t e : mt.ops) sum += cost(e);
  return sum;
}

// What the fusion can save from: an optimizer step's per-parameter ops, not the step itself,
// whose own code (its loop over the groups, Python's) the fused optimizer runs too. On the
// Llama-style model SGD's step took 1.1 ms as profiled, its 63 ops 0.7.
double CostModel::match_time(const Match& mt) const {
  if (mt.rule != nullptr && mt.rule->kind == "optimizer" && mt.parent < 0 && mt.ops.size() == 1 &&
      index.links.child_count(mt.ops[0]) > 0) {
    const int32_t* step_ops = index.links.children_of(mt.ops[0]);
    double sum = 0;
    for (size_t k = 0; k < index.links.child_count(mt.ops[0]); ++k) sum += index.time(step_ops[k]);
    return sum;
  }
  return mt.parent >= 0 ? index.time(mt.parent) : index.run_time(mt.ops);
}

// The ops that vanish with the fusion: the chain, its wrapper op, an optimizer step's children.
int64_t CostModel::covered_ops(const Match& mt) const {
  int64_t n = static_cast<int64_t>(mt.ops.size()) + (mt.parent >= 0 ? 1 : 0);
  if (mt.rule != nullptr && mt.rule->min_children > 0) n += static_cast<int64_t>(index.links.child_count(mt.ops[0]));
  return n;
}

// What the fused op would take: the opfuse op's time when the rule names one and we may time
// it, else the chain's matrix products as they ran plus its other ops' bytes at the bandwidth
// they achieved.
double CostModel::fused_time(const Match& mt, std::string& how) {
  const std::vector<int32_t>& ops = bytes_ops(mt);
  if (const double us = measured_time(mt, ops, how); us >= 0) return us;
  double kept = 0, whole = 0;
  bool products = false;
  for (int32_t e : ops)
    if (index.matrix_product(e)) kept += product_time(e), whole += index.time(e), products = true;
  if (!products) return others_fused_time(mt, ops, false, 0, how);
  const double others = others_fused_time(mt, ops, true, whole, how);
  how = how.empty() ? "matrix products" : how + " + matrix products";
  return kept + others;
}

// What the rule's opfuse op would take in the model: the chain's time scaled by the op against
// the chain as torch runs it (the op's variant the pattern names in runs_as), both timed here at
// the input shapes of the chain's ops. Timed alone an op may run faster than in the model, its
// inputs warm in the caches, and the ratio cancels what the two share of that (on an Intel VM the
// fused batch_norm_silu's own time estimated up to 3x the gain tune measured). Without that
// variant, the op's own time, once per call it would make (the pattern's `calls`: a chain
// rotating q and k together is two calls). −1 when the op cannot be timed.
double CostModel::measured_time(const Match& mt, const std::vector<int32_t>& ops, std::string& how) {
  if (mt.pattern == nullptr || mt.pattern->measure.empty() || !measure_) return -1;
  std::vector<const Shape*> distinct;
  for (int32_t e : ops) add_shapes(e, distinct);
  if (distinct.empty()) return -1;
  const std::string& op = mt.pattern->measure;
  const std::string layout = order_suffix(dim_order(ops, distinct[0]->size()));
  const double fused = measure(op + layout, distinct);
  if (fused < 0) return -1;
  if (const double chain = mt.pattern->runs_as == "none" ? -1 : measure(op + "@" + mt.pattern->runs_as + layout, distinct);
      chain > 0) {
    how = fmt::format("opfuse::{} timed against {}", op, mt.pattern->runs_as);
    return match_time(mt) * fused / chain;
  }
  how = "measured opfuse::" + op;
  if (mt.pattern->calls.empty()) return fused;
  const auto calls = std::count_if(mt.ops.begin(), mt.ops.end(), [&](int32_t e) { return index.name(e) == mt.pattern->calls; });
  return fused * static_cast<double>(std::max<std::ptrdiff_t>(1, calls));
}

// The order in memory of the chain's main activations, as recorded: that of the first input of
// distinct[0]'s rank whose strides decide one (dense_order), in the chain's ops or, for an
// autograd node, the ops it ran; empty where none does. The timer makes its activations so
// (channels-last, attention's heads transposed out of [B, T, H, D]), which changes what they take:
// the composite copies a transposed q and k before its matrix products, the fused op reads them
// where they lie.
Shape CostModel::dim_order(const std::vector<int32_t>& ops, size_t rank, int depth) const {
  for (int32_t e : ops) {
    const trace::Event& ev = index.trace.events[e];
    if (ev.strides != 0) {
      const auto sizes = parse_dims(index.trace.strings[ev.dims]);
      const auto strides = parse_dims(index.trace.strings[ev.strides]);
      for (size_t k = 0; k < sizes.size() && k < strides.size(); ++k)
        if (sizes[k].size() == rank)
          if (Shape order = dense_order(sizes[k], strides[k]); !order.empty()) return order;
    }
    if (depth < 2 && index.links.child_count(e) > 0) {
      const int32_t* first = index.links.children_of(e);
      if (Shape inside = dim_order({first, first + index.links.child_count(e)}, rank, depth + 1); !inside.empty())
        return inside;
    }
  }
  return {};
}

// An op's input shapes; for an autograd node, which records none, those of the ops it ran
// (NativeBatchNormBackward0's native_batch_norm_backward).
void CostModel::add_shapes(int32_t e, std::vector<const Shape*>& distinct, int depth) {
  const std::vector<const Shape*>& own = index.shapes(e).shapes;
  for (const Shape* shape : own)
    if (std::find(distinct.begin(), distinct.end(), shape) == distinct.end()) distinct.push_back(shape);
  if (!own.empty() || depth == 2) return;
  for (size_t k = 0; k < index.links.child_count(e); ++k) add_shapes(index.links.children_of(e)[k], distinct, depth + 1);
}

// A matrix product's time less the copies and views it made first (a 4-d matmul's expand and
// reshape): the fused op does the arithmetic, not the copies.
double CostModel::product_time(int32_t e) const {
  double t = index.time(e);
  for (size_t k = 0; k < index.links.child_count(e); ++k) {
    const int32_t c = index.links.children_of(e)[k];
    if (index.copy_or_view(c)) t -= index.time(c);
  }
  return std::max(0.0, t);
}

// The fused op's time for the chain's ops other than its matrix products (if it has any, they
// took `products_time` in all), estimated from their bytes; 0 (and `how` empty) when there are none.
double CostModel::others_fused_time(const Match& mt, const std::vector<int32_t>& ops, bool products,
                                  double products_time, std::string& how) {
  std::vector<const Shape*> distinct;
  std::vector<int64_t> distinct_bytes;
  double chain_bytes = 0, chain_time = 0, slowest = 0;
  size_t others = 0;
  for (int32_t e : ops) {
    if (index.matrix_product(e)) continue;
    ++others;
    const OpShapes& s = index.shapes(e);
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
    chain_time += index.time(e);
    slowest = std::max(slowest, index.time(e));
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
const std::vector<int32_t>& CostModel::bytes_ops(const Match& mt) {
  if (mt.ops.size() == 1 && index.links.child_count(mt.ops[0]) > 0) {
    const int32_t* first = index.links.children_of(mt.ops[0]);
    children.assign(first, first + index.links.child_count(mt.ops[0]));
    return children;
  }
  return mt.ops;
}

// Per-parameter ops repeat once per parameter; the first op's first input is the parameter.
double CostModel::parameter_bytes(const std::vector<int32_t>& ops) {
  double sum = 0;
  for (int32_t e : ops)
    if (index.trace.events[e].name == index.trace.events[ops[0]].name && !index.shapes(e).bytes.empty())
      sum += static_cast<double>(index.shapes(e).bytes[0]);
  return sum;
}

// The shapes largest first; of equal sizes, the one the chain met first (its input x before x
// viewed as pairs), as the op's first input is the one its case is built around.
double CostModel::measure(const std::string& op, std::vector<const Shape*> shapes) {
  std::stable_sort(shapes.begin(), shapes.end(), [](const Shape* a, const Shape* b) { return elements(*a) > elements(*b); });
  std::vector<std::string> each;
  for (const Shape* s : shapes) each.push_back(fmt::format("{}", fmt::join(*s, ",")));
  const std::string dims = fmt::format("{}", fmt::join(each, ";"));
  return timed(op, dims);
}

double CostModel::timed(const std::string& op, const std::string& dims) {
  auto [it, fresh] = measured.try_emplace({op, dims}, -1.0);
  if (fresh) it->second = measure_(op, dims);
  return it->second;
}

// The autograd node (ConvolutionBackward0) that differentiates a forward op, or −1.
int32_t CostModel::backward_of(int32_t e) {
  if (!backward_by_sequence_) backward_by_sequence_ = backward_ops_by_sequence(index.trace, index.links);
  const auto it = backward_by_sequence_->find(index.trace.events[e].sequence_nr);
  return it == backward_by_sequence_->end() ? -1 : it->second;
}

namespace {

// A convolution's stride and padding along one spatial dimension, from its input, kernel and
// output sizes: the least stride, then the least padding, that gives the output's size.
bool stride_and_padding(int64_t in, int64_t kernel, int64_t out, int64_t& stride, int64_t& padding) {
  for (stride = 1; stride <= std::max(in, kernel); ++stride)
    for (padding = 0; padding < std::max<int64_t>(kernel, 1); ++padding)
      if (in + 2 * padding >= kernel && (in + 2 * padding - kernel) / stride + 1 == out) return true;
  return false;
}

// What bench::time_fused_op needs to run a recorded 2-d convolution again, "x;w;y;stride;padding;groups"
// (x [N, C, H, W], w [O, C/groups, kh, kw], y [N, O, Ho, Wo]), or "" when the sizes do not fit one.
std::string convolution_args(const Shape& x, const Shape& w, const Shape& y) {
  if (x.size() != 4 || w.size() != 4 || y.size() != 4 || y[0] != x[0] || y[1] != w[0] || w[1] <= 0 || x[1] % w[1] != 0)
    return "";
  int64_t stride[2], padding[2];
  for (int d = 0; d < 2; ++d)
    if (!stride_and_padding(x[2 + d], w[2 + d], y[2 + d], stride[d], padding[d])) return "";
  return fmt::format("{};{};{};{},{};{},{};{}", fmt::join(x, ","), fmt::join(w, ","), fmt::join(y, ","), stride[0],
                     stride[1], padding[0], padding[1], x[1] / w[1]);
}

}  // namespace

// A layout change's cost over a matched convolution: its forward and its backward as recorded,
// each scaled by what the same convolution takes in the rule's layout against the recorded one,
// timed here at its sizes (the output's from the backward's gradient). What the layout does to
// the ops between the convolutions is left out. False where it cannot be timed.
bool CostModel::layout_cost(const Match& mt, MatchCost& c) {
  if (!measure_ || mt.ops.size() != 1) return false;
  const int32_t forward = mt.ops[0], node = backward_of(forward);
  if (node < 0 || index.links.child_count(node) == 0) return false;
  const OpShapes& in = index.shapes(forward);
  const OpShapes& back = index.shapes(index.links.children_of(node)[0]);
  if (in.shapes.size() < 2 || back.shapes.empty()) return false;
  const std::string args = convolution_args(*in.shapes[0], *in.shapes[1], *back.shapes[0]);
  if (args.empty()) return false;
  double scaled[2];
  const int32_t ops[2] = {forward, node};
  for (int k = 0; k < 2; ++k) {
    const std::string op = k == 0 ? "conv2d" : "conv2d_backward";
    const double now = timed(op + "@contiguous", args), after = timed(op + "@" + mt.rule->memory_format, args);
    if (now <= 0 || after < 0) return false;
    scaled[k] = index.time(ops[k]) * after / now;
  }
  c.time_us = index.time(forward) + index.time(node);
  c.recorded_us += index.recorded_time(node);
  c.host_us += index.host_time(node);
  c.device_us += index.device_time(node);
  c.fused_us = scaled[0] + scaled[1];
  c.how = "convolutions timed in both layouts";
  return true;
}

MatchCost CostModel::of(const Match& mt) {
  MatchCost c;
  c.time_us = match_time(mt);
  c.recorded_us = over_match(mt, [&](int32_t e) { return index.recorded_time(e); });
  c.host_us = over_match(mt, [&](int32_t e) { return index.host_time(e); });
  c.device_us = over_match(mt, [&](int32_t e) { return index.device_time(e); });
  if (mt.rule == nullptr || mt.rule->memory_format.empty()) {
    c.fused_us = fused_time(mt, c.how);
  } else if (!layout_cost(mt, c)) {
    // Without the convolutions timed, no figure from the matched ops would hold: the layout
    // changes every op after them, backward included.
    c.estimated = false;
    c.how = "not estimated: tune measures a layout change";
    c.fused_us = c.time_us;
  }
  c.ops = covered_ops(mt);
  return c;
}

}  // namespace opfuse::analyze
