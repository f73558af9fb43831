// Rule matching, chain mining and the saving estimate (findings.cpp).
#pragma once

#include "opfuse/analyze.h"

namespace opfuse::analyze {

// With `finding_of_event`, also marks each event of a match (its ops and their wrapper op) with
// the index of its finding in the result, −1 elsewhere: the timeline colours by it.
std::vector<Finding> find_fusions(const trace::Trace& trace, const trace::Model& model, const std::vector<Rule>& rules,
                                  const Options& options, std::vector<int32_t>* finding_of_event = nullptr);

}  // namespace opfuse::analyze
