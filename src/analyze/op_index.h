// What every analysis of the findings asks of an op, computed once per trace: its normalised
// name and its class (elementwise, matrix product, copy or view), its tensor inputs' shapes and
// bytes, and its cost (host time less profiling's, or the device time it launched).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "opfuse/analyze.h"

namespace opfuse::analyze {

using Shape = std::vector<int64_t>;

// "aten::mul" → "mul"; "autograd::engine::evaluate_function: MulBackward0" → "MulBackward0";
// a C++ autograd function's node "torch::autograd::CppNode<opfuse::(anonymous namespace)::SiluFunction>"
// → "CppNode<SiluFunction>", as a pattern can name it.
std::string normalise(const std::string& name);

int64_t elements(const Shape& s);

// A recorded "Input type" string ("float;float;Scalar") split into one entry per input.
std::vector<std::string_view> split_types(const std::string& types);

// Bytes per element of a recorded "Input type" ("float", "c10::BFloat16", "long int" …); 4 when unknown.
int64_t dtype_bytes(std::string_view type);

// What opfuse's profiler added per op, scope or allocation recorded in a step: the median
// profiled step's excess over the unprofiled step the trace records, spread over a step's
// records; 0 without markers or that time.
double profiler_cost(const trace::Trace& trace, const trace::Links& links);

// Start times by process and thread, sorted, counted for e's thread: within [from, to] (inside
// an op, its ends too) or between (from, to) (a gap between two ops, neither end).
class StartsByThread {
 public:
  void add(int64_t pid, int64_t tid, double ts) { starts_[{pid, tid}].push_back(ts); }
  void sort();
  int64_t within(const trace::Event& e, double from, double to) const;
  int64_t between(const trace::Event& e, double from, double to) const;

 private:
  std::map<std::pair<int64_t, int64_t>, std::vector<double>> starts_;
};

// Per event, what profiling took inside it at `each` per record: the ops inside an op and the
// allocations its thread made while it ran (a per-parameter optimizer op makes none, a forward
// op one or two).
std::vector<double> profiled_cost_inside(const trace::Trace& trace, const trace::Links& links, double each,
                                         const StartsByThread& allocations);

// The layout a 4-d tensor's recorded strides give it: torch's default NCHW, channels-last,
// `either` where its sizes make the two one (one channel, or one pixel), `other` for any else
// (a view). A dimension of one may have any stride.
enum class Layout4d { nchw, channels_last, either, other };
Layout4d layout_4d(const Shape& sizes, const Shape& strides);

// The dimensions of a dense tensor by its recorded strides, outermost first ({0, 2, 3, 1} for
// channels-last, {0, 2, 1, 3} for attention's heads transposed out of [B, T, H, D]); empty for a
// view that is not dense and where dimensions of one leave the order open.
Shape dense_order(const Shape& sizes, const Shape& strides);

// The autograd node (ConvolutionBackward0 …) of each sequence number. Ops that make no node (a
// pad before a convolution) share the number of the op that does, so the trace's own forward
// link may name another op: a forward op's node is the one of its number.
std::map<int64_t, int32_t> backward_ops_by_sequence(const trace::Trace& trace, const trace::Links& links);

// An op's tensor inputs (scalars and unknown entries dropped). Shapes are interned: equal
// shapes are one object, so comparing them is comparing pointers.
struct OpShapes {
  std::vector<const Shape*> shapes;
  std::vector<int64_t> bytes;
  const Shape* single = nullptr;  // the shape every input has, if there is one
};

class OpIndex {
 public:
  // Device backends cost an op by the device time it launched; a CPU trace by its host time less
  // profiler_us_per_event for each record inside it.
  OpIndex(const trace::Trace& trace, const trace::Links& links, Backend backend, double profiler_us_per_event);

  const trace::Trace& trace;
  const trace::Links& links;

  // Per op event, its name's string id (0 for other events): compact, so walking sequences does
  // not pull in whole events.
  uint32_t name_id(int32_t e) const { return name_of_op_[e]; }
  const std::string& name(int32_t e) const { return names_[name_of_op_[e]]; }
  // Per string id: the name normalised (op names only, else empty).
  const std::vector<std::string>& names() const { return names_; }

  bool elementwise(int32_t e) const { return elementwise_[name_of_op_[e]]; }
  bool matrix_product(int32_t e) const { return matrix_product_[name_of_op_[e]]; }
  bool copy_or_view(int32_t e) const { return copy_or_view_[name_of_op_[e]]; }

  const OpShapes& shapes(int32_t e);

  // An op's cost: its host time less what profiling the ops inside it took, or on device
  // backends the device time of what it launched.
  double time(int32_t e) const;
  double recorded_time(int32_t e) const;
  double host_time(int32_t e) const;
  double device_time(int32_t e) const { return device_time_.empty() ? 0 : device_time_[e]; }
  bool less_profiling() const { return !profiled_cost_.empty(); }
  // What a run of sibling ops costs on a host trace whose profiling cost is known: their times
  // and the gaps between them, each less that cost for the records its thread began in it (the
  // next op's own, allocations; no other op starts between siblings). A gap is the code that calls the next op (Python's between calls,
  // the autograd engine's between nodes), which a fused op runs once. A gap that holds a module
  // scope is left out: profiling's Python hooks there cost far more than the average record.
  // Without that cost, the sum of their times.
  double run_time(const std::vector<int32_t>& ops) const;

  // f(ops, count, parent): each thread's top-level ops (parent −1), then the children of every
  // op that has some. These are what a fusion can replace: top-level ops (nested ones dropped,
  // as the Ascend advisor does) and the ops inside a wrapper (SwishImplementation → sigmoid, mul).
  template <class F>
  void for_each_sequence(F&& f) const {
    for (const auto& thread : links.threads) f(thread.data(), thread.size(), -1);
    for (int32_t e = 0; e < static_cast<int32_t>(trace.events.size()); ++e)
      if (links.kind[e] == trace::Kind::op && links.child_count(e) > 0) f(links.children_of(e), links.child_count(e), e);
  }

 private:
  std::vector<std::string> names_;
  std::vector<uint32_t> name_of_op_;
  std::vector<char> elementwise_, matrix_product_, copy_or_view_;  // per string id
  // OpShapes by (dims, types) string ids: per dims id a short chain of entries, one per types id.
  struct ShapeEntry {
    uint32_t types;
    int32_t next;
    OpShapes shapes;
  };
  std::vector<int32_t> shapes_by_dims_;   // per string id: its first entry, or -1
  std::deque<ShapeEntry> shape_entries_;  // a deque: references into it stay valid
  std::set<Shape> distinct_shapes_;       // what OpShapes point into
  std::vector<double> device_time_;       // per event on device backends: what it launched took
  std::vector<double> profiled_cost_;     // per event, when the trace shows it: the profiler's cost inside
  double profiled_cost_each_ = 0;         // and per record
  StartsByThread allocation_starts_, annotation_starts_;  // with profiled_cost_
};

}  // namespace opfuse::analyze
