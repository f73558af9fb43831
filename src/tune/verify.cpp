// Verification of a rewritten workload against its baseline: outputs, every parameter gradient
// and (where the workload reports them) its optimizer's updates from seeded gradients, in float64
// and in float32.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <optional>

#include "opfuse/errors.h"
#include "tune/model_workload.h"

namespace opfuse::tune {
namespace {

double max_abs(const at::Tensor& t) { return t.numel() == 0 ? 0 : t.detach().abs().max().item<double>(); }

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  const double d = max_abs(a.detach().to(at::kDouble) - b.detach().to(at::kDouble));
  return std::isfinite(d) ? d : std::numeric_limits<double>::infinity();
}

// The largest magnitude among the reference tensors: part of each tensor's allowance, so a
// gradient that is zero in exact arithmetic (a bias feeding a BatchNorm), which holds only
// rounding noise, is not judged against its own noise.
double largest_magnitude(const Probe& ref) {
  double m = 0;
  for (const at::Tensor& t : ref.outputs) m = std::max(m, max_abs(t));
  for (const auto& [name, t] : ref.grads)
    if (t.defined()) m = std::max(m, max_abs(t));
  return m;
}

// The optimizer's updates are on their own scale (a learning rate's worth of the parameters), so
// they get their own floor: against the gradients' they would pass whatever the step did.
double largest_update(const Probe& ref) {
  double m = 0;
  for (const auto& [name, t] : ref.updates)
    if (t.defined()) m = std::max(m, max_abs(t));
  return m;
}

std::string shape_of(const at::Tensor& t) { return fmt::format("{}", fmt::join(t.sizes(), "x")); }

// Compares every tensor of `got` with `ref`; `noise`, when given, is the reference run on a
// rounding-nudged input, whose distance from the reference is allowed kRoundingFactor times over.
// Returns an error message for a structural mismatch, else scores into the verdict.
std::string compare(const Probe& got, const Probe& ref, const Probe* noise, double tolerance, double& error,
                    Verdict& v, const char* precision) {
  if (got.outputs.size() != ref.outputs.size())
    return fmt::format("{} outputs instead of {}", got.outputs.size(), ref.outputs.size());
  for (size_t i = 0; i < ref.outputs.size(); ++i)
    if (got.outputs[i].sizes() != ref.outputs[i].sizes())
      return fmt::format("output shape {} instead of {}", shape_of(got.outputs[i]), shape_of(ref.outputs[i]));
  if (got.grads.size() != ref.grads.size())
    return fmt::format("{} parameters instead of {}", got.grads.size(), ref.grads.size());
  if (got.updates.size() != ref.updates.size())
    return fmt::format("an optimizer step updates {} parameters instead of {}", got.updates.size(), ref.updates.size());
  auto score = [&](const std::string& what, const at::Tensor& g, const at::Tensor& r, const at::Tensor* n, double floor) {
    const double scale = max_abs(r), deviation = max_abs_diff(g, r);
    const double allowance = tolerance * (scale + floor) + (n ? kRoundingFactor * max_abs_diff(*n, r) : 0);
    const double margin = allowance > 0 ? deviation / allowance : (deviation > 0 ? INFINITY : 0);
    if (margin > v.margin || v.worst.empty()) v.margin = margin, v.worst = fmt::format("{} ({})", what, precision);
    if (scale + floor > 0) error = std::max(error, deviation / (scale + floor));
  };
  const double floor = largest_magnitude(ref);
  for (size_t i = 0; i < ref.outputs.size(); ++i)
    score(ref.outputs.size() == 1 ? "output" : fmt::format("output {}", i), got.outputs[i], ref.outputs[i],
          noise ? &noise->outputs[i] : nullptr, floor);
  for (size_t i = 0; i < ref.grads.size(); ++i) {
    const auto& [name, want] = ref.grads[i];
    const at::Tensor& have = got.grads[i].second;
    if (want.defined() != have.defined())
      return fmt::format("gradient of {} is {}", name, have.defined() ? "no longer zero" : "missing");
    if (want.defined()) score("gradient of " + name, have, want, noise ? &noise->grads[i].second : nullptr, floor);
  }
  const double update_floor = largest_update(ref);
  for (size_t i = 0; i < ref.updates.size(); ++i) {
    const auto& [name, want] = ref.updates[i];
    const at::Tensor& have = got.updates[i].second;
    if (want.defined() != have.defined() || (want.defined() && want.sizes() != have.sizes()))
      return fmt::format("the optimizer step's update of {} is {}", name, have.defined() ? "of another shape" : "missing");
    if (want.defined())
      score("optimizer update of " + name, have, want, noise ? &noise->updates[i].second : nullptr, update_floor);
  }
  return "";
}

Probe probe_clone(const Workload& w, at::ScalarType dtype, uint64_t seed, double nudge = 0) {
  return w.clone()->probe(dtype, seed, nudge);
}

// The baseline's float64 probe, or none where the model as written cannot run in float64
// (Hugging Face 4.36's torch.full(…, finfo(dtype).min) without a dtype overflows float32): then
// float32 alone is checked, and the verdict says why.
std::optional<Probe> float64_probe(const Workload& baseline, uint64_t seed, Verdict& v) {
  try {
    return probe_clone(baseline, at::kDouble, seed);
  } catch (const std::exception& e) {
    v.float64_skipped = "the model as written does not run in float64: " + error_summary(e.what());
    return std::nullopt;
  }
}

}  // namespace

// Runs baseline and candidate on the same input, parameters and random streams, in float64 (does
// the rewrite compute the same function?) and in float32 (do its kernels, as training uses them,
// agree as closely as rounding allows?).
Verdict verify(const Workload& baseline, const Workload& candidate, uint64_t seed) {
  Verdict v;
  try {
    if (const std::optional<Probe> ref64 = float64_probe(baseline, seed, v)) {
      const Probe got64 = probe_clone(candidate, at::kDouble, seed);
      v.error = compare(got64, *ref64, nullptr, kFloat64Tolerance, v.float64_error, v, "float64");
      if (!v.error.empty()) return v;
    }
    const Probe ref32 = probe_clone(baseline, at::kFloat, seed);
    const Probe noise32 = probe_clone(baseline, at::kFloat, seed, kRoundingNudge);
    const Probe got32 = probe_clone(candidate, at::kFloat, seed);
    v.error = compare(got32, ref32, &noise32, kFloat32Tolerance, v.float32_error, v, "float32");
  } catch (const std::exception& e) {
    v.error = error_summary(e.what());
  }
  v.passed = v.error.empty() && v.margin <= 1;
  return v;
}

std::string rejection(const Verdict& v) {
  if (!v.error.empty()) return "failed verification: " + v.error;
  return fmt::format("failed verification ({} off by {:.1f}x its allowance)", v.worst, v.margin);
}

}  // namespace opfuse::tune
