// What a fused op would take in place of a chain found in a trace: run it at the chain's shapes,
// on inputs its OpSpec makes from them.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>

#include "opfuse/analyze.h"
#include "opfuse/bench.h"
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

}  // namespace

double time_fused_op(const std::string& op, const std::string& dims) {
  // "<op>_backward" times the op's fused backward: the gradient of one forward, retained.
  static const std::string kBackward = "_backward";
  const size_t stem = op.size() - std::min(op.size(), kBackward.size());
  const bool backward = stem > 0 && op.compare(stem, std::string::npos, kBackward) == 0;
  const OpSpec* spec = find_op_spec(backward ? op.substr(0, stem) : op);
  OpArgs args;
  args.shapes = analyze::parse_dims(dims);
  if (spec == nullptr || !sizable(args.shapes)) return -1;
  OpCase c;
  try {
    c = spec->make(args);
  } catch (const std::exception&) {  // shapes the op does not take
    return -1;
  }
  const OpVariant& fused = c.variants.back();
  if (fused.step) return time_calls(fused.step);
  if (!backward) {
    at::NoGradGuard no_grad;
    return time_calls([&] { fused.forward(); });
  }
  const at::Tensor y = fused.forward();
  return time_calls([&] { torch::autograd::grad({y}, c.leaves, {c.grad_output}, /*retain_graph=*/true); });
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
