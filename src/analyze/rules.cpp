// Rule files: opfuse's own (rules/*.yaml: a name, patterns, a replacement per backend) and the
// Ascend advisor's timeline fusion file, read unchanged (versions that add to or delete from
// the rules of the versions they inherit; op patterns under "aten", optimizer steps under
// "Optimizer").
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "opfuse/analyze.h"

namespace opfuse::analyze {

extern const char* const kDefaultRules;  // rules/default.yaml, compiled in (default_rules.cpp.in)

namespace {

[[noreturn]] void fail(const std::string& name, const YAML::Node& at, const std::string& what) {
  throw std::invalid_argument(fmt::format("{}: {} at line {}", name, what, at.Mark().line + 1));
}

std::string scalar(const std::string& name, const YAML::Node& n, const std::string& what) {
  if (!n || !n.IsScalar()) fail(name, n, fmt::format("{} must be a string", what));
  return n.as<std::string>();
}

std::shared_ptr<Pattern> compile(const std::string& name, const YAML::Node& at, const std::string& text) {
  try {
    return std::make_shared<Pattern>(text);
  } catch (const std::invalid_argument& e) {
    fail(name, at, e.what());
  }
}

Shapes parse_shapes(const std::string& name, const YAML::Node& n) {
  const std::string s = scalar(name, n, "shapes");
  if (s == "any") return Shapes::any;
  if (s == "same") return Shapes::same;
  if (s == "broadcast") return Shapes::broadcast;
  fail(name, n, "shapes must be any, same or broadcast");
}

RulePattern parse_pattern(const std::string& name, const YAML::Node& n) {
  RulePattern p;
  if (n.IsScalar()) {
    p.pattern = compile(name, n, n.as<std::string>());
    return p;
  }
  if (!n.IsMap()) fail(name, n, "a pattern is a string or a map with 'match'");
  p.pattern = compile(name, n, scalar(name, n["match"], "match"));
  if (n["measure"]) p.measure = scalar(name, n["measure"], "measure");
  if (n["shapes"]) p.shapes = parse_shapes(name, n["shapes"]);
  if (n["passes"]) p.passes = n["passes"].as<int>();
  if (n["calls"]) p.calls = scalar(name, n["calls"], "calls");
  if (n["runs_as"]) {
    p.runs_as = scalar(name, n["runs_as"], "runs_as");
    if (p.runs_as != "reference" && p.runs_as != "aten" && p.runs_as != "none")
      fail(name, n["runs_as"], "runs_as must be reference, aten or none");
    if (p.measure.empty()) fail(name, n["runs_as"], "runs_as names the measured op's variant: it needs measure");
  }
  if (n["memory_format"]) {
    if (scalar(name, n["memory_format"], "memory_format") != "contiguous")
      fail(name, n["memory_format"], "a pattern's memory_format must be contiguous");
    p.memory_format = MemoryFormat::contiguous;
  }
  if (!p.calls.empty() && (p.measure.empty() || p.runs_as != "none"))
    fail(name, n["calls"], "calls counts the measured op's calls: it needs measure and runs_as: none");
  return p;
}

Rule parse_opfuse_rule(const std::string& name, const YAML::Node& n) {
  if (!n.IsMap()) fail(name, n, "a rule is a map");
  Rule r;
  r.name = scalar(name, n["name"], "name");
  r.kind = n["kind"] ? scalar(name, n["kind"], "kind") : "elementwise";
  r.source = name;
  if (n["min_children"]) r.min_children = n["min_children"].as<int>();
  if (const YAML::Node fused = n["fused_by"]) {
    if (!fused.IsSequence()) fail(name, fused, "fused_by must be a list of op names");
    for (const auto& op : fused) r.fused_by.push_back(scalar(name, op, "an op name"));
  }
  const YAML::Node patterns = n["patterns"];
  if (!patterns || !patterns.IsSequence() || patterns.size() == 0) fail(name, n, "rule '" + r.name + "' needs patterns");
  for (const auto& p : patterns) r.patterns.push_back(parse_pattern(name, p));
  const YAML::Node repl = n["replacement"];
  if (!repl || !repl.IsMap()) fail(name, n, "rule '" + r.name + "' needs a replacement per backend");
  for (const auto& kv : repl)
    r.replacement[parse_backend(kv.first.as<std::string>())] = scalar(name, kv.second, "replacement");
  if (const YAML::Node ts = n["torchscript"]) {
    if (!ts.IsSequence()) fail(name, ts, "torchscript must be a list of {pattern, replacement, inline?}");
    for (const auto& g : ts)
      r.torchscript.push_back({scalar(name, g["pattern"], "a torchscript pattern"),
                               scalar(name, g["replacement"], "a torchscript replacement"),
                               g["inline"] && g["inline"].as<bool>()});
  }
  if (const YAML::Node py = n["python"]) {
    if (!py.IsMap()) fail(name, py, "python must be a map with module, fx and/or optimizer");
    if (py["module"]) r.python.module = scalar(name, py["module"], "a python module class");
    if (py["kind"]) r.python.kind = scalar(name, py["kind"], "a submodule kind");
    // (where rule files before the C++ optimizers named it)
    if (py["optimizer"]) r.optimizer = scalar(name, py["optimizer"], "an opfuse optimizer class");
    if (const YAML::Node fx = py["fx"]) {
      if (!fx.IsSequence()) fail(name, fx, "python fx must be a list of {pattern, replacement, outputs?}");
      for (const auto& g : fx) {
        FxRewrite f{scalar(name, g["pattern"], "an fx pattern"), scalar(name, g["replacement"], "an fx replacement"), {}};
        if (const YAML::Node outs = g["outputs"]) {
          if (!outs.IsSequence()) fail(name, outs, "fx outputs must be a list of names");
          for (const auto& o : outs) f.outputs.push_back(scalar(name, o, "an fx output name"));
        }
        r.python.fx.push_back(f);
      }
    }
  }
  if (n["optimizer"]) r.optimizer = scalar(name, n["optimizer"], "an opfuse optimizer class");  // over python's
  if (n["memory_format"]) {
    r.memory_format = scalar(name, n["memory_format"], "memory_format");
    if (r.memory_format != "channels_last") fail(name, n["memory_format"], "a rule's memory_format must be channels_last");
  }
  return r;
}

// Advisor versions apply in order: each "add" puts patterns under a replacement, each "delete"
// takes a replacement away; the union over versions is what a current CANN offers.
std::vector<Rule> parse_advisor(const std::string& name, const YAML::Node& root) {
  std::vector<Rule> rules;
  auto find = [&](const std::string& replacement) {
    auto it = std::find_if(rules.begin(), rules.end(), [&](const Rule& r) { return r.name == replacement; });
    if (it != rules.end()) return it;
    Rule r;
    r.name = replacement;
    r.source = name;
    for (Backend b : {Backend::cpu, Backend::cuda, Backend::npu, Backend::mtia}) r.replacement[b] = replacement;
    rules.push_back(r);
    return rules.end() - 1;
  };
  for (const auto& version : root) {
    const YAML::Node ops = version["operator_rules"];
    if (!ops) continue;
    if (!ops.IsMap()) fail(name, ops, "operator_rules must be a map");
    for (const auto& section : ops) {
      const bool optimizer = section.first.as<std::string>() == "Optimizer";
      if (const YAML::Node del = section.second["delete"]; del && del.IsMap())
        for (const auto& kv : del) {
          const std::string replacement = kv.first.as<std::string>();
          rules.erase(std::remove_if(rules.begin(), rules.end(), [&](const Rule& r) { return r.name == replacement; }),
                      rules.end());
        }
      const YAML::Node add = section.second["add"];
      if (!add) continue;
      if (!add.IsMap()) fail(name, add, "'add' must map replacements to patterns");
      for (const auto& kv : add) {
        auto rule = find(kv.first.as<std::string>());
        rule->kind = optimizer ? "optimizer" : "advisor";
        rule->min_children = optimizer ? 2 : 0;
        rule->patterns.clear();
        const YAML::Node list = kv.second;
        if (!list.IsSequence()) fail(name, list, "patterns must be a list");
        for (const auto& p : list) {
          const std::string text = scalar(name, p, "a pattern");
          RulePattern rp;
          rp.pattern = compile(name, p, optimizer ? "Optimizer.step#" + text : text);
          if (optimizer) rp.passes = 7;
          rule->patterns.push_back(rp);
        }
      }
    }
  }
  return rules;
}

}  // namespace

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::cpu: return "cpu";
    case Backend::cuda: return "cuda";
    case Backend::npu: return "npu";
    case Backend::mtia: return "mtia";
  }
  return "cpu";
}

Backend parse_backend(const std::string& name) {
  if (name == "cpu") return Backend::cpu;
  if (name == "cuda") return Backend::cuda;
  if (name == "npu") return Backend::npu;
  if (name == "mtia") return Backend::mtia;
  throw std::invalid_argument(fmt::format("unknown backend '{}' (cpu, cuda, npu or mtia)", name));
}

std::vector<Rule> parse_rules(const std::string& yaml_text, const std::string& name) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw std::invalid_argument(fmt::format("{}: {} at line {}", name, e.msg, e.mark.line + 1));
  }
  try {
    if (root.IsSequence()) return parse_advisor(name, root);
    if (!root.IsMap() || !root["rules"] || !root["rules"].IsSequence())
      fail(name, root, "expected a map with a 'rules' list (or an Ascend advisor rule file)");
    std::vector<Rule> rules;
    for (const auto& r : root["rules"]) rules.push_back(parse_opfuse_rule(name, r));
    return rules;
  } catch (const YAML::Exception& e) {
    throw std::invalid_argument(fmt::format("{}: {} at line {}", name, e.msg, e.mark.line + 1));
  }
}

std::vector<Rule> load_rules(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument(fmt::format("{}: cannot open", path));
  std::stringstream text;
  text << in.rdbuf();
  return parse_rules(text.str(), path);
}

std::vector<Rule> default_rules() { return parse_rules(kDefaultRules, "rules/default.yaml"); }

std::vector<Rule> rule_set(const std::vector<std::string>& files, bool with_defaults) {
  std::vector<Rule> rules;
  for (const auto& file : files) {
    auto more = load_rules(file);
    rules.insert(rules.end(), more.begin(), more.end());
  }
  if (with_defaults) {
    auto defaults = default_rules();
    rules.insert(rules.end(), defaults.begin(), defaults.end());
  }
  return rules;
}

}  // namespace opfuse::analyze
