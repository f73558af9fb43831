// opfuse analyze TRACE [TRACE2]: findings for any trace; with two, also the before/after diff;
// with a folder or a glob of rank traces, the ranks side by side.
#include <fmt/format.h>
#include <glob.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

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
  int64_t steps = 0;  // the training steps a trace without ProfilerStep markers holds
  std::string json, html;
  bool force = false, measure = false, all = false;
};

analyze::Analysis analyze_one(const std::string& path, const AnalyzeArgs& args, const std::vector<analyze::Rule>& rules) {
  analyze::FileOptions options;
  options.backend = args.backend;
  options.steps = args.steps;
  options.timeline = !args.html.empty();  // only the page draws it
  // Timing an opfuse op here loads LibTorch, which costs more than the whole analysis: asked for.
  if (args.measure) {
    const auto time_op = reinterpret_cast<TimeFusedOp>(torch_symbol("opfuse_time_fused_op"));
    options.measure = [time_op](const std::string& op, const std::string& dims) { return time_op(op.c_str(), dims.c_str()); };
    options.measure_roofline = [](int threads) {
      const auto peaks = reinterpret_cast<MachineRoofline>(torch_symbol("opfuse_machine_roofline"));
      analyze::Roofline r;
      if (peaks(threads, &r.flops_per_s, &r.bytes_per_s)) r.threads = threads, r.source = "measured here";
      return r;
    };
  }
  return analyze::analyze_file(path, rules, options);
}

bool is_glob(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// name ends in KIND.json or KIND.json.gz.
bool is_trace_name(const std::string& name, const std::string& kind) {
  auto ends = [&name](const std::string& tail) {
    return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  return ends(kind + ".json") || ends(kind + ".json.gz");
}

// The rank traces a folder (its .json and .json.gz files) or a glob names, sorted; empty for a
// single trace file.
std::vector<std::string> rank_traces(const std::string& arg) {
  std::vector<std::string> paths;
  if (std::filesystem::is_directory(arg)) {
    // Named as traces (Kineto's "*.pt.trace.json", opfuse's "rank0.baseline.trace.json") when
    // any are, so a report.json beside them is not taken for one.
    for (const std::string& kind : {std::string(".trace"), std::string()}) {
      for (const auto& entry : std::filesystem::directory_iterator(arg))
        if (entry.is_regular_file() && is_trace_name(entry.path().filename().string(), kind)) paths.push_back(entry.path().string());
      if (!paths.empty()) break;
    }
    if (paths.empty()) throw std::invalid_argument(fmt::format("{}: no .json or .json.gz traces in this folder", arg));
  } else if (is_glob(arg) && !std::filesystem::exists(arg)) {
    glob_t found{};
    if (glob(arg.c_str(), 0, nullptr, &found) == 0)
      for (size_t i = 0; i < found.gl_pathc; ++i)
        if (std::filesystem::is_regular_file(found.gl_pathv[i])) paths.push_back(found.gl_pathv[i]);
    globfree(&found);
    if (paths.empty()) throw std::invalid_argument(fmt::format("{}: no trace matches", arg));
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

// Every trace analysed, on up to one thread per core while the files in flight fit in the
// largest one's size: a job's equal rank traces go one at a time (each large one parsed on all
// cores by the reader), so memory stays one trace's whatever the number of ranks.
std::vector<analyze::Analysis> analyze_all(const std::vector<std::string>& paths, const AnalyzeArgs& args,
                                           const std::vector<analyze::Rule>& rules) {
  std::vector<uintmax_t> bytes;
  for (const auto& p : paths) bytes.push_back(std::filesystem::file_size(p));
  const uintmax_t budget = *std::max_element(bytes.begin(), bytes.end());
  std::vector<analyze::Analysis> out(paths.size());
  std::mutex mu;
  std::condition_variable freed;
  size_t next = 0;
  uintmax_t in_flight = 0;
  std::exception_ptr failure;
  auto work = [&] {
    for (;;) {
      size_t i = 0;
      {
        std::unique_lock<std::mutex> lock(mu);
        freed.wait(lock, [&] { return next >= paths.size() || failure || in_flight == 0 || in_flight + bytes[next] <= budget; });
        if (next >= paths.size() || failure) return;
        i = next++;
        in_flight += bytes[i];
      }
      try {
        out[i] = analyze_one(paths[i], args, rules);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!failure) failure = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mu);
      in_flight -= bytes[i];
      freed.notify_all();
    }
  };
  std::vector<std::thread> threads;
  const size_t workers = std::min<size_t>(paths.size(), std::max(1u, std::thread::hardware_concurrency()));
  for (size_t t = 0; t < workers; ++t) threads.emplace_back(work);
  for (auto& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);
  return out;
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

std::FILE* tables_stream(const AnalyzeArgs& args) {
  // With --json -, stdout is the JSON alone, for a script to read; people get the tables on stderr.
  return report::is_stdout(args.json) || report::is_stdout(args.html) ? stderr : stdout;
}

// The slowest rank's analysis in full, then every rank's step time and the merged findings.
int analyze_ranks(const std::vector<std::string>& paths, const AnalyzeArgs& args, const std::vector<analyze::Rule>& rules,
                  std::chrono::steady_clock::time_point start) {
  const std::vector<analyze::Analysis> analyses = analyze_all(paths, args, rules);
  const analyze::Ranks ranks = analyze::compare_ranks(analyses);
  const auto& slowest_time = *std::find_if(ranks.ranks.begin(), ranks.ranks.end(),
                                           [&](const analyze::RankTime& r) { return r.rank == ranks.slowest_rank; });
  const analyze::Analysis* slowest = &*std::find_if(analyses.begin(), analyses.end(), [&](const analyze::Analysis& a) {
    return a.trace.path == slowest_time.trace;
  });
  std::FILE* tables = tables_stream(args);
  std::fprintf(tables, "the slowest rank, %lld:\n", static_cast<long long>(ranks.slowest_rank));
  std::fputs(report::format_analysis(*slowest, args.top, args.all).c_str(), tables);
  std::fputs(report::format_ranks(ranks, args.top).c_str(), tables);
  nlohmann::json json = report::analysis_json(*slowest);
  report::add_ranks(json, ranks);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(tables, "\n%zu traces analysed in %.2f s\n", paths.size(), seconds);
  if (!args.json.empty()) report::write_json(args.json, json, args.force);
  if (!args.html.empty()) {
    report::add_timelines(json, *slowest, nullptr);
    report::write_text(args.html, report::analysis_html(json), args.force);
  }
  return 0;
}

}  // namespace

Run add_analyze(CLI::App& app) {
  auto args = std::make_shared<AnalyzeArgs>();
  auto* cmd = app.add_subcommand("analyze", "Find small-op chains in a trace, name their fused replacement and its saving");
  // Two positionals rather than one taking 1-2 values, so the usage line reads TRACE [TRACE2].
  cmd->add_option("TRACE", args->traces[0],
                  "a Chrome trace (.json or .json.gz); or a folder or a quoted glob of one trace per rank ('run/rank*.json')")
      ->required()
      ->check([](const std::string& p) {
        return std::filesystem::exists(p) || is_glob(p) ? std::string() : p + ": no such file or folder";
      });
  cmd->add_option("TRACE2", args->traces[1], "a second trace, diffed against the first (before -> after)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--rules", args->rules, "also apply the rules in FILE (opfuse YAML or the Ascend advisor's file); they take precedence over the built-in ones")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--no-default-rules", args->no_default_rules, "apply only the --rules files");
  cmd->add_option("--backend", args->backend, "whose replacements to name")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda", "npu", "mtia"}));
  cmd->add_option("--top", args->top, "rows per table")->capture_default_str()->check(CLI::Range(1, 100000));
  cmd->add_option("--steps", args->steps,
                  "the training steps each trace holds, when it has no ProfilerStep markers: times are then per step "
                  "(without markers or this, they are totals over the trace)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
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
    const std::vector<std::string> ranks = rank_traces(args->traces[0]);
    if (!ranks.empty()) {
      if (!args->traces[1].empty())
        throw std::invalid_argument(fmt::format("{}: a folder of ranks is analysed alone, not diffed against {}",
                                                args->traces[0], args->traces[1]));
      return analyze_ranks(ranks, *args, rules, start);
    }
    // Both traces are read before anything is printed: a bad second one fails with one line.
    const analyze::Analysis before = analyze_one(args->traces[0], *args, rules);
    std::optional<analyze::Analysis> after;
    if (!args->traces[1].empty()) after = analyze_one(args->traces[1], *args, rules);
    const report::AnalysisOutputs out =
        report::analysis_outputs(before, after ? &*after : nullptr, args->top, args->all, !args->html.empty());
    std::FILE* tables = tables_stream(*args);
    std::fputs(out.text.c_str(), tables);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(tables, "\nanalysed in %.2f s\n", seconds);
    if (!args->json.empty()) report::write_json(args->json, out.json, args->force);
    if (!args->html.empty()) report::write_text(args->html, out.html, args->force);
    return 0;
  };
}

}  // namespace opfuse::cli
