// Steps inferred from a trace without ProfilerStep markers (repeated_steps.cpp).
#pragma once

#include "opfuse/trace.h"

namespace opfuse::analyze {

struct RepeatedSteps {
  int64_t steps = 0;   // whole repeats of the period; 0 when the ops do not clearly repeat
  size_t period = 0;   // top-level ops per step
  double step_us = 0;  // median time from one repeat's first op to the next one's
};

// A training loop profiled without a schedule repeats the same top-level ops on its main thread
// (the one with the most) once per step: forward ops, the backward call, the optimizer step.
// Inferred only when that sequence is whole repeats of one period (a partial step before the first
// and after the last allowed), at least two of them, and the period shows training (an optimizer
// step or a backward op): a forward pass of identical layers alone is no step.
RepeatedSteps repeated_steps(const trace::Trace& trace, const trace::Model& model);

}  // namespace opfuse::analyze
