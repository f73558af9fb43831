// Trace → Analysis: the op table, rule matches (named fusions), mined chains (unnamed ones),
// and what each would save. No LibTorch here: timing an opfuse op is passed in as a function.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "opfuse/trace.h"

namespace opfuse::analyze {

enum class Backend { cpu, cuda, npu, mtia };
const char* backend_name(Backend b);
Backend parse_backend(const std::string& name);  // throws std::invalid_argument
Backend detect_backend(const trace::Trace& trace);

// A regex over dash-joined op names ("sigmoid-(empty_like)?-(fill_)?-(rsub|sub_)-mul"),
// compiled to match whole names; names are compared without their "aten::" prefix. It is
// matched as an automaton over the names it mentions, so a match costs a few integer compares
// per op and allocates nothing.
class Pattern {
 public:
  explicit Pattern(const std::string& text);  // throws std::invalid_argument naming the position
  const std::string& text() const { return text_; }
  // The op names the pattern mentions, each once.
  const std::vector<std::string>& names() const { return names_; }
  // The longest match of ops[begin..n), or 0. `name_of[op]` is the index in names() of that op's
  // name, or −1 for a name the pattern never mentions (ops are any dense ids: a trace's strings).
  size_t match(const uint32_t* ops, size_t n, size_t begin, const std::vector<int16_t>& name_of) const;
  // The same over names already normalised (for tests and one-off use).
  size_t match(const std::vector<const std::string*>& names, size_t begin) const;
  // Whether a match can begin with this name (always true for a pattern that can match nothing).
  bool can_start(const std::string& name) const;

  struct State {  // name ≥ 0: consume that name, go to `next`; kSplit: go to next and other
    int name, next, other;
  };
  static constexpr int kSplit = -1, kAccept = -2;

 private:
  std::string text_;
  std::vector<std::string> names_;
  std::vector<State> states_;
  int start_ = 0;
  std::vector<char> first_;  // per name: a match can begin with it (a quick reject)
  bool nullable_ = false;    // it can match nothing, so first_ does not apply
};

enum class Shapes { any, same, broadcast };
// The layout a pattern asks of its ops' 4-d tensor inputs: `contiguous`, torch's default NCHW
// (a tensor of one channel or one pixel is channels-last too, so it neither fits nor bars).
enum class MemoryFormat { any, contiguous };

struct RulePattern {
  std::shared_ptr<Pattern> pattern;
  std::string measure;  // the opfuse op to time at the recorded shapes ("" → bandwidth model)
  Shapes shapes = Shapes::any;
  int passes = 0;       // full-size tensor passes the fused op makes (0: inputs + one output)
  std::string calls;    // the measured op runs once per op of this name in the match ("": once)
  // The measured op's variant that the matched chain is: reference (the chain as models write
  // it), aten (torch's own op) or none (no variant: the op's own time stands for the chain's).
  std::string runs_as = "reference";
  MemoryFormat memory_format = MemoryFormat::any;  // any: strides are not asked
};

// A TorchScript IR pattern and its replacement (torch::jit::SubgraphRewriter's form), for
// `opfuse rewrite` and `opfuse tune` on scripted models.
struct GraphRewrite {
  std::string pattern, replacement;
  // The pattern spans module calls (a BatchNorm2d's, then a Swish module's), so the TorchScript
  // module's forward is inlined before it is matched.
  bool inline_calls = false;
};

// How the Python package answers a rule on a Python model: a submodule whose whole forward op
// chain is one of the rule's patterns becomes `module` (a class in opfuse.nn built from the one it
// replaces, keeping its parameters and buffers); chains written inside a forward are rewritten
// with torch.fx, each pair a Python expression over placeholders and its replacement.
// An fx pair: Python expressions. `outputs` names values of the pattern (bound with `h := …`) that
// may be used outside it; the replacement then returns (the pattern's value, those values).
struct FxRewrite {
  std::string pattern, replacement;
  std::vector<std::string> outputs;
};

struct PythonRewrite {
  std::string module;
  std::vector<FxRewrite> fx;
  // The submodule kind (an fx pattern's `silu_module(x)`) that a module computing this rule's
  // whole chain is of.
  std::string kind;
};

struct Rule {
  std::string name, kind;  // kind: elementwise, norm, attention, layout, optimizer, …
  std::vector<RulePattern> patterns;
  std::map<Backend, std::string> replacement;
  std::vector<GraphRewrite> torchscript;
  PythonRewrite python;
  // Layout rules: the memory format (torch's name, "channels_last") the model's 4-d parameters
  // and buffers take, in any front end.
  std::string memory_format;
  // Optimizer rules: the opfuse optimizer (opfuse.optim.<name> in Python, opfuse::optim::<name> in
  // C++) that takes the place of torch's of the same name.
  std::string optimizer;
  int min_children = 0;    // optimizer steps: how many per-parameter ops make it "unfused"
  // Optimizer steps: ops that show a step is fused already, however many groups it has (torch's
  // _fused_adamw_, opfuse::adamw_: each group's one op, so min_children alone would count them).
  std::vector<std::string> fused_by;
  std::string source;      // the file it came from
};

// The rules compiled in from rules/*.yaml.
std::vector<Rule> default_rules();
// An opfuse rule file, or the Ascend advisor's timeline fusion file, read unchanged.
// Throws std::invalid_argument "PATH: … at line N".
std::vector<Rule> load_rules(const std::string& path);
std::vector<Rule> parse_rules(const std::string& yaml_text, const std::string& name);
// The rules of `files`, then (with_defaults) the default ones: a user's rule claims ops first.
std::vector<Rule> rule_set(const std::vector<std::string>& files, bool with_defaults);

struct OpStat {
  std::string name;
  int64_t count = 0;
  double total_us = 0, self_us = 0, device_us = 0;
  // The roofline: the work of the calls whose shapes say it (op_work), and their time (inclusive
  // host time; device time on a device backend). All 0 when no call's work is known.
  double flops = 0, bytes = 0, work_us = 0;
};

// What one call of an op does, from its recorded input shapes (src/analyze/roofline.cpp): the
// floating-point operations and the bytes it must move at least. For the matrix products,
// convolutions, elementwise ops, norms, softmax and attention; zero for any other op or unknown
// shapes. A trace holds no convolution's stride: its output's size (`output`, from the gradient
// its backward received) says it, and without it the convolution is counted at stride 1.
struct Work {
  double flops = 0, bytes = 0;
};
Work op_work(const std::string& op, const std::vector<std::vector<int64_t>>& inputs, const std::vector<std::string_view>& types,
             const std::vector<int64_t>* output = nullptr);
// Whether op_work counts `op` ("aten::mkldnn_convolution" …) as a convolution's forward.
bool convolution_forward(std::string_view op);

// A machine's measured peaks, for the op table's roofline (0: not known). An op whose FLOPs per
// byte fall below peak_flops / peak_bytes is bound by memory bandwidth: fusion is what helps it.
struct Roofline {
  double flops_per_s = 0, bytes_per_s = 0;
  int threads = 0;
  std::string source;  // how they were had: "measured here", "cached in …"
  bool known() const { return flops_per_s > 0 && bytes_per_s > 0; }
};
// Peaks measured earlier on this machine at this many threads (bench::machine_roofline caches
// them), or an unknown Roofline.
Roofline cached_roofline(int threads);
void cache_roofline(const Roofline& r);

struct Location {
  std::string where;
  int64_t count = 0;
  int64_t ops = 0;           // the ops the occurrences here cover
  double est_saving_us = 0;  // of the occurrences here
};

struct Finding {
  std::string rule, kind, pattern, replacement;
  bool mined = false;         // an unnamed chain found by the miner, not by a rule
  bool shape_unknown = false; // rules that ask for shapes matched a chain without them: `rule` lists them
  int64_t occurrences = 0;
  int64_t ops = 0;            // ops the occurrences cover (wrapper ops included)
  double time_us = 0, est_saving_us = 0;  // time_us: the saving's basis, device time on device backends
  double host_us = 0, device_us = 0;     // the matched ops' host time; the device time of what they launched
  std::string estimate;       // how the saving was estimated: "measured opfuse::silu", "bandwidth"
  bool estimated = true;      // false: no estimate holds (a layout change not timed), est_saving_us is 0
  // The critical path (critical_path.cpp): the share of the matched ops' time on it, and so the
  // part of the saving that shortens the step.
  double critical_share = 0, saving_on_path_us = 0;
  std::vector<Location> locations;  // most frequent first
};

// Device time in HolisticTraceAnalysis' get_temporal_breakdown convention. With two or more
// ProfilerStep# markers, only the device events launched (their runtime call, by correlation id)
// before the last step begins are kept: the last step is usually cut short. The window runs from
// the first kept event's start to the last one's end; busy is the union of the kept intervals
// over all the device's streams, so overlapping streams are not counted twice.
struct StreamTime {
  std::string stream;  // the trace's stream id ("7")
  int64_t events = 0;
  double busy_us = 0;  // union of its kept events
};

// Kept kernels only (not memcpy/memset); delays and "shorter" need the launch call in the trace.
struct LaunchStats {
  static constexpr double kSmallKernelUs = 10;
  int64_t kernels = 0, launched = 0;
  double delay_median_us = 0, delay_p90_us = 0;  // launch call start → kernel start
  int64_t shorter_than_launch = 0;               // kernels that ran shorter than their launch call
  double small_kernel_time_pct = 0;              // of kernel time, in kernels under kSmallKernelUs
};

// Ascend's "Overlap Analysis" lanes: the profiler's own split of the device's time into
// Computing, Communication, Communication(Not Overlapped) and Free, by slice name, over the whole
// trace. Shown as the profiler gives it: a summary of the device, never ops.
struct OverlapLane {
  std::string name;  // "Computing"
  int64_t slices = 0;
  double total_us = 0;
};

struct DeviceTime {
  std::string device;                // the trace's pid for it ("0")
  int64_t events = 0, left_out = 0;  // device events kept; left out (launched in the last step or launch unknown)
  int64_t steps = 0;                 // ProfilerSteps the window spans (0: none known, the figures are totals)
  double window_us = 0, busy_us = 0, idle_us = 0;  // totals in the window
  double compute_us = 0, communication_us = 0, memory_us = 0;  // unions: kernels, nccl/gloo kernels, memcpy+memset
  double summed_us = 0, op_linked_us = 0;  // kept events' durations summed (not a union): all; those whose
                                           // launching op is known
  std::vector<StreamTime> streams;
  LaunchStats launch;
  std::vector<OverlapLane> overlap_analysis;  // on the busiest device, where the trace has the lanes
  double overlap_span_us = 0;                 // first start to last end over those lanes
};

// One per device with events, busiest first. The steps are the trace's ProfilerStep markers, or,
// in a trace without them, the starts of the steps inferred from its ops.
std::vector<DeviceTime> device_time(const trace::Trace& trace, const trace::Links& links,
                                    const std::vector<double>& inferred_step_starts = {});

struct Summary {
  std::string path, dialect;
  Backend backend = Backend::cpu;
  int64_t events = 0, skipped = 0, overlapping = 0;
  double duration_us = 0;
  int64_t steps = 0;
  double step_us = 0;  // median ProfilerStep duration (0 without steps)
  // Where the steps came from: "ProfilerStep" (the trace's markers), "given" (Options::steps:
  // then step_us is the span over the steps), "repeated pattern" (no markers, no count, but the
  // top-level ops repeat, whole or nearly, as a training loop's do: step_us is the median repeat;
  // see src/analyze/repeated_steps.h), or "" (none known: times are totals).
  std::string steps_from;
  // opfuse's profiler, with the step's unprofiled time in the trace: that time, and what
  // profiling added per recorded op or scope (the profiled step's excess over it, spread over the
  // events a step records). Savings leave out that cost for the events a chain holds.
  double plain_step_us = 0, profiler_us_per_event = 0;
  bool has_device = false;
  int64_t rank = -1;                // the trace's distributedInfo rank, or -1
  std::vector<DeviceTime> devices;  // busiest first
  std::vector<std::string> warnings;
};

// The critical path through the trace (src/analyze/critical_path.cpp): walked back from the last
// end, through host threads (top-level ops), device streams, launches and the waits between them.
struct CriticalPath {
  double length_us = 0;                        // first start to last end
  double host_us = 0, device_us = 0, idle_us = 0;  // of it: host ops, device events, gaps nothing recorded fills
  std::vector<double> on_path;                 // per event: its µs on the path (top-level host ops, device events)
};
CriticalPath critical_path(const trace::Trace& trace, const trace::Links& links);
// Each finding's critical_share and saving_on_path_us, from the path and the events its matches
// cover (finding_of_event: the finding's index per matched op, else −1).
void what_if(const trace::Trace& trace, const trace::Links& links, const CriticalPath& path,
             const std::vector<int32_t>& finding_of_event, std::vector<Finding>& findings);

// Time per module scope: opfuse's and record_function's scopes (user annotations) where the
// trace has them, else the ops' "Module Hierarchy". Totals over the trace; the report divides by
// the steps.
struct ModuleTime {
  std::string module;
  int64_t calls = 0;
  double total_us = 0;  // inclusive: nested scopes count in their parent too
  double self_us = 0;   // less the nested scopes
};
std::vector<ModuleTime> module_time(const trace::Trace& trace, const trace::Links& links);  // by total, largest first

// Where memory goes, from the allocations the profile recorded (Kineto's "[memory]" events, which
// opfuse's profiler writes too): per device, the peak of the allocator's total, when it came, and
// which blocks hold it then, by module, op and phase of the step.
struct MemoryHolder {
  std::string name;  // a module path, an op ("aten::mm"), or a phase ("forward", "before the profile")
  int64_t bytes = 0, blocks = 0;
};
struct MemoryTime {
  std::string device;                // "cpu", "cuda:0", or the trace's numbers ("type 20:0")
  int64_t allocations = 0, frees = 0;
  int64_t peak_bytes = 0;            // the largest "Total Allocated" (the allocator's own count)
  double peak_at_us = 0;             // since the trace's first event
  std::string peak_step, peak_op;    // the ProfilerStep and the op of the allocation that reached it ("" if none)
  // The blocks live at the peak, largest first. by_phase: what opfuse's profiler says the model
  // held before the profile ("parameters", "gradients", "optimizer state", "inputs"), then the
  // blocks by the part of the step that allocated them ("forward", "backward", "optimizer step",
  // "outside ops"), and "before the profile (other)": the rest of the allocator's total.
  std::vector<MemoryHolder> by_module, by_op, by_phase;
  std::vector<std::pair<double, int64_t>> timeline;  // (µs since the first event, total allocated), the
                                                     // highest point of each of at most kTimelinePoints spans
  static constexpr size_t kTimelinePoints = 400;
};
std::vector<MemoryTime> memory_time(const trace::Trace& trace, const trace::Links& links);  // largest peak first
// The CPU's peak among them (bytes), or −1 when the profile recorded none there.
int64_t cpu_peak_bytes(const std::vector<MemoryTime>& memory);

// Device events by name (kernels, memcpy, memset, device tasks), over the whole trace.
struct KernelStat {
  std::string name;
  int64_t count = 0;
  double total_us = 0;
};
std::vector<KernelStat> kernel_table(const trace::Trace& trace, const trace::Links& links);  // by total, largest first

// One step as a timeline: host threads and device streams as lanes, each slice on the row of its
// nesting depth, coloured by the finding whose chain it belongs to. Times are µs from `begin_us`.
struct TimelineSlice {
  int32_t lane = 0, row = 0;
  double start_us = 0, dur_us = 0;
  int32_t name = 0;         // index into Timeline::names
  int32_t module = -1;      // index into Timeline::names, or −1
  int32_t finding = -1;     // index into Analysis::findings, or −1
};

struct TimelineLane {
  std::string name;  // "thread 7 (python)", "stream 7"
  bool device = false;
  int32_t rows = 1;
};

struct Timeline {
  static constexpr size_t kMaxSlices = 30000;  // what the page draws smoothly and embeds in ~1.5 MB
  std::string step;        // "ProfilerStep#5", or "" for the whole trace
  int64_t steps = 0;       // steps in the trace (the one shown has the median duration)
  double begin_us = 0, dur_us = 0;  // on the trace's clock (µs since Trace::origin_us)
  std::vector<TimelineLane> lanes;
  std::vector<std::string> names;
  std::vector<TimelineSlice> slices;  // by lane, then start
  int64_t left_out = 0;    // slices over kMaxSlices: the deepest and shortest go first
};

// `finding_of_event`: per event, the index of the finding whose chain holds it, or −1.
Timeline step_timeline(const trace::Trace& trace, const trace::Links& links, const std::vector<int32_t>& finding_of_event);

struct Analysis {
  Summary trace;
  std::vector<OpStat> ops;        // by self time, largest first
  std::vector<Finding> findings;  // by estimated saving, largest first
  std::vector<ModuleTime> modules;
  std::vector<KernelStat> kernels;
  std::vector<MemoryTime> memory;    // empty when the profile recorded no allocations
  Roofline roofline;                 // Options::roofline, for the report
  CriticalPath critical_path;        // its summary (on_path is dropped once the findings have their shares)
  std::optional<Timeline> timeline;  // with Options::timeline
};

// Microseconds one call of opfuse op `op` takes at "Input Dims" `dims`, or < 0 when unknown.
using Measure = std::function<double(const std::string& op, const std::string& dims)>;

struct Options {
  Backend backend = Backend::cpu;
  Measure measure;  // empty: every saving comes from the bandwidth model
  int min_chain_occurrences = 2;
  bool timeline = false;  // also lay out one step for the HTML page (costs a pass and its slices)
  Roofline roofline;  // this machine's peaks, for a trace recorded on it (unknown: FLOPs and bytes only)
  // How many training steps the trace holds, for a trace without ProfilerStep markers (0: not
  // known, times stay totals). A trace whose markers count otherwise is refused.
  int64_t steps = 0;
};

Analysis analyze(const trace::Trace& trace, const std::string& path, const std::vector<Rule>& rules,
                 const Options& options);

// How a trace file is analysed, the same from the command line and from Python.
struct FileOptions {
  std::string backend = "auto";  // "auto" (what the trace shows) or a backend's name
  int64_t steps = 0;             // Options::steps
  bool timeline = false;         // Options::timeline
  // Ways to time an opfuse op here and to measure this machine's peaks (at `threads`): both only
  // for a CPU trace, as they say nothing of a device. Without them, savings come from bandwidth
  // and the roofline from the peaks an earlier run cached.
  Measure measure;
  std::function<Roofline(int threads)> measure_roofline;
  int threads = 0;  // the roofline's; 0: this machine's cores
};

// Reads the trace at path and analyses it as what it is. Throws std::invalid_argument naming the
// file for a file that is no trace opfuse knows; a measurement asked of a device trace is left
// out, with a warning in the summary.
Analysis analyze_file(const std::string& path, const std::vector<Rule>& rules, const FileOptions& options);

// Many ranks of one job (a trace per process) side by side.
struct RankTime {
  int64_t rank = 0;
  std::string trace;
  int64_t steps = 0;
  double step_us = 0;  // median ProfilerStep; the whole trace's span when it has no steps
};

// A finding as the ranks saw it: on how many, and its saving per step over those ranks.
struct RankFinding {
  std::string rule, pattern, replacement;
  bool mined = false;
  int ranks = 0;
  double saving_us_min = 0, saving_us_median = 0, saving_us_max = 0;  // per step (per trace without steps)
  double time_us_median = 0;
};

struct Ranks {
  std::vector<RankTime> ranks;  // by rank
  bool per_step = true;         // every trace had steps; otherwise times are per trace
  int64_t slowest_rank = -1;
  double behind_pct = 0;  // the slowest rank's step over the median rank's, − 1, in %
  std::vector<RankFinding> findings;  // by median saving, largest first
};

// The ranks of `analyses`, one per trace: each trace's distributedInfo rank, else the number
// after "rank" in its file name, else its place in the list. Throws std::invalid_argument when two
// traces claim one rank.
Ranks compare_ranks(const std::vector<Analysis>& analyses);

struct OpChange {
  std::string name;
  int64_t count_before = 0, count_after = 0;
  double total_us_before = 0, total_us_after = 0;
};

struct Diff {
  double step_us_before = 0, step_us_after = 0;
  std::vector<OpChange> ops;  // by |time change|, largest first
  std::vector<Finding> vanished, appeared;
};

Diff diff(const Analysis& before, const Analysis& after);

// What the analyses say a change to a model saves, per step, in `before`'s time less what
// profiling added: at each place (a finding's location) where the change altered the chains
// (their count or ops), the saving `before` gave them less the saving `after` gives what is left
// there. A change may reach fewer places than a finding lists, or part of another finding's
// chains (a norm swapped inside add + norm chains): the rest is still found, and costed, after.
double saving_between(const Analysis& before, const Analysis& after);

// A trace's step less what profiling added, when the trace records the step unprofiled (savings
// leave that cost out then), else as profiled. Never more than the profiled step: an unprofiled
// step timed slower is noise in the few warm-up steps it comes from (EfficientNet-B0's: 406 ms
// against 339 ms profiled and 312 ms measured), which would shrink every estimated gain.
double unprofiled_step_us(const Analysis& a);

// "4,3,64,64;;16" → [[4,3,64,64],[],[16]]; "*" dims (nested lists) → -1.
std::vector<std::vector<int64_t>> parse_dims(const std::string& dims);

}  // namespace opfuse::analyze
