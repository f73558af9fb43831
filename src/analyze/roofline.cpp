// The work an op does, from the shapes the profiler recorded: floating-point operations and the
// bytes it must move at least (its inputs read once, its output written once). Counted for the
// ops a training step spends its time in; any other op is unknown (zero). A convolution's output
// size, which its inputs do not say (a trace holds no stride), comes from its backward.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string_view>
#include <unordered_map>

#include "analyze/op_index.h"
#include "opfuse/analyze.h"

namespace opfuse::analyze {
namespace {

using Shape = std::vector<int64_t>;

// Elements, in floating point: a recorded shape may multiply past what an int64 holds. −1: unknown.
double numel(const Shape& s) {
  double n = 1;
  for (int64_t d : s) {
    if (d < 0) return -1;
    n *= static_cast<double>(d);
  }
  return n;
}

enum class Family : uint8_t { mm, addmm, bmm, baddbmm, linear, matmul, conv, conv_backward, elementwise, norm,
                              norm_backward, softmax, attention };

const std::unordered_map<std::string_view, Family>& families() {
  static const std::unordered_map<std::string_view, Family> table = [] {
    std::unordered_map<std::string_view, Family> t;
    for (std::string_view n : {"mm", "_mm"}) t[n] = Family::mm;
    t["addmm"] = Family::addmm;
    t["bmm"] = Family::bmm;
    t["baddbmm"] = Family::baddbmm;
    t["linear"] = Family::linear;
    t["matmul"] = Family::matmul;
    for (std::string_view n : {"convolution", "_convolution", "conv2d", "conv1d", "mkldnn_convolution", "cudnn_convolution",
                               "thnn_conv2d", "_slow_conv2d_forward", "_nnpack_spatial_convolution"})
      t[n] = Family::conv;
    for (std::string_view n : {"convolution_backward", "mkldnn_convolution_backward"}) t[n] = Family::conv_backward;
    for (std::string_view n : {"add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "sigmoid", "sigmoid_", "tanh",
                               "relu", "relu_", "gelu", "silu", "silu_", "exp", "neg", "rsqrt", "sqrt", "pow", "clamp",
                               "where", "masked_fill", "masked_fill_", "addcmul_", "addcdiv_", "lerp_", "rsub",
                               "sigmoid_backward", "silu_backward", "gelu_backward", "tanh_backward",
                               "threshold_backward", "hardswish", "hardsigmoid", "copy_", "fill_", "zero_"})
      t[n] = Family::elementwise;
    for (std::string_view n : {"native_layer_norm", "layer_norm", "native_batch_norm", "batch_norm",
                               "_native_batch_norm_legit", "_batch_norm_impl_index", "rms_norm", "_fused_rms_norm",
                               "native_group_norm", "group_norm"})
      t[n] = Family::norm;
    for (std::string_view n : {"native_layer_norm_backward", "native_batch_norm_backward", "native_group_norm_backward",
                               "_fused_rms_norm_backward"})
      t[n] = Family::norm_backward;
    for (std::string_view n : {"softmax", "_softmax", "log_softmax", "_log_softmax", "_softmax_backward_data",
                               "_log_softmax_backward_data"})
      t[n] = Family::softmax;
    for (std::string_view n : {"scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
                               "_scaled_dot_product_attention_math", "_scaled_dot_product_efficient_attention",
                               "_scaled_dot_product_flash_attention"})
      t[n] = Family::attention;
    return t;
  }();
  return table;
}

// 2·m·k·n for [.., m, k] × [k, n]; the product's batch is the larger operand's leading dims.
Work product(const Shape& a, const Shape& b, double size, const Shape* bias = nullptr) {
  if (a.size() < 2 || b.size() < 2) return {};
  if (b[b.size() - 2] != a.back() || numel(a) < 0 || numel(b) < 0) return {};
  const double m = static_cast<double>(a[a.size() - 2]), k = static_cast<double>(a.back()), n = static_cast<double>(b.back());
  const double batch = std::max(numel(a) / std::max(1.0, m * k), numel(b) / std::max(1.0, k * n));
  Work w;
  w.flops = 2 * batch * m * k * n;
  w.bytes = size * (numel(a) + numel(b) + batch * m * n + (bias != nullptr ? std::max(0.0, numel(*bias)) : 0));
  return w;
}

}  // namespace

bool convolution_forward(std::string_view op) {
  if (op.compare(0, 6, "aten::") == 0) op.remove_prefix(6);
  const auto it = families().find(op);
  return it != families().end() && it->second == Family::conv;
}

Work op_work(const std::string& op_name, const std::vector<Shape>& inputs, const std::vector<std::string_view>& types,
             const Shape* output) {
  std::string_view name = op_name;
  if (name.compare(0, 6, "aten::") == 0) name.remove_prefix(6);
  const auto it = families().find(name);
  if (it == families().end()) return {};
  std::vector<const Shape*> tensors;  // the tensor inputs, scalars ([]) left out
  double size = 4;
  for (size_t k = 0; k < inputs.size(); ++k)
    if (!inputs[k].empty() && numel(inputs[k]) > 0) {
      if (tensors.empty() && k < types.size()) size = static_cast<double>(dtype_bytes(types[k]));
      tensors.push_back(&inputs[k]);
    }
  if (tensors.empty()) return {};
  const Shape& x = *tensors[0];
  const double elements = numel(x);
  switch (it->second) {
    case Family::mm:
    case Family::bmm:
    case Family::matmul:
      return tensors.size() >= 2 ? product(x, *tensors[1], size) : Work{};
    case Family::addmm:
    case Family::baddbmm:
      return tensors.size() >= 3 ? product(*tensors[1], *tensors[2], size, tensors[0]) : Work{};
    case Family::linear: {  // x [.., k], weight [n, k]
      if (tensors.size() < 2 || tensors[1]->size() != 2) return {};
      const Shape w = {(*tensors[1])[1], (*tensors[1])[0]};
      return product(x, w, size, tensors.size() > 2 ? tensors[2] : nullptr);
    }
    case Family::conv: {  // x [N, C, H, W…], weight [O, C/groups, kH, kW…]; output [N, O, H', W'…]
      if (tensors.size() < 2 || x.size() < 3 || tensors[1]->size() != x.size()) return {};
      const Shape& w = *tensors[1];
      const bool sized = output != nullptr && output->size() == x.size() && (*output)[0] == x[0] && (*output)[1] == w[0];
      const Shape& y = sized ? *output : x;  // else at stride 1, the size of x
      const double spatial = numel(Shape(y.begin() + 2, y.end()));
      const double per_output = numel(Shape(w.begin() + 1, w.end()));
      const double outputs = static_cast<double>(x[0]) * static_cast<double>(w[0]) * spatial;
      return {2 * outputs * per_output, size * (elements + numel(w) + outputs)};
    }
    case Family::conv_backward: {  // grad_output [N, O, H', W'], input, weight: both gradients
      if (tensors.size() < 3) return {};
      const Shape &dy = *tensors[0], &in = *tensors[1], &w = *tensors[2];
      if (dy.size() < 3 || w.size() != dy.size()) return {};
      const double outputs = numel(dy);
      const double per_output = numel(Shape(w.begin() + 1, w.end()));
      return {4 * outputs * per_output, size * (outputs + 2 * numel(in) + 2 * numel(w))};
    }
    case Family::elementwise: {
      double read = 0, largest = 0;
      for (size_t k = 0; k < tensors.size(); ++k) {
        const double n = numel(*tensors[k]);
        read += n, largest = std::max(largest, n);
      }
      return {largest, size * (read + largest)};
    }
    case Family::norm:  // mean, variance, normalise, scale and shift
      return {8 * elements, size * 2 * elements};
    case Family::norm_backward:
      return {12 * elements, size * 3 * elements};
    case Family::softmax:  // max, exp, sum, divide
      return {5 * elements, size * 2 * elements};
    case Family::attention: {  // q [.., L, D], k [.., S, D], v [.., S, Dv]: two products, no score matrix in memory
      if (tensors.size() < 3 || x.size() < 2 || tensors[1]->size() < 2) return {};
      const double l = static_cast<double>(x[x.size() - 2]), d = static_cast<double>(x.back());
      const double s = static_cast<double>((*tensors[1])[tensors[1]->size() - 2]);
      const double heads = elements / std::max(1.0, l * d);
      const double read = elements + numel(*tensors[1]) + numel(*tensors[2]);
      return {4 * heads * l * s * d, size * (read + elements)};
    }
  }
  return {};
}

namespace {

std::string cache_path() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  if (xdg != nullptr && *xdg != '\0') return std::string(xdg) + "/opfuse/roofline.json";
  return home != nullptr && *home != '\0' ? std::string(home) + "/.cache/opfuse/roofline.json" : "";
}

// The CPU's model name: peaks cached on one machine say nothing of another that shares the home.
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.compare(0, 10, "model name") == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

nlohmann::json read_cache(const std::string& path) {
  std::ifstream in(path);
  if (!in) return nlohmann::json::object();
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("entries") && j["entries"].is_array() ? j : nlohmann::json::object();
}

}  // namespace

Roofline cached_roofline(int threads) {
  const std::string path = cache_path();
  if (path.empty()) return {};
  const std::string cpu = cpu_model();
  const nlohmann::json j = read_cache(path);
  for (const auto& e : j.value("entries", nlohmann::json::array())) {
    if (!e.is_object() || e.value("threads", 0) != threads || e.value("cpu", std::string()) != cpu) continue;
    Roofline r;
    r.flops_per_s = e.value("flops_per_s", 0.0);
    r.bytes_per_s = e.value("bytes_per_s", 0.0);
    r.threads = threads;
    r.source = "measured here earlier, cached in " + path;
    if (r.known()) return r;
  }
  return {};
}

void cache_roofline(const Roofline& r) {
  const std::string path = cache_path();
  if (path.empty() || !r.known()) return;
  const std::string cpu = cpu_model();
  nlohmann::json j = read_cache(path);
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& e : j.value("entries", nlohmann::json::array()))
    if (e.is_object() && !(e.value("threads", 0) == r.threads && e.value("cpu", std::string()) == cpu)) entries.push_back(e);
  entries.push_back({{"cpu", cpu}, {"threads", r.threads}, {"flops_per_s", r.flops_per_s}, {"bytes_per_s", r.bytes_per_s}});
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  std::ofstream out(path);  // a cache: a machine where it cannot be written measures again next time
  if (out) out << nlohmann::json{{"entries", entries}}.dump(1) << "\n";
}

}  // namespace opfuse::analyze
