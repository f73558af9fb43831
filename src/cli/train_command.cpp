#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <sstream>
#include <stdexcept>

#include "cli/commands.h"
#include "cli/progress.h"
#include "opfuse/report.h"
#include "opfuse/rewrite.h"
#include "opfuse/train.h"

namespace opfuse::cli {
namespace {

struct TrainArgs {
  train::TrainOptions options;
  std::string compare, json;
  int rounds = 5;
  int print_freq = 1;
  bool force = false;
  bool profile_overhead = false;
  std::string fuse;
};

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');)
    if (!part.empty()) parts.push_back(part);
  return parts;
}

// --fuse names the fusions by their rule, as analyze and tune print them; "all" is every one.
std::vector<std::string> fusions_to_apply(const std::string& list) {
  std::vector<std::string> rules;
  for (const std::string& name : split_commas(list)) {
    if (name != train::kAllFusions) {
      rules.push_back(name);
      continue;
    }
    for (const auto& f : rewrite::efficientnet_fusions()) rules.push_back(f.rule);
  }
  return rules;
}

int run_train(TrainArgs& a) {
  Progress progress("train");
  const int total = a.options.warmup + a.options.steps;
  double sum_step = 0, sum_data = 0, sum_loss = 0;
  auto on_step = [&](const train::StepRecord& s) {
    sum_step += s.step_ms;
    sum_data += s.data_ms;
    sum_loss += s.loss;
    if (s.step % a.print_freq == 0 || s.step == total) {
      progress.clear();
      std::fputs(report::format_step(s, total, sum_step / s.step, sum_data / s.step, sum_loss / s.step).c_str(), stdout);
      std::fflush(stdout);
    }
    progress.update(s.step, total);
  };
  const train::TrainResult result = train::train(a.options, on_step);
  progress.clear();
  std::fputs(report::format_train_summary(result).c_str(), stdout);
  if (!a.options.profile.empty())
    std::fprintf(stdout, "profile          %s (%zu events, %d steps, %.1f ms per step: %+.0f %% under the profiler)\n",
                 a.options.profile.c_str(), result.profile_events, a.options.profile_steps, result.profile_step_ms_median,
                 100 * (result.profile_step_ms_median / result.step_ms_median - 1));
  if (!a.json.empty()) report::write_json(a.json, report::train_json(result), a.force);
  return 0;
}

int run_compare(TrainArgs& a) {
  Progress progress("compare");
  const auto variants = split_commas(a.compare);
  const train::CompareResult result =
      train::compare(a.options, variants, a.rounds, [&](int r, int n) { progress.update(r, n); });
  progress.clear();
  std::fputs(report::format_compare(result).c_str(), stdout);
  if (!a.json.empty()) report::write_json(a.json, report::compare_json(result), a.force);
  return 0;
}

}  // namespace

Run add_train(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  auto& o = a->options;
  auto* cmd = app.add_subcommand("train", "Train a built-in model and report images/s");
  cmd->add_option("--model", o.model, "efficientnet-b0 … efficientnet-b7")->capture_default_str();
  cmd->add_option("--fuse", a->fuse,
                  "fusions to train with, by rule name: silu,se_gate,batch_norm_silu,drop_connect_add or all");
  cmd->add_option("--swish", o.swish, "how the model spells Swish: memory-efficient | composite | aten")
      ->capture_default_str();
  cmd->add_option("--image-size", o.image_size, "input resolution (default: the model's own)");
  cmd->add_option("--batch-size", o.batch_size, "images per step")->capture_default_str();
  cmd->add_option("--steps", o.steps, "timed steps after the warm-up")->capture_default_str();
  cmd->add_option("--warmup", o.warmup, "untimed steps first")->capture_default_str();
  cmd->add_option("--optimizer", o.optimizer, "sgd | opfuse-sgd | rmsprop | adamw | opfuse-adamw (sgd and adamw stepped by opfuse::sgd_ and opfuse::adamw_)")
      ->capture_default_str();
  cmd->add_option("--lr", o.lr, "learning rate")->capture_default_str();
  cmd->add_option("--threads", o.threads, "intra-op threads (0: all cores)")->capture_default_str();
  cmd->add_option("--seed", o.seed, "seed for initialization and synthetic data")->capture_default_str();
  cmd->add_option("--num-classes", o.num_classes, "classes of synthetic data (an image folder has its own)")
      ->capture_default_str();
  cmd->add_option("--data", o.data, "image folder, one subfolder per class (default: synthetic data)");
  cmd->add_option("--print-freq", a->print_freq, "print every N steps")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--compare", a->compare,
                  "alternate these variants in one run, e.g. memory-efficient,aten,silu,all (first is the "
                  "baseline): a Swish spelling, a fusion added to --fuse, or all for every fusion");
  cmd->add_flag("--profile-overhead", a->profile_overhead,
                "benchmark: alternate plain and profiled steps, report the profiler's cost");
  cmd->add_option("--rounds", a->rounds, "rounds for --compare and --profile-overhead")->capture_default_str();
  cmd->add_option("--profile", o.profile, "write a Chrome trace (Kineto layout) of extra steps to FILE (.gz: gzipped)");
  cmd->add_option("--profile-steps", o.profile_steps, "steps to profile, after the timed ones")->capture_default_str();
  cmd->add_option("--json", a->json, "also write the result as JSON to FILE");
  cmd->add_flag("--force", a->force, "replace an existing --json file");

  return [cmd, a]() {
    if (!cmd->parsed()) return -1;
    a->options.fuse = fusions_to_apply(a->fuse);
    for (const std::string* out : {&a->json, &a->options.profile})
      if (!out->empty()) report::check_output_path(*out, a->force);
    if (a->profile_overhead) {
      const train::OverheadResult r = train::profiler_overhead(a->options, a->rounds);
      std::printf("plain step     %.1f ms (median)\nprofiled step  %.1f ms (median, %zu events per step)\n"
                  "overhead       %s (paired rounds)\n%s",
                  r.plain_ms, r.profiled_ms, r.events_per_step, measure::format_gain(r.overhead, r.overhead_ci).c_str(),
                  report::format_machine(r.machine).c_str());
      return 0;
    }
    return a->compare.empty() ? run_train(*a) : run_compare(*a);
  };
}

}  // namespace opfuse::cli
