// opfuse._C: the C++ core for the Python package. The tune loop, the analysis, the profiler and
// the rules are the same code the opfuse binary runs; a Python model enters as a Workload
// subclass whose methods are Python.
#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <ATen/Parallel.h>
#include <torch/csrc/utils/pybind.h>
#include <ATen/record_function.h>

#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <string>
#include <vector>

#include "opfuse/analyze.h"
#include "opfuse/ops.h"
#include "opfuse/profile.h"
#include "opfuse/measure.h"
#include "opfuse/report.h"
#include "opfuse/report_html.h"
#include "opfuse/trace.h"
#include "opfuse/tune.h"
#include "opfuse/workload.h"
#include "opfuse/bench.h"

namespace py = pybind11;
using opfuse::tune::Probe;
using opfuse::tune::Rewrite;
using opfuse::tune::Workload;

namespace {

// An object made in Python (a Workload, a Recorder) lives as long as C++ holds it: the
// shared_ptr keeps the Python object (and so its Python half) alive, and drops it under the GIL.
template <class T>
std::shared_ptr<T> hold(py::object o) {
  auto* t = o.cast<T*>();
  auto* keep = new py::object(std::move(o));
  return std::shared_ptr<T>(t, [keep](T*) {
    py::gil_scoped_acquire gil;
    delete keep;
  });
}

using opfuse::profile::Recorder;

class PyRecorder : public Recorder {
 public:
  void start() override { PYBIND11_OVERRIDE_PURE(void, Recorder, start); }
  void stop() override { PYBIND11_OVERRIDE_PURE(void, Recorder, stop); }
  void push_scope(const std::string& name) override { PYBIND11_OVERRIDE_PURE(void, Recorder, push_scope, name); }
  void pop_scope() override { PYBIND11_OVERRIDE_PURE(void, Recorder, pop_scope); }
  void write(const std::string& path, const std::string& metadata) override {
    PYBIND11_OVERRIDE_PURE(void, Recorder, write, path, metadata);
  }
};

// make(): a new Recorder (a Python one: torch.profiler); None: opfuse's own profiler. Held by
// reference: the factory is copied while the GIL is released.
opfuse::tune::RecorderFactory recorder_factory(const py::object& make) {
  if (make.is_none()) return {};
  return [&make]() {
    py::gil_scoped_acquire gil;
    return hold<Recorder>(make());
  };
}

const char* dtype_name(at::ScalarType t) { return t == at::kDouble ? "float64" : t == at::kFloat ? "float32" : "bfloat16"; }

class PyWorkload : public Workload {
 public:
  std::string name() const override { PYBIND11_OVERRIDE_PURE(std::string, Workload, name); }
  std::string describe() const override { PYBIND11_OVERRIDE_PURE(std::string, Workload, describe); }
  int64_t samples_per_step() const override { PYBIND11_OVERRIDE_PURE(int64_t, Workload, samples_per_step); }
  std::string sample_unit() const override { PYBIND11_OVERRIDE(std::string, Workload, sample_unit); }
  double step() override { PYBIND11_OVERRIDE_PURE(double, Workload, step); }
  void set_profiling(Recorder* recorder) override { PYBIND11_OVERRIDE(void, Workload, set_profiling, recorder); }
  void set_measuring(bool on) override { PYBIND11_OVERRIDE(void, Workload, set_measuring, on); }
  std::map<std::string, int64_t> held_memory() override {
    using Held = std::map<std::string, int64_t>;
    PYBIND11_OVERRIDE(Held, Workload, held_memory);
  }
  std::string why_unchanged() const override { PYBIND11_OVERRIDE(std::string, Workload, why_unchanged); }
  int rank() const override { PYBIND11_OVERRIDE(int, Workload, rank); }
  int ranks() const override { PYBIND11_OVERRIDE(int, Workload, ranks); }
  std::vector<std::string> gather(const std::string& mine) const override {
    PYBIND11_OVERRIDE(std::vector<std::string>, Workload, gather, mine);
  }
  std::vector<std::string> save(const std::string& path) const override {
    PYBIND11_OVERRIDE_PURE(std::vector<std::string>, Workload, save, path);
  }

  std::shared_ptr<Workload> clone() const override {
    py::gil_scoped_acquire gil;
    return hold<Workload>(override_of("clone")());
  }

  Probe probe(at::ScalarType dtype, uint64_t seed, double nudge) override {
    py::gil_scoped_acquire gil;
    py::object torch_dtype = py::module_::import("torch").attr(dtype_name(dtype));
    using Named = std::vector<std::pair<std::string, std::optional<at::Tensor>>>;
    // (outputs, grads) or (outputs, grads, updates): the optimizer step's updates are optional.
    const py::tuple got = override_of("probe")(torch_dtype, seed, nudge);
    if (got.size() != 2 && got.size() != 3)
      throw std::invalid_argument("Workload.probe must return (outputs, grads) or (outputs, grads, updates)");
    Probe p;
    p.outputs = got[0].cast<std::vector<at::Tensor>>();
    for (const auto& [n, t] : got[1].cast<Named>()) p.grads.emplace_back(n, t.value_or(at::Tensor()));
    if (got.size() == 3)
      for (const auto& [n, t] : got[2].cast<Named>()) p.updates.emplace_back(n, t.value_or(at::Tensor()));
    return p;
  }

  // Python answers a list of (name, apply) pairs; apply(workload) returns the places changed.
  std::vector<Rewrite> rewrites_for(const opfuse::analyze::Rule& rule) const override {
    py::gil_scoped_acquire gil;
    std::vector<Rewrite> out;
    for (const py::handle item : override_of("rewrites_for")(py::cast(rule, py::return_value_policy::copy))) {
      auto [name, apply] = item.cast<std::pair<std::string, py::function>>();
      // Dropped wherever tune drops the rewrite, which may be without the GIL.
      std::shared_ptr<py::function> fn(new py::function(std::move(apply)), [](py::function* f) {
        py::gil_scoped_acquire gil;
        delete f;
      });
      out.push_back({rule.name, name, [fn](Workload& w) {
                       py::gil_scoped_acquire g;
                       return (*fn)(py::cast(&w, py::return_value_policy::reference)).cast<int>();
                     }});
    }
    return out;
  }

 private:
  py::function override_of(const char* method) const {
    py::function f = py::get_override(static_cast<const Workload*>(this), method);
    if (!f) throw std::logic_error(std::string("opfuse Workload subclass lacks ") + method);
    return f;
  }
};

// The ops a callable runs at its top level on this thread: how a module's whole forward chain is
// read. A custom autograd Function (a name without "::") is looked through: its ops count.
thread_local std::vector<std::string>* recorded = nullptr;
thread_local std::vector<bool> opened;  // per open op: whether it is an operator ("aten::…")
thread_local int operators_open = 0;

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  if (!recorded) return nullptr;
  const bool op = std::string_view(fn.name()).find("::") != std::string_view::npos;
  if (op && operators_open == 0) recorded->push_back(fn.name());
  opened.push_back(op);
  operators_open += op;
  return nullptr;
}
void on_exit(const at::RecordFunction&, at::ObserverContext*) {
  if (!recorded || opened.empty()) return;
  operators_open -= opened.back();
  opened.pop_back();
}

std::vector<std::string> top_level_ops(const py::function& fn) {
  std::vector<std::string> names;
  recorded = &names;
  opened.clear();
  operators_open = 0;
  const auto handle = at::addThreadLocalCallback(at::RecordFunctionCallback(on_enter, on_exit).scopes({at::RecordScope::FUNCTION}));
  try {
    fn();
  } catch (...) {
    at::removeCallback(handle);
    recorded = nullptr;
    throw;
  }
  at::removeCallback(handle);
  recorded = nullptr;
  return names;
}

// Whether one of the rule's patterns matches the whole chain (names with or without "aten::").
bool matches_whole(const opfuse::analyze::Rule& rule, const std::vector<std::string>& chain) {
  std::vector<std::string> names;
  for (const auto& n : chain) names.push_back(n.rfind("aten::", 0) == 0 ? n.substr(6) : n);
  std::vector<const std::string*> ptrs;
  for (const auto& n : names) ptrs.push_back(&n);
  if (ptrs.empty()) return false;
  for (const auto& p : rule.patterns)
    if (p.pattern->match(ptrs, 0) == ptrs.size()) return true;
  return false;
}

py::dict tune_workload(const Workload& w, const std::vector<opfuse::analyze::Rule>& rules, const py::dict& kw,
                       const py::object& on_stage, const py::object& on_progress) {
  opfuse::tune::TuneOptions o;
  o.rules = rules;
  o.out_dir = kw["out_dir"].cast<std::string>();
  o.steps = kw["steps"].cast<int>();
  o.rounds = kw["rounds"].cast<int>();
  o.warmup = kw["warmup"].cast<int>();
  o.profile_steps = kw["profile_steps"].cast<int>();
  o.max_rounds = kw["max_rounds"].cast<int>();
  o.min_gain = kw["min_gain"].cast<double>();
  o.keep_inconclusive = kw["keep_inconclusive"].cast<bool>();
  o.seed = kw["seed"].cast<uint64_t>();
  o.threads = kw["threads"].cast<int>();
  o.measure_ops = kw["measure_ops"].cast<bool>();
  const py::object make_recorder = kw["recorder"];
  o.recorder = recorder_factory(make_recorder);
  // The hooks hold the callbacks by reference: they are copied while the GIL is released.
  opfuse::tune::Hooks hooks;
  if (!on_stage.is_none())
    hooks.stage = [&on_stage](const std::string& s) {
      py::gil_scoped_acquire gil;
      on_stage(s);
    };
  if (!on_progress.is_none())
    hooks.progress = [&on_progress](int done, int total) {
      py::gil_scoped_acquire gil;
      on_progress(done, total);
    };
  // A reference BLAS or a busy machine is a RuntimeWarning, which scripts can filter or raise.
  hooks.warning = [](const std::string& w) {
    py::gil_scoped_acquire gil;
    py::module_::import("warnings").attr("warn")(w, py::module_::import("builtins").attr("RuntimeWarning"), 2);
  };
  std::shared_ptr<Workload> tuned;
  opfuse::tune::TuneResult r;
  {
    // Without the GIL: torch refuses a backward run from C++ while it is held (the op timings
    // of the analysis run one), and the workload's Python half takes it when called.
    py::gil_scoped_release no_gil;
    r = opfuse::tune::tune(w, o, hooks, &tuned);
  }
  py::dict out;
  out["json"] = opfuse::report::tune_json(r).dump();
  out["page"] = opfuse::report::tune_page(r).dump();  // the page's data: Python adds compile's figures
  out["text"] = opfuse::report::format_tune(r);
  out["analysis_text"] = opfuse::report::format_analysis(r.baseline.analysis, 10);
  out["tuned"] = tuned ? py::cast(tuned) : py::none();
  return out;
}

py::dict analyze_paths(const std::vector<std::string>& paths, const std::vector<opfuse::analyze::Rule>& rules,
                       bool measure, int top, const std::string& backend, int64_t steps) {
  if (paths.empty() || paths.size() > 2) throw std::invalid_argument("analyze takes one trace, or two to compare");
  opfuse::analyze::FileOptions options;  // as the command line's, with the page always made
  options.backend = backend;
  options.steps = steps;
  options.timeline = true;
  if (measure) {
    options.measure = [](const std::string& op, const std::string& dims) { return opfuse::bench::time_fused_op(op, dims); };
    options.measure_roofline = [](int threads) { return opfuse::bench::machine_roofline(threads); };
  }
  std::vector<opfuse::analyze::Analysis> analyses;
  {
    py::gil_scoped_release no_gil;  // the op timings may run a backward, which torch refuses under the GIL
    for (const auto& p : paths) analyses.push_back(opfuse::analyze::analyze_file(p, rules, options));
  }
  const opfuse::report::AnalysisOutputs out = opfuse::report::analysis_outputs(
      analyses.front(), analyses.size() == 2 ? &analyses.back() : nullptr, top, /*all=*/false, /*page=*/true);
  py::dict result;
  result["json"] = out.json.dump();
  result["text"] = out.text;
  result["html"] = out.html;
  return result;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "opfuse's C++ core: the tune loop, the trace analysis, the profiler, the rules";
  m.attr("ops_library") = opfuse::ops_library_path();

  py::class_<opfuse::analyze::GraphRewrite>(m, "GraphRewrite")
      .def_readonly("pattern", &opfuse::analyze::GraphRewrite::pattern)
      .def_readonly("replacement", &opfuse::analyze::GraphRewrite::replacement);
  py::class_<opfuse::analyze::FxRewrite>(m, "FxRewrite")
      .def_readonly("pattern", &opfuse::analyze::FxRewrite::pattern)
      .def_readonly("replacement", &opfuse::analyze::FxRewrite::replacement)
      .def_readonly("outputs", &opfuse::analyze::FxRewrite::outputs);
  py::class_<opfuse::analyze::Rule>(m, "Rule")
      .def_readonly("name", &opfuse::analyze::Rule::name)
      .def_readonly("kind", &opfuse::analyze::Rule::kind)
      .def_readonly("source", &opfuse::analyze::Rule::source)
      .def_property_readonly("patterns",
                             [](const opfuse::analyze::Rule& r) {
                               std::vector<std::string> out;
                               for (const auto& p : r.patterns) out.push_back(p.pattern->text());
                               return out;
                             })
      .def_property_readonly("replacement",
                             [](const opfuse::analyze::Rule& r) {
                               std::map<std::string, std::string> out;
                               for (const auto& [b, s] : r.replacement) out[opfuse::analyze::backend_name(b)] = s;
                               return out;
                             })
      .def_property_readonly("python_module", [](const opfuse::analyze::Rule& r) { return r.python.module; })
      .def_property_readonly("python_kind", [](const opfuse::analyze::Rule& r) { return r.python.kind; })
      .def_property_readonly("python_fx", [](const opfuse::analyze::Rule& r) { return r.python.fx; })
      .def_property_readonly("optimizer", [](const opfuse::analyze::Rule& r) { return r.optimizer; })
      .def_property_readonly("memory_format", [](const opfuse::analyze::Rule& r) { return r.memory_format; })
      .def("matches_whole", &matches_whole, py::arg("ops"),
           "whether one of the rule's patterns matches exactly this chain of op names")
      .def("__repr__", [](const opfuse::analyze::Rule& r) { return "<opfuse rule " + r.name + ">"; });
  m.def("rule_set", &opfuse::analyze::rule_set, py::arg("files"), py::arg("with_defaults") = true,
        "the rules of the files, then (with_defaults) the built-in ones");

  py::class_<Workload, PyWorkload, std::shared_ptr<Workload>>(m, "Workload")
      .def(py::init<>())
      .def("name", &Workload::name)
      .def("describe", &Workload::describe)
      .def("samples_per_step", &Workload::samples_per_step)
      .def("step", &Workload::step);

  m.def("tune", &tune_workload, py::arg("workload"), py::arg("rules"), py::arg("options"), py::arg("on_stage") = py::none(),
        py::arg("on_progress") = py::none());
  m.def(
      "verify",
      [](const Workload& baseline, const Workload& candidate, uint64_t seed) {
        opfuse::tune::Verdict v;
        {
          py::gil_scoped_release no_gil;  // as in tune: the workloads take it for their Python half
          v = opfuse::tune::verify(baseline, candidate, seed);
        }
        return py::make_tuple(v.passed, v.float64_error, v.float32_error, v.passed ? "" : opfuse::tune::rejection(v));
      },
      py::arg("baseline"), py::arg("candidate"), py::arg("seed"),
      "tune's verification of candidate against baseline (float64 and float32, outputs, gradients and "
      "optimizer updates): (passed, float64 error, float32 error, why it failed)");
  m.def(
      "interleave",
      [](const std::vector<std::shared_ptr<Workload>>& workloads, int steps, int rounds, int warmup) {
        opfuse::measure::Options options;
        options.rounds = rounds, options.warmup = warmup;
        std::vector<opfuse::measure::Run> runs;
        for (const auto& w : workloads) runs.push_back(opfuse::measure::per_step([w] { return w->step(); }, steps));
        opfuse::measure::Measurement got;
        {
          py::gil_scoped_release no_gil;  // as in tune: the workloads take it for their Python half
          got = opfuse::measure::interleave(runs, options);
        }
        py::list variants;
        for (size_t i = 0; i < got.variants.size(); ++i) {
          const auto& s = got.variants[i];
          const auto r = opfuse::measure::ratio(got, 0, i);
          variants.append(py::dict(py::arg("ms") = s.median, py::arg("ms_ci") = py::make_tuple(s.ci.lo, s.ci.hi),
                                   py::arg("ms_rounds") = s.ms, py::arg("speedup_vs_first") = r.estimate,
                                   py::arg("speedup_vs_first_ci") = py::make_tuple(r.ci.lo, r.ci.hi)));
        }
        return py::dict(py::arg("variants") = variants, py::arg("rounds") = got.rounds,
                        py::arg("machine_busy") = got.machine.busy, py::arg("machine_warning") = got.machine.warning);
      },
      py::arg("workloads"), py::arg("steps"), py::arg("rounds"), py::arg("warmup"),
      "tune's measurement of workloads' training steps, interleaved in paired rounds: each one's ms per "
      "step (median and interval) and its speed-up over the first (paired ratio and interval)");
  m.def("environment", [] { return opfuse::report::environment_json(opfuse::measure::environment()).dump(); },
        "what measured figures depend on (BLAS, threads, CPU path, LibTorch) as JSON");
  m.def("analyze", &analyze_paths, py::arg("paths"), py::arg("rules"), py::arg("measure") = false, py::arg("top") = 15,
        py::arg("backend") = "auto", py::arg("steps") = 0);

  py::class_<Recorder, PyRecorder, std::shared_ptr<Recorder>>(m, "Recorder",
                                                              "what records a profile: subclass it, or opfuse_recorder()")
      .def(py::init<>())
      .def("start", &Recorder::start)
      .def("stop", &Recorder::stop)
      .def("push_scope", &Recorder::push_scope, py::arg("name"))
      .def("pop_scope", &Recorder::pop_scope)
      .def("write", &Recorder::write, py::arg("path"), py::arg("metadata"));
  m.def("opfuse_recorder", &opfuse::profile::opfuse_recorder, "opfuse's own profiler, as a Recorder");
  m.def(
      "profile",
      [](Workload& w, const std::string& path, int steps, int warmup, const py::object& make_recorder) {
        opfuse::tune::ProfileOptions o;
        o.steps = steps, o.warmup = warmup;
        o.recorder = recorder_factory(make_recorder);
        py::gil_scoped_release no_gil;  // as in tune: the workload takes it for its Python half
        opfuse::tune::record_profile(w, o, path);
      },
      py::arg("workload"), py::arg("path"), py::arg("steps"), py::arg("warmup"), py::arg("recorder") = py::none(),
      "tune's profile of a workload: warm-up steps (the last few timed as the step unprofiled), then "
      "`steps` steps recorded (recorder(): a Recorder; None: opfuse's profiler) into the trace at path");
  m.def(
      "patch",
      [](Workload& w, const std::vector<opfuse::analyze::Rule>& rules, uint64_t seed) {
        std::vector<opfuse::tune::Replacement> done;
        {
          py::gil_scoped_release no_gil;  // verification runs a backward, which torch refuses under the GIL
          done = opfuse::tune::patch(w, rules, seed);
        }
        py::list out;
        for (const auto& r : done)
          out.append(py::dict(py::arg("rule") = r.rule, py::arg("places") = r.places, py::arg("kept") = r.kept,
                              py::arg("why") = r.why));
        return out;
      },
      py::arg("workload"), py::arg("rules"), py::arg("seed"),
      "tune's patch: every rewrite of the rules applied to the workload itself where it verifies");
  m.def("top_level_ops", &top_level_ops, py::arg("fn"), "the names of the top-level ops fn() runs on this thread");
  m.def("page_html", [](const std::string& page) { return opfuse::report::analysis_html(nlohmann::json::parse(page)); },
        py::arg("page"), "the self-contained report page drawn from its data (tune's \"page\")");
  m.def("check_output_path", &opfuse::report::check_output_path, py::arg("path"), py::arg("overwrite"));
}
