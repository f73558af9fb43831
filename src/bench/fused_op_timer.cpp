// What a fused op would take in place of a chain found in a trace: run it at the chain's shapes.
#include <torch/torch.h>

#include <chrono>

#include "ops/dispatch.h"
#include "opfuse/analyze.h"
#include "opfuse/bench.h"
#include "opfuse/ops.h"
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

}  // namespace

double time_fused_op(const std::string& op, const std::string& dims) {
  const auto shapes = analyze::parse_dims(dims);
  if (shapes.empty() || !sizable(shapes[0])) return -1;
  at::NoGradGuard no_grad;
  const at::Tensor x = torch::randn(shapes[0]);
  if (op == "silu") return time_calls([&] { opfuse::silu(x); });
  if (op == "silu_backward") {
    static const auto backward = find_op<at::Tensor(const at::Tensor&, const at::Tensor&)>("opfuse::silu_backward");
    const at::Tensor grad = torch::randn(shapes[0]);
    return time_calls([&] { backward.call(grad, x); });
  }
  if (op == "se_gate") {
    if (x.dim() != 4) return -1;
    std::vector<int64_t> gate_shape{x.size(0), x.size(1), 1, 1};
    const at::Tensor gate = torch::randn(gate_shape);
    return time_calls([&] { opfuse::se_gate(x, gate); });
  }
  if (op == "batch_norm_silu") {
    if (x.dim() != 4 && x.dim() != 2) return -1;
    const at::Tensor w = torch::ones({x.size(1)}), b = torch::zeros({x.size(1)});
    at::Tensor rm = torch::zeros({x.size(1)}), rv = torch::ones({x.size(1)});
    return time_calls([&] { opfuse::batch_norm_silu(x, w, b, rm, rv, true, 0.01, 1e-3); });
  }
  if (op == "rms_norm") {  // the largest shape is x; the weight is its last dimension
    if (x.dim() < 1) return -1;
    const at::Tensor w = torch::ones({x.size(-1)});
    return time_calls([&] { opfuse::rms_norm(x, w, 1e-6); });
  }
  if (op == "drop_connect_add") {
    const at::Tensor residual = torch::randn(shapes[0]);
    return time_calls([&] { opfuse::drop_connect_add(x, residual, 0.2, true); });
  }
  return -1;
}

}  // namespace opfuse::bench
