// The profiler's trace of real EfficientNet training steps: layout, nesting, links, scopes.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "opfuse/train.h"

namespace opfuse::profile {
namespace {

using nlohmann::json;

std::string read_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  std::string text;
  char buf[65536];
  for (int n; (n = gzread(f, buf, sizeof buf)) > 0;) text.append(buf, n);
  gzclose(f);
  return text;
}

json profile_run(const std::vector<std::string>& fuse, const std::string& name) {
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  std::filesystem::remove(path);
  train::TrainOptions o;
  o.image_size = 32;
  o.batch_size = 2;
  o.steps = 1;
  o.warmup = 1;
  o.num_classes = 10;
  o.fuse = fuse;
  o.profile = path;
  o.profile_steps = 2;
  train::train(o);
  const bool gz = path.size() > 3 && path.substr(path.size() - 3) == ".gz";
  std::string text;
  if (gz) {
    text = read_gz(path);
  } else {
    std::ifstream in(path);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::filesystem::remove(path);
  return json::parse(text);  // throws on invalid JSON
}

std::vector<json> complete_events(const json& trace) {
  std::vector<json> out;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X") out.push_back(e);
  std::stable_sort(out.begin(), out.end(), [](const json& a, const json& b) {
    const double ta = a["ts"], tb = b["ts"];
    return ta != tb ? ta < tb : double(a["dur"]) > double(b["dur"]);
  });
  return out;
}

// Children of each event by index, from nesting per thread.
std::map<size_t, std::vector<size_t>> children_of(const std::vector<json>& ev) {
  std::map<size_t, std::vector<size_t>> children;
  std::map<int64_t, std::vector<size_t>> stacks;
  for (size_t i = 0; i < ev.size(); ++i) {
    auto& stack = stacks[ev[i]["tid"].get<int64_t>()];
    const double ts = ev[i]["ts"];
    while (!stack.empty() && double(ev[stack.back()]["ts"]) + double(ev[stack.back()]["dur"]) <= ts + 1e-3) stack.pop_back();
    if (!stack.empty()) children[stack.back()].push_back(i);
    stack.push_back(i);
  }
  return children;
}

TEST(Trace, IsKinetoLayoutWithSaneTimesAndNesting) {
  const json trace = profile_run({}, "opfuse_test_trace.json");
  EXPECT_EQ(trace["displayTimeUnit"], "ms");
  EXPECT_EQ(trace["opfuse"]["model"], "efficientnet-b0");
  EXPECT_EQ(trace["opfuse"]["batch_size"], 2);
  std::set<std::string> metadata;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "M") metadata.insert(e["name"].get<std::string>());
  EXPECT_TRUE(metadata.count("process_name") && metadata.count("thread_name"));

  const auto ev = complete_events(trace);
  ASSERT_GT(ev.size(), 1000u);
  std::set<std::string> steps;
  int convolutions = 0;
  for (const auto& e : ev) {
    EXPECT_GE(double(e["dur"]), 0.0) << e.dump();
    EXPECT_TRUE(e["cat"] == "cpu_op" || e["cat"] == "user_annotation") << e.dump();
    if (e["cat"] == "cpu_op") {
      EXPECT_TRUE(e["args"].contains("Input Dims") && e["args"].contains("Input Strides") && e["args"].contains("Input type"));
      EXPECT_EQ(e["args"]["Input Strides"].size(), e["args"]["Input Dims"].size()) << e.dump();
    }
    // Strides as torch.profiler records them: the model runs in torch's default (NCHW) layout.
    if (e["name"] == "aten::conv2d" && convolutions++ == 0) {
      const json& dims = e["args"]["Input Dims"][0];
      ASSERT_EQ(dims.size(), 4u) << e.dump();
      const int64_t c = dims[1], h = dims[2], w = dims[3];
      EXPECT_EQ(e["args"]["Input Strides"][0], json({c * h * w, h * w, w, 1})) << e.dump();
    }
    const std::string name = e["name"];
    if (name.rfind("ProfilerStep#", 0) == 0) steps.insert(name);
  }
  EXPECT_EQ(steps, (std::set<std::string>{"ProfilerStep#3", "ProfilerStep#4"}));

  // Per thread, a child never outlives its parent: strict nesting, no partial overlap.
  std::map<int64_t, std::vector<size_t>> stacks;
  for (size_t i = 0; i < ev.size(); ++i) {
    auto& stack = stacks[ev[i]["tid"].get<int64_t>()];
    const double ts = ev[i]["ts"], end = ts + double(ev[i]["dur"]);
    while (!stack.empty() && double(ev[stack.back()]["ts"]) + double(ev[stack.back()]["dur"]) <= ts + 1e-3) stack.pop_back();
    if (!stack.empty()) {
      const double parent_end = double(ev[stack.back()]["ts"]) + double(ev[stack.back()]["dur"]);
      EXPECT_LE(end, parent_end + 1e-3) << ev[i]["name"] << " overlaps " << ev[stack.back()]["name"];
    }
    stack.push_back(i);
  }
}

TEST(Trace, EveryBackwardNodeLinksToOneForwardOp) {
  const json trace = profile_run({}, "opfuse_test_links.json.gz");
  std::map<int64_t, int> starts, finishes;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "s") ++starts[e["id"].get<int64_t>()];
    if (e["ph"] == "f") {
      ++finishes[e["id"].get<int64_t>()];
      EXPECT_EQ(e["bp"], "e");
    }
  }
  int backward_nodes = 0;
  for (const auto& e : complete_events(trace)) {
    const std::string name = e["name"];
    if (!e["args"].contains("Sequence number")) continue;
    if (name.find("Backward") == std::string::npos && name.find("CppNode") == std::string::npos) continue;
    if (name.rfind("autograd::engine", 0) == 0) continue;
    ++backward_nodes;
    const int64_t seq = e["args"]["Sequence number"];
    EXPECT_EQ(starts[seq], 1) << name << " seq " << seq;
    EXPECT_EQ(finishes[seq], 1) << name << " seq " << seq;
  }
  EXPECT_GT(backward_nodes, 100);
}

TEST(Trace, MemoryEfficientSwishShowsItsSmallOps) {
  const json trace = profile_run({}, "opfuse_test_me.json");
  const auto ev = complete_events(trace);
  const auto children = children_of(ev);
  int swish = 0, backward = 0;
  for (size_t i = 0; i < ev.size(); ++i) {
    const std::string name = ev[i]["name"];
    std::multiset<std::string> kids;
    if (children.count(i))
      for (size_t c : children.at(i)) kids.insert(ev[c]["name"].get<std::string>());
    if (name == "SwishImplementation") {
      ++swish;
      EXPECT_TRUE(kids.count("aten::sigmoid") && kids.count("aten::mul")) << "SwishImplementation holds sigmoid and mul";
      EXPECT_TRUE(ev[i]["args"].contains("Module Hierarchy"));
    }
    if (name.find("SwishImplementation>") != std::string::npos && name.rfind("autograd::engine", 0) != 0) {
      ++backward;
      // g · (s · (1 + i · (1 − s))): sigmoid, 1 − s (C++ spells it fill_ + sub_, Python rsub), mul ×3, add
      EXPECT_TRUE(kids.count("aten::sigmoid") && (kids.count("aten::rsub") || kids.count("aten::sub_")) &&
                  kids.count("aten::add"));
      EXPECT_GE(kids.count("aten::mul"), 3u);
    }
  }
  EXPECT_GT(swish, 30);
  EXPECT_EQ(backward, swish);
}

TEST(Trace, FusedSwishScopeHoldsOneOpAndOneBackwardNode) {
  const json trace = profile_run({"silu", "se_gate"}, "opfuse_test_fused.json");
  const auto ev = complete_events(trace);
  const auto children = children_of(ev);
  int scopes = 0, silu_backward_nodes = 0;
  for (size_t i = 0; i < ev.size(); ++i) {
    const std::string name = ev[i]["name"];
    const bool swish_scope = name == "_swish" || (name.size() > 7 && name.substr(name.size() - 7) == "._swish");
    if (ev[i]["cat"] == "user_annotation" && swish_scope) {
      ++scopes;
      ASSERT_TRUE(children.count(i));
      ASSERT_EQ(children.at(i).size(), 1u) << name;
      EXPECT_EQ(ev[children.at(i)[0]]["name"], "opfuse::silu");
      EXPECT_EQ(ev[children.at(i)[0]]["args"]["Module Hierarchy"], name);
    }
    if (name.find("SiluFunction>") != std::string::npos && name.rfind("autograd::engine", 0) != 0) {
      ++silu_backward_nodes;
      std::vector<std::string> kids;
      for (size_t c : children.count(i) ? children.at(i) : std::vector<size_t>{}) kids.push_back(ev[c]["name"]);
      EXPECT_EQ(kids, std::vector<std::string>{"opfuse::silu_backward"});
    }
    EXPECT_NE(name, "SwishImplementation");
  }
  EXPECT_GT(scopes, 30);
  EXPECT_EQ(silu_backward_nodes, scopes);
}

}  // namespace
}  // namespace opfuse::profile
