// Rule matching (match.h): a pattern is tried only where the sequence holds a name it can start
// with, decided once per name; matches claim their ops in rule order.
#include "analyze/match.h"

#include <algorithm>

namespace opfuse::analyze {
namespace {

class RuleMatcher {
 public:
  // Which op names each pattern can begin with, decided once per name rather than per op.
  RuleMatcher(OpIndex& ops, const std::vector<Rule>& rules, std::vector<char>& claims) : index(ops), claimed(claims) {
    for (const Rule& rule : rules)
      for (const RulePattern& rp : rule.patterns) {
        std::vector<char> starts(index.trace.strings.size(), 0);
        std::vector<int16_t> position(index.trace.strings.size(), -1);
        const std::vector<std::string>& mentioned = rp.pattern->names();
        for (size_t i = 0; i < index.trace.strings.size(); ++i) {
          if (index.names()[i].empty()) continue;
          starts[i] = rp.pattern->can_start(index.names()[i]);
          const auto it = std::find(mentioned.begin(), mentioned.end(), index.names()[i]);
          if (it != mentioned.end()) position[i] = static_cast<int16_t>(it - mentioned.begin());
        }
        can_start.push_back(std::move(starts));
        name_of.push_back(std::move(position));
      }
    for (const Rule& rule : rules)
      for (const RulePattern& rp : rule.patterns) flat.emplace_back(&rule, &rp);
    words = (flat.size() + 63) / 64;
    starters.assign(index.trace.strings.size() * words, 0);
    for (size_t k = 0; k < flat.size(); ++k)
      for (size_t i = 0; i < index.trace.strings.size(); ++i)
        if (can_start[k][i]) starters[i * words + k / 64] |= uint64_t{1} << (k % 64);
  }

  void match_sequence(const int32_t* seq, size_t n, int32_t parent, std::vector<Match>& out) {
    // Only the patterns that can start at some op of the sequence are tried, still in rule
    // order; most sequences (conv2d → convolution → …) have none.
    ids.resize(n);  // in sequence order, so the scans below stay in cache
    candidates.assign(words, 0);
    for (size_t i = 0; i < n; ++i) {
      ids[i] = index.name_id(seq[i]);
      const uint64_t* bits = &starters[size_t{ids[i]} * words];
      for (size_t w = 0; w < words; ++w) candidates[w] |= bits[w];
    }
    for (size_t w = 0; w < words; ++w)
      for (uint64_t bits = candidates[w]; bits != 0; bits &= bits - 1) {
        const size_t k = w * 64 + static_cast<size_t>(__builtin_ctzll(bits));
        const Rule& rule = *flat[k].first;
        const RulePattern& rp = *flat[k].second;
        const std::vector<char>& starts = can_start[k];
        const std::vector<int16_t>& pattern_names = name_of[k];
        for (size_t i = 0; i < n;) {
          const bool try_here = starts[ids[i]] && !claimed[seq[i]];
          const size_t len = try_here ? rp.pattern->match(ids.data(), n, i, pattern_names) : 0;
          if (len > 0) {
            std::vector<int32_t> ops(seq + i, seq + i + len);
            const Verdict v = acceptable(rule, rp, ops);
            if (v != Verdict::no) {
              for (int32_t e : ops) claimed[e] = 1;
              Match mt{rule.name, &rule, &rp, std::move(ops), -1, {}};
              if (v == Verdict::unknown) readings_of(k, i, len, mt);
              if (parent >= 0 && len == n) mt.parent = parent;
              out.push_back(std::move(mt));
              i += len;
              continue;
            }
          }
          ++i;
        }
      }
  }


 private:
  enum class Verdict { no, yes, unknown };

  // Whether the ops' tensor inputs have the shapes a rule asks for; unknown where an op recorded
  // none (the legacy profiler records no shapes), so that sigmoid-mul is never called silu or an
  // SE gate on a guess.
  Verdict shapes_ok(const std::vector<int32_t>& ops, Shapes want) {
    if (want == Shapes::any) return Verdict::yes;
    const Shape* first = nullptr;
    bool all_same = true;
    for (int32_t e : ops) {
      const OpShapes& known = index.shapes(e);
      if (known.shapes.empty()) return Verdict::unknown;
      for (const Shape* s : known.shapes) {
        if (first == nullptr) first = s;
        else if (s != first) all_same = false;
      }
    }
    return (want == Shapes::same) == all_same ? Verdict::yes : Verdict::no;
  }

  // A match whose shapes are unknown names every rule that could claim the same ops by their
  // shapes (se_gate or silu for sigmoid-mul), in rule order, and no replacement of its own.
  void readings_of(size_t k, size_t i, size_t len, Match& mt) {
    mt.readings.push_back(flat[k]);
    auto named = [&](const Rule* r) {
      return std::any_of(mt.readings.begin(), mt.readings.end(), [&](const auto& x) { return x.first == r; });
    };
    for (size_t j = k + 1; j < flat.size(); ++j) {
      if (flat[j].second->shapes == Shapes::any || named(flat[j].first)) continue;
      if (!can_start[j][ids[i]] || flat[j].second->pattern->match(ids.data(), ids.size(), i, name_of[j]) != len) continue;
      mt.readings.push_back(flat[j]);
    }
    mt.key.clear();
    for (const auto& x : mt.readings) mt.key += (mt.key.empty() ? "" : " or ") + x.first->name;
    mt.key += " (shape unknown)";
  }

  Verdict acceptable(const Rule& rule, const RulePattern& rp, const std::vector<int32_t>& ops) {
    if (std::any_of(ops.begin(), ops.end(), [&](int32_t e) { return claimed[e]; })) return Verdict::no;
    // Inside an op a fusion already took (SwishImplementation, claimed with its BatchNorm).
    for (int32_t x = index.links.op_parent[ops[0]]; x >= 0; x = index.links.op_parent[x])
      if (claimed[x]) return Verdict::no;
    const auto children = static_cast<size_t>(rule.min_children);
    if (rule.min_children > 0 && (ops.size() != 1 || index.links.child_count(ops[0]) < children)) return Verdict::no;
    if (!rule.fused_by.empty() && runs_any(ops[0], rule.fused_by)) return Verdict::no;
    if (rp.memory_format == MemoryFormat::contiguous &&
        !std::all_of(ops.begin(), ops.end(), [&](int32_t e) { return in_contiguous_format(e); }))
      return Verdict::no;
    return shapes_ok(ops, rp.shapes);
  }

  // Whether an op's 4-d tensor inputs are in torch's contiguous (NCHW) format, at least one of them
  // not channels-last as well. Without recorded strides (opfuse's profiler before them, the legacy
  // profiler) it cannot be told, and a layout is never changed on a guess.
  bool in_contiguous_format(int32_t e) const {
    const trace::Event& ev = index.trace.events[e];
    if (ev.strides == 0) return false;
    const auto sizes = parse_dims(index.trace.strings[ev.dims]);
    const auto strides = parse_dims(index.trace.strings[ev.strides]);
    bool decided = false;
    for (size_t k = 0; k < sizes.size() && k < strides.size(); ++k) {
      if (sizes[k].size() != 4) continue;
      const Layout4d layout = layout_4d(sizes[k], strides[k]);
      if (layout == Layout4d::channels_last || layout == Layout4d::other) return false;
      decided |= layout == Layout4d::nchw;
    }
    return decided;
  }

  // Whether one of the op's children is one of these ops (named as patterns name them, "aten::" dropped).
  bool runs_any(int32_t e, const std::vector<std::string>& ops) const {
    for (size_t k = 0; k < index.links.child_count(e); ++k) {
      const std::string& child = index.name(index.links.children_of(e)[k]);
      if (std::find(ops.begin(), ops.end(), child) != ops.end()) return true;
    }
    return false;
  }

  OpIndex& index;
  std::vector<char>& claimed;
  std::vector<std::vector<char>> can_start;  // per rule pattern, per string id: may a match start here
  std::vector<std::vector<int16_t>> name_of; // per rule pattern, per string id: its index in the pattern's names
  std::vector<std::pair<const Rule*, const RulePattern*>> flat;  // every rule pattern, in rule order
  size_t words = 0;                          // 64-bit words in a set of patterns
  std::vector<uint64_t> starters;            // per string id: the patterns that may start there
  std::vector<uint64_t> candidates;          // scratch: the patterns that may start in a sequence
  std::vector<uint32_t> ids;                 // scratch: a sequence's name ids
};

}  // namespace

std::vector<Match> match_rules(OpIndex& index, const std::vector<Rule>& rules, std::vector<char>& claimed) {
  RuleMatcher matcher(index, rules, claimed);
  std::vector<Match> matches;
  index.for_each_sequence([&](const int32_t* seq, size_t n, int32_t parent) {
    matcher.match_sequence(seq, n, parent, matches);
  });
  return matches;
}

}  // namespace opfuse::analyze
