// What a fused op would take in place of a chain found in a trace: run it at the chain's shapes,
// on inputs its OpSpec makes from them.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <tuple>

#include "opfuse/analyze.h"
#include "opfuse/bench.h"
#include "opfuse/measure.h"
#include "opfuse/op_spec.h"
#include "opfuse/stats.h"

namespace opfuse::bench {
namespace {

// Median microseconds of fn over enough calls to fill about 20 ms (at least 5), after 2 untimed.
double time_calls(const std::function<void()>& fn) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < 2; ++i) fn();
  std::vector<double> us;
  const auto start = Clock::now();
  while (us.size() < 5 || (us.size() < 200 && Clock::now() - start < std::chrono::milliseconds(20))) {
    const auto t0 = Clock::now();
    fn();
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  return median(us);
}

bool sizable(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || d > (int64_t{1} << 31)) return false;
    n *= std::max<int64_t>(d, 1);
    if (n > (int64_t{1} << 30)) return false;  // a recorded shape, not a request for gigabytes
  }
  return !shape.empty();
}

// The largest shape is a tensor's; a scalar's [] among the rest is no request for memory.
bool sizable(const InputShapes& shapes) {
  return !shapes.empty() && sizable(shapes[0]) &&
         std::all_of(shapes.begin(), shapes.end(), [](const auto& s) { return s.empty() || sizable(s); });
}

// A recorded 2-d convolution run again in a memory format: "conv2d" (forward) or "conv2d_backward"
// (the gradients of its input and weight) in "channels_last" or "contiguous", dims
// "x;w;y;stride;padding;groups" as the cost model writes them. What a layout change's estimate compares.
double time_convolution(const std::string& kind, const std::string& format, const std::string& dims) {
  const auto shapes = analyze::parse_dims(dims);
  if (shapes.size() != 6 || !sizable(shapes[0]) || !sizable(shapes[1]) || !sizable(shapes[2]) || shapes[3].size() != 2 ||
      shapes[4].size() != 2 || shapes[5].size() != 1)
    return -1;
  if (format != "contiguous" && format != "channels_last") return -1;
  const auto memory_format = format == "channels_last" ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
  const at::Tensor x = at::randn(shapes[0]).contiguous(memory_format), w = at::randn(shapes[1]).contiguous(memory_format);
  const at::Tensor grad_y = at::randn(shapes[2]).contiguous(memory_format);
  const std::vector<int64_t> dilation{1, 1}, no_padding{0, 0};
  const std::vector<int64_t>&stride = shapes[3], &padding = shapes[4];
  const int64_t groups = shapes[5][0];
  at::NoGradGuard no_grad;
  try {
    if (kind == "conv2d")
      return time_calls([&] { at::convolution(x, w, {}, stride, padding, dilation, false, no_padding, groups); });
    if (kind == "conv2d_backward")
      return time_calls([&] {
        at::convolution_backward(grad_y, x, w, std::nullopt, stride, padding, dilation, false, no_padding, groups,
                                 {true, true, false});
      });
  } catch (const std::exception&) {  // sizes no convolution takes
  }
  return -1;
}

// A permutation of 0 … n-1 ("0,2,3,1"), else empty.
std::vector<int64_t> permutation(const std::string& text) {
  const auto parsed = analyze::parse_dims(text);
  if (parsed.size() != 1) return {};
  std::vector<int64_t> sorted = parsed[0];
  std::sort(sorted.begin(), sorted.end());
  for (size_t k = 0; k < sorted.size(); ++k)
    if (sorted[k] != static_cast<int64_t>(k)) return {};
  return parsed[0];
}

// `name` is "<op>[_backward][@variant][+order=<dims>]": the OpSpec's variant (reference, aten,
// opfuse: the default), or a convolution's memory format; its activations' dimensions in memory,
// outermost first ("+order=0,2,3,1": channels-last).
double time_uncached(const std::string& full_name, const std::string& dims) {
  static const std::string kOrder = "+order=";
  const size_t plus = full_name.find(kOrder);
  const std::string name = full_name.substr(0, plus);
  std::vector<int64_t> order;
  if (plus != std::string::npos && (order = permutation(full_name.substr(plus + kOrder.size()))).empty()) return -1;
  const size_t at_sign = name.find('@');
  const std::string op = name.substr(0, at_sign);
  const std::string variant = at_sign == std::string::npos ? "opfuse" : name.substr(at_sign + 1);
  if (op == "conv2d" || op == "conv2d_backward") return order.empty() ? time_convolution(op, variant, dims) : -1;
  // "<op>_backward" times the op's backward: the gradient of one forward, retained.
  static const std::string kBackward = "_backward";
  const size_t stem = op.size() - std::min(op.size(), kBackward.size());
  const bool backward = stem > 0 && op.compare(stem, std::string::npos, kBackward) == 0;
  const OpSpec* spec = find_op_spec(backward ? op.substr(0, stem) : op);
  OpArgs args;
  args.shapes = analyze::parse_dims(dims);
  args.dim_order = order;
  if (spec == nullptr || !sizable(args.shapes)) return -1;
  OpCase c;
  try {
    c = spec->make(args);
  } catch (const std::exception&) {  // shapes the op does not take
    return -1;
  }
  const auto chosen = std::find_if(c.variants.begin(), c.variants.end(), [&](const OpVariant& v) { return v.name == variant; });
  if (chosen == c.variants.end()) return -1;
  if (chosen->step) return time_calls(chosen->step);
  if (!backward) {
    at::NoGradGuard no_grad;
    return time_calls([&] { chosen->forward(); });
  }
  const at::Tensor y = chosen->forward();
  return time_calls([&] { torch::autograd::grad({y}, c.leaves, {c.grad_output}, /*retain_graph=*/true); });
}

}  // namespace

double time_fused_op(const std::string& op, const std::string& dims) {
  // Once per process for each op, sizes and thread count: tune analyses its baseline and every
  // variant, which ask the same ones again, and a saving between two analyses should not carry
  // the noise of two timings.
  static std::mutex mutex;
  static std::map<std::tuple<std::string, std::string, int>, double> times;
  const auto key = std::make_tuple(op, dims, at::get_num_threads());
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (const auto it = times.find(key); it != times.end()) return it->second;
  }
  // In tune's memory regime, where a large temporary reuses touched pages: `analyze --measure`
  // then estimates what tune would.
  measure::keep_freed_memory();
  const double us = time_uncached(op, dims);
  const std::lock_guard<std::mutex> lock(mutex);
  return times.emplace(key, us).first->second;
}

analyze::Roofline machine_roofline(int threads) {
  analyze::Roofline r = analyze::cached_roofline(threads);
  if (r.known()) return r;
  const int before = at::get_num_threads();
  at::set_num_threads(threads);
  // Compute: a float32 matrix product large enough for the BLAS to run at its best.
  const int64_t n = 1024;
  const at::Tensor a = at::rand({n, n}), b = at::rand({n, n});
  at::Tensor c = at::empty({n, n});
  const double mm_us = time_calls([&] { at::mm_out(c, a, b); });
  // Bandwidth: a copy of 64 MB, far past the caches; it reads and writes each byte once.
  const at::Tensor x = at::rand({int64_t{16} << 20});
  at::Tensor y = at::empty_like(x);
  const double copy_us = time_calls([&] { y.copy_(x); });
  at::set_num_threads(before);
  r.flops_per_s = 2.0 * static_cast<double>(n * n * n) / (mm_us * 1e-6);
  r.bytes_per_s = 2.0 * static_cast<double>(x.nbytes()) / (copy_us * 1e-6);
  r.threads = threads;
  r.source = "measured here (a 1024x1024 float32 matrix product; a 64 MB copy)";
  analyze::cache_roofline(r);
  return r;
}

}  // namespace opfuse::bench
