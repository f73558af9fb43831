// Rule matching, chain mining and the saving estimate (findings.cpp).
#pragma once

#include "opfuse/analyze.h"

namespace opfuse::analyze {

std::vector<Finding> find_fusions(const trace::Trace& trace, const trace::Model& model, const std::vector<Rule>& rules,
                                  const Options& options);

}  // namespace opfuse::analyze
