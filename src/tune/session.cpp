// Training steps on fixed batches, and verification of a rewritten model against its baseline.
#include "tune/session.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "opfuse/profile.h"

namespace opfuse::tune {
namespace {

constexpr int kBatches = 4;

struct Run {
  at::Tensor output;
  std::vector<std::pair<std::string, at::Tensor>> grads;
};

// One training-mode forward and backward with the random streams (dropout, drop connect) reset;
// `nudge` scales the input by (1 + nudge · noise) to see how far rounding-sized changes carry.
Run forward_backward(rewrite::Model& model, const Batches& batches, uint64_t seed, at::ScalarType dtype,
                     double nudge = 0) {
  model.to(dtype);
  model.set_training(true);
  at::Tensor input = batches.inputs[0].to(dtype);
  if (nudge > 0) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed + 1);
    input = input * (1 + nudge * at::randn(input.sizes(), gen, input.options()));
  }
  torch::manual_seed(seed);
  Run run;
  const at::Tensor& target = batches.targets[0];
  run.output = model.forward(input);
  loss_of(run.output, target.is_floating_point() ? target.to(dtype) : target, batches.loss).backward();
  for (auto& [name, p] : model.named_parameters()) run.grads.emplace_back(name, p.grad());
  return run;
}

// An error's first line, or for the TorchScript interpreter's report (a traceback first), the
// line that says what failed.
std::string first_useful_line(const std::string& what) {
  const size_t cause = what.rfind("RuntimeError: ");
  const std::string& from = what.find("TorchScript interpreter") != std::string::npos && cause != std::string::npos
                                ? what.substr(cause + 14)
                                : what;
  return from.substr(0, from.find('\n'));
}

double max_abs(const at::Tensor& t) { return t.detach().abs().max().item<double>(); }

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  const double d = max_abs(a.detach().to(at::kDouble) - b.detach().to(at::kDouble));
  return std::isfinite(d) ? d : std::numeric_limits<double>::infinity();
}

// The largest magnitude among the reference tensors: part of each tensor's allowance, so a
// gradient that is zero in exact arithmetic (a bias feeding a BatchNorm), which holds only
// rounding noise, is not judged against its own noise.
double largest_magnitude(const Run& ref) {
  double m = max_abs(ref.output);
  for (const auto& [name, t] : ref.grads)
    if (t.defined()) m = std::max(m, max_abs(t));
  return m;
}

// Compares every tensor of `got` with `ref`; `noise`, when given, is the reference run on a
// rounding-nudged input, whose distance from the reference is allowed kRoundingFactor times over.
// Returns an error message for a structural mismatch, else scores into the verdict.
std::string compare(const Run& got, const Run& ref, const Run* noise, double tolerance, double& error, Verdict& v,
                    const char* precision) {
  if (got.output.sizes() != ref.output.sizes())
    return fmt::format("output shape {} instead of {}", fmt::join(got.output.sizes(), "x"),
                       fmt::join(ref.output.sizes(), "x"));
  if (got.grads.size() != ref.grads.size())
    return fmt::format("{} parameters instead of {}", got.grads.size(), ref.grads.size());
  const double floor = largest_magnitude(ref);
  auto score = [&](const std::string& what, const at::Tensor& g, const at::Tensor& r, const at::Tensor* n) {
    const double scale = max_abs(r), deviation = max_abs_diff(g, r);
    const double allowance = tolerance * (scale + floor) + (n ? kRoundingFactor * max_abs_diff(*n, r) : 0);
    const double margin = deviation / allowance;
    if (margin > v.margin || v.worst.empty()) v.margin = margin, v.worst = fmt::format("{} ({})", what, precision);
    error = std::max(error, deviation / (scale + floor));
  };
  score("output", got.output, ref.output, noise ? &noise->output : nullptr);
  for (size_t i = 0; i < ref.grads.size(); ++i) {
    const auto& [name, want] = ref.grads[i];
    const at::Tensor& have = got.grads[i].second;
    if (want.defined() != have.defined())
      return fmt::format("gradient of {} is {}", name, have.defined() ? "no longer zero" : "missing");
    if (want.defined()) score("gradient of " + name, have, want, noise ? &noise->grads[i].second : nullptr);
  }
  return "";
}

}  // namespace

bool is_file_model(const std::string& model) {
  return model.size() > 3 && model.compare(model.size() - 3, 3, ".pt") == 0;
}

std::vector<int64_t> input_shape(const TuneOptions& o) {
  if (!o.input_shape.empty()) return o.input_shape;
  if (is_file_model(o.model))
    throw std::invalid_argument(fmt::format("{}: a TorchScript model needs --input-shape (e.g. 16,3,224,224)", o.model));
  return {o.batch_size, 3, o.image_size, o.image_size};
}

at::Tensor loss_of(const at::Tensor& output, const at::Tensor& target, const std::string& loss) {
  if (loss == "mse") return torch::mse_loss(output, target);
  return torch::nn::functional::cross_entropy(output, target);
}

Batches make_batches(const TuneOptions& o, rewrite::Model& model) {
  Batches b;
  b.loss = o.loss;
  const std::vector<int64_t> shape = input_shape(o);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed + 7);
  for (int i = 0; i < kBatches; ++i)
    b.inputs.push_back(at::randn(shape, gen, at::TensorOptions().dtype(at::kFloat)));
  at::Tensor probe;
  {
    torch::NoGradGuard no_grad;
    model.set_training(false);
    probe = model.forward(b.inputs[0]);
    model.set_training(true);
  }
  if (o.loss == "ce" && probe.dim() != 2)
    throw std::invalid_argument(fmt::format("{}: --loss ce needs a [batch, classes] output, the model gives {}",
                                            o.model, fmt::join(probe.sizes(), "x")));
  for (int i = 0; i < kBatches; ++i)
    b.targets.push_back(o.loss == "ce" ? at::randint(probe.size(1), {probe.size(0)}, gen, at::kLong)
                                       : at::randn(probe.sizes(), gen, at::TensorOptions().dtype(at::kFloat)));
  return b;
}

// SGD with momentum 0.9 and weight decay 1e-5, the reference's ImageNet recipe.
Session::Session(std::unique_ptr<rewrite::Model> model, const Batches& batches, const TuneOptions& o)
    : model_(std::move(model)), batches_(batches) {
  std::vector<at::Tensor> params;
  for (auto& [name, p] : model_->named_parameters()) params.push_back(p);
  optimizer_ = std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(o.lr).momentum(0.9).weight_decay(1e-5));
  model_->set_training(true);
}

double Session::step() {
  const auto start = std::chrono::steady_clock::now();
  const size_t i = next_++ % batches_.inputs.size();
  optimizer_->zero_grad();
  loss_of(model_->forward(batches_.inputs[i]), batches_.targets[i], batches_.loss).backward();
  {
    profile::Scope scope("Optimizer.step#SGD.step");  // named as PyTorch's profiler names it
    optimizer_->step();
  }
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// Runs baseline and candidate on the same input, parameters and random streams, in float64 (does
// the rewrite compute the same function?) and in float32 (do its kernels, as training uses them,
// agree as closely as rounding allows?).
Verdict verify(const rewrite::Model& baseline, const rewrite::Model& candidate, const Batches& batches, uint64_t seed) {
  Verdict v;
  try {
    const Run ref64 = forward_backward(*baseline.clone(), batches, seed, at::kDouble);
    const Run got64 = forward_backward(*candidate.clone(), batches, seed, at::kDouble);
    v.error = compare(got64, ref64, nullptr, kFloat64Tolerance, v.float64_error, v, "float64");
    if (!v.error.empty()) return v;
    const Run ref32 = forward_backward(*baseline.clone(), batches, seed, at::kFloat);
    const Run noise32 = forward_backward(*baseline.clone(), batches, seed, at::kFloat, kRoundingNudge);
    const Run got32 = forward_backward(*candidate.clone(), batches, seed, at::kFloat);
    v.error = compare(got32, ref32, &noise32, kFloat32Tolerance, v.float32_error, v, "float32");
  } catch (const std::exception& e) {
    v.error = first_useful_line(e.what());
  }
  v.passed = v.error.empty() && v.margin <= 1;
  return v;
}

std::string rejection(const Verdict& v) {
  if (!v.error.empty()) return "failed verification: " + v.error;
  return fmt::format("failed verification ({} off by {:.1f}x its allowance)", v.worst, v.margin);
}

}  // namespace opfuse::tune
