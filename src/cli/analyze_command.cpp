// opfuse analyze TRACE [TRACE2]: findings for any trace; with two, also the before/after diff.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "cli/plugin.h"
#include "opfuse/analyze.h"
#include "opfuse/report.h"
#include "opfuse/report_html.h"

namespace opfuse::cli {
namespace {

struct AnalyzeArgs {
  std::string traces[2];  // the second is empty without a diff
  std::vector<std::string> rules;
  bool no_default_rules = false;
  std::string backend = "auto";
  int top = 15;
  std::string json, html;
  bool force = false, measure = false, all = false;
};

analyze::Analysis analyze_one(const std::string& path, const AnalyzeArgs& args, const std::vector<analyze::Rule>& rules) {
  const trace::Trace t = trace::read_trace(path);
  if (t.dialect == trace::Dialect::unknown)
    throw std::invalid_argument(fmt::format(
        "{}: not a trace opfuse recognises (no cpu_op, Operator, kernel, CANN or legacy-profiler events) at byte 0", path));
  analyze::Options options;
  options.timeline = !args.html.empty();  // only the page draws it
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

// "a.json" and "./a.json" are one file; so are two paths through a link.
bool same_file(const std::string& a, const std::string& b) {
  if (a == b) return true;
  if (report::is_stdout(a) || report::is_stdout(b)) return false;
  auto resolved = [](const std::string& p, std::error_code& ec) {
    return std::filesystem::weakly_canonical(std::filesystem::absolute(p), ec).lexically_normal();
  };
  std::error_code ea, eb;
  const auto ca = resolved(a, ea), cb = resolved(b, eb);
  return !ea && !eb && ca == cb;
}

// Every output is checked before a trace is read: a typo in a path fails at once, not after the
// analysis. One file for both outputs would keep only the last written.
void check_outputs(const AnalyzeArgs& args) {
  if (!args.json.empty()) report::check_output_path(args.json, args.force);
  if (!args.html.empty()) report::check_output_path(args.html, args.force);
  if (!args.json.empty() && !args.html.empty() && same_file(args.json, args.html))
    throw std::invalid_argument(fmt::format("{}: given for both --json and --html; give each its own file",
                                            report::is_stdout(args.json) ? "- (stdout)" : args.json));
}

}  // namespace

Run add_analyze(CLI::App& app) {
  auto args = std::make_shared<AnalyzeArgs>();
  auto* cmd = app.add_subcommand("analyze", "Find small-op chains in a trace, name their fused replacement and its saving");
  // Two positionals rather than one taking 1-2 values, so the usage line reads TRACE [TRACE2].
  cmd->add_option("TRACE", args->traces[0], "a Chrome trace (.json or .json.gz)")->required()->check(CLI::ExistingFile);
  cmd->add_option("TRACE2", args->traces[1], "a second trace, diffed against the first (before -> after)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--rules", args->rules, "also apply the rules in FILE (opfuse YAML or the Ascend advisor's file); they take precedence over the built-in ones")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--no-default-rules", args->no_default_rules, "apply only the --rules files");
  cmd->add_option("--backend", args->backend, "whose replacements to name")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda", "npu"}));
  cmd->add_option("--top", args->top, "rows per table")->capture_default_str()->check(CLI::Range(1, 100000));
  cmd->add_flag("--all", args->all,
                "also list the findings with no estimated saving (always in --json and --html, sorted last)");
  cmd->add_option("--json", args->json,
                  "write the analysis as JSON to FILE; '-': to stdout, and the tables go to stderr");
  cmd->add_option("--html", args->html, "write a self-contained report page to FILE (not the --json file; '-': to stdout)");
  cmd->add_flag("--force", args->force, "replace existing --json / --html files");
  cmd->add_flag("--measure", args->measure,
                "time each opfuse replacement here at the recorded shapes instead of estimating it from bandwidth "
                "(for a CPU trace recorded on this machine; loads LibTorch, about 0.5 s)");

  return [cmd, args]() {
    if (!cmd->parsed()) return -1;
    check_outputs(*args);
    const std::vector<analyze::Rule> rules = analyze::rule_set(args->rules, !args->no_default_rules);
    const auto start = std::chrono::steady_clock::now();
    // Both traces are read before anything is printed: a bad second one fails with one line.
    const analyze::Analysis before = analyze_one(args->traces[0], *args, rules);
    std::optional<analyze::Analysis> after;
    if (!args->traces[1].empty()) after = analyze_one(args->traces[1], *args, rules);
    // With --json -, stdout is the JSON alone, for a script to read; people get the tables on stderr.
    std::FILE* tables = report::is_stdout(args->json) || report::is_stdout(args->html) ? stderr : stdout;
    std::fputs(report::format_analysis(before, args->top, args->all).c_str(), tables);
    nlohmann::json json = report::analysis_json(before);
    if (after) {
      std::fputs(("\n" + report::format_analysis(*after, args->top, args->all)).c_str(), tables);
      const analyze::Diff d = analyze::diff(before, *after);
      std::fputs(report::format_diff(d, *after, args->top).c_str(), tables);
      report::add_diff(json, d, *after);
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(tables, "\nanalysed in %.2f s\n", seconds);
    if (!args->json.empty()) report::write_json(args->json, json, args->force);
    if (!args->html.empty()) {
      report::add_timelines(json, before, after ? &*after : nullptr);  // after --json: the page alone carries it
      report::write_text(args->html, report::analysis_html(json), args->force);
    }
    return 0;
  };
}

}  // namespace opfuse::cli
