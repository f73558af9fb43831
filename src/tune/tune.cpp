// The tune loop: baseline profile → analyze → plan → verify → measure → re-profile → diff.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <filesystem>
#include <thread>

#include "opfuse/bench.h"
#include "opfuse/efficientnet.h"
#include "opfuse/measure.h"
#include "opfuse/profile.h"
#include "opfuse/stats.h"
#include "opfuse/trace.h"
#include "tune/distributed.h"
#include "tune/model_workload.h"

namespace opfuse::tune {
namespace {

void say(const Hooks& h, const std::string& stage) {
  if (h.stage) h.stage(stage);
}

void warn(const Hooks& h, const std::string& warning) {
  if (h.warning) h.warning(warning);
}

// The baseline is profiled right after it is built, while its memory is still settling: at
// B0 128 px (single runs each) its profiled steps ran 1.8× an unprofiled step after 2 warm-up
// steps, 1.2–1.45× after 6 and 1.1–1.4× after 12. Inflated chain times would inflate what the
// analysis says each fusion saves.
constexpr int kProfileWarmup = 12;
// Of them, the last few give the unprofiled step the profile is compared with.
constexpr int kPlainSteps = 3;

// The steps before a profile; returns the median of the last few after the first (which makes
// lazy state), the step unprofiled just before the profile; 0 when there are none.
double warm_up(Workload& w, int steps, const std::function<void(int, int)>& progress) {
  std::vector<double> last;
  for (int i = 0; i < steps; ++i) {
    const double ms = w.step();
    if (i >= 1 && i >= steps - kPlainSteps) last.push_back(ms);
    if (progress) progress(i + 1, steps);
  }
  return last.empty() ? 0 : median(last);
}

// Profiles `steps` steps of w; plain_step_ms, the step's time unprofiled just before (0: not
// timed), lets the analysis take out what profiling added.
void profile_steps(Workload& w, const ProfileOptions& o, int first_step, double plain_step_ms, const std::string& path) {
  const std::shared_ptr<profile::Recorder> recorder = o.recorder ? o.recorder() : profile::opfuse_recorder();
  const std::map<std::string, int64_t> held = w.held_memory();
  w.set_profiling(recorder.get());
  recorder->start();
  try {
    for (int i = 0; i < o.steps; ++i) {
      recorder->push_scope("ProfilerStep#" + std::to_string(first_step + i));
      try {
        w.step();
      } catch (...) {
        recorder->pop_scope();  // a torch.profiler range left open would outlive its profile
        throw;
      }
      recorder->pop_scope();
    }
  } catch (...) {
    recorder->stop();
    w.set_profiling(nullptr);
    throw;
  }
  recorder->stop();
  w.set_profiling(nullptr);
  nlohmann::json metadata = {{"opfuse_version", "0.1.0"},       {"torch_version", TORCH_VERSION},
                             {"model", w.name()},                {"variant", w.describe()},
                             {"threads", at::get_num_threads()}, {"batch_size", w.samples_per_step()},
                             {"memory_before", held}};
  if (w.ranks() > 1) metadata["distributedInfo"] = {{"rank", w.rank()}, {"world_size", w.ranks()}};
  if (plain_step_ms > 0) metadata["plain_step_ms"] = plain_step_ms;
  recorder->write(path, metadata.dump());
}

// How tune profiles a workload warmed up `warmup` steps (0: warm already, its first profiled step
// numbered first_step).
ProfileOptions profiling(const TuneOptions& o, int warmup, int first_step = 0) {
  ProfileOptions p;
  p.warmup = warmup;
  p.steps = o.profile_steps;
  p.first_step = first_step;
  p.recorder = o.recorder;
  return p;
}

// for_page: the report page draws a step of this side (a timeline costs a pass and its slices).
analyze::Analysis profile_and_analyze(Workload& w, const ProfileOptions& p, const TuneOptions& o,
                                      const std::string& path, bool for_page = true) {
  record_profile(w, p, path);
  const trace::Trace t = trace::read_trace(path);
  analyze::Options options;
  options.timeline = for_page;
  if (o.measure_ops)
    options.measure = [](const std::string& op, const std::string& dims) { return bench::time_fused_op(op, dims); };
  options.roofline = bench::machine_roofline(at::get_num_threads());
  return analyze::analyze(t, path, o.rules, options);
}

// The memory peak of the pristine model with one kept rewrite alone, from a profile of its own,
// so each rewrite's effect on memory is measured apart. Two steps make every buffer the step
// keeps (the optimizer's state); a peak needs no more warm-up than that.
int64_t peak_with(const Workload& pristine, const Rewrite& rewrite, const TuneOptions& o, const std::string& path) {
  const std::shared_ptr<Workload> w = pristine.clone();
  rewrite.apply(*w);
  record_profile(*w, profiling(o, std::max(o.warmup, 2)), path);
  const trace::Trace t = trace::read_trace(path);
  return analyze::cpu_peak_bytes(analyze::memory_time(t, trace::build_links(t)));
}

double ops_per_step(const analyze::Analysis& a) {
  int64_t n = 0;
  for (const auto& op : a.ops) n += op.count;
  return static_cast<double>(n) / std::max<int64_t>(1, a.trace.steps);
}

const analyze::Rule* rule_named(const std::vector<analyze::Rule>& rules, const std::string& name) {
  for (const auto& r : rules)
    if (r.name == name) return &r;
  return nullptr;
}

// One replacement per finding a rewrite applies to; the others are listed with the reason.
// Among ranks, on the findings of every rank, and every rank must plan alike.
void plan(const analyze::Analysis& a, const TuneOptions& o, const Workload& baseline, std::vector<Replacement>& planned,
          std::vector<Rewrite>& rewrites, std::vector<NotApplied>& skipped) {
  for (const analyze::Finding& f : merged_findings(baseline, a.findings)) {
    if (f.mined) {
      skipped.push_back({f.rule + " " + f.pattern, "no fused op exists for it yet"});
      continue;
    }
    const analyze::Rule* rule = rule_named(o.rules, f.rule);
    const std::vector<Rewrite> candidates = rule ? baseline.rewrites_for(*rule) : std::vector<Rewrite>{};
    if (candidates.empty()) {
      skipped.push_back({f.rule, fmt::format("no rewrite to {} is known for this model yet", f.replacement)});
      continue;
    }
    bool applied = false;
    std::string why = "its rewrites match nothing in this model";
    for (const auto& rw : candidates) {
      auto trial = baseline.clone();
      const int places = rw.apply(*trial);
      if (places == 0) {
        if (std::string unchanged = trial->why_unchanged(); !unchanged.empty()) why = std::move(unchanged);
        continue;
      }
      Replacement r;
      r.rule = f.rule;
      r.rewrite = rw.name;
      r.places = places;
      planned.push_back(r);
      rewrites.push_back(rw);
      applied = true;
      break;
    }
    if (!applied) skipped.push_back({f.rule, why});
  }
  std::string summary;
  for (const Replacement& r : planned) summary += fmt::format("{}{} ({} places)", summary.empty() ? "" : ", ", r.rule, r.places);
  check_same(baseline, summary.empty() ? "nothing" : summary, "the rewrites that apply to their models");
}

// Each rank's own time per call of each variant; a call's figure is the slowest rank's.
class RankTimes {
 public:
  explicit RankTimes(size_t variants) : calls_(variants) {}
  void add(size_t variant, std::vector<double> per_rank) { calls_[variant].push_back(std::move(per_rank)); }
  // Each rank's median over the last `rounds` calls (the warm-up's calls come first).
  std::vector<double> medians(size_t variant, int rounds) const {
    const auto& calls = calls_.at(variant);
    std::vector<double> out;
    for (size_t r = 0; !calls.empty() && r < calls.back().size(); ++r) {
      std::vector<double> mine;
      for (size_t c = calls.size() - std::min<size_t>(rounds, calls.size()); c < calls.size(); ++c) mine.push_back(calls[c][r]);
      out.push_back(median(mine));
    }
    return out;
  }

 private:
  std::vector<std::vector<std::vector<double>>> calls_;  // [variant][call][rank]
};

// Among ranks, a call's time is the slowest rank's, and all stop in the same round.
measure::Measurement interleave(const std::vector<Workload*>& workloads, const TuneOptions& o, const Hooks& h,
                                const std::function<bool(const measure::Measurement&)>& settled = {}, int rounds = 0,
                                RankTimes* rank_times = nullptr) {
  measure::Options m;
  m.warmup = std::max(1, o.warmup);
  m.rounds = rounds > 0 ? rounds : o.rounds;
  m.max_rounds = rounds > 0 ? rounds : o.max_rounds;
  m.progress = h.progress;
  const Workload& group = *workloads.front();
  if (group.ranks() > 1) {
    m.all_stop = [&group](bool stop) { return first_failure(group, stop ? "" : "more rounds").empty(); };
    m.siblings = sibling_pids(group);
  }
  std::vector<measure::Run> runs;
  for (size_t k = 0; k < workloads.size(); ++k) {
    Workload* w = workloads[k];
    measure::Run own = measure::per_step([w] { return w->step(); }, o.steps);
    runs.push_back([w, own, k, rank_times] {
      std::vector<double> all = each_rank(*w, own());
      const double slowest = *std::max_element(all.begin(), all.end());
      if (rank_times) rank_times->add(k, std::move(all));
      return slowest;
    });
  }
  const auto measuring = [&workloads](bool on) {
    for (Workload* w : workloads) w->set_measuring(on);
  };
  measuring(true);
  try {
    measure::Measurement got = measure::interleave(runs, m, settled);
    measuring(false);
    return got;
  } catch (...) {
    measuring(false);
    throw;
  }
}

// Variant k's gain over variant k − 1: their step-time ratio − 1, paired round by round.
std::pair<double, measure::Interval> gain_of(const measure::Measurement& m, size_t k) {
  const measure::Ratio r = measure::ratio(m, k - 1, k);
  return {r.estimate - 1, {r.ci.lo - 1, r.ci.hi - 1}};
}

void fill(Side& side, const measure::Series& s, int64_t samples_per_step) {
  side.step_ms = s;
  const double per_s = 1000.0 * static_cast<double>(samples_per_step);
  side.images_per_sec = per_s / s.median;
  side.images_per_sec_ci = {per_s / s.ci.hi, per_s / std::max(0.0, s.ci.lo)};
}

const measure::Machine& busier(const measure::Machine& a, const measure::Machine& b) {
  return b.others_share > a.others_share ? b : a;
}

// The rule's finding in an analysis, or null when the trace no longer has its chains.
const analyze::Finding* finding_of(const analyze::Analysis& a, const std::string& rule) {
  for (const auto& f : a.findings)
    if (f.rule == rule) return &f;
  return nullptr;
}

// The baseline's measured step less what its critical path says the kept rewrites take off it;
// 0 (no prediction, and `why`) when a kept rewrite has no estimate (a layout change not timed).
double predicted_step_ms(const TuneResult& r, std::string& why) {
  const analyze::Analysis& a = r.baseline.analysis;
  if (a.critical_path.length_us <= 0 || a.trace.step_us <= 0) return 0;
  double saving = 0;
  for (const Replacement& rep : r.replacements)
    if (rep.kept)
      if (const analyze::Finding* f = finding_of(a, rep.rule)) {
        if (!f->estimated) {
          why = fmt::format("{} has no estimate", rep.rule);
          return 0;
        }
        saving += f->saving_on_path_us;
      }
  const double path_us = a.critical_path.length_us * analyze::unprofiled_step_us(a) / a.trace.step_us;
  return r.baseline.step_ms.median * std::max(0.0, 1 - saving / path_us);
}

// A copy of a variant, warmed and profiled as the baseline is, and analysed: what its rewrite
// left for the analysis to find.
analyze::Analysis analysis_of(const Workload& variant, const TuneOptions& o, const std::string& path) {
  const std::shared_ptr<Workload> w = variant.clone();
  analyze::Analysis a = profile_and_analyze(*w, profiling(o, std::max(o.warmup, kProfileWarmup)), o, path,
                                            /*for_page=*/false);
  std::filesystem::remove(path);
  return a;
}

// The estimate as a gain over the variant measured before it, whose step (less what profiling
// added) it shortens by saved_us. Savings and step stay in a trace's own time: a profiled step
// ran 1.5× a measured one on the Llama-style model, and a trace's saving over a measured step
// inflated every estimate by that ratio.
void set_estimate(Replacement& r, double saved_us, double step_us) {
  if (saved_us <= 0 || step_us <= 0 || saved_us >= step_us) return;
  r.has_estimate = true;
  r.estimated_gain = step_us / (step_us - saved_us) - 1;
  r.estimate_disagrees = r.estimated_gain < r.gain_ci.lo || r.estimated_gain > r.gain_ci.hi;
}

void judge(Replacement& r, const TuneOptions& o) {
  r.decision = decide(r.gain, r.gain_ci, o.min_gain);
  r.kept = r.decision == Decision::kept || (r.decision == Decision::inconclusive && o.keep_inconclusive);
  const std::string measured = measure::format_gain(r.gain, r.gain_ci);
  if (r.decision == Decision::rolled_back)
    r.why = fmt::format("gain {} is below --min-gain {:.1f}%", measured, 100 * o.min_gain);
  else if (r.decision == Decision::inconclusive)
    r.why = fmt::format("gain {} after {} rounds straddles --min-gain {:.1f}%{}", measured, r.rounds,
                        100 * o.min_gain, r.kept ? " (kept: --keep-inconclusive)" : "; not kept without --keep-inconclusive");
}

double ops_of(const analyze::Finding* f) { return f ? static_cast<double>(f->ops) : 0; }
double time_of(const analyze::Finding* f) { return f ? f->time_us : 0; }

// The fused op's own time: ops named as the replacement, or its backward ("opfuse::silu_backward").
double replacement_time(const analyze::Analysis& a, const std::string& op) {
  double us = 0;
  for (const auto& s : a.ops)
    if (!op.empty() && (s.name == op || s.name == op + "_backward")) us += s.total_us;
  return us;
}

bool covers_backward(const analyze::Finding* f) {
  if (f == nullptr) return false;
  for (const auto& l : f->locations)
    if (l.where.size() >= 10 && l.where.compare(l.where.size() - 10, 10, "(backward)") == 0) return true;
  return false;
}

std::string cpu_replacement(const analyze::Rule* rule) {
  if (rule == nullptr) return "";
  const auto it = rule->replacement.find(analyze::Backend::cpu);
  return it == rule->replacement.end() ? "" : it->second;
}

std::vector<RuleTime> rule_times(const TuneResult& r, const TuneOptions& o) {
  std::vector<RuleTime> out;
  const auto& before = r.baseline.analysis;
  const auto& after = r.tuned.analysis;
  const double steps_before = std::max<int64_t>(1, before.trace.steps);
  const double steps_after = std::max<int64_t>(1, after.trace.steps);
  for (const Replacement& rep : r.replacements) {
    // Before and after compare only where the rule matched the backward chains too; otherwise
    // "before" would hold the forward ops and "after" the fused op's forward and backward.
    const analyze::Finding* was = finding_of(before, rep.rule);
    const analyze::Finding* is = finding_of(after, rep.rule);
    if (!rep.kept || !covers_backward(was)) continue;
    const std::string op = cpu_replacement(rule_named(o.rules, rep.rule));
    RuleTime t;
    t.rule = rep.rule;
    t.ops_per_step_before = ops_of(was) / steps_before;
    t.ops_per_step_after = ops_of(is) / steps_after;
    t.us_per_step_before = (time_of(was) + replacement_time(before, op)) / steps_before;
    t.us_per_step_after = (time_of(is) + replacement_time(after, op)) / steps_after;
    out.push_back(t);
  }
  return out;
}

}  // namespace

const char* decision_name(Decision d) {
  switch (d) {
    case Decision::kept: return "kept";
    case Decision::rolled_back: return "rolled back";
    case Decision::inconclusive: return "inconclusive";
  }
  return "";
}

bool worth_a_group(const Replacement& r) {
  return r.measured && r.verdict.passed && !r.kept &&
         (r.decision == Decision::inconclusive || (r.decision == Decision::rolled_back && r.gain_ci.lo > 0));
}

Decision decide(double gain, const measure::Interval& ci, double min_gain) {
  if (min_gain <= -1 || ci.lo >= min_gain || (ci.lo > 0 && gain >= min_gain)) return Decision::kept;
  if (ci.hi < min_gain) return Decision::rolled_back;
  return Decision::inconclusive;
}

namespace {

// More rounds while any variant's gain over the one before is still inconclusive.
std::function<bool(const measure::Measurement&)> settled_by(const TuneOptions& o) {
  return [&o](const measure::Measurement& m) {
    for (size_t k = 1; k < m.variants.size(); ++k)
      if (const auto [gain, ci] = gain_of(m, k); decide(gain, ci, o.min_gain) == Decision::inconclusive) return false;
    return true;
  };
}

// Rewrites each too small to keep alone can together be a gain worth keeping (four of +0.7% to
// +3.4% on llama2.c; Qwen2's add + RMSNorm, rotary and RMSNorm at +0.8% to +1.5%, each interval
// above zero): those are timed together on top of the tuned model, in rounds bounded as the rest,
// and kept together when the group's gain is kept by the same test.
void keep_small_gains_together(Workload& tuned, const std::vector<Rewrite>& rewrites,
                                const std::vector<size_t>& verified, TuneResult& result, const TuneOptions& o,
                                const Hooks& h) {
  std::vector<size_t> group;
  for (size_t i : verified)
    if (worth_a_group(result.replacements[i])) group.push_back(i);
  if (group.size() < 2) return;  // one alone was measured on its own already
  std::vector<std::string> names;
  for (size_t i : group) names.push_back(result.replacements[i].rule);
  say(h, fmt::format("measure: the small gains together ({})", fmt::join(names, ", ")));
  const std::shared_ptr<Workload> before = tuned.clone(), with_group = tuned.clone();
  for (size_t i : group) rewrites[i].apply(*with_group);
  const measure::Measurement m = interleave({before.get(), with_group.get()}, o, h, settled_by(o));
  result.machine = busier(result.machine, m.machine);
  const auto [gain, ci] = gain_of(m, 1);
  const bool keep = decide(gain, ci, o.min_gain) == Decision::kept;
  const std::string together = fmt::format("{} as a group ({}) after {} rounds", measure::format_gain(gain, ci),
                                            fmt::join(names, ", "), m.rounds);
  for (size_t i : group) {
    Replacement& r = result.replacements[i];
    if (keep) {
      rewrites[i].apply(tuned);
      r.kept = r.kept_as_group = true;
      r.why = "kept as a group: " + together;
    } else {
      r.why += "; " + together + ", not kept either";
    }
  }
}

// The loop's numbers, checked before any folder is made or model built.
void validate_measurement(const TuneOptions& o) {
  if (o.steps < 1) throw std::invalid_argument("--steps must be at least 1");
  if (o.rounds < 1) throw std::invalid_argument("--rounds must be at least 1");
  if (o.max_rounds != 0 && o.max_rounds < o.rounds)
    throw std::invalid_argument(fmt::format("--max-rounds {} is below --rounds {} (0 runs --rounds only)", o.max_rounds, o.rounds));
  if (o.warmup < 0) throw std::invalid_argument("--warmup must not be negative");
  if (o.profile_steps < 1) throw std::invalid_argument("--profile-steps must be at least 1");
  if (!(o.min_gain >= -1)) throw std::invalid_argument("--min-gain must be at least -1 (which keeps every verified rewrite)");
}

}  // namespace

void validate_loop(const TuneOptions& o) {
  validate_measurement(o);
  if (o.out_dir.empty() || !std::filesystem::is_directory(o.out_dir))
    throw std::invalid_argument(fmt::format("{}: the output folder does not exist", o.out_dir));
}

void validate(const TuneOptions& o) {
  validate_measurement(o);
  if (o.image_size < 32) throw std::invalid_argument(fmt::format("--image-size {} is below the minimum of 32", o.image_size));
  if (o.batch_size < 1) throw std::invalid_argument("--batch-size must be at least 1");
  if (o.loss != "ce" && o.loss != "mse") throw std::invalid_argument(fmt::format("unknown loss '{}' (ce or mse)", o.loss));
  for (const InputSpec& in : o.inputs)
    if (std::any_of(in.shape.begin(), in.shape.end(), [](int64_t d) { return d < 1; }))
      throw std::invalid_argument(fmt::format("--input-shape {}: dimensions must be positive", to_string(in)));
  if (!is_file_model(o.model)) {
    models::efficientnet_params(o.model);  // throws for an unknown name
  } else {
    if (!std::filesystem::is_regular_file(o.model))
      throw std::invalid_argument(
          fmt::format("{}: no such file (nor a built-in model: efficientnet-b0 … efficientnet-b7)", o.model));
    input_specs(o);  // throws without --input-shape
  }
}

TuneResult tune(const TuneOptions& o, const Hooks& h) {
  validate(o);
  validate_loop(o);
  at::set_num_threads(o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency()));
  say(h, "baseline: building the model");
  const std::shared_ptr<ModelWorkload> pristine = ModelWorkload::load(o);
  TuneResult result = tune(*pristine, o, h);
  result.model = o.model;
  result.image_size = is_file_model(o.model) ? 0 : o.image_size;
  if (!o.inputs.empty()) result.input_shape = o.inputs.front().shape;
  for (const InputSpec& in : o.inputs) result.inputs.push_back(to_string(in));
  return result;
}

TuneResult tune(const Workload& pristine, const TuneOptions& o, const Hooks& h, std::shared_ptr<Workload>* tuned_out) {
  validate_loop(o);
  if (o.threads > 0) at::set_num_threads(o.threads);
  TuneResult result;
  result.model = pristine.name();
  result.batch_size = static_cast<int>(pristine.samples_per_step());
  result.sample_unit = pristine.sample_unit();
  result.steps = o.steps;
  result.rounds = o.rounds;
  result.threads = at::get_num_threads();
  result.ranks = pristine.ranks();
  result.environment = measure::environment(1 + static_cast<int>(sibling_pids(pristine).size()));
  for (const auto& w : result.environment.warnings) warn(h, w);

  say(h, "baseline: warming up and profiling");
  // The profile's times feed the estimates that the measurement is checked against: both in the
  // measurement's memory regime (a trace taken while every large temporary faults in fresh
  // pages estimated +40% for a GELU rewrite that measured +0.2%).
  measure::keep_freed_memory();
  const std::shared_ptr<Workload> base = pristine.clone();
  ProfileOptions base_profile = profiling(o, std::max(o.warmup, kProfileWarmup));
  base_profile.progress = h.progress;
  result.baseline.variant = pristine.describe();
  result.baseline.trace = o.out_dir + "/" + trace_name(pristine, "baseline");
  result.baseline.analysis = profile_and_analyze(*base, base_profile, o, result.baseline.trace);
  result.baseline.ops_per_step = ops_per_step(result.baseline.analysis);
  if (h.analysed) h.analysed(result.baseline.analysis);

  say(h, "plan and verify");
  std::vector<Rewrite> rewrites;
  plan(result.baseline.analysis, o, pristine, result.replacements, rewrites, result.not_applied);
  std::vector<size_t> verified_index;  // the pristine workload with each verified rewrite alone
  for (size_t i = 0; i < rewrites.size(); ++i) {
    auto candidate = pristine.clone();
    Replacement& r = result.replacements[i];
    try {
      rewrites[i].apply(*candidate);
      r.verdict = verify(pristine, *candidate, o.seed + 11);
    } catch (const std::exception& e) {
      r.verdict.error = std::string("the rewrite failed: ") + e.what();
    }
    // Kept only where it verified on every rank ("on rank 1: failed verification: …").
    const std::string failed = first_failure(pristine, r.verdict.passed ? "" : rejection(r.verdict));
    if (h.progress) h.progress(static_cast<int>(i + 1), static_cast<int>(rewrites.size()));
    if (!failed.empty()) {
      if (r.verdict.passed) r.verdict.passed = false, r.verdict.error = failed;
      r.why = failed;
      continue;
    }
    verified_index.push_back(i);
  }
  result.any_verified = !verified_index.empty();
  if (!result.any_verified) {
    say(h, "measure: the baseline alone (nothing verified)");
    RankTimes ranks(1);
    const measure::Measurement timing = interleave({base.get()}, o, h, {}, 0, &ranks);
    result.machine = timing.machine;
    fill(result.baseline, timing.variants.front(), result.batch_size);
    if (result.ranks > 1) result.baseline.rank_step_ms = ranks.medians(0, timing.rounds);
    result.tuned = result.baseline;
    return result;
  }

  // Each variant adds one verified rewrite to the one before, so each gain is measured on its own.
  std::vector<std::shared_ptr<Workload>> variants;
  variants.push_back(pristine.clone());
  std::shared_ptr<Workload> cumulative = pristine.clone();
  for (size_t i : verified_index) {
    rewrites[i].apply(*cumulative);
    variants.push_back(cumulative->clone());
  }
  say(h, "estimates: each variant profiled, what its rewrite leaves");
  std::vector<analyze::Analysis> left{result.baseline.analysis};
  for (size_t k = 1; k < variants.size(); ++k) {
    left.push_back(analysis_of(*variants[k], o, o.out_dir + "/." + trace_name(pristine, "variant")));
    if (h.progress) h.progress(static_cast<int>(k), static_cast<int>(variants.size() - 1));
  }
  say(h, "measure: baseline and rewrites alternating");
  std::vector<Workload*> order;
  for (auto& v : variants) order.push_back(v.get());
  RankTimes ranks(order.size());
  const measure::Measurement timing = interleave(order, o, h, settled_by(o), 0, &ranks);
  result.machine = timing.machine;
  std::shared_ptr<Workload> tuned_model = pristine.clone();
  bool all_kept = true;
  for (size_t k = 0; k < verified_index.size(); ++k) {
    Replacement& r = result.replacements[verified_index[k]];
    r.measured = true;
    r.rounds = timing.rounds;
    std::tie(r.gain, r.gain_ci) = gain_of(timing, k + 1);
    judge(r, o);
    set_estimate(r, analyze::saving_between(left[k], left[k + 1]), analyze::unprofiled_step_us(left[k]));
    if (r.kept) rewrites[verified_index[k]].apply(*tuned_model);
  }
  keep_small_gains_together(*tuned_model, rewrites, verified_index, result, o, h);
  for (size_t i : verified_index) all_kept = all_kept && result.replacements[i].kept;

  // With every rewrite kept, the last variant is the tuned model; otherwise the kept set is timed
  // against a fresh baseline, as many rounds as above: a workload that has trained longer on its
  // fixed batches can run at another speed (tiny gradients turn denormal), so neither side may
  // have run more steps than the other.
  std::shared_ptr<Workload> tuned = variants.back();
  measure::Measurement final_timing = timing;
  RankTimes final_ranks = ranks;
  if (!all_kept) {
    say(h, "measure: baseline and the kept rewrites alternating");
    tuned = tuned_model->clone();
    const std::shared_ptr<Workload> fresh_baseline = pristine.clone();
    final_ranks = RankTimes(2);
    final_timing = interleave({fresh_baseline.get(), tuned.get()}, o, h, {}, timing.rounds, &final_ranks);
    result.machine = busier(result.machine, final_timing.machine);
  }
  const size_t last = final_timing.variants.size() - 1;
  fill(result.baseline, final_timing.variants.front(), result.batch_size);
  fill(result.tuned, final_timing.variants.back(), result.batch_size);
  if (result.ranks > 1) {
    result.baseline.rank_step_ms = final_ranks.medians(0, final_timing.rounds);
    result.tuned.rank_step_ms = final_ranks.medians(last, final_timing.rounds);
  }
  const measure::Ratio speedup = measure::ratio(final_timing, 0, last);
  result.speedup = speedup.estimate;
  result.speedup_ci = speedup.ci;
  if (result.machine.busy) warn(h, result.machine.warning);
  result.tuned.variant = tuned->describe();
  result.predicted_step_ms = predicted_step_ms(result, result.not_predicted);

  say(h, "tuned: profiling");
  result.tuned.trace = o.out_dir + "/" + trace_name(pristine, "tuned");
  result.tuned.analysis = profile_and_analyze(*tuned, profiling(o, 0, o.warmup + 1), o, result.tuned.trace);
  result.tuned.ops_per_step = ops_per_step(result.tuned.analysis);
  result.diff = analyze::diff(result.baseline.analysis, result.tuned.analysis);
  say(h, "memory: each kept rewrite alone, profiled");
  for (size_t i : verified_index) {
    Replacement& r = result.replacements[i];
    if (!r.kept) continue;
    r.memory_trace = o.out_dir + "/" + trace_name(pristine, "kept-" + r.rule);
    r.peak_memory_bytes = peak_with(pristine, rewrites[i], o, r.memory_trace);
  }
  result.rule_times = rule_times(result, o);
  result.saved = tuned_model->save(o.out_dir + "/tuned");
  if (tuned_out) *tuned_out = tuned_model;
  return result;
}

void record_profile(Workload& w, const ProfileOptions& o, const std::string& path) {
  if (o.steps < 1) throw std::invalid_argument("profile steps must be at least 1");
  if (o.warmup < 0) throw std::invalid_argument("warm-up steps cannot be negative");
  const double plain_ms = warm_up(w, o.warmup, o.progress);
  profile_steps(w, o, o.first_step > 0 ? o.first_step : o.warmup + 1, plain_ms, path);
}

std::vector<Replacement> patch(Workload& model, const std::vector<analyze::Rule>& rules, uint64_t seed) {
  const std::shared_ptr<Workload> pristine = model.clone();
  std::vector<Replacement> done;
  for (const analyze::Rule& rule : rules)
    for (const Rewrite& rw : model.rewrites_for(rule)) {
      const std::shared_ptr<Workload> candidate = model.clone();
      Replacement r;
      r.rule = rule.name;
      r.rewrite = rw.name;
      r.places = rw.apply(*candidate);
      if (r.places == 0) continue;
      r.verdict = verify(*pristine, *candidate, seed);
      r.kept = r.verdict.passed;
      if (r.kept) rw.apply(model);
      else r.why = rejection(r.verdict);
      done.push_back(r);
    }
  return done;
}

RewriteResult rewrite_file(const std::string& in_path, const std::string& out_path, const TuneOptions& o) {
  TuneOptions with_model = o;
  with_model.model = in_path;
  validate(with_model);
  const std::shared_ptr<ModelWorkload> model = ModelWorkload::load(with_model);
  RewriteResult result;
  result.replacements = patch(*model, o.rules, o.seed + 11);
  const bool any = std::any_of(result.replacements.begin(), result.replacements.end(),
                               [](const Replacement& r) { return r.kept; });
  if (any) {
    rewrite::save_torchscript(model->model(), out_path);
    result.written = true;
  }
  return result;
}

}  // namespace opfuse::tune
