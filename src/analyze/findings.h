// Rule matching, chain mining and the saving estimate (findings.cpp).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "opfuse/analyze.h"

namespace opfuse::analyze {

// Savings leave out profiler_us_per_event (profiler_cost) for each record inside an op. With
// `finding_of_event`, also marks each event of a match (its ops and their wrapper op) with the
// index of its finding in the result, −1 elsewhere: the timeline colours by it.
std::vector<Finding> find_fusions(const trace::Trace& trace, const trace::Links& links, const std::vector<Rule>& rules,
                                  const Options& options, double profiler_us_per_event = 0,
                                  std::vector<int32_t>* finding_of_event = nullptr);

// What opfuse's profiler added per op, scope or allocation recorded in a step: the median
// profiled step's excess over the unprofiled step the trace records, spread over a step's
// records; 0 without markers or that time.
double profiler_cost(const trace::Trace& trace, const trace::Links& links);

// Per event, what profiling took inside it at `each` per record: the ops inside an op and the
// allocations its thread made while it ran (a per-parameter optimizer op makes none, a forward
// op one or two).
std::vector<double> profiled_cost_inside(const trace::Trace& trace, const trace::Links& links, double each);

// A recorded "Input type" string ("float;float;Scalar") split into one entry per input.
std::vector<std::string_view> split_types(const std::string& types);

// Bytes per element of a recorded "Input type" ("float", "c10::BFloat16", "long int" …); 4 when unknown.
int64_t dtype_bytes(std::string_view type);

}  // namespace opfuse::analyze
