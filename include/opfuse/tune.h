// The closed loop behind `opfuse tune`: profile the baseline, analyze its trace, plan a rewrite per
// finding, verify each (outputs and every parameter gradient), measure baseline and tuned
// alternating in one process, keep what verified and gained, re-profile and diff.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "opfuse/analyze.h"
#include "opfuse/measure.h"

namespace opfuse::profile {
class Recorder;  // opfuse/profile.h
}

namespace opfuse::tune {

class Workload;  // opfuse/workload.h (LibTorch types; the report needs none of them)

// What makes the recorder of each profile; empty: opfuse's own profiler.
using RecorderFactory = std::function<std::shared_ptr<profile::Recorder>()>;

// One positional input of a TorchScript model's forward, as --input-shape gives it:
// "16,3,224,224" (float32, normal), "8,64:int64:32000" (integers uniform in [0, 32000): token
// ids), "8,64:bool" (a mask that keeps everything: all true).
struct InputSpec {
  std::vector<int64_t> shape;
  std::string dtype = "float32";  // float32 | float64 | bfloat16 | int64 | int32 | bool
  int64_t high = 0;               // integer inputs: values below it
};
// Throws std::invalid_argument quoting `text` and saying what is wrong.
InputSpec parse_input_spec(const std::string& text);
std::string to_string(const InputSpec& spec);  // parses back to the same spec

struct TuneOptions {
  std::string model = "efficientnet-b0";  // a built-in model, or a TorchScript FILE.pt
  int image_size = 128;
  int batch_size = 16;
  std::vector<InputSpec> inputs;  // TorchScript models: forward's positional inputs, batch first
  std::string sample_unit = "images";  // what images_per_sec counts: images, sequences, samples: the input, batch first
  std::string loss = "ce";           // ce (class labels) | mse (a random target)
  int num_classes = 1000;            // built-in models
  int steps = 3;                     // timed steps per variant and round
  int rounds = 5;                    // measurement rounds, after a warm-up
  int max_rounds = 20;               // more rounds, up to this, while a gain's interval straddles min_gain
  int warmup = 2;
  int profile_steps = 2;
  double min_gain = 0.02;  // kept when its gain's interval lies above this, rolled back when below
  bool keep_inconclusive = false;  // keep a replacement whose interval still straddles min_gain
  double lr = 0.01;
  uint64_t seed = 0;
  int threads = 0;  // 0: all cores
  std::vector<analyze::Rule> rules;
  std::string out_dir;  // where traces and the tuned model go; must exist
  bool measure_ops = true;  // time opfuse ops at the trace's shapes for the saving estimates
  RecorderFactory recorder;  // what profiles (Python: torch.profiler on request)
};

// Verification runs baseline and rewritten model on the same input, parameters and random streams
// (dropout, drop connect), once in float64 — does the rewrite compute the same function? — and
// once in float32 — do its kernels, as training uses them, agree? For the output and each
// parameter gradient: max |tuned − baseline| ≤ tolerance · (max |baseline| + M), where M is the
// largest magnitude among all of them, so a gradient that is zero in exact arithmetic (a bias
// feeding a BatchNorm, which holds only rounding noise) is not judged against its own noise.
// In float32 the allowance also holds kRoundingFactor times what nudging the baseline's input by
// kRoundingNudge (a few ulps) changes: small batches through BatchNorm amplify rounding.
inline constexpr double kFloat64Tolerance = 1e-9;
inline constexpr double kFloat32Tolerance = 1e-4;
inline constexpr double kRoundingNudge = 1e-6;
inline constexpr double kRoundingFactor = 4;

struct Verdict {
  bool passed = false;
  double float64_error = 0, float32_error = 0;  // largest |tuned − baseline| / (max |baseline| + M)
  double margin = 0;  // the largest deviation over its allowance: ≤ 1 passes
  std::string worst;  // the tensor (and precision) with the largest deviation over its allowance
  std::string error;  // set when the rewritten model failed to run
  std::string float64_skipped;  // why only float32 was compared (the baseline itself fails in float64)
};

enum class Decision { kept, rolled_back, inconclusive };
const char* decision_name(Decision d);  // "kept" | "rolled back" | "inconclusive"

// Kept when the whole interval is at or above min_gain, or when it lies above zero and the median
// clears min_gain (a real gain is not thrown away for its interval's width); rolled back when the
// interval lies below min_gain; otherwise inconclusive. min_gain ≤ −1 keeps everything.
Decision decide(double gain, const measure::Interval& ci, double min_gain);

struct Replacement {
  std::string rule, rewrite;
  int places = 0;  // modules or graph matches it changed
  Verdict verdict;
  bool measured = false;
  double gain = 0;  // step time of the variant before it / its own, − 1 (median of paired rounds)
  measure::Interval gain_ci;
  int rounds = 0;   // paired rounds behind the interval
  Decision decision = Decision::rolled_back;
  bool kept = false;
  bool kept_as_group = false;  // too small or unclear alone; kept because such rewrites together cleared min_gain
  // The analysis' saving for the rule as a gain of the measured step, when it made one, and
  // whether the measured interval excludes it.
  double estimated_gain = 0;
  bool has_estimate = false, estimate_disagrees = false;
  std::string why;  // why it was not kept
  // Kept: the CPU memory peak of the baseline with this rewrite alone, from a profile of its own
  // (bytes; −1: not measured). Side::analysis' memory holds the baseline's and the tuned model's.
  int64_t peak_memory_bytes = -1;
  std::string memory_trace;  // the profile it comes from
};

// Whether a rewrite not kept alone is timed with the others like it, to be kept as a group: its
// gain is inconclusive, or real (interval above zero) but below min_gain.
bool worth_a_group(const Replacement& r);

struct NotApplied {
  std::string rule, why;
};

struct Side {
  std::string variant;      // what the model ran, e.g. "swish=fused se_gate=composite"
  measure::Series step_ms;  // ms per step, one per round (among ranks, the slowest rank's)
  std::vector<double> rank_step_ms;  // among ranks: each rank's own median step time, by rank
  // Derived from the step time (samples per step / median step time), never measured apart;
  // TuneResult::sample_unit says what a sample is.
  double images_per_sec = 0;
  measure::Interval images_per_sec_ci;
  double ops_per_step = 0;  // host ops in a profiled step
  std::string trace;                    // the profile written
  analyze::Analysis analysis;
};

// What a rule's chains cost per step, before and after, from the two traces.
struct RuleTime {
  std::string rule;
  double ops_per_step_before = 0, ops_per_step_after = 0;  // the chains' small ops
  double us_per_step_before = 0, us_per_step_after = 0;    // the chains, then their fused op
};

struct TuneResult {
  std::string model;
  int image_size = 0, batch_size = 0, steps = 0, rounds = 0, threads = 0;
  int ranks = 1;  // processes that trained together (torch.distributed); batch_size is all of theirs
  std::vector<int64_t> input_shape;  // TorchScript models: the first input's
  std::vector<std::string> inputs;   // TorchScript models: every input, as --input-shape gives it
  std::string sample_unit = "images";  // what images_per_sec counts: images, sequences, samples
  Side baseline, tuned;
  double speedup = 1;  // baseline / tuned step time, median of paired rounds
  measure::Interval speedup_ci{1, 1};
  // The tuned step as the baseline's critical path predicts it: the baseline's measured step less
  // the kept rewrites' estimated savings on its path, in proportion (0: no prediction).
  double predicted_step_ms = 0;
  std::string not_predicted;  // why there is no prediction, where a kept rewrite has no estimate
  measure::Machine machine;  // the busier of the measurements
  measure::Environment environment;
  std::vector<Replacement> replacements;
  std::vector<NotApplied> not_applied;
  std::vector<RuleTime> rule_times;
  analyze::Diff diff;
  std::vector<std::string> saved;  // the tuned model's files
  bool any_verified = false;
};

struct Hooks {
  std::function<void(const std::string& stage)> stage;
  std::function<void(int done, int total)> progress;
  std::function<void(const analyze::Analysis&)> analysed;  // the baseline's findings, as soon as known
  std::function<void(const std::string&)> warning;         // environment and busy-machine warnings
};

// Throws std::invalid_argument naming the bad option (or the model file) of a built-in or
// TorchScript model.
void validate(const TuneOptions& options);
// The options every workload's loop reads (steps, rounds, out_dir, …).
void validate_loop(const TuneOptions& options);

// How a workload is profiled: as tune profiles its baseline, and opfuse.profile() a Python model.
struct ProfileOptions {
  int warmup = 3;      // steps first; the last few (after the first) give the step's unprofiled time
  int steps = 2;       // steps profiled
  int first_step = 0;  // the first profiled step's number, for "ProfilerStep#N" (0: warmup + 1)
  RecorderFactory recorder;
  std::function<void(int done, int total)> progress;  // over the warm-up
};
// Warms w up and writes the profile of its next steps to path: a Chrome trace in Kineto's layout
// with opfuse's metadata (the step's unprofiled time among it, for analyze). w trains on.
void record_profile(Workload& w, const ProfileOptions& options, const std::string& path);

// Verifies `candidate` against `baseline` in float64 and float32 (neither is changed: both run as
// clones). Also what opfuse.patch() runs for each rewrite.
Verdict verify(const Workload& baseline, const Workload& candidate, uint64_t seed);
// "failed verification (gradient of _fc.weight off by 0.31)", for a verdict that did not pass.
std::string rejection(const Verdict& v);

// The loop on the model options.model names. Throws std::invalid_argument for bad options or a
// model that cannot be loaded.
TuneResult tune(const TuneOptions& options, const Hooks& hooks = {});

// The loop on any workload (a Python model's, from the Python package): `pristine` is only
// cloned, never changed. `tuned`, when given, receives the tuned workload (the pristine one's
// clone with the kept rewrites) when any rewrite verified.
TuneResult tune(const Workload& pristine, const TuneOptions& options, const Hooks& hooks,
                std::shared_ptr<Workload>* tuned = nullptr);

// Applies to `model` itself, one after another, every rewrite of the rules whose result still
// verifies (on a clone) against the model as it was; what failed leaves the model as it was.
// opfuse.patch() and `opfuse rewrite` run it. Returns each rewrite that applied: places, verdict, kept.
std::vector<Replacement> patch(Workload& model, const std::vector<analyze::Rule>& rules, uint64_t seed);

// `opfuse rewrite`: the TorchScript rewrites of every rule applied and verified on inputs made
// as options.inputs says; the rewritten module is written to out_path only when at least one verified.
struct RewriteResult {
  std::vector<Replacement> replacements;
  bool written = false;
};
RewriteResult rewrite_file(const std::string& in_path, const std::string& out_path, const TuneOptions& options);

}  // namespace opfuse::tune
