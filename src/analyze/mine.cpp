// Chain mining (mine.h).
#include "analyze/mine.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace opfuse::analyze {
namespace {

// The single shape of an unclaimed elementwise op's tensor inputs, or null.
const Shape* run_shape(OpIndex& index, const std::vector<char>& claimed, int32_t e) {
  if (!index.elementwise(e)) return nullptr;
  for (int32_t x = e; x >= 0; x = index.links.op_parent[x])  // inside a match (an optimizer step) is taken
    if (claimed[x]) return nullptr;
  return index.shapes(e).single;
}

void mine_sequence(OpIndex& index, const std::vector<char>& claimed, const int32_t* seq, size_t n,
                   std::vector<Match>& out) {
  size_t i = 0;
  while (i < n) {
    const Shape* shape = run_shape(index, claimed, seq[i]);
    if (shape == nullptr) {
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < n && j - i < 8) {
      const Shape* next = run_shape(index, claimed, seq[j]);
      if (next == nullptr || next != shape) break;
      ++j;
    }
    if (j - i >= 2) {
      Match mt;
      mt.ops.assign(seq + i, seq + j);
      for (int32_t e : mt.ops) mt.key += (mt.key.empty() ? "" : "-") + index.name(e);
      out.push_back(std::move(mt));
    }
    i = j;
  }
}

}  // namespace

std::vector<Match> mine_chains(OpIndex& index, const std::vector<char>& claimed) {
  std::vector<Match> mined;
  index.for_each_sequence([&](const int32_t* seq, size_t n, int32_t) { mine_sequence(index, claimed, seq, n, mined); });
  return mined;
}

// Its ops share one input shape (that is how they were mined), so one elementwise pass over it
// does their work.
std::string chain_advice(OpIndex& index, const Match& chain) {
  const trace::Event& first = index.trace.events[chain.ops[0]];
  const std::string& types = index.trace.strings[first.types];
  const std::string dtype = types.substr(0, types.find(';'));
  const Shape* shape = index.shapes(chain.ops[0]).single;
  return fmt::format("elementwise kernel over [{}]{}, its {} ops in one pass (no rule names one yet: write it, "
                     "or name an existing op in a rule of your own, --rules FILE)",
                     shape ? fmt::format("{}", fmt::join(*shape, ", ")) : "?", dtype.empty() ? "" : " " + dtype,
                     chain.ops.size());
}

}  // namespace opfuse::analyze
