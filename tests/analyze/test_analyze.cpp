// The analyze stage on hand-written traces whose answers are known: op-name regexes, rule files
// (opfuse's and the Ascend advisor's), op trees, device linking, locations, the miner, the diff.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <stdexcept>

#include "opfuse/analyze.h"

namespace opfuse::analyze {
namespace {

size_t match(const std::string& pattern, std::vector<std::string> names, size_t begin = 0) {
  std::vector<const std::string*> p;
  for (const auto& n : names) p.push_back(&n);
  return Pattern(pattern).match(p, begin);
}

TEST(Pattern, MatchesWholeOpNamesWithGroupsAndRepeats) {
  EXPECT_EQ(match("sigmoid-mul", {"sigmoid", "mul", "add"}), 2u);
  EXPECT_EQ(match("sigmoid-mul", {"sigmoid", "mul_"}), 0u);  // names are whole, not prefixes
  EXPECT_EQ(match("(chunk|slice)-neg-cat-(mul){0,2}-add", {"slice", "neg", "cat", "mul", "mul", "add"}), 6u);
  EXPECT_EQ(match("(chunk|slice)-neg-cat-(mul){0,2}-add", {"chunk", "neg", "cat", "add"}), 4u);
  EXPECT_EQ(match("(chunk|slice)-neg-cat-(mul){0,2}-add", {"chunk", "neg", "cat", "mul", "mul", "mul", "add"}), 0u);
  EXPECT_EQ(match("a-(b-c)+", {"a", "b", "c", "b", "c", "b"}), 5u);  // longest
  EXPECT_EQ(match("a-(x)?-b", {"a", "b"}), 2u);
  EXPECT_EQ(match("a-b*", {"a", "b", "b", "b"}), 4u);
  EXPECT_EQ(match("mul-add", {"x", "mul", "add"}, 1), 2u);
  EXPECT_EQ(match("Optimizer.step#Adam.step", {"Optimizer.step#Adam.step"}), 1u);
}

TEST(Pattern, BadPatternsNameTheirPosition) {
  for (const char* bad : {"a-(b", "a--b", "a-{1}", "a{2,1}", "(a|)", "a)"}) {
    try {
      Pattern p(bad);
      ADD_FAILURE() << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("at character"), std::string::npos) << e.what();
    }
  }
}

TEST(Pattern, RepeatsThatWouldExhaustMemoryAreAnError) {
  try {
    Pattern p("a-((b-c){999}){999}");
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("too large at character"), std::string::npos) << e.what();
  }
}

// A random pattern over names a..d: the same text as an op pattern and as a POSIX regex over one
// letter per op (POSIX, because it finds the longest match, as patterns do).
struct RandomPattern {
  std::mt19937& rng;
  std::string ops, posix;

  void piece(int depth) {
    // One level of groups: libstdc++'s POSIX regex backtracks exponentially on deeper nests.
    const int what = static_cast<int>(rng() % (depth > 0 ? 1 : 3));
    if (what == 0) {
      const char c = static_cast<char>('a' + rng() % 4);
      ops += c, posix += c;
    } else {
      ops += '(', posix += '(';
      choice(depth + 1);
      ops += ')', posix += ')';
    }
    static const char* quantifiers[] = {"", "", "", "?", "*", "+", "{2}", "{0,2}", "{1,3}", "{2,}"};
    const char* q = quantifiers[rng() % 10];
    ops += q, posix += q;
  }
  void sequence(int depth) {
    const int n = 1 + static_cast<int>(rng() % 3);
    for (int i = 0; i < n; ++i) {
      if (i > 0) ops += '-';
      piece(depth);
    }
  }
  void choice(int depth) {
    const int n = 1 + static_cast<int>(rng() % 2);
    for (int i = 0; i < n; ++i) {
      if (i > 0) ops += '|', posix += '|';
      sequence(depth);
    }
  }
};

TEST(Pattern, LongestMatchAgreesWithPosixRegexOnRandomPatterns) {
  std::mt19937 rng(std::random_device{}());
  for (int round = 0; round < 300; ++round) {
    RandomPattern r{rng};
    r.choice(0);
    const Pattern pattern(r.ops);
    const std::regex posix(r.posix, std::regex::extended);
    for (int k = 0; k < 20; ++k) {
      std::string letters;
      for (size_t n = rng() % 9; n > 0; --n) letters += static_cast<char>('a' + rng() % 5);  // 'e': never named
      std::vector<std::string> names;
      for (char c : letters) names.emplace_back(1, c);
      const size_t begin = letters.empty() ? 0 : rng() % letters.size();
      size_t expected = 0;
      for (size_t len = letters.size() - begin; len > 0 && expected == 0; --len)
        if (std::regex_match(letters.substr(begin, len), posix)) expected = len;
      EXPECT_EQ(match(r.ops, names, begin), expected) << r.ops << " on " << letters << " from " << begin;
    }
  }
}

TEST(Rules, DefaultSetCoversTheNamedFusions) {
  const auto rules = default_rules();
  for (const char* name : {"silu", "se_gate", "gelu_tanh", "fast_gelu", "mish", "hardswish", "rms_norm", "layer_norm",
                           "softmax", "swiglu", "rotary_embedding", "scaled_masked_softmax", "attention",
                           "add_layer_norm", "confusion_transpose", "fused_adam", "cross_entropy"}) {
    auto it = std::find_if(rules.begin(), rules.end(), [&](const Rule& r) { return r.name == name; });
    ASSERT_NE(it, rules.end()) << name;
    EXPECT_EQ(it->replacement.size(), 3u) << name << ": a replacement per backend";
  }
}

TEST(Rules, ReadsTheAscendAdvisorFileUnchanged) {
  const auto rules = load_rules(OPFUSE_TEST_DATA "/rules/ascend_advisor_timeline_fusion_ops.yaml");
  auto find = [&](const std::string& name) {
    auto it = std::find_if(rules.begin(), rules.end(), [&](const Rule& r) { return r.name == name; });
    return it == rules.end() ? nullptr : &*it;
  };
  for (const char* name : {"torch_npu.npu_rms_norm", "torch_npu.npu_swiglu", "torch_npu.npu_rotary_mul",
                           "torch_npu.npu_fusion_attention", "torch_npu.optim.NpuFusedAdam", "mindspeed.ops.npu_matmul_add"})
    EXPECT_NE(find(name), nullptr) << name;
  EXPECT_EQ(find("torch_npu.npu_swiglu")->patterns.size(), 10u);
  EXPECT_EQ(find("torch_npu.optim.NpuFusedAdam")->kind, "optimizer");
  EXPECT_THROW(parse_rules("rules: [{name: x}]", "r.yaml"), std::invalid_argument);
  EXPECT_THROW(parse_rules("rules: [{name: x, patterns: [a], replacement: {tpu: y}}]", "r.yaml"), std::invalid_argument);
  EXPECT_THROW(parse_rules("{ [", "r.yaml"), std::invalid_argument);
}

// One forward step of a tiny CUDA-like model: a Swish module (sigmoid, mul on one shape), an SE
// gate (sigmoid on [2,8,1,1], mul broadcasting it), a chain no rule knows, twice, and kernels.
std::string kineto_trace(bool fused) {
  std::string ev;
  double ts = 0;
  int corr = 0;
  auto op = [&](const std::string& name, const std::string& dims, double dur, const std::string& module = "") {
    ev += R"({"ph":"X","cat":"cpu_op","name":")" + name + R"(","pid":1,"tid":1,"ts":)" + std::to_string(ts) +
          R"(,"dur":)" + std::to_string(dur) + R"(,"args":{"Input Dims":)" + dims + R"(,"Input type":["float","float"])" +
          (module.empty() ? "" : R"(,"Module Hierarchy":")" + module + "\"") + "}},\n";
    // its launch and its kernel, linked by correlation
    ev += R"({"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":1,"tid":1,"ts":)" + std::to_string(ts + 1) +
          R"(,"dur":1,"args":{"correlation":)" + std::to_string(++corr) + "}},\n";
    ev += R"({"ph":"X","cat":"kernel","name":"k_)" + name + R"(","pid":0,"tid":7,"ts":)" + std::to_string(ts + 3) +
          R"(,"dur":)" + std::to_string(dur * 2) + R"(,"args":{"correlation":)" + std::to_string(corr) + "}},\n";
    ts += dur * 3;
  };
  ev += R"({"ph":"X","cat":"user_annotation","name":"ProfilerStep#1","pid":1,"tid":1,"ts":0,"dur":100000},)" "\n";
  for (int rep = 0; rep < 2; ++rep) {
    if (fused) {
      op("aten::silu", "[[2,8,4,4]]", 10, "model.act");
    } else {
      op("aten::sigmoid", "[[2,8,4,4]]", 10, "model.act");
      op("aten::mul", "[[2,8,4,4],[2,8,4,4]]", 10, "model.act");
    }
    op("aten::sigmoid", "[[2,8,1,1]]", 10, "model.se");
    op("aten::mul", "[[2,8,4,4],[2,8,1,1]]", 10, "model.se");
    op("aten::add", "[[3,5],[3,5]]", 10, "model.head");
    op("aten::exp", "[[3,5]]", 10, "model.head");
    op("aten::conv2d", "[[2,8,4,4],[8,8,3,3]]", 50);
  }
  ev.resize(ev.size() - 2);
  return "[" + ev + "]";
}

Analysis analyze_text(const std::string& json, Backend backend = Backend::cuda) {
  const trace::Trace t = trace::parse_trace(json, "t.json");
  Options o;
  o.backend = backend;
  return analyze(t, "t.json", default_rules(), o);
}

const Finding* find(const Analysis& a, const std::string& rule) {
  for (const auto& f : a.findings)
    if (f.rule == rule || (f.mined && f.pattern == rule)) return &f;
  return nullptr;
}

Analysis rank_analysis(const std::string& path, int64_t rank, double step_us, int64_t steps,
                       std::vector<std::pair<std::string, double>> savings) {
  Analysis a;
  a.trace.path = path;
  a.trace.rank = rank;
  a.trace.steps = steps;
  a.trace.step_us = step_us;
  a.trace.duration_us = step_us * std::max<int64_t>(1, steps) + 7;
  for (const auto& [rule, saving] : savings) {
    Finding f;
    f.rule = rule, f.pattern = rule + "-chain", f.replacement = "opfuse::" + rule;
    f.est_saving_us = saving * std::max<int64_t>(1, steps);
    f.time_us = 2 * f.est_saving_us;
    a.findings.push_back(f);
  }
  return a;
}

TEST(Ranks, RanksFromFileNamesWhenTracesDoNotSayAndSpreadPerStep) {
  const std::vector<Analysis> ranks = {rank_analysis("run/trace_rank_10.json", -1, 300, 4, {{"silu", 30}}),
                                       rank_analysis("run/rank2.json", -1, 100, 2, {{"silu", 10}, {"rope", 5}}),
                                       rank_analysis("run/rank-3.json", -1, 110, 3, {{"silu", 20}})};
  const Ranks r = compare_ranks(ranks);
  ASSERT_EQ(r.ranks.size(), 3u);
  EXPECT_EQ(r.ranks[0].rank, 2);
  EXPECT_EQ(r.ranks[1].rank, 3);
  EXPECT_EQ(r.ranks[2].rank, 10);
  EXPECT_EQ(r.slowest_rank, 10);
  EXPECT_NEAR(r.behind_pct, 100 * (300.0 / 110 - 1), 1e-9);
  ASSERT_EQ(r.findings.size(), 2u);
  EXPECT_EQ(r.findings[0].rule, "silu");
  EXPECT_EQ(r.findings[0].ranks, 3);
  EXPECT_DOUBLE_EQ(r.findings[0].saving_us_min, 10);
  EXPECT_DOUBLE_EQ(r.findings[0].saving_us_median, 20);
  EXPECT_DOUBLE_EQ(r.findings[0].saving_us_max, 30);
  EXPECT_DOUBLE_EQ(r.findings[0].time_us_median, 40);
  EXPECT_EQ(r.findings[1].ranks, 1);
}

TEST(Ranks, WithoutRanksInNamesTheOrderGivenAndWithoutStepsPerTrace) {
  const Ranks r = compare_ranks({rank_analysis("a.json", -1, 0, 0, {}), rank_analysis("b.json", -1, 0, 0, {})});
  EXPECT_EQ(r.ranks[0].trace, "a.json");
  EXPECT_EQ(r.ranks[1].rank, 1);
  EXPECT_FALSE(r.per_step);
  EXPECT_DOUBLE_EQ(r.ranks[0].step_us, 7);  // the trace's span
  EXPECT_THROW(compare_ranks({rank_analysis("x.json", 4, 1, 1, {}), rank_analysis("y.json", 4, 1, 1, {})}),
               std::invalid_argument);
}

TEST(Analyze, FindsRulesByShapeAndLocatesThemByModule) {
  const Analysis a = analyze_text(kineto_trace(false));
  EXPECT_EQ(a.trace.dialect, "PyTorch Kineto");
  EXPECT_EQ(a.trace.steps, 1);
  const Finding* silu = find(a, "silu");
  const Finding* gate = find(a, "se_gate");
  ASSERT_NE(silu, nullptr);
  ASSERT_NE(gate, nullptr);
  EXPECT_EQ(silu->occurrences, 2);
  EXPECT_EQ(gate->occurrences, 2);
  ASSERT_EQ(silu->locations.size(), 1u);
  EXPECT_EQ(silu->locations[0].where, "model.act");
  EXPECT_EQ(silu->locations[0].count, 2);
  EXPECT_EQ(gate->locations[0].where, "model.se");
  EXPECT_EQ(silu->replacement, "torch.nn.functional.silu");
  // On a device trace the chain's time is its kernels' time: 2 ops × 20 µs, twice.
  EXPECT_DOUBLE_EQ(silu->time_us, 80);
  EXPECT_GT(silu->est_saving_us, 0);
  EXPECT_LT(silu->est_saving_us, silu->time_us);
  // sigmoid-mul moves 5 tensors of one shape, the fused op 2, which would be 40 % of the time;
  // but the fused op cannot beat the slower of the two 20 µs kernels, so half is saved.
  EXPECT_EQ(silu->estimate, "slowest op");
  EXPECT_NEAR(silu->est_saving_us, 0.5 * 80, 1e-6);
  const Finding* mined = find(a, "add-exp");
  ASSERT_NE(mined, nullptr);
  EXPECT_TRUE(mined->mined);
  EXPECT_EQ(mined->occurrences, 2);
  // What to do about it: the kernel that would replace it, over what.
  EXPECT_EQ(mined->replacement.substr(0, 60), "elementwise kernel over [3, 5] float, its 2 ops in one pass ");
}

TEST(Analyze, OpTableAndDeviceTime) {
  const Analysis a = analyze_text(kineto_trace(false));
  auto conv = std::find_if(a.ops.begin(), a.ops.end(), [](const OpStat& s) { return s.name == "aten::conv2d"; });
  ASSERT_NE(conv, a.ops.end());
  EXPECT_EQ(conv->count, 2);
  EXPECT_DOUBLE_EQ(conv->total_us, 100);
  EXPECT_DOUBLE_EQ(conv->self_us, 98);     // the launch inside it is not its own time
  EXPECT_DOUBLE_EQ(conv->device_us, 200);  // its kernels, found through the correlation id
  EXPECT_TRUE(a.trace.has_device);
  ASSERT_EQ(a.trace.devices.size(), 1u);
  EXPECT_GT(a.trace.devices[0].idle_us, 0);
}

TEST(Analyze, DiffShowsTheFusedChainGone) {
  const Analysis before = analyze_text(kineto_trace(false)), after = analyze_text(kineto_trace(true));
  const Diff d = diff(before, after);
  ASSERT_EQ(d.vanished.size(), 1u);
  EXPECT_EQ(d.vanished[0].rule, "silu");
  EXPECT_TRUE(d.appeared.empty());
  auto silu = std::find_if(d.ops.begin(), d.ops.end(), [](const OpChange& c) { return c.name == "aten::silu"; });
  ASSERT_NE(silu, d.ops.end());
  EXPECT_EQ(silu->count_before, 0);
  EXPECT_EQ(silu->count_after, 2);
}

// A chain inside a wrapper op (the memory-efficient Swish's autograd Function) is found among
// its children and costs the wrapper's whole time; its backward is placed by the fwdbwd flow.
TEST(Analyze, ChainsInsideAParentAndBackwardLocations) {
  const std::string json = R"({"opfuse": {}, "traceEvents": [
    {"ph":"X","cat":"user_annotation","name":"blocks.0._swish","pid":1,"tid":1,"ts":0,"dur":30},
    {"ph":"X","cat":"cpu_op","name":"SwishImplementation","pid":1,"tid":1,"ts":1,"dur":28,"args":{"Sequence number":5}},
    {"ph":"X","cat":"cpu_op","name":"aten::sigmoid","pid":1,"tid":1,"ts":2,"dur":10,"args":{"Input Dims":[[4,4]]}},
    {"ph":"X","cat":"cpu_op","name":"aten::mul","pid":1,"tid":1,"ts":13,"dur":10,"args":{"Input Dims":[[4,4],[4,4]]}},
    {"ph":"s","cat":"fwdbwd","name":"fwdbwd","id":5,"pid":1,"tid":1,"ts":1},
    {"ph":"X","cat":"cpu_op","name":"autograd::engine::evaluate_function: CppNode<Swish>","pid":1,"tid":2,"ts":50,"dur":40},
    {"ph":"f","cat":"fwdbwd","name":"fwdbwd","id":5,"pid":1,"tid":2,"ts":50,"bp":"e"},
    {"ph":"X","cat":"cpu_op","name":"aten::sigmoid","pid":1,"tid":2,"ts":51,"dur":4,"args":{"Input Dims":[[4,4]]}},
    {"ph":"X","cat":"cpu_op","name":"aten::rsub","pid":1,"tid":2,"ts":56,"dur":4,"args":{"Input Dims":[[4,4],[]]}},
    {"ph":"X","cat":"cpu_op","name":"aten::mul","pid":1,"tid":2,"ts":61,"dur":4,"args":{"Input Dims":[[4,4],[4,4]]}},
    {"ph":"X","cat":"cpu_op","name":"aten::add","pid":1,"tid":2,"ts":66,"dur":4,"args":{"Input Dims":[[4,4],[]]}},
    {"ph":"X","cat":"cpu_op","name":"aten::mul","pid":1,"tid":2,"ts":71,"dur":4,"args":{"Input Dims":[[4,4],[4,4]]}},
    {"ph":"X","cat":"cpu_op","name":"aten::mul","pid":1,"tid":2,"ts":76,"dur":4,"args":{"Input Dims":[[4,4],[4,4]]}}]})";
  const Analysis a = analyze_text(json, Backend::cpu);
  EXPECT_EQ(a.trace.dialect, "opfuse profiler");
  const Finding* silu = find(a, "silu");
  ASSERT_NE(silu, nullptr);
  EXPECT_EQ(silu->occurrences, 2);
  EXPECT_DOUBLE_EQ(silu->time_us, 28 + 40);  // both wrappers whole
  std::vector<std::string> places;
  for (const auto& l : silu->locations) places.push_back(l.where);
  std::sort(places.begin(), places.end());
  EXPECT_EQ(places, (std::vector<std::string>{"blocks.0._swish", "blocks.0._swish (backward)"}));
}

// An optimizer step of two parameter groups: torch's fused AdamW records one _foreach_add_ (the
// step counts) and one _fused_adamw_ per group, four ops like a per-tensor step's; the fused op
// tells them apart. The per-tensor step of the same groups is found.
TEST(Analyze, AnOptimizerStepAlreadyFusedIsNoFinding) {
  auto step = [](const std::vector<std::string>& ops) {
    std::string ev = R"({"ph":"X","cat":"user_annotation","name":"Optimizer.step#AdamW.step","pid":1,"tid":1,"ts":0,"dur":100},)";
    double ts = 1;
    for (const std::string& op : ops) {
      ev += R"({"ph":"X","cat":"cpu_op","name":"aten::)" + op + R"(","pid":1,"tid":1,"ts":)" + std::to_string(ts) +
            R"(,"dur":10,"args":{"Input Dims":[[64,64],[64,64]],"Input type":["float","float"]}},)";
      ts += 12;
    }
    ev.pop_back();
    return R"({"opfuse": {}, "traceEvents": [)" + ev + "]}";
  };
  const Analysis fused = analyze_text(step({"_foreach_add_", "_fused_adamw_", "_foreach_add_", "_fused_adamw_"}), Backend::cpu);
  EXPECT_EQ(find(fused, "fused_adamw"), nullptr);
  const Analysis per_tensor = analyze_text(step({"lerp_", "mul_", "addcmul_", "sqrt", "div", "addcdiv_"}), Backend::cpu);
  EXPECT_NE(find(per_tensor, "fused_adamw"), nullptr);
}

// Cross entropy three ways: F.cross_entropy (cross_entropy_loss wrapping log_softmax and
// nll_loss_nd, each wrapping its own op), the two written out, and autograd's backward of either.
TEST(Analyze, CrossEntropyForwardSpellingsAndItsBackward) {
  std::string ev;
  auto op = [&](const std::string& name, int tid, double ts, double dur, const std::string& dims) {
    ev += fmt::format(R"({}{{"ph":"X","cat":"cpu_op","name":"{}","pid":1,"tid":{},"ts":{},"dur":{},"args":{{"Input Dims":{}}}}})",
                      ev.empty() ? "" : ",\n", name, tid, ts, dur, dims);
  };
  const std::string logits = "[[1024,32000],[]]", loss = "[[1024,32000],[1024]]";
  op("aten::cross_entropy_loss", 1, 0, 100, loss);
  op("aten::log_softmax", 1, 1, 60, logits);
  op("aten::_log_softmax", 1, 2, 58, logits);
  op("aten::nll_loss_nd", 1, 62, 30, loss);
  op("aten::nll_loss", 1, 63, 28, loss);
  op("aten::nll_loss_forward", 1, 64, 26, loss);
  op("aten::log_softmax", 1, 200, 60, logits);
  op("aten::_log_softmax", 1, 201, 58, logits);
  op("aten::nll_loss_nd", 1, 262, 30, loss);
  op("aten::nll_loss", 1, 263, 28, loss);
  op("aten::nll_loss_forward", 1, 264, 26, loss);
  op("autograd::engine::evaluate_function: NllLossBackward0", 2, 400, 50, "[]");
  op("aten::nll_loss_backward", 2, 401, 48, "[[],[1024,32000],[1024]]");
  op("autograd::engine::evaluate_function: LogSoftmaxBackward0", 2, 451, 70, "[]");
  op("aten::_log_softmax_backward_data", 2, 452, 68, "[[1024,32000],[1024,32000]]");
  const Analysis a = analyze_text("[" + ev + "]", Backend::cpu);
  const Finding* ce = find(a, "cross_entropy");
  ASSERT_NE(ce, nullptr);
  EXPECT_EQ(ce->occurrences, 3);
  EXPECT_EQ(ce->replacement, "opfuse::cross_entropy");
  EXPECT_DOUBLE_EQ(ce->time_us, 100 + (60 + 30) + (50 + 70));  // the wrapper whole, the two, the backward
  EXPECT_EQ(find(analyze_text("[" + ev + "]", Backend::cuda), "cross_entropy")->replacement,
            "liger_kernel LigerCrossEntropyLoss");
  EXPECT_EQ(find(analyze_text("[" + ev + "]", Backend::npu), "cross_entropy")->replacement,
            "torch.nn.functional.cross_entropy");
}

// The chain's time scaled by the opfuse op's time over the chain's own (the op's reference
// variant), both timed at the recorded shapes; without the reference, the op's own time.
TEST(Analyze, MeasuredSavingsComeFromTheTimer) {
  const std::string json = R"([{"ph":"X","cat":"cpu_op","name":"aten::sigmoid","pid":1,"tid":1,"ts":0,"dur":10,"args":{"Input Dims":[[8,3]]}},
    {"ph":"X","cat":"cpu_op","name":"aten::mul","pid":1,"tid":1,"ts":11,"dur":10,"args":{"Input Dims":[[8,3],[8,3]]}}])";
  const trace::Trace t = trace::parse_trace(json, "m.json");
  Options o;
  std::vector<std::string> asked;
  double reference_us = 10;
  o.measure = [&](const std::string& op, const std::string& dims) {
    asked.push_back(op + " " + dims);
    return op == "silu" ? 4.0 : reference_us;
  };
  const Analysis a = analyze(t, "m.json", default_rules(), o);
  ASSERT_FALSE(a.findings.empty());
  EXPECT_EQ(asked, (std::vector<std::string>{"silu 8,3", "silu@reference 8,3"}));
  EXPECT_DOUBLE_EQ(a.findings[0].est_saving_us, 20 - 20 * 4.0 / 10);
  EXPECT_EQ(a.findings[0].estimate, "opfuse::silu timed against reference");
  reference_us = -1;
  const Analysis alone = analyze(t, "m.json", default_rules(), o);
  EXPECT_DOUBLE_EQ(alone.findings[0].est_saving_us, 20 - 4);
  EXPECT_EQ(alone.findings[0].estimate, "measured opfuse::silu");
}

// A chain is timed in the layout its recorded strides give its activations, the opfuse op and the
// chain alike: channels-last, heads transposed; an NCHW one, a view that is not dense, or one
// without strides in torch's default layout.
TEST(Analyze, AChainIsTimedInItsRecordedLayout) {
  const auto trace_with = [](const std::string& strides) {
    const std::string args = R"("Input Dims":[[2,8,5,3]])" + (strides.empty() ? "" : R"(,"Input Strides":[)" + strides + "]");
    const std::string mul_args = R"("Input Dims":[[2,8,5,3],[2,8,5,3]])" +
                                 (strides.empty() ? "" : R"(,"Input Strides":[)" + strides + "," + strides + "]");
    return trace::parse_trace(R"([{"ph":"X","cat":"cpu_op","name":"aten::sigmoid","pid":1,"tid":1,"ts":0,"dur":10,"args":{)" +
                                  args + R"(}},{"ph":"X","cat":"cpu_op","name":"aten::mul","pid":1,"tid":1,"ts":11,"dur":10,"args":{)" +
                                  mul_args + "}}]",
                              "m.json");
  };
  std::vector<std::string> asked;
  Options o;
  o.measure = [&](const std::string& op, const std::string&) {
    asked.push_back(op);
    return 4.0;
  };
  for (const auto& [strides, layout] : {std::pair<std::string, std::string>{"[120,1,24,8]", "+order=0,2,3,1"},
                                        {"[120,15,3,1]", ""},
                                        {"[120,3,24,1]", "+order=0,2,1,3"},  // [B, H, T, D] from [B, T, H, D]
                                        {"[120,1,40,8]", ""},                // a view: not dense
                                        {"[0,15,3,1]", ""},                  // expanded
                                        {"", ""}}) {
    asked.clear();
    analyze(trace_with(strides), "m.json", default_rules(), o);
    EXPECT_EQ(asked, (std::vector<std::string>{"silu" + layout, "silu@reference" + layout})) << strides;
  }
}

// The memory-efficient Swish backward, sigmoid-rsub-mul-add-mul-mul on one shape: 16 tensor
// passes, against the fused op's 3. Streaming at the chain's own bandwidth bounds the fused op
// when the ops take time by their bytes; a compute-bound sigmoid bounds it when it dominates.
double swish_backward_saving(double sigmoid_us, double other_us, std::string& how) {
  std::string ev;
  double ts = 0;
  for (const char* name : {"sigmoid", "rsub", "mul", "add", "mul", "mul"}) {
    const std::string op = name;
    const double dur = op == "sigmoid" ? sigmoid_us : other_us;
    const char* dims = op == "sigmoid" || op == "rsub" ? "[[64,32]]" : "[[64,32],[64,32]]";
    ev += fmt::format(R"({}{{"ph":"X","cat":"cpu_op","name":"aten::{}","pid":1,"tid":1,"ts":{},"dur":{},"args":{{"Input Dims":{}}}}})",
                      ev.empty() ? "" : ",", op, ts, dur, dims);
    ts += dur + 1;
  }
  const Analysis a = analyze_text("[" + ev + "]", Backend::cpu);
  const Finding* silu = find(a, "silu");
  if (silu == nullptr) return -1;
  how = silu->estimate;
  return silu->est_saving_us;
}

TEST(Analyze, BandwidthEstimateIsBoundedByTheSlowestOp) {
  std::string how;
  EXPECT_NEAR(swish_backward_saving(10, 10, how), 60 - 60 * 3.0 / 16, 1e-6);
  EXPECT_EQ(how, "bandwidth");
  EXPECT_NEAR(swish_backward_saving(40, 4, how), 60 - 40, 1e-6);
  EXPECT_EQ(how, "slowest op");
}

// One thread of top-level ops named as a profiler names them: "aten::X", and for autograd nodes
// (…Backward0, AccumulateGrad) the engine's "evaluate_function: X" wrapping the node "X". Every
// tensor input [2,4,8], unless `dims` is empty (no shapes recorded, as the legacy profiler).
std::string op_sequence_trace(const std::vector<std::string>& names, const std::string& dims = "[[2,4,8],[2,4,8]]") {
  std::string ev;
  double ts = 0;
  for (const std::string& n : names) {
    const bool node = n.find("Backward") != std::string::npos || n == "torch::autograd::AccumulateGrad";
    const std::string args = dims.empty() ? "{}" : R"({"Input Dims":)" + dims + "}";
    auto slice = [&](const std::string& name, double at, double dur) {
      ev += fmt::format(R"({}{{"ph":"X","cat":"cpu_op","name":"{}","pid":1,"tid":1,"ts":{},"dur":{},"args":{}}})",
                        ev.empty() ? "" : ",\n", name, at, dur, args);
    };
    if (node) {
      slice("autograd::engine::evaluate_function: " + n, ts, 8);
      slice(n, ts + 1, 6);
    } else {
      slice("aten::" + n, ts, 8);
    }
    ts += 10;
  }
  return "[" + ev + "]";
}

std::vector<std::string> split_names(const std::string& dashed) {
  std::vector<std::string> out;
  for (size_t a = 0, b; a <= dashed.size(); a = b + 1) {
    b = dashed.find('-', a);
    if (b == std::string::npos) b = dashed.size();
    out.push_back(dashed.substr(a, b - a));
  }
  return out;
}

// SwiGLU with its projections, linear-silu-linear-mul, each op 8 µs: the two linears stay, so
// the fused chain takes their 16 µs plus the fused silu·mul, which is bounded by its slowest op
// (8 µs) when shapes are recorded, or is one op's time (8 µs) when they are not. Counting only
// the slowest op as the fused time (as before) claimed one linear as saved: 24 µs of 32.
TEST(Analyze, MatrixProductsInAChainStayInTheFusedTime) {
  for (const std::string dims : {"[[2,4,8],[2,4,8]]", ""}) {
    const Analysis a = analyze_text(op_sequence_trace({"linear", "silu", "linear", "mul"}, dims), Backend::cpu);
    const Finding* swiglu = find(a, "swiglu");
    ASSERT_NE(swiglu, nullptr) << dims;
    EXPECT_EQ(swiglu->occurrences, 1);
    EXPECT_DOUBLE_EQ(swiglu->time_us, 32);
    EXPECT_DOUBLE_EQ(swiglu->est_saving_us, 32 - 16 - 8) << dims;
    EXPECT_EQ(swiglu->estimate, dims.empty() ? "op count + matrix products" : "slowest op + matrix products");
  }
  // A chain without products is estimated as before.
  const Analysis plain = analyze_text(op_sequence_trace({"silu", "mul"}), Backend::cpu);
  ASSERT_NE(find(plain, "swiglu"), nullptr);
  EXPECT_EQ(find(plain, "swiglu")->estimate, "slowest op");
}

// A 4-d matmul (20 µs) spends 5 of them copying for its reshape, which the fused op does not
// make: the other 15 stay in the fused time, with the linear's 8 and the fused silu·mul's slowest
// op, 8 (with shapes recorded), or one of those two ops' time (without).
TEST(Analyze, AMatrixProductsCopiesAreSaved) {
  for (const std::string dims : {"[[2,4,8],[2,4,8]]", ""}) {
    std::string ev;
    auto op = [&](const std::string& name, double ts, double dur) {
      const std::string args = dims.empty() ? "{}" : R"({"Input Dims":)" + dims + "}";
      ev += fmt::format(R"({}{{"ph":"X","cat":"cpu_op","name":"aten::{}","pid":1,"tid":1,"ts":{},"dur":{},"args":{}}})",
                        ev.empty() ? "" : ",\n", name, ts, dur, args);
    };
    op("matmul", 0, 20), op("reshape", 1, 5), op("bmm", 8, 8);
    op("silu", 30, 8), op("linear", 40, 8), op("mul", 50, 8);
    const Finding* swiglu = find(analyze_text("[" + ev + "]", Backend::cpu), "swiglu");
    ASSERT_NE(swiglu, nullptr) << dims;
    EXPECT_DOUBLE_EQ(swiglu->time_us, 44);
    EXPECT_DOUBLE_EQ(swiglu->est_saving_us, 44 - (15 + 8) - 8) << dims;
  }
}

// The chains real model code produces, forward and backward, as torch 1.13's profiler recorded
// them (tests/analyze/record_real_spellings.py; autograd nodes in the order the engine ran them,
// AccumulateGrad where a parameter's gradient was ready). Each must be claimed whole, by one match
// of the rule whose fused op (and its backward) replaces it.
TEST(Rules, RealSpellingsForwardAndBackwardAreClaimedWhole) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      // Hugging Face's LlamaRMSNorm: .to(float32), pow, mean, + eps, rsqrt, mul, .to(dtype), weight *
      {"rms_norm", "to-pow-mean-add-rsqrt-mul-to-mul"},
      {"rms_norm", "MulBackward0-torch::autograd::AccumulateGrad-ToCopyBackward0-MulBackward0-RsqrtBackward0-"
                   "AddBackward0-MeanBackward1-PowBackward0-ToCopyBackward0"},
      {"rms_norm", "MulBackward0-torch::autograd::AccumulateGrad-MulBackward0-RsqrtBackward0-AddBackward0-"
                   "MeanBackward1-PowBackward0"},  // float32: no casts recorded in the backward
      // llama2.c's: x.float(), …, .type_as(x) * weight
      {"rms_norm", "to-pow-mean-add-rsqrt-mul-type_as-mul"},
      // mean(x * x) and pow(-0.5) for rsqrt, with and without the float cast
      {"rms_norm", "mul-mean-add-rsqrt-mul-mul"},
      {"rms_norm", "MulBackward0-torch::autograd::AccumulateGrad-MulBackward0-RsqrtBackward0-AddBackward0-"
                   "MeanBackward1-MulBackward0"},
      {"rms_norm", "pow-mean-add-pow-mul-mul"},
      {"rms_norm", "pow-mean-add-pow-to-mul-mul"},
      {"rms_norm", "to-pow-mean-add-pow-mul-type_as-mul"},
      // x / sqrt(mean(x²) + eps) * weight
      {"rms_norm", "pow-mean-add-sqrt-div-mul"},
      {"rms_norm", "MulBackward0-torch::autograd::AccumulateGrad-DivBackward0-SqrtBackward0-AddBackward0-"
                   "MeanBackward1-PowBackward0"},
      {"rms_norm", "MulBackward0-torch::autograd::AccumulateGrad-ToCopyBackward0-MulBackward0-PowBackward0-"
                   "AddBackward0-MeanBackward1-PowBackward0-ToCopyBackward0"},
      // a Llama block's residual add before llama2.c's norm (h = x + r; norm(h)); in the backward
      // the add's node after the norm's, once h's other use has given its gradient
      {"add_rms_norm", "add-to-pow-mean-add-rsqrt-mul-type_as-mul"},
      {"add_rms_norm", "MulBackward0-torch::autograd::AccumulateGrad-ToCopyBackward0-MulBackward0-RsqrtBackward0-"
                       "AddBackward0-MeanBackward1-PowBackward0-ToCopyBackward0-AddBackward0"},
      // minGPT's NewGELU (Hugging Face's gelu_new): forward and backward
      {"gelu_tanh", "mul-pow-mul-add-mul-tanh-add-mul"},
      {"gelu_tanh", "MulBackward0-AddBackward0-TanhBackward0-MulBackward0-AddBackward0-MulBackward0-PowBackward0-"
                    "MulBackward0"},
      // SwiGLU: F.silu(a) * b of a chunk, and llama2.c's w2(F.silu(w1(x)) * w3(x)), whose up
      // projection's backward runs between mul's and silu's
      {"swiglu", "chunk-silu-mul"},
      {"swiglu", "MulBackward0-SiluBackward0-SplitBackward0"},
      {"swiglu", "linear-silu-linear-mul"},
      {"swiglu", "MulBackward0-UnsafeViewBackward0-MmBackward0-ReshapeAliasBackward0-TBackward0-"
                 "torch::autograd::AccumulateGrad-SiluBackward0"},
      // Hugging Face's q * cos + rotate_half(q) * sin
      {"rotary_embedding", "mul-slice-slice-neg-cat-mul-add"},
      {"rotary_embedding", "AddBackward0-MulBackward0-CatBackward0-NegBackward0-SliceBackward0-SliceBackward0-"
                           "MulBackward0"},
      // llama2.c's real arithmetic on q and k together
      {"rotary_embedding", "to-reshape-unbind-to-reshape-unbind-mul-mul-sub-mul-mul-add-mul-mul-sub-mul-mul-add-"
                           "stack-flatten-stack-flatten-type_as-type_as"},
      {"rotary_embedding", "ToCopyBackward0-ToCopyBackward0-ReshapeAliasBackward0-StackBackward0-"
                           "ReshapeAliasBackward0-StackBackward0-AddBackward0-MulBackward0-MulBackward0-SubBackward0-"
                           "MulBackward0-MulBackward0-AddBackward0-MulBackward0-MulBackward0-SubBackward0-MulBackward0-"
                           "MulBackward0-UnbindBackward0-ReshapeAliasBackward0-ToCopyBackward0-UnbindBackward0-"
                           "ReshapeAliasBackward0-ToCopyBackward0"},
      // GPT-J's rotate_every_two: x[:, :, :, 1::2] and x[:, :, :, ::2], a slice per index
      {"rotary_embedding", "mul-slice-slice-slice-slice-slice-slice-slice-slice-neg-stack-flatten-mul-add"},
      {"rotary_embedding", "AddBackward0-MulBackward0-ReshapeAliasBackward0-StackBackward0-NegBackward0-"
                           "SliceBackward0-SliceBackward0-SliceBackward0-SliceBackward0-SliceBackward0-"
                           "SliceBackward0-SliceBackward0-SliceBackward0-MulBackward0"},
      // Meta's complex form
      {"rotary_embedding", "to-reshape-view_as_complex-to-reshape-view_as_complex-mul-view_as_real-flatten-mul-"
                           "view_as_real-flatten-type_as-type_as"},
      {"rotary_embedding", "ToCopyBackward0-ToCopyBackward0-ReshapeAliasBackward0-ViewAsRealBackward0-MulBackward0-"
                           "ReshapeAliasBackward0-ViewAsRealBackward0-MulBackward0-ViewAsComplexBackward0-"
                           "ReshapeAliasBackward0-ToCopyBackward0-ViewAsComplexBackward0-ReshapeAliasBackward0-"
                           "ToCopyBackward0"},
      // Hugging Face GPT-2's: / torch.full(…), the tril buffer sliced, torch.where(…, full(finfo.min))
      {"attention", "matmul-full-div-slice-slice-slice-slice-full-to-where-softmax-to-dropout-matmul"},
      {"attention", "UnsafeViewBackward0-BmmBackward0-ReshapeAliasBackward0-ExpandBackward0-"
                    "torch::autograd::AccumulateGrad-ReshapeAliasBackward0-ExpandBackward0-MulBackward0-"
                    "SoftmaxBackward0-WhereBackward0-DivBackward0-UnsafeViewBackward0-BmmBackward0"},
      // GPT-J's: q and k upcast, the fill made by torch.tensor, / sqrt(d) after the where
      {"attention", "matmul-slice-slice-slice-slice-empty-to-lift_fresh-detach_-to-where-div-softmax-to-dropout-matmul"},
      {"attention", "UnsafeViewBackward0-BmmBackward0-ReshapeAliasBackward0-ExpandBackward0-ReshapeAliasBackward0-"
                    "ExpandBackward0-MulBackward0-SoftmaxBackward0-DivBackward0-WhereBackward0-UnsafeViewBackward0-"
                    "BmmBackward0"},
      // llama2.c's under torch 2.x: the mask's full-size slice records an alias, softmax through float
      {"attention", "matmul-div-alias-add-to-softmax-type_as-dropout-matmul"},
      // minGPT's attention with dropout (torch 1.13's dropout: a mul in the backward)
      {"attention", "matmul-mul-slice-slice-slice-slice-eq-masked_fill-softmax-dropout-matmul"},
      {"attention", "UnsafeViewBackward0-BmmBackward0-ReshapeAliasBackward0-ExpandBackward0-"
                    "torch::autograd::AccumulateGrad-ReshapeAliasBackward0-ExpandBackward0-MulBackward0-"
                    "SoftmaxBackward0-MaskedFillBackward0-MulBackward0-UnsafeViewBackward0-BmmBackward0"},
  };
  for (const auto& [rule, chain] : cases) {
    SCOPED_TRACE(chain);
    const std::vector<std::string> names = split_names(chain);
    const Analysis a = analyze_text(op_sequence_trace(names), Backend::cpu);
    ASSERT_EQ(a.findings.size(), 1u);
    EXPECT_EQ(a.findings[0].rule, rule);
    EXPECT_EQ(a.findings[0].occurrences, 1);
    EXPECT_EQ(a.findings[0].ops, static_cast<int64_t>(names.size()));
  }
}

// The same modules recorded by torch 1.13's legacy profiler (whole µs, no shapes): forward and
// backward each found, by the one rule, and nothing else.
TEST(Rules, RealTracesOfEachSpellingFindForwardAndBackward) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"hf_rms_norm.bfloat16", "rms_norm"},        {"l2c_rms_norm.bfloat16", "rms_norm"},
      {"meansq_rms_norm.bfloat16", "rms_norm"},    {"powhalf_rms_norm.bfloat16", "rms_norm"},
      {"powhalf_float_rms_norm.bfloat16", "rms_norm"}, {"powhalf_float_rms_norm.float32", "rms_norm"},
      {"new_gelu.bfloat16", "gelu_tanh"},          {"chunk_swiglu.bfloat16", "swiglu"},
      {"swiglu_mlp.bfloat16", "swiglu"},           {"hf_rope.bfloat16", "rotary_embedding"},
      {"l2c_rope.bfloat16", "rotary_embedding"},   {"meta_rope.bfloat16", "rotary_embedding"},
      {"meta_rope.float32", "rotary_embedding"},   {"mingpt_attention.bfloat16", "attention"},
      {"div_rms_norm.bfloat16", "rms_norm"},       {"gptj_rope.bfloat16", "rotary_embedding"},
      {"hf_eager_attention.bfloat16", "attention"},
      // float32: in bfloat16 the mask value's full and its empty and fill_ all last 0 µs at one
      // start, and the legacy trace cannot tell the children from siblings
      {"gpt2_attention.float32", "attention"},     {"gptj_attention.float32", "attention"},
      {"neox_attention.float32", "attention"},     {"t5_attention.float32", "attention"},
      {"t5_attention.bfloat16", "attention"}};
  for (const auto& [name, rule] : cases) {
    SCOPED_TRACE(name);
    const std::string path = OPFUSE_TEST_DATA "/traces/real_spellings/" + name + ".legacy.json.gz";
    const Analysis a = analyze(trace::read_trace(path), path, default_rules(), {});
    std::string rules;
    for (const auto& f : a.findings) rules += f.rule + "; ";
    ASSERT_EQ(a.findings.size(), 1u) << rules;
    EXPECT_EQ(a.findings[0].rule, rule);
    // rotate_half's and rotate_every_two's forward and backward for q and for k; the others one
    // chain each way
    const bool q_and_k_apart = name.rfind("hf_rope", 0) == 0 || name.rfind("gptj_rope", 0) == 0;
    EXPECT_EQ(a.findings[0].occurrences, q_and_k_apart ? 4 : 2);
  }
}

// Without shapes a sigmoid-mul may be Swish (one shape) or an SE gate (a broadcast gate): the
// finding says so rather than naming either.
TEST(Analyze, ShapeUnknownNeverNamesTheWrongOp) {
  const Analysis a = analyze_text(op_sequence_trace({"sigmoid", "mul", "conv2d", "sigmoid", "mul"}, ""), Backend::cpu);
  ASSERT_EQ(a.findings.size(), 1u);
  const Finding& f = a.findings[0];
  EXPECT_EQ(f.rule, "se_gate or silu (shape unknown)");
  EXPECT_TRUE(f.shape_unknown);
  EXPECT_EQ(f.occurrences, 2);
  EXPECT_NE(f.replacement.find("opfuse::se_gate where an input broadcasts"), std::string::npos) << f.replacement;
  EXPECT_NE(f.replacement.find("opfuse::silu where the inputs have one shape"), std::string::npos) << f.replacement;
  EXPECT_EQ(find(a, "silu"), nullptr);
  EXPECT_EQ(find(a, "se_gate"), nullptr);
  // With shapes each is named: one shape is silu, a broadcast gate se_gate.
  const Analysis same = analyze_text(op_sequence_trace({"sigmoid", "mul"}, "[[2,8,4,4],[2,8,4,4]]"), Backend::cpu);
  ASSERT_EQ(same.findings.size(), 1u);
  EXPECT_EQ(same.findings[0].rule, "silu");
  EXPECT_FALSE(same.findings[0].shape_unknown);
  const Analysis gate = analyze_text(op_sequence_trace({"sigmoid", "mul"}, "[[2,8,4,4],[2,8,1,1]]"), Backend::cpu);
  ASSERT_EQ(gate.findings.size(), 1u);
  EXPECT_EQ(gate.findings[0].rule, "se_gate");
  // A rule with no shape condition still names its op without shapes; silu-mul (SwiGLU only on
  // one shape) is shape unknown in a real legacy trace, while its backward is named.
  const std::string path = OPFUSE_TEST_DATA "/traces/real_spellings/silu_mul.float32.legacy.json.gz";
  const Analysis legacy = analyze(trace::read_trace(path), path, default_rules(), {});
  ASSERT_NE(find(legacy, "swiglu (shape unknown)"), nullptr);
  EXPECT_EQ(find(legacy, "swiglu (shape unknown)")->occurrences, 1);
  ASSERT_NE(find(legacy, "swiglu"), nullptr);
  EXPECT_EQ(find(legacy, "swiglu")->occurrences, 1);
}

// One conv2d over an input and weight of these sizes and strides (none when strides is empty).
std::string conv_trace(const std::string& dims, const std::string& strides) {
  const std::string recorded = strides.empty() ? "" : R"(,"Input Strides":)" + strides;
  return R"([{"ph":"X","cat":"cpu_op","name":"aten::conv2d","pid":1,"tid":1,"ts":0,"dur":50,"args":{"Input Dims":)" + dims +
         recorded + "}}]";
}

// channels_last is advised for a convolution by its recorded strides: over NCHW, not over a
// channels-last input or weight, not where neither tells (one channel; a 1x1 weight is both
// layouts), never without strides; and with no estimate, which tune measures.
TEST(Analyze, ChannelsLastIsAdvisedByTheConvolutionsStrides) {
  const std::string nchw = "[[2,8,16,16],[8,8,3,3],[8]]";
  const Analysis a = analyze_text(conv_trace(nchw, "[[2048,256,16,1],[72,9,3,1],[1]]"), Backend::cpu);
  const Finding* f = find(a, "channels_last");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->kind, "layout");
  EXPECT_FALSE(f->estimated);
  EXPECT_EQ(f->est_saving_us, 0);
  EXPECT_EQ(f->estimate, "not estimated: tune measures a layout change");
  EXPECT_EQ(f->replacement, "model.to(memory_format=torch.channels_last)");
  EXPECT_EQ(find(analyze_text(conv_trace(nchw, "[[2048,1,128,8],[72,9,3,1],[1]]"), Backend::cpu), "channels_last"), nullptr);
  EXPECT_EQ(find(analyze_text(conv_trace(nchw, "[[2048,256,16,1],[72,1,24,8],[1]]"), Backend::cpu), "channels_last"), nullptr);
  EXPECT_EQ(find(analyze_text(conv_trace(nchw, ""), Backend::cpu), "channels_last"), nullptr);
  const std::string pointwise = "[[2,8,16,16],[8,8,1,1],[]]";
  EXPECT_NE(find(analyze_text(conv_trace(pointwise, "[[2048,256,16,1],[8,1,1,1],[]]"), Backend::cpu), "channels_last"), nullptr);
  const std::string one_channel = "[[2,1,16,16],[8,1,3,3],[8]]";
  EXPECT_EQ(find(analyze_text(conv_trace(one_channel, "[[256,256,16,1],[9,9,3,1],[1]]"), Backend::cpu), "channels_last"),
            nullptr);
  EXPECT_THROW(parse_rules(R"(rules: [{name: x, patterns: [{match: a, memory_format: nhwc}], replacement: {cpu: y}}])", "r.yaml"),
               std::invalid_argument);
  EXPECT_THROW(parse_rules(R"(rules: [{name: x, patterns: [a], memory_format: nhwc, replacement: {cpu: y}}])", "r.yaml"),
               std::invalid_argument);
}

// At whole µs a parent and its child tie: equal start and length. The nesting (and so the op
// sequences and findings) must not depend on the order the file lists them in.
TEST(Analyze, TiesAtWholeMicrosecondsNestTheSameInAnyFileOrder) {
  std::vector<std::string> events = {
      // linear and its matmul tie on both: the one recorded first (External id) is the parent
      R"({"ph":"X","cat":"cpu_op","name":"aten::linear","pid":1,"tid":1,"ts":10,"dur":5,"args":{"External id":7,"Input Dims":[[2,4,8],[8,8]]}})",
      R"({"ph":"X","cat":"cpu_op","name":"aten::matmul","pid":1,"tid":1,"ts":10,"dur":5,"args":{"External id":8,"Input Dims":[[2,4,8],[8,8]]}})",
      R"({"ph":"X","cat":"cpu_op","name":"aten::silu","pid":1,"tid":1,"ts":16,"dur":1,"args":{"External id":9,"Input Dims":[[2,4,8]]}})",
      R"({"ph":"X","cat":"cpu_op","name":"aten::linear","pid":1,"tid":1,"ts":18,"dur":2,"args":{"External id":10,"Input Dims":[[2,4,8],[8,8]]}})",
      R"({"ph":"X","cat":"cpu_op","name":"aten::mul","pid":1,"tid":1,"ts":21,"dur":0,"args":{"External id":11,"Input Dims":[[2,4,8],[2,4,8]]}})",
      // a zero-length child on its parent's end
      R"({"ph":"X","cat":"cpu_op","name":"aten::empty_strided","pid":1,"tid":1,"ts":20,"dur":0,"args":{"External id":12,"Input Dims":[[]]}})",
      // the backward, no ids (the legacy profiler): zero-length wrappers tie with their nodes
      R"({"ph":"X","cat":"cpu_op","name":"autograd::engine::evaluate_function: MulBackward0","pid":1,"tid":1,"ts":30,"dur":0,"args":{"Input Dims":[[2,4,8]]}})",
      R"({"ph":"X","cat":"cpu_op","name":"MulBackward0","pid":1,"tid":1,"ts":30,"dur":0,"args":{"Input Dims":[[2,4,8]]}})",
      R"({"ph":"X","cat":"cpu_op","name":"autograd::engine::evaluate_function: SiluBackward0","pid":1,"tid":1,"ts":31,"dur":0,"args":{"Input Dims":[[2,4,8]]}})",
      R"({"ph":"X","cat":"cpu_op","name":"SiluBackward0","pid":1,"tid":1,"ts":31,"dur":0,"args":{"Input Dims":[[2,4,8]]}})",
      // and a wrapper whose node the legacy profiler put a µs past the wrapper's end
      R"({"ph":"X","cat":"cpu_op","name":"autograd::engine::evaluate_function: SplitBackward0","pid":1,"tid":1,"ts":33,"dur":0,"args":{"Input Dims":[[2,4,8]]}})",
      R"({"ph":"X","cat":"cpu_op","name":"SplitBackward0","pid":1,"tid":1,"ts":34,"dur":0,"args":{"Input Dims":[[2,4,8]]}})"};
  auto summary = [](const std::vector<std::string>& order) {
    std::string json;
    for (const auto& e : order) json += (json.empty() ? "[" : ",\n") + e;
    const trace::Trace t = trace::parse_trace(json + "]", "ties.json");
    const trace::Links m = trace::build_links(t);
    std::vector<std::string> nesting;  // "child < parent" for every op
    for (size_t i = 0; i < t.events.size(); ++i)
      nesting.push_back(t.strings[t.events[i].name] + " < " +
                        (m.op_parent[i] < 0 ? std::string("top") : t.strings[t.events[m.op_parent[i]].name]));
    std::sort(nesting.begin(), nesting.end());
    const Analysis a = analyze(t, "ties.json", default_rules(), {});
    std::string out = fmt::format("{}\n", fmt::join(nesting, "\n"));
    for (const auto& op : a.ops) out += fmt::format("{} {}\n", op.name, op.count);
    for (const auto& f : a.findings) out += fmt::format("{} {} {}\n", f.rule, f.occurrences, f.ops);
    return out;
  };
  const std::string in_order = summary(events);
  EXPECT_NE(in_order.find("aten::matmul < aten::linear"), std::string::npos) << in_order;
  EXPECT_NE(in_order.find("aten::empty_strided < aten::linear"), std::string::npos) << in_order;
  EXPECT_NE(in_order.find("MulBackward0 < autograd::engine::evaluate_function: MulBackward0"), std::string::npos) << in_order;
  EXPECT_NE(in_order.find("SplitBackward0 < autograd::engine::evaluate_function: SplitBackward0"), std::string::npos)
      << in_order;
  // linear-silu-linear-mul forward, MulBackward0-SiluBackward0-SplitBackward0 backward
  EXPECT_NE(in_order.find("swiglu 2 7"), std::string::npos) << in_order;
  std::vector<std::string> reversed(events.rbegin(), events.rend());
  EXPECT_EQ(summary(reversed), in_order);
  std::mt19937 rng(18);
  for (int round = 0; round < 20; ++round) {
    std::vector<std::string> shuffled = events;
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    EXPECT_EQ(summary(shuffled), in_order);
  }
}

// Inputs kept from fuzzing (scripts/fuzz.sh): each reads or is rejected cleanly, and analyses.
TEST(Analyze, FuzzRegressionInputs) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(OPFUSE_TEST_DATA "/fuzz")) {
    SCOPED_TRACE(entry.path().string());
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    try {
      const trace::Trace t = trace::parse_trace(bytes.str(), entry.path().string());
      analyze(t, "fuzz", default_rules(), {});
    } catch (const std::invalid_argument&) {
    }
    ++n;
  }
  EXPECT_GE(n, 2);
}

}  // namespace
}  // namespace opfuse::analyze
