// The estimates tune checks against its measurements, on hand-written traces worked out by hand:
// what profiling adds to each op is left out of a saving when the trace records the unprofiled
// step, and the saving of a change to a model is counted where it changed the chains.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "opfuse/analyze.h"

namespace opfuse::analyze {
namespace {

struct Op {
  std::string name;
  double ts, dur;
  std::string dims, module;
};

std::string event(const std::string& cat, const Op& op) {
  std::string args;
  if (!op.dims.empty()) args = R"("Input Dims":)" + op.dims;
  if (!op.module.empty()) args += std::string(args.empty() ? "" : ",") + R"("Module Hierarchy":")" + op.module + "\"";
  return R"({"ph":"X","cat":")" + cat + R"(","name":")" + op.name + R"(","pid":1,"tid":1,"ts":)" +
         std::to_string(op.ts) + R"(,"dur":)" + std::to_string(op.dur) + R"(,"args":{)" + args + "}}";
}

std::string allocation(double ts) {
  return R"({"ph":"i","s":"t","cat":"cpu_instant_event","name":"[memory]","pid":1,"tid":1,"ts":)" + std::to_string(ts) +
         R"(,"args":{"Addr":1,"Bytes":64,"Total Allocated":64,"Total Reserved":64,"Device Type":0,"Device Id":-1}})";
}

// Steps of 500 µs, each holding `ops` and allocations at `allocated` shifted by the step's start;
// `meta` is the "opfuse" object.
Analysis analysis_of(const std::vector<Op>& ops, int steps, const std::string& meta = "{}",
                     const std::vector<double>& allocated = {}) {
  std::string events;
  for (int s = 0; s < steps; ++s) {
    events += (s ? "," : "") + event("user_annotation", {"ProfilerStep#" + std::to_string(s + 1), 500.0 * s, 500, "", ""});
    for (Op op : ops) {
      op.ts += 500.0 * s;
      events += "," + event("cpu_op", op);
    }
    for (double ts : allocated) events += "," + allocation(ts + 500.0 * s);
  }
  const std::string json = R"({"opfuse":)" + meta + R"(,"traceEvents":[)" + events + "]}";
  const trace::Trace t = trace::parse_trace(json, "t.json");
  return analyze(t, "t.json", default_rules(), {});
}

const Finding& finding(const Analysis& a, const std::string& rule) {
  const auto f = std::find_if(a.findings.begin(), a.findings.end(), [&](const Finding& g) { return g.rule == rule; });
  if (f == a.findings.end()) throw std::runtime_error("no " + rule + " finding");
  return *f;
}

const std::string x = "[[64,64]]", xy = "[[64,64],[64,64]]";

// sigmoid holds two ops; mul is the slowest op and none. Chain 200 µs, the fused op bounded by
// the slowest op (100 µs; its bytes at the chain's bandwidth take 80): a saving of 100 µs, less
// what profiling the two ops inside sigmoid cost. A matrix product ends each step, so no chain
// runs on into the next.
const std::vector<Op> swish = {{"aten::sigmoid", 10, 100, x, ""}, {"aten::empty", 20, 1, "[]", ""},
                               {"aten::empty", 40, 1, "[]", ""}, {"aten::mul", 120, 100, xy, ""},
                               {"aten::mm", 300, 100, xy, ""}};

TEST(ProfilerCost, IsTheStepsExcessOverItsUnprofiledTimePerRecordedOp) {
  const Analysis plain = analysis_of(swish, 2);
  EXPECT_EQ(plain.trace.plain_step_us, 0);
  EXPECT_EQ(plain.trace.profiler_us_per_event, 0);
  EXPECT_DOUBLE_EQ(finding(plain, "silu").est_saving_us, 2 * 100);

  // 500 µs profiled, 450 unprofiled, 5 ops a step: 10 µs each, 20 inside each sigmoid.
  const Analysis a = analysis_of(swish, 2, R"({"plain_step_ms": 0.45})");
  EXPECT_DOUBLE_EQ(a.trace.plain_step_us, 450);
  EXPECT_DOUBLE_EQ(a.trace.profiler_us_per_event, 10);
  const Finding& silu = finding(a, "silu");
  EXPECT_DOUBLE_EQ(silu.est_saving_us, 2 * 80);
  EXPECT_DOUBLE_EQ(silu.time_us, 2 * 200);  // the chain's time stays as recorded
  EXPECT_NE(silu.estimate.find("less profiling's cost"), std::string::npos) << silu.estimate;
  EXPECT_DOUBLE_EQ(unprofiled_step_us(a), 450);
}

// The code between a chain's ops (Python's between calls, the autograd engine's between nodes)
// goes with the chain: here 40 µs between sigmoid's end and mul's start, of which profiling took
// one record's 10 µs, mul's own. A gap that holds a module scope is left out.
TEST(ProfilerCost, TheCodeBetweenAChainsOpsIsSavedWithIt) {
  std::vector<Op> spaced = swish;
  spaced[3].ts = 150;  // mul, 40 µs after sigmoid's end
  const Analysis a = analysis_of(spaced, 2, R"({"plain_step_ms": 0.45})");
  ASSERT_DOUBLE_EQ(a.trace.profiler_us_per_event, 10);
  // sigmoid 100 less the two records inside it, mul 100, the gap 40 less 10; the fused op as
  // the slowest op, 100
  EXPECT_DOUBLE_EQ(finding(a, "silu").est_saving_us, 2 * ((80 + 100 + 30) - 100));
  // Gaps no longer than a record's cost add nothing (the test above: 10 µs apart).

  spaced.insert(spaced.begin() + 3, Op{"a module", 130, 125, "", ""});  // a scope opens between them
  std::string events;
  for (int s = 0; s < 2; ++s) {
    events += (s ? "," : "") + event("user_annotation", {"ProfilerStep#" + std::to_string(s + 1), 500.0 * s, 500, "", ""});
    for (Op op : spaced) {
      op.ts += 500.0 * s;
      events += "," + event(op.name == "a module" ? "user_annotation" : "cpu_op", op);
    }
  }
  const trace::Trace t = trace::parse_trace(R"({"opfuse":{"plain_step_ms": 0.44},"traceEvents":[)" + events + "]}", "t.json");
  const Analysis scoped = analyze(t, "t.json", default_rules(), {});
  ASSERT_DOUBLE_EQ(scoped.trace.profiler_us_per_event, 10);  // 6 records a step, 60 µs
  EXPECT_DOUBLE_EQ(finding(scoped, "silu").est_saving_us, 2 * (80 + 100 - 100));
}

TEST(ProfilerCost, AllocationsAreRecordsToo) {
  // Two allocations inside each sigmoid: 7 records a step, 10 µs each at 430 µs unprofiled, and
  // 40 µs inside each sigmoid.
  const Analysis a = analysis_of(swish, 2, R"({"plain_step_ms": 0.43})", {50, 60});
  EXPECT_DOUBLE_EQ(a.trace.profiler_us_per_event, 10);
  EXPECT_DOUBLE_EQ(finding(a, "silu").est_saving_us, 2 * 60);
}

TEST(ProfilerCost, NoCostWithoutAUsableUnprofiledStep) {
  for (const char* meta : {R"({"plain_step_ms": "fast"})", R"({"plain_step_ms": -3})", R"({"plain_step_ms": 0.6})"}) {
    const Analysis a = analysis_of(swish, 2, meta);
    EXPECT_EQ(a.trace.profiler_us_per_event, 0) << meta;  // 0.6 ms: slower unprofiled, nothing to take out
    EXPECT_DOUBLE_EQ(finding(a, "silu").est_saving_us, 2 * 100) << meta;
    // The gain estimated over the step as profiled: a slower unprofiled one would shrink it.
    EXPECT_DOUBLE_EQ(unprofiled_step_us(a), 500) << meta;
  }
}

TEST(SavingBetween, CountsThePlacesAChangeReached) {
  // Two Swish chains, in modules a and b, each before a matrix product; the change fuses a's.
  const Op mm_a{"aten::mm", 221, 8, xy, "a"}, mm_b{"aten::mm", 450, 8, xy, "b"};
  const std::vector<Op> before = {{"aten::sigmoid", 10, 100, x, "a"}, {"aten::mul", 120, 100, xy, "a"}, mm_a,
                                  {"aten::sigmoid", 230, 100, x, "b"}, {"aten::mul", 340, 100, xy, "b"}, mm_b};
  const std::vector<Op> after = {{"opfuse::silu", 10, 60, x, "a"}, mm_a, {"aten::sigmoid", 230, 100, x, "b"},
                                 {"aten::mul", 340, 100, xy, "b"}, mm_b};
  const Analysis b = analysis_of(before, 2), c = analysis_of(after, 2);
  ASSERT_EQ(finding(b, "silu").locations.size(), 2u);
  EXPECT_DOUBLE_EQ(finding(b, "silu").est_saving_us, 2 * 200);
  EXPECT_DOUBLE_EQ(saving_between(b, c), 100);  // per step: a's chain, not b's
  EXPECT_DOUBLE_EQ(saving_between(b, b), 0);
}

TEST(SavingBetween, APartlyFusedChainKeepsWhatIsLeftOfItsSaving) {
  // BatchNorm then Swish, then the Swish fused on its own: batch_norm_silu still finds the pair,
  // with less to save; the change saved the difference.
  const std::vector<Op> before = {{"aten::batch_norm", 10, 100, x, "c"}, {"aten::sigmoid", 120, 100, x, "c"},
                                  {"aten::mul", 230, 100, xy, "c"}, {"aten::mm", 340, 100, xy, "c"}};
  const std::vector<Op> after = {{"aten::batch_norm", 10, 100, x, "c"}, {"opfuse::silu", 120, 120, x, "c"},
                                 {"aten::mm", 340, 100, xy, "c"}};
  const Analysis b = analysis_of(before, 1), c = analysis_of(after, 1);
  const double was = finding(b, "batch_norm_silu").est_saving_us, is = finding(c, "batch_norm_silu").est_saving_us;
  EXPECT_GT(was, is);
  EXPECT_GT(is, 0);
  EXPECT_DOUBLE_EQ(saving_between(b, c), was - is);
}

// A chain that rotates q and k side by side holds two calls of the fused op: `calls` counts them.
TEST(Measured, ARuleCountsTheFusedOpsCallsInAMatch) {
  const std::vector<Rule> rules = parse_rules(R"(rules:
  - name: pairs
    patterns: [{match: "(unbind-mul){1,2}", measure: silu, calls: unbind, runs_as: none}]
    replacement: {cpu: opfuse::silu})", "r.yaml");
  std::string ev;
  double ts = 0;
  for (const char* name : {"aten::unbind", "aten::mul", "aten::unbind", "aten::mul", "aten::mm", "aten::unbind", "aten::mul"}) {
    ev += std::string(ev.empty() ? "" : ",") + event("cpu_op", {name, ts, 10, xy, ""});
    ts += 11;
  }
  Options o;
  o.measure = [](const std::string&, const std::string&) { return 4.0; };
  const Analysis a = analyze(trace::parse_trace("[" + ev + "]", "t.json"), "t.json", rules, o);
  // two matches: 40 µs less two calls, 20 µs less one
  EXPECT_DOUBLE_EQ(finding(a, "pairs").est_saving_us, (40 - 2 * 4) + (20 - 4));
  EXPECT_THROW(parse_rules(R"(rules: [{name: x, patterns: [{match: a, calls: a}], replacement: {cpu: y}}])", "r.yaml"),
               std::invalid_argument);
  // the chain timed as a variant of the op makes the count moot
  EXPECT_THROW(parse_rules(R"(rules: [{name: x, patterns: [{match: a, measure: silu, calls: a}], replacement: {cpu: y}}])",
                           "r.yaml"),
               std::invalid_argument);
  EXPECT_THROW(parse_rules(R"(rules: [{name: x, patterns: [{match: a, measure: silu, runs_as: eager}], replacement: {cpu: y}}])",
                           "r.yaml"),
               std::invalid_argument);
}

// An optimizer step with `measure:` (the default rules' SGD): its per-parameter ops scaled by
// the fused step against the per-tensor loop, both timed at the parameters' shapes; the step's
// own code (Python's loop over the groups) is left out, as without the timer.
TEST(Measured, AnOptimizerStepIsScaledByTheFusedStepOverThePerTensorLoop) {
  std::string ev = event("user_annotation", {"Optimizer.step#SGD.step", 0, 200, "", ""});
  double ts = 1;
  for (const char* name : {"aten::add", "aten::mul_", "aten::add_", "aten::add_"}) {
    ev += "," + event("cpu_op", {name, ts, 30, xy, ""});
    ts += 31;
  }
  std::vector<std::string> asked;
  Options o;
  o.measure = [&](const std::string& op, const std::string& dims) {
    asked.push_back(op + " " + dims);
    return op == "sgd" ? 2.0 : op == "sgd@reference" ? 8.0 : -1;
  };
  const Analysis a = analyze(trace::parse_trace("[" + ev + "]", "t.json"), "t.json", default_rules(), o);
  EXPECT_EQ(asked, (std::vector<std::string>{"sgd 64,64", "sgd@reference 64,64"}));
  EXPECT_DOUBLE_EQ(finding(a, "fused_sgd").est_saving_us, 120 - 120 * 2.0 / 8);
  EXPECT_EQ(finding(a, "fused_sgd").estimate, "opfuse::sgd timed against reference");
}

// A layout change is estimated from its convolutions timed in both layouts: each recorded
// forward and backward scaled by the ratio, the stride and padding read from the sizes, the
// backward found by its sequence number (which the pad before the convolution shares).
TEST(Measured, ALayoutChangeScalesEachConvolutionByItsTimesInBothLayouts) {
  auto op = [](const std::string& name, double ts, double dur, int seq, const std::string& dims, const std::string& strides) {
    return R"({"ph":"X","cat":"cpu_op","name":")" + name + R"(","pid":1,"tid":1,"ts":)" + std::to_string(ts) +
           R"(,"dur":)" + std::to_string(dur) + R"(,"args":{"Input Dims":)" + dims + R"(,"Input Strides":)" + strides +
           (seq >= 0 ? R"(,"Sequence number":)" + std::to_string(seq) : std::string()) + "}}";
  };
  const std::string events = "[" +
      op("aten::pad", 0, 10, 7, "[[2,8,16,16]]", "[[2048,256,16,1]]") + "," +
      op("aten::conv2d", 20, 100, 7, "[[2,8,17,17],[16,8,3,3],[16]]", "[[2312,289,17,1],[72,9,3,1],[1]]") + "," +
      op("aten::conv2d", 130, 60, 9, "[[2,16,8,8],[16,1,3,3]]", "[[1024,64,8,1],[9,9,3,1]]") + "," +
      op("ConvolutionBackward0", 300, 80, 9, "[[2,16,8,8]]", "[[1024,64,8,1]]") + "," +
      op("aten::convolution_backward", 301, 78, -1, "[[2,16,8,8],[2,16,8,8],[16,1,3,3]]",
         "[[1024,64,8,1],[1024,64,8,1],[9,9,3,1]]") + "," +
      op("ConvolutionBackward0", 400, 200, 7, "[[2,16,8,8]]", "[[1024,64,8,1]]") + "," +
      op("aten::convolution_backward", 401, 198, -1, "[[2,16,8,8],[2,8,17,17],[16,8,3,3]]",
         "[[1024,64,8,1],[2312,289,17,1],[72,9,3,1]]") + "]";
  std::vector<std::string> asked;
  Options o;
  o.measure = [&](const std::string& name, const std::string& dims) {
    asked.push_back(name + " " + dims);
    const bool backward = name.rfind("conv2d_backward@", 0) == 0, after = name.find("@channels_last") != std::string::npos;
    return backward ? (after ? 50.0 : 100.0) : (after ? 10.0 : 40.0);
  };
  const Analysis a = analyze(trace::parse_trace(events, "t.json"), "t.json", default_rules(), o);
  const Finding& f = finding(a, "channels_last");
  EXPECT_TRUE(f.estimated);
  EXPECT_EQ(f.estimate, "convolutions timed in both layouts");
  // each convolution: forward x 10/40, backward x 50/100
  EXPECT_DOUBLE_EQ(f.est_saving_us, (100 + 200 - (25 + 100)) + (60 + 80 - (15 + 40)));
  // the first of stride 2 and no padding (17 -> 8), the depthwise one of stride 1, padding 1, 16 groups
  EXPECT_NE(std::find(asked.begin(), asked.end(), "conv2d@channels_last 2,8,17,17;16,8,3,3;2,16,8,8;2,2;0,0;1"), asked.end());
  EXPECT_NE(std::find(asked.begin(), asked.end(), "conv2d_backward@contiguous 2,16,8,8;16,1,3,3;2,16,8,8;1,1;1,1;16"),
            asked.end());
  EXPECT_EQ(asked.size(), 8u);
  // a convolution whose backward the trace does not hold is not estimated
  const std::string forward_only = "[" + op("aten::conv2d", 20, 100, 7, "[[2,8,17,17],[16,8,3,3],[16]]",
                                            "[[2312,289,17,1],[72,9,3,1],[1]]") + "]";
  const Finding& g = finding(analyze(trace::parse_trace(forward_only, "t.json"), "t.json", default_rules(), o), "channels_last");
  EXPECT_FALSE(g.estimated);
  EXPECT_EQ(g.est_saving_us, 0);
}

}  // namespace
}  // namespace opfuse::analyze
