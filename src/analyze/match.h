// Rule matching: every occurrence of a rule's op pattern in a trace's op sequences.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "analyze/op_index.h"

namespace opfuse::analyze {

// One occurrence of a rule pattern or a mined chain.
struct Match {
  std::string key;  // the rule's name, or the mined chain's names
  const Rule* rule = nullptr;
  const RulePattern* pattern = nullptr;
  std::vector<int32_t> ops;
  int32_t parent = -1;  // set when the match is every child of this op
  // Shapes unknown: each rule pattern it may be by its shapes, `rule` the first.
  std::vector<std::pair<const Rule*, const RulePattern*>> readings;
};

// The rules' matches in every sequence (OpIndex::for_each_sequence), earlier rules first: a
// match claims its ops (`claimed`, per event), and no later match takes a claimed op or one
// inside it. A match whose shapes the trace does not record names every rule it may be.
std::vector<Match> match_rules(OpIndex& index, const std::vector<Rule>& rules, std::vector<char>& claimed);

}  // namespace opfuse::analyze
