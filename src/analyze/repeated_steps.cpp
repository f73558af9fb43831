// Steps from a repeated pattern of top-level ops (see repeated_steps.h).
#include "analyze/repeated_steps.h"

#include <algorithm>
#include <string>

#include "opfuse/stats.h"

namespace opfuse::analyze {
namespace {

using trace::Links;
using trace::Trace;

// A step is nearly another when this share of its ops (as a multiset of names, over the longer
// of the two) is in both. Real loops differ a little from step to step: on a 3-layer MLP traced
// by torch 1.13, 2–4 of ~27 top-level ops per step (allocations, the first step's lazy state,
// whole-µs nesting); another loop differs in most.
constexpr double kNearlyShared = 0.8;

bool is_training_name(const std::string& name) {
  return name.starts_with("Optimizer.") || name.find("Backward") != std::string::npos ||
         name.starts_with("autograd::engine::evaluate_function");
}

double end_of(const Trace& t, int32_t e) { return t.events[e].ts + t.events[e].dur; }

std::vector<uint32_t> names_of(const Trace& t, const std::vector<int32_t>& ops) {
  std::vector<uint32_t> names(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) names[i] = t.events[ops[i]].name;
  return names;
}

// The smallest p with s[i] == s[i + p] for every i: n minus the longest proper border of s
// (Knuth–Morris–Pratt's failure function). Any stretch of P P P … has P's length as a period,
// so a trace that starts or ends inside a step still shows it.
size_t smallest_period(const std::vector<uint32_t>& s) {
  std::vector<size_t> border(s.size(), 0);
  for (size_t i = 1, k = 0; i < s.size(); ++i) {
    while (k > 0 && s[i] != s[k]) k = border[k - 1];
    if (s[i] == s[k]) ++k;
    border[i] = k;
  }
  return s.size() - (s.empty() ? 0 : border.back());
}

// Exact repeats on the thread with the most top-level ops.
RepeatedSteps exact_repeats(const Trace& t, const Links& m) {
  const std::vector<int32_t>* main = nullptr;
  for (const auto& ops : m.threads)
    if (main == nullptr || ops.size() > main->size()) main = &ops;
  if (main == nullptr || main->size() < 4) return {};
  const std::vector<uint32_t> names = names_of(t, *main);
  const size_t p = smallest_period(names), k = names.size() / p;
  if (p < 2 || k < 2) return {};
  if (!std::any_of(names.begin(), names.begin() + p, [&](uint32_t n) { return is_training_name(t.strings[n]); })) return {};
  std::vector<double> spans, starts;  // first op of a repeat to the first of the next (the last: to its last op's end)
  for (size_t j = 0; j < k; ++j) {
    const size_t next = (j + 1) * p;
    const double end = next < names.size() ? t.events[(*main)[next]].ts : end_of(t, main->back());
    starts.push_back(t.events[(*main)[j * p]].ts);
    spans.push_back(end - starts.back());
  }
  return {static_cast<int64_t>(k), median(spans), starts};
}

// The share of ops two steps have in common, as multisets of names (both sorted).
double shared(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  size_t common = 0;
  for (size_t i = 0, j = 0; i < a.size() && j < b.size();)
    if (a[i] == b[j]) ++common, ++i, ++j;
    else if (a[i] < b[j]) ++i;
    else ++j;
  return static_cast<double>(common) / static_cast<double>(std::max<size_t>(1, std::max(a.size(), b.size())));
}

// Near repeats: a training loop steps its optimizer once per step, so the Optimizer.step ops
// split the thread that runs them into steps, each ending with one. Taken when every step between
// two of them is nearly the median one; the ops before the first count as a step only when they
// are nearly one too (a trace that starts mid-step has less).
RepeatedSteps optimizer_steps(const Trace& t, const Links& m) {
  const std::vector<int32_t>* thread = nullptr;
  std::vector<size_t> ends;  // indices of its optimizer steps
  for (const auto& ops : m.threads) {
    std::vector<size_t> at;
    for (size_t i = 0; i < ops.size(); ++i)
      if (t.strings[t.events[ops[i]].name].starts_with("Optimizer.step")) at.push_back(i);
    if (at.size() > ends.size()) thread = &ops, ends = std::move(at);
  }
  if (ends.size() < 2) return {};
  const std::vector<uint32_t> names = names_of(t, *thread);
  auto step = [&](size_t begin, size_t end) {  // names[begin, end], sorted
    std::vector<uint32_t> s(names.begin() + begin, names.begin() + end + 1);
    std::sort(s.begin(), s.end());
    return s;
  };
  std::vector<std::vector<uint32_t>> steps;  // the whole ones: from after one optimizer step to the next
  for (size_t j = 1; j < ends.size(); ++j) steps.push_back(step(ends[j - 1] + 1, ends[j]));
  std::vector<size_t> by_length(steps.size());
  for (size_t j = 0; j < steps.size(); ++j) by_length[j] = j;
  std::stable_sort(by_length.begin(), by_length.end(), [&](size_t a, size_t b) { return steps[a].size() < steps[b].size(); });
  const std::vector<uint32_t>& typical = steps[by_length[by_length.size() / 2]];
  if (typical.size() < 2) return {};  // optimizer steps alone, one after another, show no loop
  for (const auto& s : steps)
    if (shared(s, typical) < kNearlyShared) return {};
  const bool first_whole = shared(step(0, ends[0]), typical) >= kNearlyShared;
  const int64_t count = static_cast<int64_t>(steps.size()) + (first_whole ? 1 : 0);
  if (count < 2) return {};
  std::vector<double> spans, starts;  // the end of one optimizer step to the next's (the first: from the first op)
  if (first_whole) {
    spans.push_back(end_of(t, (*thread)[ends[0]]) - t.events[thread->front()].ts);
    starts.push_back(t.events[thread->front()].ts);
  }
  for (size_t j = 1; j < ends.size(); ++j) {
    spans.push_back(end_of(t, (*thread)[ends[j]]) - end_of(t, (*thread)[ends[j - 1]]));
    starts.push_back(t.events[(*thread)[ends[j - 1] + 1]].ts);  // a step holds more than its optimizer step
  }
  return {count, median(spans), starts};
}

}  // namespace

RepeatedSteps repeated_steps(const Trace& t, const Links& m) {
  const RepeatedSteps exact = exact_repeats(t, m);
  return exact.steps > 0 ? exact : optimizer_steps(t, m);
}

}  // namespace opfuse::analyze
