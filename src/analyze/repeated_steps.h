// Steps inferred from a trace without ProfilerStep markers (repeated_steps.cpp).
#pragma once

#include <vector>

#include "opfuse/trace.h"

namespace opfuse::analyze {

struct RepeatedSteps {
  int64_t steps = 0;   // 0 when the ops do not clearly repeat
  double step_us = 0;  // median time from one step's start to the next one's
  std::vector<double> starts;  // each step's first op's start, in time order
};

// A training loop profiled without a schedule repeats the same top-level ops once per step:
// forward ops, the backward call, the optimizer step. Inferred, at least two steps, when
//  - the main thread's (the one with the most) top-level ops are whole repeats of one period (a
//    partial step before the first and after the last allowed) that shows training (an optimizer
//    step or a backward op): a forward pass of identical layers alone is no step; or else
//  - the thread that runs Optimizer.step ops, split after each, gives steps that nearly repeat
//    (80% of their ops in common with the median step), as real loops do.
// Anything less clear gives no steps.
RepeatedSteps repeated_steps(const trace::Trace& trace, const trace::Links& links);

}  // namespace opfuse::analyze
