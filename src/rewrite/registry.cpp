// Rule → rewrite: module swaps on the built-in EfficientNet, and TorchScript pattern pairs
// (from the rule files) for scripted models.
#include <fmt/format.h>
#include <torch/csrc/jit/ir/irparser.h>
#include <torch/csrc/jit/ir/subgraph_matcher.h>
#include <torch/csrc/jit/passes/constant_propagation.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/passes/subgraph_rewrite.h>

#include <algorithm>
#include <optional>
#include <unordered_set>

#include "rewrite/targets.h"

namespace opfuse::rewrite {
namespace {

using torch::jit::Graph;

std::shared_ptr<Graph> parse_graph(const std::string& text, const char* what) {
  auto graph = std::make_shared<Graph>();
  try {
    torch::jit::parseIR(text, graph.get());
  } catch (const std::exception& e) {
    const std::string why = e.what();
    throw std::invalid_argument(fmt::format("torchscript {} does not parse: {}", what, why.substr(0, why.find('\n'))));
  }
  return graph;
}

// The op a replacement introduces, counted to know how many places changed: its opfuse op (the
// glue around it, e.g. attention's transpose of kᵀ back to k, is not), else its first op.
// (in a prim::If's blocks too: a replacement may keep the composite for the dtypes the op does
// not cover).
std::optional<c10::Symbol> opfuse_op_in(const torch::jit::Block* block) {
  for (const torch::jit::Node* n : block->nodes()) {
    if (std::string(n->kind().ns().toUnqualString()) == "opfuse") return n->kind();
    for (const torch::jit::Block* inner : n->blocks())
      if (auto op = opfuse_op_in(inner)) return op;
  }
  return std::nullopt;
}

c10::Symbol introduced_op(const Graph& replacement) {
  if (auto op = opfuse_op_in(replacement.block())) return *op;
  for (const torch::jit::Node* n : replacement.nodes())
    if (n->kind() != c10::prim::Constant) return n->kind();
  throw std::invalid_argument("torchscript replacement has no op");
}

int count_nodes(const torch::jit::Block* block, c10::Symbol kind) {
  int n = 0;
  for (const torch::jit::Node* node : block->nodes()) {
    n += node->kind() == kind;
    for (const torch::jit::Block* inner : node->blocks()) n += count_nodes(inner, kind);
  }
  return n;
}

// A pattern's distinct inputs must be distinct values: x·sigmoid(g) is not meant to take x·sigmoid(x),
// which the silu pattern covers. Constants are exempt: a saved model pools them, so the residual
// add's alpha and the eps add's are one value there.
torch::jit::MatchFilter distinct_inputs(const Graph& pattern) {
  std::vector<std::string> inputs;
  for (const torch::jit::Value* v : pattern.inputs()) inputs.push_back(v->debugName());
  return [inputs](const torch::jit::Match& match, const std::unordered_map<std::string, torch::jit::Value*>& vmap) {
    std::unordered_set<const torch::jit::Value*> seen;
    for (const auto& name : inputs) {
      const auto v = vmap.find(name);
      if (v == vmap.end()) continue;
      const auto bound = match.values_map.find(v->second);
      if (bound == match.values_map.end() || bound->second->node()->kind() == c10::prim::Constant) continue;
      if (!seen.insert(bound->second).second) return false;
    }
    return true;
  };
}

// Module reads and constants moved as early as their inputs allow (moved, never merged: distinct
// values stay distinct for distinct_inputs). SubgraphRewriter inserts a replacement at the first
// use of a pattern's outputs and skips a match whose inputs come later; inlining leaves a
// submodule's weight read and a folded constant just before their use, after the residual add
// that add_rms_norm's patterns start at. Not done where the forward sets an attribute.
void hoist_reads(Graph& graph) {
  if (count_nodes(graph.block(), c10::prim::SetAttr) > 0) return;
  std::unordered_set<const torch::jit::Value*> ready(graph.inputs().begin(), graph.inputs().end());
  torch::jit::Node* first_other = nullptr;
  const std::vector<torch::jit::Node*> nodes(graph.nodes().begin(), graph.nodes().end());
  for (torch::jit::Node* n : nodes) {
    const bool read = (n->kind() == c10::prim::GetAttr || n->kind() == c10::prim::Constant) &&
                      std::all_of(n->inputs().begin(), n->inputs().end(), [&](auto* v) { return ready.count(v) > 0; });
    if (!read) {
      if (first_other == nullptr) first_other = n;
      continue;
    }
    ready.insert(n->outputs().begin(), n->outputs().end());
    if (first_other != nullptr) n->moveBefore(first_other);
  }
}

}  // namespace

int rewrite_graph(Target& model, const std::string& pattern, const std::string& replacement, bool inline_calls) {
  const auto pattern_graph = parse_graph(pattern, "pattern");
  const c10::Symbol op = introduced_op(*parse_graph(replacement, "replacement"));
  auto* ts = dynamic_cast<TorchScriptTarget*>(&model);
  if (ts == nullptr) return 0;
  // Every submodule's code becomes the forward's own, each call site a copy (the submodules'
  // methods stay, no longer called), as torch.jit.freeze does; constants are then folded, so
  // that branches on them (F.softmax's `if dim is None`, which reads the scores) are gone.
  std::shared_ptr<Graph> forward = ts->module.get_method("forward").graph();
  if (inline_calls) {
    torch::jit::Inline(*forward);
    torch::jit::ConstantPropagation(forward);
    hoist_reads(*forward);
  }
  torch::jit::SubgraphRewriter rewriter;
  rewriter.RegisterRewritePattern(pattern, replacement);
  const torch::jit::MatchFilter filter = distinct_inputs(*pattern_graph);
  auto rewrite = [&](std::shared_ptr<Graph> graph) {
    const int before = count_nodes(graph->block(), op);
    rewriter.runOnGraph(graph, filter);
    return count_nodes(graph->block(), op) - before;
  };
  // A forward that calls no method (inlined, or written so) is all that runs: places are its own.
  if (count_nodes(forward->block(), c10::Symbol::fromQualString("prim::CallMethod")) == 0) return rewrite(forward);
  int replaced = 0;
  std::unordered_set<const Graph*> done;  // submodules of one class share their method graphs
  for (const auto& m : ts->module.modules())
    for (const auto& method : m.get_methods())
      if (done.insert(method.graph().get()).second) replaced += rewrite(method.graph());
  return replaced;
}

std::vector<Rewriter> rewriters_for(const analyze::Rule& rule) {
  std::vector<Rewriter> out;
  for (const ModuleFusion& fusion : efficientnet_fusions()) {
    if (rule.name != fusion.rule) continue;
    out.push_back({rule.name, fusion.what, [rule = fusion.rule](Target& m) {
                     auto* net = dynamic_cast<EfficientNetTarget*>(&m);
                     return net == nullptr ? 0 : net->fuse(rule);
                   }});
  }
  if (!rule.torchscript.empty()) {
    const auto pairs = rule.torchscript;
    const std::string op = introduced_op(*parse_graph(pairs.front().replacement, "replacement")).toQualString();
    const std::string name = fmt::format("TorchScript graph → {} ({} pattern{})", op, pairs.size(),
                                         pairs.size() == 1 ? "" : "s");
    out.push_back({rule.name, name, [pairs, name](Target& m) {
                     int places = 0;
                     for (const auto& p : pairs) places += rewrite_graph(m, p.pattern, p.replacement, p.inline_calls);
                     if (places > 0)
                       if (auto* ts = dynamic_cast<TorchScriptTarget*>(&m)) ts->applied.push_back(name);
                     return places;
                   }});
  }
  return out;
}

}  // namespace opfuse::rewrite
