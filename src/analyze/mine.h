// Chain mining: runs of elementwise ops no rule names, which one kernel could replace.
#pragma once

#include <string>
#include <vector>

#include "analyze/match.h"

namespace opfuse::analyze {

// In every sequence, runs of 2 to 8 consecutive elementwise ops, none claimed by a rule's match
// (nor inside one), whose tensor inputs all have one shape; each keyed by its ops' names.
std::vector<Match> mine_chains(OpIndex& index, const std::vector<char>& claimed);

// What to do about a mined chain: which kernel would replace it, over what.
std::string chain_advice(OpIndex& index, const Match& chain);

}  // namespace opfuse::analyze
