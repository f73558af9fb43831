// Turning results into what people and scripts read: terminal tables and JSON.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "opfuse/analyze.h"
#include "opfuse/bench.h"
#include "opfuse/measure.h"
#include "opfuse/train.h"
#include "opfuse/tune.h"

namespace opfuse::report {

using Row = std::vector<std::string>;

// Columns padded to their widest cell; numeric-looking cells right-aligned.
std::string format_table(const Row& header, const std::vector<Row>& rows);

// Measurement: [lo, hi] (null for an unbounded end), the machine's load, the environment.
nlohmann::json interval_json(const measure::Interval& interval);
nlohmann::json machine_json(const measure::Machine& machine);
std::string format_machine(const measure::Machine& machine);
nlohmann::json environment_json(const measure::Environment& environment);
std::string format_environment(const measure::Environment& environment);  // a line, then its warnings

std::string format_op_bench(const bench::OpBenchResult& result);
nlohmann::json op_bench_json(const bench::OpBenchResult& result);

nlohmann::json train_json(const train::TrainResult& result);
// One per-step line in the reference's style: current (running mean) of time, data time, loss.
std::string format_step(const train::StepRecord& step, int total, double mean_step_ms, double mean_data_ms,
                        double mean_loss);
std::string format_train_summary(const train::TrainResult& result);
std::string format_compare(const train::CompareResult& result);
nlohmann::json compare_json(const train::CompareResult& result);

// analyze: the summary, the top ops and the findings, for a terminal; `top` rows per table.
// Findings with no estimated saving (listed last) are counted but left out unless `all`.
std::string format_analysis(const analyze::Analysis& a, int top, bool all = false);
std::string format_diff(const analyze::Diff& d, const analyze::Analysis& after, int top);
// {"trace", "ops", "device", "findings", "diff": null}; add_diff fills "diff".
nlohmann::json analysis_json(const analyze::Analysis& a);
void add_diff(nlohmann::json& analysis, const analyze::Diff& d, const analyze::Analysis& after);
// Many ranks: each rank's step time, the slowest and how far behind the median rank, the findings
// merged across ranks; add_ranks adds "ranks", "ranks_per", "slowest_rank", "rank_findings".
std::string format_ranks(const analyze::Ranks& r, int top);
void add_ranks(nlohmann::json& analysis, const analyze::Ranks& r);
// {"per": "step"|"total", "count", "top": [...]}: the top 50 modules / device kernels by time.
nlohmann::json modules_json(const analyze::Analysis& a);
nlohmann::json kernels_json(const analyze::Analysis& a);
// The timeline of one step, for the HTML page only (it runs to megabytes): "timeline" for the
// first analysis, "diff.after.timeline" for the second (after add_diff).
nlohmann::json timeline_json(const analyze::Timeline& t);
void add_timelines(nlohmann::json& page, const analyze::Analysis& before, const analyze::Analysis* after);

// One trace's analysis, or two with their diff, as `opfuse analyze` and opfuse.analyze give it:
// the tables (each side's, then the diff), the JSON, and with `page` the HTML page, which alone
// carries the timelines (analysed with FileOptions::timeline).
struct AnalysisOutputs {
  std::string text;
  nlohmann::json json;
  std::string html;
};
AnalysisOutputs analysis_outputs(const analyze::Analysis& before, const analyze::Analysis* after, int top, bool all,
                                 bool page);

// tune: the summary in the reference's terms (images/s, ops per step, time under each fused
// chain, each replacement with its verified error and measured gain), and report.json.
std::string format_tune(const tune::TuneResult& r);
std::string format_replacements(const std::vector<tune::Replacement>& replacements);
nlohmann::json tune_json(const tune::TuneResult& r);
nlohmann::json replacement_json(const tune::Replacement& r);
// The analyze page's object for a tune run: the baseline's analysis, the diff, and "tune".
nlohmann::json tune_page(const tune::TuneResult& r);

// Output files. "-" names stdout (for --json -). check_output_path throws std::invalid_argument
// naming PATH, with the OS's reason, unless PATH can be written: its folder exists and takes a
// file, it is no folder, and it does not exist yet unless overwrite is set. Commands call it
// before any work; write_* call it again before writing.
bool is_stdout(const std::string& path);
void check_output_path(const std::string& path, bool overwrite);
void write_json(const std::string& path, const nlohmann::json& value, bool overwrite);
void write_text(const std::string& path, const std::string& text, bool overwrite);

}  // namespace opfuse::report
