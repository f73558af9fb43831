// The training loop behind `opfuse train`.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/resource.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <utility>

#include "opfuse/data.h"
#include "opfuse/efficientnet.h"
#include "opfuse/measure.h"
#include "opfuse/optim.h"
#include "opfuse/profile.h"
#include "opfuse/rewrite.h"
#include "opfuse/stats.h"
#include "opfuse/train.h"

namespace opfuse::train {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

bool is_fusion(const std::string& rule) {
  const auto& all = rewrite::efficientnet_fusions();
  return std::any_of(all.begin(), all.end(), [&](const rewrite::ModuleFusion& f) { return f.rule == rule; });
}

std::string fusion_names() {
  std::vector<std::string> names;
  for (const auto& f : rewrite::efficientnet_fusions()) names.push_back(f.rule);
  return fmt::format("{}", fmt::join(names, ", "));
}

void validate(const TrainOptions& o) {
  models::efficientnet_params(o.model);  // throws for an unknown model
  models::check_swish_spelling(o.swish);
  for (const std::string& rule : o.fuse)
    if (!is_fusion(rule)) throw std::invalid_argument(fmt::format("--fuse {}: unknown fusion ({}, or all)", rule, fusion_names()));
  if (o.image_size != 0 && o.image_size < 32)
    throw std::invalid_argument(fmt::format("--image-size {} is below the minimum of 32", o.image_size));
  if (o.batch_size < 1) throw std::invalid_argument("--batch-size must be at least 1");
  if (o.steps < 1 || o.steps > 1'000'000) throw std::invalid_argument("--steps must be between 1 and 1000000");
  if (o.warmup < 0 || o.warmup > 1'000'000) throw std::invalid_argument("--warmup must be between 0 and 1000000");
  if (o.num_classes < 1) throw std::invalid_argument("--num-classes must be at least 1");
  if (!(o.lr > 0)) throw std::invalid_argument("--lr must be positive");
  if (!o.profile.empty() && o.profile_steps < 1) throw std::invalid_argument("--profile-steps must be at least 1");
  if (o.optimizer != "sgd" && o.optimizer != "opfuse-sgd" && o.optimizer != "rmsprop" && o.optimizer != "adamw" &&
      o.optimizer != "opfuse-adamw")
    throw std::invalid_argument(fmt::format(
        "unknown optimizer '{}' (expected sgd, opfuse-sgd, rmsprop, adamw or opfuse-adamw)", o.optimizer));
}

// The reference's ImageNet recipes: SGD with momentum 0.9 (stepped by torch or by opfuse::sgd_),
// or RMSprop as in the TF training (decay 0.9, momentum 0.9, eps 1e-3); weight decay 1e-5 for
// both. AdamW with torch's defaults (betas 0.9, 0.999, weight decay 1e-2), stepped by torch or by
// opfuse::adamw_.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainOptions& o, models::EfficientNet& model) {
  if (o.optimizer == "adamw")
    return std::make_unique<torch::optim::AdamW>(model->parameters(), torch::optim::AdamWOptions(o.lr));
  if (o.optimizer == "opfuse-adamw")
    return std::make_unique<opfuse::optim::AdamW>(model->parameters(), torch::optim::AdamWOptions(o.lr));
  if (o.optimizer == "rmsprop")
    return std::make_unique<torch::optim::RMSprop>(
        model->parameters(), torch::optim::RMSpropOptions(o.lr).alpha(0.9).momentum(0.9).eps(1e-3).weight_decay(1e-5));
  const auto sgd = torch::optim::SGDOptions(o.lr).momentum(0.9).weight_decay(1e-5);
  if (o.optimizer == "opfuse-sgd") return std::make_unique<opfuse::optim::SGD>(model->parameters(), sgd);
  return std::make_unique<torch::optim::SGD>(model->parameters(), sgd);
}

// The scope PyTorch's profiler gives the optimizer's step; opfuse's optimizers are named as
// torch's, as opfuse.optim's are in Python, so a trace of either reads the same to analyze.
std::string optimizer_scope(const std::string& optimizer) {
  if (optimizer == "rmsprop") return "Optimizer.step#RMSprop.step";
  if (optimizer == "adamw" || optimizer == "opfuse-adamw") return "Optimizer.step#AdamW.step";
  return "Optimizer.step#SGD.step";
}

struct Session {
  models::EfficientNet model{nullptr};
  std::unique_ptr<data::BatchSource> source;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::string optimizer_scope;  // "Optimizer.step#SGD.step"
  int image_size = 0;
};

Session open_session(const TrainOptions& o) {
  Session s;
  s.image_size = o.image_size > 0 ? o.image_size : models::efficientnet_params(o.model).image_size;
  s.source = o.data.empty() ? data::synthetic_source(o.batch_size, s.image_size, o.num_classes, o.seed)
                            : data::image_folder_source(o.data, o.batch_size, s.image_size, o.seed);
  torch::manual_seed(o.seed);
  s.model = models::make_efficientnet(o.model, static_cast<int>(s.source->num_classes()), s.image_size, o.swish);
  for (const std::string& rule : o.fuse) rewrite::fuse_efficientnet(*s.model, rule);
  s.model->train();
  s.optimizer = make_optimizer(o, s.model);
  s.optimizer_scope = optimizer_scope(o.optimizer);
  return s;
}

StepRecord run_step(Session& s) {
  StepRecord r;
  const auto start = Clock::now();
  const data::Batch batch = s.source->next();
  r.data_ms = ms_since(start);
  s.optimizer->zero_grad();
  at::Tensor loss = torch::nn::functional::cross_entropy(s.model->forward(batch.images), batch.labels);
  loss.backward();
  {
    // Named as PyTorch's profiler names it, so traces of either read the same to analyze.
    profile::Scope scope(s.optimizer_scope);
    s.optimizer->step();
  }
  r.loss = loss.item<double>();
  r.step_ms = ms_since(start);
  return r;
}

void set_threads(int threads) {
  at::set_num_threads(threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace

namespace {

// count steps, each inside a "ProfilerStep#N" scope; the caller runs the profiler.
std::vector<double> run_profiled_steps(Session& s, int count, int first_step) {
  std::vector<double> step_ms;
  for (int i = 0; i < count; ++i) {
    profile::Scope step("ProfilerStep#" + std::to_string(first_step + i));
    step_ms.push_back(run_step(s).step_ms);
  }
  return step_ms;
}

// Profiled steps run after the timed ones so the profiler's cost never reaches images/s; their
// median (plain_step_ms) goes in the trace, so analyze can take out what profiling added.
// Returns the profiled steps' median time and the events written.
std::pair<double, size_t> profile_steps(const TrainOptions& o, Session& s, int first_step, double plain_step_ms) {
  profile::Profiler profiler;
  const auto held = profile::held_memory(s.model->parameters(), s.optimizer.get(), {});
  profiler.start();
  const std::vector<double> step_ms = run_profiled_steps(s, o.profile_steps, first_step);
  profiler.stop();
  const nlohmann::json metadata{{"opfuse_version", "0.1.0"},
                                {"torch_version", TORCH_VERSION},
                                {"model", o.model},
                                {"swish", o.swish},
                                {"fusions", o.fuse},
                                {"threads", at::get_num_threads()},
                                {"batch_size", o.batch_size},
                                {"image_size", s.image_size},
                                {"memory_before", held},
                                {"plain_step_ms", plain_step_ms}};
  profiler.write(o.profile, metadata);
  return {median(step_ms), profiler.event_count()};
}

}  // namespace

double peak_rss_mb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024.0;  // Linux reports kilobytes
}

TrainResult train(const TrainOptions& o, const std::function<void(const StepRecord&)>& on_step) {
  validate(o);
  set_threads(o.threads);
  Session s = open_session(o);

  TrainResult result;
  result.model = o.model;
  result.swish = o.swish;
  result.fusions = o.fuse;
  result.data = s.source->describe();
  result.parameters = s.model->parameter_count();
  result.image_size = s.image_size;
  result.batch_size = o.batch_size;
  result.steps = o.steps;
  result.threads = at::get_num_threads();

  double timed_ms = 0;
  std::vector<double> timed;
  for (int i = 0; i < o.warmup + o.steps; ++i) {
    StepRecord r = run_step(s);
    r.step = i + 1;
    r.warmup = i < o.warmup;
    if (!r.warmup) {
      timed_ms += r.step_ms;
      timed.push_back(r.step_ms);
    }
    result.records.push_back(r);
    if (on_step) on_step(r);
  }
  result.images_per_sec = static_cast<double>(o.batch_size) * o.steps / (timed_ms / 1000.0);
  result.step_ms_median = median(timed);
  result.loss_first = result.records.front().loss;
  result.loss_last = result.records.back().loss;
  if (!o.profile.empty())
    std::tie(result.profile_step_ms_median, result.profile_events) =
        profile_steps(o, s, o.warmup + o.steps + 1, result.step_ms_median);
  result.peak_rss_mb = peak_rss_mb();
  result.environment = measure::environment();
  return result;
}

TrainOptions variant_options(const TrainOptions& o, const std::string& variant) {
  TrainOptions v = o;
  const auto& spellings = models::swish_spellings();
  if (std::find(spellings.begin(), spellings.end(), variant) != spellings.end()) {
    v.swish = variant;
  } else if (variant == kAllFusions) {
    v.fuse.clear();
    for (const auto& f : rewrite::efficientnet_fusions()) v.fuse.push_back(f.rule);
  } else if (is_fusion(variant)) {
    if (std::find(v.fuse.begin(), v.fuse.end(), variant) == v.fuse.end()) v.fuse.push_back(variant);
  } else {
    throw std::invalid_argument(fmt::format("unknown --compare variant '{}' (expected a swish spelling: {}; a fusion: {}; or {})",
                                            variant, fmt::join(spellings, ", "), fusion_names(), kAllFusions));
  }
  return v;
}

measure::Options measure_options(const TrainOptions& o, int rounds, const std::function<void(int, int)>& progress) {
  measure::Options m;
  m.warmup = std::max(1, o.warmup);
  m.rounds = rounds;
  m.progress = progress;
  return m;
}

CompareResult compare(const TrainOptions& o, const std::vector<std::string>& variants, int rounds,
                      const std::function<void(int, int)>& on_round) {
  validate(o);
  if (variants.empty()) throw std::invalid_argument("--compare needs at least one variant");
  if (rounds < 1) throw std::invalid_argument("--rounds must be at least 1");
  std::vector<TrainOptions> variant_runs;
  for (const auto& v : variants) variant_runs.push_back(variant_options(o, v));
  set_threads(o.threads);

  std::vector<Session> sessions;
  for (const auto& v : variant_runs) sessions.push_back(open_session(v));
  std::vector<measure::Run> runs;
  for (auto& s : sessions) runs.push_back(measure::per_step([&s] { return run_step(s).step_ms; }, o.steps));

  CompareResult result;
  result.variants = variants;
  result.batch_size = o.batch_size;
  result.steps = o.steps;
  result.timing = measure::interleave(runs, measure_options(o, rounds, on_round));
  for (size_t v = 0; v < variants.size(); ++v) result.speedup.push_back(measure::ratio(result.timing, 0, v));
  result.environment = measure::environment();
  return result;
}

OverheadResult profiler_overhead(const TrainOptions& o, int rounds) {
  validate(o);
  if (rounds < 1) throw std::invalid_argument("--rounds must be at least 1");
  set_threads(o.threads);
  Session s = open_session(o);
  size_t events = 0;
  const measure::Run plain = measure::per_step([&s] { return run_step(s).step_ms; }, o.steps);
  const measure::Run profiled = [&] {
    profile::Profiler profiler;
    profiler.start();
    const std::vector<double> step_ms = run_profiled_steps(s, o.steps, 1);
    profiler.stop();
    events = profiler.event_count() / o.steps;
    double total = 0;
    for (double ms : step_ms) total += ms;
    return total / o.steps;
  };
  const measure::Measurement m = measure::interleave({plain, profiled}, measure_options(o, rounds, {}));
  OverheadResult result;
  result.plain_ms = m.variants[0].median;
  result.profiled_ms = m.variants[1].median;
  const measure::Ratio slower = measure::ratio(m, 1, 0);  // profiled over plain
  result.overhead = slower.estimate - 1;
  result.overhead_ci = {slower.ci.lo - 1, slower.ci.hi - 1};
  result.events_per_step = events;
  result.machine = m.machine;
  return result;
}

}  // namespace opfuse::train
