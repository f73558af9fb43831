// opfuse tune: the whole loop; opfuse rewrite: the TorchScript rewrite and its verification alone.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/commands.h"
#include "cli/progress.h"
#include "opfuse/ops.h"
#include "opfuse/report.h"
#include "opfuse/report_html.h"
#include "opfuse/tune.h"

namespace opfuse::cli {
namespace {

namespace fs = std::filesystem;

struct TuneArgs {
  tune::TuneOptions options;
  std::vector<std::string> rules;
  bool no_default_rules = false, no_measure = false, force = false;
  std::string out = "opfuse-out", json;
};

// A folder holding an earlier run is never written into without --force: the run goes to the
// first free "DIR-2", "DIR-3", … instead.
bool holds_a_run(const fs::path& dir) {
  for (const char* f : {"report.json", "report.html", "baseline.trace.json", "tuned.trace.json", "tuned.pt"})
    if (fs::exists(dir / f)) return true;
  return false;
}

std::string output_folder(const std::string& requested, bool force, bool& created) {
  fs::path dir = requested;
  for (int n = 2; !force && holds_a_run(dir); ++n) dir = fmt::format("{}-{}", requested, n);
  std::error_code ec;
  created = !fs::exists(dir);
  fs::create_directories(dir, ec);
  if (ec) throw std::invalid_argument(fmt::format("{}: cannot create the folder ({})", dir.string(), ec.message()));
  if (!fs::is_directory(dir)) throw std::invalid_argument(fmt::format("{}: is a file, not a folder", dir.string()));
  // Checked now, not when the report is written after minutes of training.
  report::check_output_path((dir / "report.json").string(), true);
  return dir.string();
}

void add_model_options(CLI::App* cmd, TuneArgs& a) {
  cmd->add_option_function<std::vector<std::string>>(
         "--input-shape",
         [&a](const std::vector<std::string>& specs) {
           try {
             for (const std::string& spec : specs) a.options.inputs.push_back(tune::parse_input_spec(spec));
           } catch (const std::invalid_argument& e) {
             throw CLI::ValidationError(e.what());  // a parse error: one line, exit 2
           }
         },
         "TorchScript models: one per input of forward, batch first: SHAPE[:DTYPE[:BOUND]], e.g. 16,3,224,224 "
         "(float32), 8,64:int64:32000 (token ids below 32000), 8,64:bool (a mask, all true)")
      ->type_name("SHAPE[:DTYPE[:BOUND]]");
  cmd->add_option("--loss", a.options.loss, "ce: class labels from the output's second dimension; mse: a random target")
      ->capture_default_str()
      ->check(CLI::IsMember({"ce", "mse"}));
  cmd->add_option("--rules", a.rules, "also use the rules in FILE; they take precedence over the built-in ones")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--no-default-rules", a.no_default_rules, "use only the --rules files");
  cmd->add_option("--seed", a.options.seed, "seed of the parameters and the synthetic data")->capture_default_str();
  cmd->add_option("--threads", a.options.threads, "intra-op threads (0: all cores)")->capture_default_str();
}

// A run that fails before writing anything (a model that does not load or run) leaves no empty
// folder behind; one that wrote traces keeps them.
tune::TuneResult run_or_tidy(const tune::TuneOptions& o, const tune::Hooks& hooks, bool created) {
  try {
    return tune::tune(o, hooks);
  } catch (...) {
    std::error_code ec;
    if (created && fs::is_empty(o.out_dir, ec)) fs::remove(o.out_dir, ec);
    throw;
  }
}

int run_tune(TuneArgs& a) {
  if (!a.json.empty()) report::check_output_path(a.json, a.force);
  a.options.rules = analyze::rule_set(a.rules, !a.no_default_rules);
  a.options.measure_ops = !a.no_measure;
  tune::validate(a.options);
  bool created = false;
  a.options.out_dir = output_folder(a.out, a.force, created);
  // With --json -, stdout is the JSON alone, for a script to read; people get the rest on stderr.
  std::FILE* out = report::is_stdout(a.json) ? stderr : stdout;
  std::fprintf(out, "output in %s/\n", a.options.out_dir.c_str());

  int stage = 0;
  auto progress = std::make_unique<Progress>("");
  const auto start = std::chrono::steady_clock::now();
  tune::Hooks hooks;
  hooks.stage = [&](const std::string& what) {
    progress = std::make_unique<Progress>(what.substr(0, what.find(':')));
    const double at = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(out, "\n[%d] %s (at %.1f s)\n", ++stage, what.c_str(), at);
    std::fflush(out);
  };
  hooks.progress = [&](int done, int total) { progress->update(done, total); };
  hooks.warning = [](const std::string& w) { std::fprintf(stderr, "warning: %s\n", w.c_str()); };
  hooks.analysed = [out](const analyze::Analysis& a) {
    std::fputs(report::format_analysis(a, 10).c_str(), out);
    std::fflush(out);
  };
  const tune::TuneResult r = run_or_tidy(a.options, hooks, created);
  progress.reset();
  std::fputs(report::format_tune(r).c_str(), out);

  const nlohmann::json json = report::tune_json(r);
  const std::string dir = a.options.out_dir;
  report::write_json(dir + "/report.json", json, a.force);
  report::write_text(dir + "/report.html", report::analysis_html(report::tune_page(r)), a.force);
  if (!a.json.empty()) report::write_json(a.json, json, a.force);
  std::fprintf(out, "\nwrote %s/report.json, %s/report.html, %s", dir.c_str(), dir.c_str(), r.baseline.trace.c_str());
  if (r.any_verified) std::fprintf(out, ", %s", r.tuned.trace.c_str());
  for (const auto& rep : r.replacements)
    if (!rep.memory_trace.empty()) std::fprintf(out, ", %s", rep.memory_trace.c_str());
  for (const auto& f : r.saved) std::fprintf(out, ", %s", f.c_str());
  std::fputs("\n", out);
  return r.any_verified ? 0 : 1;
}

}  // namespace

Run add_tune(CLI::App& app) {
  auto a = std::make_shared<TuneArgs>();
  auto* cmd = app.add_subcommand(
      "tune", "Profile a model, find fusable chains, replace them, verify the numerics, measure and report");
  tune::TuneOptions& o = a->options;
  cmd->add_option("--model", o.model, "efficientnet-b0…b7, or a TorchScript FILE.pt")->capture_default_str();
  cmd->add_option("--image-size", o.image_size, "built-in models: input resolution")
      ->capture_default_str()
      ->check(CLI::Range(32, 1024));
  cmd->add_option("--batch-size", o.batch_size, "built-in models: batch size")->capture_default_str()->check(CLI::Range(1, 4096));
  cmd->add_option("--num-classes", o.num_classes, "built-in models: classifier outputs")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--steps", o.steps, "timed steps per variant and round")->capture_default_str()->check(CLI::Range(1, 100000));
  cmd->add_option("--rounds", o.rounds, "measurement rounds, variants alternating")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--warmup", o.warmup, "untimed steps per variant first")->capture_default_str()->check(CLI::Range(0, 1000));
  cmd->add_option("--profile-steps", o.profile_steps, "steps in each profile")->capture_default_str()->check(CLI::Range(1, 100));
  cmd->add_option("--max-rounds", o.max_rounds, "more rounds, up to this many, while a gain's interval straddles --min-gain (0: --rounds only)")
      ->capture_default_str()
      ->check(CLI::Range(0, 10000));
  cmd->add_option("--min-gain", o.min_gain,
                  "keep a verified replacement when its gain's 95% interval lies at or above this, roll it back when "
                  "below (0.02 = 2%; -1 keeps every verified one)")
      ->capture_default_str();
  cmd->add_flag("--keep-inconclusive", o.keep_inconclusive, "also keep replacements whose interval still straddles --min-gain after --max-rounds");
  cmd->add_option("--lr", o.lr, "SGD learning rate")->capture_default_str();
  cmd->add_option("--out", a->out, "folder for traces, report and tuned model (a numbered sibling if it holds a run)")
      ->capture_default_str();
  cmd->add_option("--json", a->json, "also write report.json's content to FILE; '-': to stdout, and the rest goes to stderr");
  cmd->add_flag("--force", a->force, "write into --out and --json even if they hold an earlier run");
  cmd->add_flag("--no-measure", a->no_measure, "estimate savings from bandwidth only, without timing opfuse ops");
  add_model_options(cmd, *a);
  return [cmd, a]() { return cmd->parsed() ? run_tune(*a) : -1; };
}

Run add_rewrite(CLI::App& app) {
  auto a = std::make_shared<TuneArgs>();
  auto in = std::make_shared<std::string>(), out = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("rewrite", "Rewrite a TorchScript module's graph with fused ops and verify it");
  cmd->add_option("IN", *in, "a TorchScript module (.pt)")->required()->check(CLI::ExistingFile);
  cmd->add_option("OUT", *out, "where the rewritten module goes (written only if a rewrite verified)")->required();
  cmd->add_flag("--force", a->force, "replace OUT if it exists");
  add_model_options(cmd, *a);
  return [cmd, a, in, out]() {
    if (!cmd->parsed()) return -1;
    report::check_output_path(*out, a->force);
    a->options.model = *in;
    if (a->options.inputs.empty())
      throw std::invalid_argument(fmt::format("{}: pass --input-shape (e.g. 16,3,224,224) to verify the rewrite", *in));
    a->options.rules = analyze::rule_set(a->rules, !a->no_default_rules);
    const tune::RewriteResult r = tune::rewrite_file(*in, *out, a->options);
    if (r.replacements.empty()) {
      std::fprintf(stdout, "%s: no rule's TorchScript pattern matches its graph; nothing written\n", in->c_str());
      return 1;
    }
    std::fputs(report::format_replacements(r.replacements).c_str(), stdout);
    if (!r.written) {
      std::fputs("no rewrite verified; nothing written\n", stdout);
      return 1;
    }
    std::fprintf(stdout, "wrote %s (load it in Python after torch.ops.load_library(\"%s\"))\n", out->c_str(),
                 opfuse::ops_library_path());
    return 0;
  };
}

}  // namespace opfuse::cli
