// opfuse analyze TRACE [TRACE2]: findings for any trace; with two, also the before/after diff.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>

#include "cli/commands.h"
#include "cli/plugin.h"
#include "opfuse/analyze.h"
#include "opfuse/report.h"
#include "opfuse/report_html.h"

namespace opfuse::cli {
namespace {

struct AnalyzeArgs {
  std::vector<std::string> traces;
  std::vector<std::string> rules;
  bool no_default_rules = false;
  std::string backend = "auto";
  int top = 15;
  std::string json, html;
  bool force = false, measure = false;
};

analyze::Analysis analyze_one(const std::string& path, const AnalyzeArgs& args, const std::vector<analyze::Rule>& rules) {
  const trace::Trace t = trace::read_trace(path);
  if (t.dialect == trace::Dialect::unknown)
    throw std::invalid_argument(fmt::format(
        "{}: not a trace opfuse recognises (no cpu_op, Operator, kernel, CANN or legacy-profiler events) at byte 0", path));
  analyze::Options options;
  options.backend = args.backend == "auto" ? analyze::detect_backend(t) : analyze::parse_backend(args.backend);
  // Timing an opfuse op here only says something about a CPU trace taken on a CPU like this one,
  // and loading LibTorch to do it costs more than the whole analysis, so it is asked for.
  if (args.measure && options.backend != analyze::Backend::cpu) {
    std::fprintf(stderr, "warning: %s: --measure times opfuse ops on CPU traces only; this one is %s, so bandwidth estimates are used\n",
                 path.c_str(), analyze::backend_name(options.backend));
  } else if (args.measure) {
    const auto time_op = reinterpret_cast<TimeFusedOp>(torch_symbol("opfuse_time_fused_op"));
    options.measure = [time_op](const std::string& op, const std::string& dims) { return time_op(op.c_str(), dims.c_str()); };
  }
  return analyze::analyze(t, path, rules, options);
}

}  // namespace

Run add_analyze(CLI::App& app) {
  auto args = std::make_shared<AnalyzeArgs>();
  auto* cmd = app.add_subcommand("analyze", "Find small-op chains in a trace, name their fused replacement and its saving");
  cmd->add_option("TRACE", args->traces, "a Chrome trace (.json or .json.gz); a second one is diffed against the first")
      ->required()
      ->expected(1, 2)
      ->check(CLI::ExistingFile);
  cmd->add_option("--rules", args->rules, "also apply the rules in FILE (opfuse YAML or the Ascend advisor's file); they take precedence over the built-in ones")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--no-default-rules", args->no_default_rules, "apply only the --rules files");
  cmd->add_option("--backend", args->backend, "whose replacements to name")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda", "npu"}));
  cmd->add_option("--top", args->top, "rows per table")->capture_default_str()->check(CLI::Range(1, 100000));
  cmd->add_option("--json", args->json, "write the analysis as JSON to FILE");
  cmd->add_option("--html", args->html, "write a self-contained report page to FILE");
  cmd->add_flag("--force", args->force, "replace existing --json / --html files");
  cmd->add_flag("--measure", args->measure,
                "time each opfuse replacement here at the recorded shapes instead of estimating it from bandwidth "
                "(for a CPU trace recorded on this machine; loads LibTorch, about 0.5 s)");

  return [cmd, args]() {
    if (!cmd->parsed()) return -1;
    if (!args->json.empty()) report::refuse_overwrite(args->json, args->force);
    if (!args->html.empty()) report::refuse_overwrite(args->html, args->force);
    const std::vector<analyze::Rule> rules = analyze::rule_set(args->rules, !args->no_default_rules);
    const auto start = std::chrono::steady_clock::now();
    const analyze::Analysis before = analyze_one(args->traces[0], *args, rules);
    std::fputs(report::format_analysis(before, args->top).c_str(), stdout);
    nlohmann::json json = report::analysis_json(before);
    if (args->traces.size() == 2) {
      const analyze::Analysis after = analyze_one(args->traces[1], *args, rules);
      std::fputs(("\n" + report::format_analysis(after, args->top)).c_str(), stdout);
      const analyze::Diff d = analyze::diff(before, after);
      std::fputs(report::format_diff(d, after, args->top).c_str(), stdout);
      report::add_diff(json, d, after);
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stdout, "\nanalysed in %.2f s\n", seconds);
    if (!args->json.empty()) report::write_json(args->json, json, args->force);
    if (!args->html.empty()) report::write_text(args->html, report::analysis_html(json), args->force);
    return 0;
  };
}

}  // namespace opfuse::cli
