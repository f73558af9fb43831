// The findings: rule matches and mined chains, tallied with their time, saving and locations.
#pragma once

#include <cstdint>
#include <vector>

#include "opfuse/analyze.h"

namespace opfuse::analyze {

// Savings leave out profiler_us_per_event (profiler_cost) for each record inside an op. With
// `finding_of_event`, also marks each event of a match (its ops and their wrapper op) with the
// index of its finding in the result, −1 elsewhere: the timeline colours by it.
std::vector<Finding> find_fusions(const trace::Trace& trace, const trace::Links& links, const std::vector<Rule>& rules,
                                  const Options& options, double profiler_us_per_event = 0,
                                  std::vector<int32_t>* finding_of_event = nullptr);

}  // namespace opfuse::analyze
